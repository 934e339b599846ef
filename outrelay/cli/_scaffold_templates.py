"""The files ``outrelay new-transport NAME`` writes (``string.Template``: ``$name``, ``$Name``, ``$package``).

The generated transport is a working skeleton on :mod:`outrelay.kit`: an
in-process broker stands where the real client library will go, so the
generated conformance test passes out of the box; replace the marked parts.
"""

from __future__ import annotations

__all__ = ["FILES"]

PYPROJECT = """\
[build-system]
# setuptools >= 77 reads SPDX license expressions (license = "MIT"); pip fetches it for an isolated build, but
# with --no-build-isolation (or offline) install it first: pip install "setuptools>=77"
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "outrelay-$name"
version = "0.1.0"
description = "An outrelay transport: $name."
requires-python = ">=3.11"
dependencies = ["outrelay"]

[project.optional-dependencies]
test = ["pytest>=8"]

# outrelay finds the transport through this entry point
[project.entry-points.outrelay]
$name = "$package"

[tool.setuptools.packages.find]
include = ["$package*"]

[tool.pytest.ini_options]
testpaths = ["tests"]
addopts = "--strict-markers -ra -p no:asyncio"  # the suite runs its own event loops
filterwarnings = [
    "error",
    # a leaked socket or file warns when it is garbage-collected, in whichever test runs then: as an error it
    # would turn one leak into a teardown error of every later test. The suite's sockets_released check names
    # the leak; these stay visible as warnings.
    "default::ResourceWarning",
    "default::pytest.PytestUnraisableExceptionWarning",
]

[tool.ruff]
line-length = 120
target-version = "py311"

[tool.ruff.lint]
select = ["E", "F", "W", "I", "B", "UP", "RUF", "SIM", "ASYNC"]
ignore = ["ASYNC109"]  # Reader.read(count, timeout) is outrelay's API shape

[tool.ruff.lint.isort]
known-first-party = ["$package"]

[tool.mypy]
strict = true
python_version = "3.11"
packages = ["$package"]
plugins = ["pydantic.mypy"]

[[tool.mypy.overrides]]
module = ["outrelay.*"]
follow_imports = "silent"
"""

INIT = '''\
"""outrelay-$name: the ``$name`` transport for outrelay.

Installed (``pip install -e .``), it registers itself through the ``outrelay``
entry-point group; configure it as ``transport = "$name"``.
"""

from __future__ import annotations

from outrelay.kit import Registry, hookimpl

from $package._transport import ${Name}Config, ${Name}Transport

__all__ = ["${Name}Config", "${Name}Transport", "outrelay_add_transports"]


@hookimpl
def outrelay_add_transports(registry: Registry) -> None:
    registry.add_transport("$name", ${Name}Transport)
'''

