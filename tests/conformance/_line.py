"""A small networked reference transport for the conformance kit's own tests: ``line``.

A real TCP server on 127.0.0.1 (one per check, in the check's event loop)
stores what it receives in an in-process :class:`MemoryBroker`; the client
transport speaks one JSON line per message and waits for a one-line answer
(stop-and-wait, so a key's order is the send order and a lost connection
loses a tail). It implements every hook of :class:`ConformanceTarget`, so the
correct version passes every check and each deliberately broken subclass
(``tests/conformance/test_broken_*.py``) fails the one check aimed at its
defect. Answers: ``ok`` / ``dup`` (Delivered), ``refused <why>`` (Rejected),
``forbidden`` (PermanentError / Rejected), ``throttle <seconds>`` (RetryLater
with the hint). The read-only token may ``ping`` (connect) but not publish;
``check()`` asks whether it may publish (op ``check``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar
from urllib.parse import quote, unquote

import orjson
from pydantic import SecretStr

from outrelay.conformance import ConformanceTarget
from outrelay.conformance._binding import Binding
from outrelay.core.contract.transport import (
    Capabilities,
    Delivered,
    Message,
    Reader,
    Received,
    Rejected,
    RetryLater,
    SendResult,
    Transport,
    TransportConfig,
)
from outrelay.core.model import cloudevents
from outrelay.core.model.errors import PermanentError, RetryableError, UsageError
from outrelay.transports.memory import MemoryReader, MemoryTransport

TOKEN = "line-token-s3cr3t-Zq9"
FORBIDDEN_TOKEN = "line-read-only-K7"
MAX_BYTES = 64 * 1024
#: printable ASCII but space, '"' and '%' (CloudEvents HTTP binding 3.1.3.2)
PERCENT_SAFE = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in '"%')


@dataclasses.dataclass
class LineServer:
    """The broker side: refuses targets starting with ``refused``, throttles targets in ``throttled``."""

    broker: str
    port: int = 0
    throttled: dict[str, float] = dataclasses.field(default_factory=dict)
    recent: list[str] = dataclasses.field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        b = MemoryTransport.broker(self.broker)
        try:
            while line := await reader.readline():
                doc = orjson.loads(line)
                writer.write(self.answer(b, doc).encode() + b"\n")
                await writer.drain()
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def answer(self, b: Any, doc: dict[str, Any]) -> str:
        if doc.get("op") == "ping" and doc.get("tok") in (TOKEN, FORBIDDEN_TOKEN):
            return "ok"  # the read-only token may connect: only publishing is forbidden
        if doc.get("tok") != TOKEN:
            return "forbidden"
        if doc.get("op") == "check":  # may this token publish?
            return "ok"
        target = doc["t"]
        if target.startswith("refused"):
            return f"refused target {target!r} does not exist"
        if target in self.throttled:
            return f"throttle {self.throttled[target]}"
        body = base64.b64decode(doc["b"])
        attrs = {k: unquote(v) for k, v in doc["h"].items()} if doc.get("pe") else doc["h"]
        event = cloudevents.from_binary(attrs, body, content_type=doc.get("ct"))
        dedupe_id = doc.get("d", event.id)  # the broker dedupes by the id the client sends with the message
        if dedupe_id in b.seen:
            return "dup"
        b.seen.add(dedupe_id)
        if doc.get("volatile") and not b.waiters:  # a pub/sub broker: kept for nobody when no reader listens
            return "ok"
        if doc.get("forget"):  # a broken broker: dedupe remembers only the last few ids
            self.recent.append(dedupe_id)
            if len(self.recent) > doc["forget"]:
                b.seen.discard(self.recent.pop(0))
        headers = dict(doc["h"]) | ({"content-type": doc["ct"] or ""} if doc.get("ct") or doc.get("empty_ct") else {})
        r = Received(event, target, doc.get("k"), headers, body, doc.get("ct"))
        b.messages[target].append(r)
        b.log.append(r)
        b.wake()
        return "ok"


_SERVERS: dict[str, LineServer] = {}
_KEEP: set[asyncio.Task[None]] = set()


async def provision(name: str, broker: str | None = None) -> str:
    """Start a :class:`LineServer` in the running loop (until the loop ends); the target is ``name``. Servers
    given one ``broker`` store into the same in-process broker, as two topics of one real broker would."""
    server = LineServer(broker=broker or f"line-{uuid.uuid4().hex[:8]}")
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[int] = loop.create_future()

    async def serve() -> None:
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0, limit=4 * MAX_BYTES)
        try:
            ready.set_result(srv.sockets[0].getsockname()[1])
            await loop.create_future()
        finally:
            srv.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(srv.wait_closed(), 1.0)

    task = loop.create_task(serve())
    _KEEP.add(task)
    task.add_done_callback(_KEEP.discard)
    server.port = await ready
    _SERVERS[name] = server
    return name


class LineConfig(TransportConfig):
    host: str = "127.0.0.1"
    port: int
    target: str
    broker: str
    token: SecretStr
    timeout: float = 1.0


class LineTransport(Transport):
    """The correct client (see the module docstring)."""

    name: ClassVar[str] = "line"
    Config = LineConfig
    #: percent-encode header values (the HTTP binding's rule); the server decodes them
    percent: ClassVar[bool] = False

    def __init__(self, config: LineConfig, *, destination: str = "line") -> None:
        super().__init__(config, destination=destination)
        self.cfg = config
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()
        self._state = "new"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(ordered_batches=True, native_dedupe=True, max_message_bytes=MAX_BYTES,
                            cloudevents_modes=("binary",), reader=True)  # fmt: skip

    def target(self, event: Any) -> str:
        return self.cfg.target

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._conn is None:
            try:
                self._conn = await asyncio.wait_for(
                    asyncio.open_connection(self.cfg.host, self.cfg.port, limit=4 * MAX_BYTES), self.cfg.timeout
                )
            except (OSError, TimeoutError) as exc:
                raise RetryableError(f"line broker {self.cfg.host}:{self.cfg.port} unreachable: {exc!r}") from None
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn[1].transport.abort()
            self._conn = None

    async def open(self) -> None:
        await self._connect()
        self._state = "open"

    async def close(self) -> None:
        if self._state == "open":
            self._state = "closed"
        self._drop()

    async def roundtrip(self, doc: dict[str, Any]) -> str:
        """One request line, one answer line, within ``timeout``. :raises OSError/TimeoutError: link trouble."""
        reader, writer = await self._connect()
        writer.write(orjson.dumps(doc) + b"\n")
        async with asyncio.timeout(self.cfg.timeout):
            await writer.drain()
            line = await reader.readline()
        if not line:
            raise ConnectionResetError("connection closed by the broker")
        return line.decode().strip()

    def request(self, m: Message) -> dict[str, Any]:
        e = m.event
        headers = cloudevents.binary_headers(e)
        if self.percent:
            headers = {k: quote(v, safe=PERCENT_SAFE) for k, v in headers.items()}
        return {"op": "send", "tok": self.cfg.token.get_secret_value(), "t": m.target, "k": m.key, "pe": self.percent,
                "h": headers, "ct": e.content_type, "b": base64.b64encode(e.data).decode(), "d": e.id}  # fmt: skip

    async def send_one(self, m: Message) -> SendResult:
        if len(m.event.data) > MAX_BYTES:
            return Rejected(f"{len(m.event.data)} bytes exceed max_message_bytes={MAX_BYTES}")
        try:
            answer = await self.roundtrip(self.request(m))
        except RetryableError as exc:
            return RetryLater(str(exc))
        except (OSError, TimeoutError) as exc:
            self._drop()
            return RetryLater(f"connection lost: {exc!r}")
        return self.classify(answer)

    @staticmethod
    def classify(answer: str) -> SendResult:
        word, _, rest = answer.partition(" ")
        if word in ("ok", "dup"):
            return Delivered(duplicate=word == "dup")
        if word == "throttle":
            return RetryLater("throttled by the broker", retry_after=float(rest))
        if word == "forbidden":
            return Rejected("the token may not publish: grant it publish permission")
        return Rejected(rest or answer)

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        if self._state != "open":
            raise UsageError(f"line transport {self.destination!r} is {self._state}, not open")
        out: list[SendResult] = []
        failed: set[str] = set()
        async with self._lock:
            for m in batch:
                r = RetryLater("an earlier message with this key failed") if m.key in failed else await self.send_one(m)
                if not isinstance(r, Delivered):
                    failed.add(m.key)
                out.append(r)
        return out

    async def check(self) -> str:
        try:
            answer = await self.roundtrip({"op": "check", "tok": self.cfg.token.get_secret_value()})
        except RetryableError:
            raise
        except (OSError, TimeoutError) as exc:
            raise RetryableError(f"line broker {self.cfg.host}:{self.cfg.port}: no answer ({exc!r})") from None
        finally:
            self._drop()
        if answer == "forbidden":
            raise PermanentError("the token may not publish: grant it publish permission or use another token")
        return f"line broker {self.cfg.host}:{self.cfg.port} reachable"

    def reader(self, target: str, **options: Any) -> Reader:
        broker = MemoryTransport.broker(self.cfg.broker)
        return MemoryReader(broker, target, from_beginning=bool(options.get("from_beginning")))


def line_target(cls: type[LineTransport] = LineTransport, **overrides: Any) -> ConformanceTarget:
    """A :class:`ConformanceTarget` for ``cls`` with every hook wired."""

    broker = f"line-{uuid.uuid4().hex[:8]}"  # one broker for the targets of one target (of one check)

    def make(target: str, host: str = "127.0.0.1", port: int | None = None, token: str = TOKEN) -> LineTransport:
        server = _SERVERS.get(target) or _SERVERS.get(target.removeprefix("refused-")) or LineServer("line-none", 1)
        cfg = LineConfig(host=host, port=server.port if port is None else port, target=target, broker=server.broker,
                         token=SecretStr(token))  # fmt: skip
        return cls(cfg, destination="conformance")

    async def refuse(target: str) -> str:
        _SERVERS[f"refused-{target}"] = _SERVERS[target]
        return f"refused-{target}"

    async def throttle(target: str) -> float:
        _SERVERS[target].throttled[target] = 2.0
        return 2.0

    def unreachable(target: str) -> LineTransport:
        from tests.services import free_port

        return make(target, port=free_port())

    hooks: dict[str, Any] = {
        "make_transport": make,
        "provision": lambda name: provision(name, broker),
        "make_unreachable": unreachable,
        "upstream": lambda target: ("127.0.0.1", _SERVERS[target].port),
        "make_transport_via": lambda target, host, port: make(target, host, port),
        "refuse_target": refuse,
        "make_forbidden": lambda target: make(target, token=FORBIDDEN_TOKEN),
        "throttle": throttle,
        "secret": TOKEN,
        "binding": Binding("line", prefix="ce-"),
        "late_reader": lambda t, target: t.reader(target, from_beginning=True),
        "label": f"line ({cls.__name__}, reference TCP transport of the kit's tests)",
        "read_timeout": 2.0,
        "timeout": 3.0,
    }
    return ConformanceTarget(**(hooks | overrides))
