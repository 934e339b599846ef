"""The shared transport conformance suite (a pytest plugin).

A transport author subclasses :class:`ConformanceSuite` in a test module and
provides one fixture, ``conformance_target``, returning a
:class:`ConformanceTarget`::

    from outrelay.conformance import ConformanceSuite, ConformanceTarget

    class TestMyTransport(ConformanceSuite):
        @pytest.fixture
        def conformance_target(self, my_broker):
            return ConformanceTarget(
                make_transport=lambda target: MyTransport(MyConfig(url=my_broker, topic=target)),
                provision=my_create_topic,          # optional: create a fresh target
                make_unreachable=lambda target: MyTransport(MyConfig(url="tcp://127.0.0.1:1", topic=target)),
                label="mine (real broker 1.2)",
            )

Every check passes, fails, or skips with a reason derived from the
transport's declared :class:`~outrelay.Capabilities`. Each check runs in its
own event loop (``asyncio.run``), so the suite needs no asyncio pytest
plugin; the callables of :class:`ConformanceTarget` are called inside that
loop, so create loop-bound clients inside them, not in the fixture.
``outrelay conformance --config FILE --destination NAME`` runs the same
suite against a configured destination (:mod:`outrelay.conformance.runner`).
The checks are listed in :data:`CHECKS` (name -> one-sentence description).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from outrelay.core.transport import Transport

__all__ = ["CHECKS", "ConformanceSuite", "ConformanceTarget"]


@dataclasses.dataclass(frozen=True)
class ConformanceTarget:
    """How the suite reaches a transport under test.

    * ``make_transport(target)`` — a new, unopened transport whose
      ``target(event)`` is ``target`` for every event.
    * ``provision(name)`` — create a fresh target (topic, queue, ...) from a
      unique name and return the target string to use; ``None`` when any
      name works as is.
    * ``make_unreachable(target)`` — the same transport configured against
      an endpoint where nothing listens (for the broker-down checks); ``None``
      skips those checks with a reason.
    * ``label`` — what the peer is, shown in the report (say so when it is a
      test double of the wire protocol rather than the real service).
    * ``read_timeout`` — how long a check waits for messages to be read back.
    * ``timeout`` — the bound on every single ``open``/``send``/``close``/
      ``check`` call; a call that takes longer fails the check as a hang.
    * ``isolated`` — ``True`` when every check gets a target of its own.
      ``False`` means ``make_transport`` ignores its argument and all checks
      share one pre-existing target: readers then ignore messages the check
      did not send, and checks that need their own target skip.
    """

    make_transport: Callable[[str], Transport]
    provision: Callable[[str], Awaitable[str]] | None = None
    make_unreachable: Callable[[str], Transport] | None = None
    label: str = ""
    read_timeout: float = 15.0
    timeout: float = 10.0
    isolated: bool = True


from outrelay.conformance._harness import CHECKS  # noqa: E402
from outrelay.conformance.suite import ConformanceSuite  # noqa: E402