TRANSPORT = '''\
"""The ``$name`` transport.

TODO: describe what goes on the wire (CloudEvents binding, key, dedupe id),
how order holds, and what each failure becomes — see outrelay's
docs/transports.md. The skeleton talks to :class:`${Name}Broker`, an
in-process stand-in for the real broker: replace ``_open``/``_send``/``_close``
and the reader with calls to your client library, mapping its exceptions
through ``ERRORS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, ClassVar

from outrelay.kit import (
    Capabilities,
    Delivered,
    ErrorMap,
    LifecycleTransport,
    Message,
    Reader,
    Received,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    TransportConfig,
    binary_headers,
    from_binary,
)
from pydantic import Field

__all__ = ["${Name}Broker", "${Name}Config", "${Name}Reader", "${Name}Transport"]

PREFIX = "ce-"  # TODO: your protocol's CloudEvents binding prefix


class ${Name}Config(TransportConfig):
    """Options of one ``$name`` destination (frozen; unknown keys rejected)."""

    broker: str = "default"  # TODO: the real connection options (declare secrets as pydantic.SecretStr)
    topic: str = "events.{type}"
    max_message_bytes: int = Field(1_048_576, ge=1)
    down: bool = False  # the stand-in broker's "nothing listens here" switch, for the broker-down checks


@dataclasses.dataclass
class ${Name}Broker:
    """TODO: delete. An in-process broker: messages per topic, in order."""

    topics: dict[str, list[tuple[dict[str, str], bytes, str | None]]] = dataclasses.field(
        default_factory=lambda: defaultdict(list)
    )
    brokers: ClassVar[dict[str, ${Name}Broker]] = {}

    @classmethod
    def named(cls, name: str) -> ${Name}Broker:
        return cls.brokers.setdefault(name, cls())

    def publish(self, topic: str, headers: dict[str, str], body: bytes, content_type: str | None) -> None:
        self.topics[topic].append((headers, body, content_type))


# TODO: one table from your client library's exceptions to outcomes
ERRORS = ErrorMap(
    (ConnectionError, "retry", "is the broker running?"),
    (TimeoutError, "retry"),
    (PermissionError, "reject", "grant the credentials publish rights"),
)


class ${Name}Transport(LifecycleTransport[${Name}Config]):
    """See the module docstring. The open/close rules come from LifecycleTransport."""

    name = "$name"
    Config = ${Name}Config
    errors = ERRORS
    target_option = "topic"  # target() renders this option's template (values kept inside one segment)
    conformance_target_option: ClassVar[str | None] = "topic"
    conformance_unreachable_options: ClassVar[dict[str, Any] | None] = {"down": True}
    # reader options for a reader that sees what was sent before it started (the durability check)
    conformance_late_reader_options: ClassVar[dict[str, Any] | None] = {"from_beginning": True}

    def __init__(self, config: ${Name}Config, *, destination: str = "$name") -> None:
        super().__init__(config, destination=destination)  # sets self.cfg, typed ${Name}Config
        self._broker: ${Name}Broker | None = None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            ordering_by_key=True,
            ordered_batches=True,
            max_batch_count=500,
            max_message_bytes=self.cfg.max_message_bytes,
            cloudevents_modes=("binary",),
            reader=True,
            delivery="at_least_once",  # TODO: "at_most_once" if the broker keeps nothing for absent readers
        )


    async def _open(self) -> None:
        if self.cfg.down:  # TODO: connect with your client library
            raise RetryableError(f"$name broker {self.cfg.broker!r} is unreachable", destination=self.destination)
        self._broker = ${Name}Broker.named(self.cfg.broker)

    async def _close(self) -> None:
        self._broker = None  # TODO: disconnect

    async def _check(self) -> str:
        # TODO: prove these credentials may *publish* to the topic, not only connect (a dry-run publish, an ACL
        # query): check() must fail, saying what to fix, for credentials that connect but may not publish
        return f"$name broker {self.cfg.broker!r} reachable, may publish"

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        broker = self._broker
        assert broker is not None  # LifecycleTransport calls _send only while open
        results: list[SendResult] = []
        failed: set[str] = set()
        for m in batch:
            if m.key in failed:  # ordered_batches: nothing of a stream after its first failure
                results.append(RetryLater(f"not sent: an earlier event of stream {m.key!r} failed"))
                continue
            if len(m.event.data) > self.cfg.max_message_bytes:
                failed.add(m.key)
                results.append(Rejected(f"{len(m.event.data)} data bytes exceed {self.cfg.max_message_bytes}"))
                continue
            try:
                broker.publish(m.target, binary_headers(m.event, PREFIX), m.event.data, m.event.content_type)
            except Exception as exc:  # per message: the error table decides
                failed.add(m.key)
                results.append(ERRORS.result(exc, f"publish to {m.target!r}"))
                continue
            results.append(Delivered())
        return results

    def reader(self, target: str, **options: Any) -> Reader:
        """A reader of ``target``; ``from_beginning=True``: also what was sent before it started."""
        broker = ${Name}Broker.named(self.cfg.broker)
        return ${Name}Reader(broker, target, from_beginning=bool(options.get("from_beginning")))


class ${Name}Reader(Reader):
    """Reads what is published to one topic after :meth:`start` (``from_beginning``: everything the broker kept).
    TODO: subscribe with your client."""

    def __init__(self, broker: ${Name}Broker, topic: str, *, from_beginning: bool = False) -> None:
        self._broker = broker
        self.topic = topic
        self.from_beginning = from_beginning
        self._pos = 0

    async def start(self) -> None:
        self._pos = 0 if self.from_beginning else len(self._broker.topics[self.topic])

    async def read(self, count: int, timeout: float) -> list[Received]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for _ in range(1_000_000):  # TODO: await your client's delivery instead of polling
            if len(self._broker.topics[self.topic]) - self._pos >= count or loop.time() >= deadline:
                break
            await asyncio.sleep(0.005)
        raw = self._broker.topics[self.topic][self._pos : self._pos + count]
        self._pos += len(raw)
        out = []
        for headers, body, content_type in raw:
            with contextlib.suppress(ValueError):  # not a CloudEvent: not ours to return
                event = from_binary(headers, body, content_type=content_type, prefix=PREFIX)
                out.append(Received(event, self.topic, event.stream, headers, body, content_type))
        return out

    async def stop(self) -> None:
        return None
'''

TEST = '''\
"""The outrelay conformance suite against the ``$name`` transport."""

from __future__ import annotations

import pytest
from outrelay.conformance import ConformanceSuite, ConformanceTarget

from $package import ${Name}Config, ${Name}Transport


class Test${Name}Conformance(ConformanceSuite):
    """Every check passes, or skips with a reason from the declared capabilities."""

    @pytest.fixture
    def conformance_target(self) -> ConformanceTarget:
        # TODO: point these at a real broker (and say so in the label)
        return ConformanceTarget(
            make_transport=lambda topic: ${Name}Transport(${Name}Config(topic=topic, max_message_bytes=4096)),
            make_unreachable=lambda topic: ${Name}Transport(${Name}Config(topic=topic, down=True)),
            # a reader started after the send, for the durability check (delivery = at_least_once)
            late_reader=lambda transport, topic: transport.reader(topic, from_beginning=True),
            label="$name (in-process stand-in broker)",
            read_timeout=2.0,
            timeout=2.0,
        )
'''

README = """\
# outrelay-$name

An outrelay transport for $name, generated by `outrelay new-transport $name`.

    pip install -e .                # registers transport "$name" (entry point group "outrelay")
    pytest                          # the conformance suite against the transport
    outrelay conformance --plugin $package:${Name}Transport -o topic=orders

The skeleton publishes to an in-process stand-in broker so that everything
above works at once; replace the TODOs in `$package/_transport.py` with your
client library. The guide: outrelay's docs/transports.md.

Building needs setuptools >= 77 (for SPDX `license = "..."` expressions).
`pip install -e .` fetches it into an isolated build environment; with
`--no-build-isolation`, or offline, run `pip install "setuptools>=77"` first.

Declare your broker's delivery semantics in `capabilities`: the default,
`delivery="at_least_once"`, promises that what was Delivered is kept for a
reader that attaches later (the suite checks it); a broker that keeps
nothing for absent readers (Redis Pub/Sub, MQTT without sessions) declares
`delivery="at_most_once"`.
"""

FILES = {
    "pyproject.toml": PYPROJECT,
    "README.md": README,
    "$package/__init__.py": INIT,
    "$package/_transport.py": TRANSPORT,
    "$package/py.typed": "",
    "tests/test_conformance.py": TEST,
}
