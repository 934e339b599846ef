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

from outrelay.conformance._binding import AMQP, HTTP, KAFKA, MQTT, NATS, STRUCTURED, Binding
from outrelay.conformance._harness import CHECKS
from outrelay.conformance._target import ConformanceTarget
from outrelay.conformance.suite import ConformanceSuite

__all__ = ["CHECKS", "Binding", "ConformanceSuite", "ConformanceTarget"]
#: the ready-made CloudEvents bindings (``from outrelay.conformance import HTTP``)
__all__ += ["AMQP", "HTTP", "KAFKA", "MQTT", "NATS", "STRUCTURED"]
