"""AMQP 1.0 wire-protocol test peer, not Azure Service Bus.

A small python-qpid-proton server that the real ``azure-servicebus`` SDK
talks to over real AMQP 1.0 frames, so the ``servicebus`` transport can be
tested without Docker or a cloud namespace. It implements only what the
tests check, the way Service Bus does it on the wire (see docs/testing.md):

* SASL ANONYMOUS, no TLS (the SDK's ``UseDevelopmentEmulator=true``);
* claims-based auth: ``$cbs`` put-token requests answered 200;
* queues, topics with subscriptions (fan-out), entity ``max-message-size``;
* single messages and batches (message format 0x80013700: the body is a
  run of Data sections, each a whole encoded message, split here);
* sessions: ``properties.group-id`` is the session id; a receiver's
  ``com.microsoft:session-filter`` picks one session (or the next
  available one), echoed with ``com.microsoft:locked-until-utc``;
* duplicate detection by ``message-id`` within a window, per entity;
* receive-and-delete and peek-lock (accept/release/reject settlement);
* throttling: :meth:`AmqpServiceBusPeer.server_busy` makes some transfers
  answer ``rejected`` with ``com.microsoft:server-busy``.

Everything else (management operations, scheduling, dead-letter queues,
lock renewal, transactions, authorization) is absent. Passing against this
peer proves the wire mapping, not Service Bus behaviour: the suite also
runs against a real namespace when ``OUTRELAY_SERVICEBUS_CONNECTION_STRING``
is set.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from proton import Condition, Data, Delivery, Described, Handler, Message, Terminus, symbol, timestamp
from proton.reactor import ApplicationEvent, Container, EventInjector

from tests.services import free_port, need

__all__ = ["AmqpServiceBusPeer", "connection_string"]

SESSION_FILTER = symbol("com.microsoft:session-filter")
LOCKED_UNTIL = symbol("com.microsoft:locked-until-utc")
SERVER_BUSY = "com.microsoft:server-busy"
MAX_MESSAGE_SIZE = 256 * 1024
_TICKS_EPOCH = 621_355_968_000_000_000
_DATA_SECTION = 0x75


def connection_string(port: int) -> str:
    """The development-emulator connection string the SDK uses for this peer."""
    return (
        f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )


@dataclasses.dataclass
class Stored:
    message: Message
    session: str | None
    seq: int
    enqueued: float


@dataclasses.dataclass
class Entity:
    """A queue or a topic subscription: messages in arrival order."""

    name: str
    sessions: bool = False
    messages: collections.deque[Stored] = dataclasses.field(default_factory=collections.deque)
    locked_sessions: dict[str, Any] = dataclasses.field(default_factory=dict)  # session id -> link


@dataclasses.dataclass
class Inbound:
    """Where sent messages go: a queue (itself) or a topic (its subscriptions)."""

    name: str
    targets: list[Entity]
    dedupe_window: float | None = None
    seen: dict[str, float] = dataclasses.field(default_factory=dict)


def _split_batch(raw: bytes) -> list[bytes] | None:
    """The encoded messages inside a batch transfer, or None if ``raw`` is one message."""
    parts: list[bytes] = []
    pos = 0
    while pos < len(raw):
        d = Data()
        n = d.decode(raw[pos:])
        d.rewind()
        d.next()
        section = d.get_object()
        pos += n
        if not isinstance(section, Described) or section.descriptor in (0x76, 0x77):
            return None  # an AMQP value/sequence body: a plain message
        if section.descriptor == _DATA_SECTION:
            parts.append(bytes(section.value))
        # the SDK copies the first message's properties onto the batch envelope: skip them
    if len(parts) < 1 or not all(p[:2] == b"\x00\x53" and 0x70 <= p[2] <= 0x78 for p in parts):
        return None
    try:  # every part must itself be a whole message
        for p in parts:
            Message().decode(p)
    except Exception:
        return None
    return parts


def _address(addr: str | None) -> str:
    addr = addr or ""
    if "://" in addr:
        addr = addr.split("://", 1)[1].split("/", 1)[1] if "/" in addr.split("://", 1)[1] else ""
    return addr.strip("/").lower()


class AmqpServiceBusPeer(Handler):  # type: ignore[misc]
    """AMQP 1.0 wire-protocol test peer, not Azure Service Bus (see the module docstring).

    Start with :meth:`start` (a background thread), create entities with
    :meth:`create_queue` / :meth:`create_topic`, stop with :meth:`stop`.
    All control methods are thread-safe.
    """

    def __init__(self, port: int, *, max_message_size: int = MAX_MESSAGE_SIZE) -> None:
        super().__init__()
        self.port = port
        self.max_message_size = max_message_size
        self.lock = threading.RLock()
        self.inbound: dict[str, Inbound] = {}
        self.entities: dict[str, Entity] = {}
        self.seq = 0
        self.transfers = 0
        self.busy_every = 0
        self.busy_left = 0
        self.busy_answers = 0
        self.container = Container(self)
        self.injector = EventInjector()
        self.container.selectable(self.injector)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._senders: list[Any] = []  # links on which we deliver to clients
        self._inflight: dict[bytes, tuple[Entity, Stored]] = {}  # peek-lock deliveries awaiting settlement
        self._pending_replies: dict[Any, list[bytes]] = collections.defaultdict(list)

    # -- control (any thread) ------------------------------------------------------

    @property
    def connection_string(self) -> str:
        return connection_string(self.port)

    def start(self) -> AmqpServiceBusPeer:
        self._thread = threading.Thread(target=self.container.run, name="amqp-servicebus-peer", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("AMQP test peer did not start")
        return self

    def stop(self) -> None:
        self.injector.trigger(ApplicationEvent("peer_stop"))
        if self._thread is not None:
            self._thread.join(10)

    def create_queue(self, name: str, *, sessions: bool = False, dedupe_window: float | None = None) -> None:
        with self.lock:
            entity = Entity(name.lower(), sessions)
            self.entities[entity.name] = entity
            self.inbound[entity.name] = Inbound(entity.name, [entity], dedupe_window)

    def create_topic(self, name: str, *, dedupe_window: float | None = None) -> None:
        with self.lock:
            self.inbound[name.lower()] = Inbound(name.lower(), [], dedupe_window)

    def create_subscription(self, topic: str, name: str, *, sessions: bool = False) -> None:
        with self.lock:
            entity = Entity(f"{topic}/subscriptions/{name}".lower(), sessions)
            self.entities[entity.name] = entity
            self.inbound[topic.lower()].targets.append(entity)

    def server_busy(self, *, every: int, count: int) -> None:
        """Reject every ``every``-th transfer with server-busy, ``count`` times in all."""
        with self.lock:
            self.busy_every, self.busy_left, self.transfers, self.busy_answers = every, count, 0, 0

    def depth(self, entity: str) -> int:
        with self.lock:
            return len(self.entities[entity.lower()].messages)

    # -- reactor callbacks ------------------------------------------------------------

    def on_reactor_init(self, event: Any) -> None:
        self.acceptor = event.container.listen(f"127.0.0.1:{self.port}")
        self._ready.set()

    def on_peer_stop(self, event: Any) -> None:
        self.acceptor.close()
        self.injector.close()
        self.container.stop()

    def on_connection_remote_open(self, event: Any) -> None:
        event.connection.open()

    def on_session_remote_open(self, event: Any) -> None:
        event.session.open()

    def on_connection_remote_close(self, event: Any) -> None:
        event.connection.close()

    def on_session_remote_close(self, event: Any) -> None:
        event.session.close()

    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        link.source.address = link.remote_source.address
        link.target.address = link.remote_target.address
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        if link.is_receiver:
            self._open_inbound(link)
        else:
            self._open_outbound(link)

    def _fail_attach(self, link: Any, condition: str, description: str) -> None:
        # A refused attach carries a null terminus (AMQP 1.0 2.6.3), then the detach with the error.
        (link.target if link.is_receiver else link.source).type = Terminus.UNSPECIFIED
        link.condition = Condition(condition, description)
        link.open()
        link.close()

    def _open_inbound(self, link: Any) -> None:
        name = _address(link.remote_target.address)
        if name != "$cbs" and name not in self.inbound:
            self._fail_attach(link, "amqp:not-found", f"The messaging entity '{name}' could not be found.")
            return
        link.max_message_size = self.max_message_size
        link.open()
        link.flow(1000)

    def _open_outbound(self, link: Any) -> None:
        name = _address(link.remote_source.address)
        if name == "$cbs":
            link.open()
            return
        entity = self.entities.get(name)
        if entity is None:
            self._fail_attach(link, "amqp:not-found", f"The messaging entity '{name}' could not be found.")
            return
        link.max_message_size = self.max_message_size
        filters = link.remote_source.filter
        wanted: Any = None
        is_session = False
        if filters is not None:
            filters.rewind()
            if filters.next():
                fmap = filters.get_object() or {}
                if SESSION_FILTER in fmap:
                    is_session, wanted = True, fmap[SESSION_FILTER]
        if is_session:
            sid = self._lock_session(entity, wanted, link)
            if sid is None:
                # Service Bus answers a session it cannot lock in time like this; the SDK
                # logs a callback error and raises OperationTimeoutError.
                self._fail_attach(link, "com.microsoft:timeout", "no session available")
                return
            link.source.filter.put_object({SESSION_FILTER: sid})
            ticks = int((time.time() + 60) * 10**7) + _TICKS_EPOCH
            link.properties = {LOCKED_UNTIL: ticks}
            link.peer_session = sid
        else:
            link.peer_session = None
        link.peer_entity = entity
        link.open()
        self._senders.append(link)

    def _lock_session(self, entity: Entity, wanted: Any, link: Any) -> str | None:
        with self.lock:
            if wanted is not None:
                sid = str(wanted)
                if sid in entity.locked_sessions:
                    return None
            else:
                candidates = [s.session for s in entity.messages if s.session not in entity.locked_sessions]
                if not candidates or candidates[0] is None:
                    return None
                sid = candidates[0]
            entity.locked_sessions[sid] = link
            return sid

    def on_link_remote_close(self, event: Any) -> None:
        link = event.link
        link.close()
        self._forget(link)

    def on_connection_unbound(self, event: Any) -> None:
        for link in list(self._senders):
            if link.connection == event.connection:
                self._forget(link)

    def _forget(self, link: Any) -> None:
        if link not in self._senders:
            return
        self._senders.remove(link)
        entity: Entity = link.peer_entity
        with self.lock:
            if link.peer_session is not None and entity.locked_sessions.get(link.peer_session) == link:
                del entity.locked_sessions[link.peer_session]
            # unsettled peek-lock deliveries of this link go back to the front
            for tag, (ent, stored) in list(self._inflight.items()):
                if ent is entity and getattr(stored, "link", None) == link:
                    del self._inflight[tag]
                    entity.messages.appendleft(stored)

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if link.is_sender:
            self._flush_replies(link)
            self._pump()

    # -- transfers ----------------------------------------------------------------------

    def on_delivery(self, event: Any) -> None:
        link, dlv = event.link, event.delivery
        if link.is_sender:
            self._on_settlement(dlv)
            return
        if not dlv.readable or dlv.partial:
            return
        raw = link.recv(dlv.pending)
        link.advance()
        if link.credit < 500:
            link.flow(1000 - link.credit)
        name = _address(link.remote_target.address)
        if name == "$cbs":
            self._put_token(link, raw)
            dlv.update(Delivery.ACCEPTED)
            dlv.settle()
            return
        outcome = self._accept(name, raw)
        if outcome is not None:
            # the SDK indexes the error's info field: never leave it empty
            dlv.local.condition = Condition(*outcome, {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())})
            dlv.update(Delivery.REJECTED)
        else:
            dlv.update(Delivery.ACCEPTED)
        dlv.settle()
        self._pump()

    def _accept(self, name: str, raw: bytes) -> tuple[str, str] | None:
        """Store one transfer (a message or a batch); the rejection condition if refused."""
        with self.lock:
            self.transfers += 1
            if self.busy_left > 0 and self.busy_every and self.transfers % self.busy_every == 0:
                self.busy_left -= 1
                self.busy_answers += 1
                return (SERVER_BUSY, "The server is busy. Please retry the operation later. (test peer)")
            inbound = self.inbound[name]
            parts = _split_batch(raw)
            messages = []
            for p in parts if parts is not None else [raw]:
                m = Message()
                m.decode(p)
                messages.append(m)
            if any(t.sessions and not m.group_id for t in inbound.targets for m in messages):
                return (
                    "amqp:not-allowed",
                    "The SessionId was not set on a message, and it cannot be sent to "
                    "the entity. Entities that have session support enabled can only receive messages that "
                    "have the SessionId set to a valid value. (test peer)",
                )
            now = time.time()
            if inbound.dedupe_window is not None:
                horizon = now - inbound.dedupe_window
                for k in [k for k, t in inbound.seen.items() if t < horizon]:
                    del inbound.seen[k]
            for m in messages:
                if inbound.dedupe_window is not None and m.id is not None:
                    if str(m.id) in inbound.seen:
                        continue
                    inbound.seen[str(m.id)] = now
                for entity in inbound.targets:
                    self.seq += 1
                    entity.messages.append(Stored(m, m.group_id or None, self.seq, now))
        return None

    def _put_token(self, link: Any, raw: bytes) -> None:
        req = Message()
        req.decode(raw)
        reply = Message(
            correlation_id=req.id,
            properties={"status-code": 200, "status-description": "OK"},
            body=None,
        )
        for other in self._links(link.connection):
            if other.is_sender and other.session == link.session and _address(other.source.address) == "$cbs":
                self._pending_replies[other].append(reply.encode())
                self._flush_replies(other)
                return

    def _links(self, connection: Any) -> list[Any]:
        out, link = [], connection.link_head(0)
        while link:
            out.append(link)
            link = link.next(0)
        return out

    def _flush_replies(self, link: Any) -> None:
        queue = self._pending_replies.get(link)
        while queue and link.credit > 0:
            dlv = link.delivery(uuid.uuid4().bytes)
            link.send(queue.pop(0))
            link.advance()
            dlv.settle()

    def _pump(self) -> None:
        """Deliver stored messages to every receiver link with credit."""
        with self.lock:
            for link in list(self._senders):
                entity: Entity = link.peer_entity
                while link.credit > 0:
                    stored = self._next_for(entity, link.peer_session)
                    if stored is None:
                        break
                    self._deliver(link, entity, stored)

    def _next_for(self, entity: Entity, session: str | None) -> Stored | None:
        for i, s in enumerate(entity.messages):
            if entity.sessions and s.session != session:
                continue
            del entity.messages[i]
            return s
        return None

    def _deliver(self, link: Any, entity: Entity, stored: Stored) -> None:
        tag = uuid.uuid4().bytes
        m = stored.message
        m.annotations = {
            symbol("x-opt-sequence-number"): stored.seq,
            symbol("x-opt-enqueued-time"): timestamp(int(stored.enqueued * 1000)),
            symbol("x-opt-locked-until"): timestamp(int((time.time() + 60) * 1000)),
        }
        if stored.session is not None:
            m.annotations[symbol("x-opt-partition-key")] = stored.session
        dlv = link.delivery(tag)
        link.send(m.encode())
        link.advance()
        if link.snd_settle_mode == link.SND_SETTLED:
            dlv.settle()
        else:
            stored.link = link  # type: ignore[attr-defined]
            self._inflight[tag] = (entity, stored)
            dlv.peer_tag = tag  # proton keeps wrapper attributes with the C object

    def _on_settlement(self, dlv: Any) -> None:
        if not dlv.updated:
            return
        state = dlv.remote_state
        with self.lock:
            item = self._inflight.pop(getattr(dlv, "peer_tag", b""), None)
            if item is not None and state in (Delivery.RELEASED, Delivery.MODIFIED):
                item[0].messages.appendleft(item[1])
        if not dlv.settled:  # the client waits for us to settle with the same outcome
            dlv.update(state)
        dlv.settle()
        if state in (Delivery.RELEASED, Delivery.MODIFIED):
            self._pump()


# -- pytest fixture ---------------------------------------------------------------------------

PEER_LABEL = "servicebus (AMQP 1.0 wire-protocol test peer, not Azure Service Bus)"


@dataclasses.dataclass
class ServiceBusEnv:
    """Where the Service Bus tests send: the test peer, or a real namespace/emulator.

    Real namespace: ``OUTRELAY_SERVICEBUS_CONNECTION_STRING`` plus existing
    queues ``OUTRELAY_SERVICEBUS_QUEUE`` (plain), ``..._SESSION_QUEUE``
    (requires sessions) and ``..._DEDUPE_QUEUE`` (duplicate detection on,
    window ``OUTRELAY_SERVICEBUS_DEDUPE_WINDOW`` seconds, default 600).
    """

    connection_string: str
    label: str
    peer: AmqpServiceBusPeer | None = None
    dedupe_window: float = 600.0

    async def provision(self, name: str, *, sessions: bool = False, dedupe: bool = False) -> str:
        """A queue with those properties, empty: created on the peer, drained on a real namespace."""
        if self.peer is not None:
            self.peer.create_queue(name, sessions=sessions, dedupe_window=self.dedupe_window if dedupe else None)
            return name.lower()
        var = "OUTRELAY_SERVICEBUS_" + ("SESSION_QUEUE" if sessions else "DEDUPE_QUEUE" if dedupe else "QUEUE")
        queue = os.environ.get(var)
        if not queue:
            need("Service Bus queue", f"{var} is not set (the queue must exist on the namespace)")
        await _drain(self.connection_string, queue, sessions)
        return queue

    def require_peer(self, why: str) -> AmqpServiceBusPeer:
        if self.peer is None:
            need("AMQP test peer", f"{why} is injected by the test peer only")
        return self.peer


async def _drain(conn: str, queue: str, sessions: bool) -> None:
    from outrelay.transports.servicebus._config import ServiceBusConfig
    from outrelay.transports.servicebus._reader import ServiceBusReader

    reader = ServiceBusReader(ServiceBusConfig(connection_string=conn, queue=queue, sessions=sessions), queue)
    async with reader:
        while await reader.read(1000, 2.0):
            pass


@pytest.fixture(scope="session")
def servicebus_env() -> Iterator[ServiceBusEnv]:
    """The peer (started on a free port, stopped at the end) or the namespace from the environment."""
    conn = os.environ.get("OUTRELAY_SERVICEBUS_CONNECTION_STRING")
    if conn:
        window = float(os.environ.get("OUTRELAY_SERVICEBUS_DEDUPE_WINDOW", "600"))
        yield ServiceBusEnv(conn, "servicebus (namespace from OUTRELAY_SERVICEBUS_CONNECTION_STRING)", None, window)
        return
    peer = AmqpServiceBusPeer(free_port()).start()
    try:
        yield ServiceBusEnv(peer.connection_string, PEER_LABEL, peer, 600.0)
    finally:
        peer.stop()


__all__ += ["PEER_LABEL", "ServiceBusEnv", "servicebus_env"]


def main() -> None:
    """``python -m tests.peers.amqp_servicebus_peer PORT QUEUE[:sessions] ...``: run the peer in its own
    process (benchmarks, manual tries) until stdin closes; prints ``ready`` once listening."""
    import sys

    port, queues = int(sys.argv[1]), sys.argv[2:]
    peer = AmqpServiceBusPeer(port).start()
    for q in queues:
        name, _, opt = q.partition(":")
        peer.create_queue(name, sessions=opt == "sessions")
    print("ready", flush=True)
    sys.stdin.read()
    peer.stop()


if __name__ == "__main__":
    main()
