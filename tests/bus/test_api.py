"""The bus API around the backends: selection, bad input, the inbox, the CLI."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from outrelay import ConfigError, ConsumerDeadLetters, Event, EventBus, Inbox, Registry, RetryableError, parse_config
from outrelay.core.config.config import RetryPolicy
from outrelay.core.consumer.subscriber import Subscription
from outrelay.core.contract.subscription import Inbound, SubscriptionBackend, SubscriptionSpec
from outrelay.core.contract.transport import Received
from outrelay.transports.memory import MemoryTransport
from tests.services import need, port_open


class TestSelection:
    def test_nothing_configured_is_the_in_process_bus(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without [bus] or $OUTRELAY_BUS the bus is the in-process one."""
        monkeypatch.delenv("OUTRELAY_BUS", raising=False)
        bus = EventBus.from_config(parse_config({}))
        assert isinstance(bus.transport, MemoryTransport)

    def test_environment_overrides_the_config(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """$OUTRELAY_BUS names the destination, over [bus] destination."""
        cfg = parse_config(
            {
                "bus": {"destination": "a"},
                "destinations": {
                    "a": {"transport": "memory", "broker": "A"},
                    "b": {"transport": "memory", "broker": "B"},
                },
            }
        )
        monkeypatch.setenv("OUTRELAY_BUS", "b")
        assert EventBus.from_config(cfg).transport.destination == "b"
        monkeypatch.setenv("OUTRELAY_BUS", "memory")
        assert EventBus.from_config(cfg).transport.destination == "memory:bus"
        monkeypatch.delenv("OUTRELAY_BUS")
        assert EventBus.from_config(cfg).transport.destination == "a"

    def test_unknown_destination_is_one_line(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A bus naming an undefined destination fails with the list of defined ones."""
        monkeypatch.setenv("OUTRELAY_BUS", "nope")
        with pytest.raises(ConfigError, match=r"\$OUTRELAY_BUS names destination 'nope'.*defined: none, or memory"):
            EventBus.from_config(parse_config({}))
        with pytest.raises(ConfigError, match=r"bus\.destination names 'x'"):
            parse_config({"bus": {"destination": "x"}})

    def test_transport_without_subscriptions_is_refused(self, tmp_path: Path) -> None:
        """A destination whose transport offers no subscriptions is a clear ConfigError."""
        cfg = parse_config({"destinations": {"f": {"transport": "file", "path": str(tmp_path / "e.jsonl")}}})
        with pytest.raises(ConfigError, match="transport 'file' of destination 'f' offers no subscriptions"):
            EventBus.from_config(cfg, destination="f")

    def test_missing_extra_names_the_pip_line(self) -> None:
        """A backend whose client library is missing says which extra to install."""
        registry = Registry(autoload=False)
        registry.add_transport(
            "ghost", "ghost_client_lib_xyz:Transport", requires=("ghost_client_lib_xyz",), extra="ghost"
        )
        cfg = parse_config({"destinations": {"g": {"transport": "ghost"}}})
        with pytest.raises(ConfigError, match=r'pip install "outrelay\[ghost\]"'):
            EventBus.from_config(cfg, destination="g", registry=registry)


class TestInProcess:
    async def test_filters_and_unsubscribe(self) -> None:
        """Type/tenant/stream filters pick events; an unsubscribed handler sees nothing more."""
        got: list[str] = []
        async with EventBus.memory() as bus:
            sub = await bus.subscribe(lambda e: got.append(e.id), types=["order.*"], tenants=["acme"], streams=["o-*"])
            keep = Event(type="order.paid", stream="o-1", tenant="acme")
            await bus.publish([keep, Event(type="user.x", stream="o-1", tenant="acme"),
                               Event(type="order.paid", stream="o-2", tenant="other"),
                               Event(type="order.paid", stream="z", tenant="acme")])  # fmt: skip
            for _ in range(100):
                if sub.stats.handled + sub.stats.skipped == 4:
                    break
                await asyncio.sleep(0.01)
            assert got == [keep.id] and sub.stats.skipped == 3
            await sub.unsubscribe()
            await bus.publish(Event(type="order.paid", stream="o-1", tenant="acme"))
            await asyncio.sleep(0.1)
        assert got == [keep.id]

    async def test_sync_handler_runs_in_a_thread(self) -> None:
        """A plain function handler is called (off the event loop) with the event as appended."""
        import threading

        seen: list[tuple[str, bool]] = []
        async with EventBus.memory() as bus:
            await bus.subscribe(lambda e: seen.append((e.id, threading.current_thread() is threading.main_thread())))
            e = Event(type="t", stream="s", data=b"\x00\xff", content_type="application/octet-stream",
                      tenant="t1", correlation_id="c", causation_id="k", metadata={"a": "b"})  # fmt: skip
            await bus.publish(e)
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
        assert seen == [(e.id, False)]


class _ListBackend(SubscriptionBackend):
    """Hands out the given messages, then nothing (a backend stand-in for the runtime's ack paths)."""

    def __init__(self, messages: list[Inbound]) -> None:
        super().__init__(SubscriptionSpec(target="t", group="g", member="m"))
        self.messages = messages

    async def start(self) -> None:
        pass

    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        out, self.messages = self.messages[:max_messages], self.messages[max_messages:]
        if not out:
            await asyncio.sleep(min(timeout, 0.01))
        return out

    async def stop(self) -> None:
        pass


class _NowaitInbound(Inbound):
    """An Inbound whose backend acks synchronously; ``fail`` makes that ack raise as a broker error would."""

    __slots__ = ("acks", "fail")

    def ack_nowait(self) -> bool:
        if self.fail:
            raise RetryableError("connection lost while acking")
        self.acks.append(self.stream)
        return True


class TestAck:
    """The runtime acks through Inbound.ack_nowait when the backend can, else awaits Inbound.ack."""

    @staticmethod
    async def run(messages: list[Inbound], handler: Any) -> Subscription:
        sub = Subscription(
            _ListBackend(messages), handler, consumer="c", member="m", types=("*",), tenants=(), streams=(),
            retry=RetryPolicy(initial_delay=0.001, max_delay=0.001), max_attempts=2, park=False,
            concurrency=4, prefetch=8, dead_letters=ConsumerDeadLetters("memory"),
        )  # fmt: skip
        await sub.start()
        for _ in range(300):
            if sub.stats.handled + sub.stats.dead_lettered == len(messages):
                break
            await asyncio.sleep(0.01)
        await sub.unsubscribe()
        return sub

    @staticmethod
    def inbound(cls: type[Inbound], i: int, awaited: list[str], **extra: Any) -> Inbound:
        e = Event(type="t", stream=f"s{i % 3}", data={"i": i})

        async def ack() -> None:
            awaited.append(e.stream)

        m = cls(Received(e, "t", e.stream, {}, b"", None), e.stream, ack, broker_id=f"#{i}")
        for name, value in extra.items():
            setattr(m, name, value)
        return m

    async def test_synchronous_ack_is_not_awaited(self) -> None:
        """Messages whose ack_nowait acks are acked through it alone, the raising handler's dead-lettered
        one too, and the prefetch window (smaller than the messages) empties."""
        acks: list[str] = []
        awaited: list[str] = []
        messages = [self.inbound(_NowaitInbound, i, awaited, acks=acks, fail=False) for i in range(20)]

        async def handler(e: Event) -> None:
            if e.json()["i"] == 5:
                raise ValueError("no")

        sub = await self.run(messages, handler)
        assert sub.stats.handled == 19 and sub.stats.dead_lettered == 1 and sub.stats.retries == 1
        assert sorted(acks) == sorted(m.stream for m in messages) and awaited == []
        assert sub._unacked == 0

    async def test_plain_inbound_ack_is_awaited(self) -> None:
        """A plain Inbound (ack_nowait is False) is acked by awaiting its ack, as before the contract grew."""
        awaited: list[str] = []
        messages = [self.inbound(Inbound, i, awaited) for i in range(20)]
        assert not messages[0].ack_nowait()
        sub = await self.run(messages, lambda e: None)
        assert sub.stats.handled == 20 and sorted(awaited) == sorted(m.stream for m in messages)
        assert sub._unacked == 0

    async def test_failed_synchronous_ack_is_logged_and_counted_off(self, caplog: pytest.LogCaptureFixture) -> None:
        """An ack_nowait raising a TransportError is logged with the message's broker id; the message still
        leaves the prefetch window (it may come again) and the stream goes on."""
        awaited: list[str] = []
        messages = [self.inbound(_NowaitInbound, i, awaited, acks=[], fail=i == 3) for i in range(20)]
        with caplog.at_level("WARNING", logger="outrelay.bus"):
            sub = await self.run(messages, lambda e: None)
        assert sub.stats.handled == 20 and sub._unacked == 0 and awaited == []
        assert "ack of #3 failed" in caplog.text and "it may come again" in caplog.text


class TestInbox:
    def test_sqlite_claim_is_once_per_committed_transaction(self, tmp_path: Path) -> None:
        """claim() is True once per event; a rolled-back claim does not count."""
        inbox = Inbox("billing")
        db = sqlite3.connect(tmp_path / "app.db")
        with db:
            inbox.create_table(db)
        e = Event(type="t", stream="s")
        try:
            with db:
                assert inbox.claim(db, e)
                raise RuntimeError("handler failed")
        except RuntimeError:
            pass
        assert not inbox.handled(db, e)
        with db:
            assert inbox.claim(db, e)
        with db:
            assert not inbox.claim(db, e)
        assert Inbox("other").claim(db, e)  # per consumer
        assert inbox.prune(db, time.time() + 1) == 1

    def test_postgres_and_sqlalchemy(self) -> None:
        """The same inbox works on a psycopg connection and a SQLAlchemy session (PostgreSQL)."""
        if not port_open("127.0.0.1", 5432):
            need("PostgreSQL", "nothing listens on 127.0.0.1:5432")
        import psycopg
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        inbox = Inbox("pg", table=f"inbox_{int(time.time() * 1000) % 10**8}")
        e = Event(type="t", stream="s")
        with psycopg.connect("postgresql://127.0.0.1/test") as conn:
            inbox.create_table(conn)
            assert inbox.claim(conn, e) and not inbox.claim(conn, e)
            conn.commit()
        engine = create_engine("postgresql+psycopg://127.0.0.1/test")
        with Session(engine) as session, session.begin():
            assert not inbox.claim(session, e)
            assert inbox.claim(session, Event(type="t", stream="s"))
        with psycopg.connect("postgresql://127.0.0.1/test") as conn:
            conn.execute(f"DROP TABLE {inbox.table}")
        engine.dispose()

    def test_unsupported_connection(self) -> None:
        """Anything but sqlite3/psycopg/SQLAlchemy is a ConfigError naming what is supported."""
        with pytest.raises(ConfigError, match="use sqlite3, psycopg or a SQLAlchemy"):
            Inbox("x").claim(object(), "id")


class TestCli:
    def test_dlq_consumer_commands(self, tmp_path: Path) -> None:
        """`outrelay dlq list/show/replay/purge --consumer` work on consumer dead letters."""
        cfg = tmp_path / "outrelay.toml"
        cfg.write_text(f'[outbox]\nurl = "sqlite:///{tmp_path}/o.db"\n')
        dlq = ConsumerDeadLetters(f"sqlite:///{tmp_path}/o.db")
        e = Event(type="order.paid", stream="o-1")
        from outrelay.core.model import cloudevents

        dl = dlq.record(consumer="billing", member="m1", event_id=e.id, type=e.type, stream=e.stream, tenant=None,
                        body=cloudevents.to_structured(e), content_type=None, reason="ValueError: boom", attempts=5,
                        first_failed_at=1.0, failed_at=2.0)  # fmt: skip
        dlq.close()

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "outrelay", *args, "-c", str(cfg)], capture_output=True,
                                  text=True, timeout=60)  # fmt: skip

        out = run("dlq", "list", "--consumer", "all")
        assert out.returncode == 0 and "billing" in out.stdout and "ValueError: boom" in out.stdout, out
        out = run("dlq", "show", str(dl), "--consumer", "billing")
        assert out.returncode == 0 and e.id in out.stdout and '"consumer": "billing"' in out.stdout, out
        out = run("dlq", "replay", "--consumer", "billing", "--all")
        assert out.returncode == 0 and "queued 1 consumer dead letter" in out.stdout, out
        out = run("dlq", "purge", "--consumer", "billing", "--all", "--yes")
        assert out.returncode == 0 and "purged 0" in out.stdout, out  # queued ones are not purged
        out = run("dlq", "show", "999", "--consumer", "all")
        assert out.returncode == 1 and "no consumer dead letter with id 999" in out.stderr, out

    def test_tail_prints_matching_events(self, tmp_path: Path, redis_url: str) -> None:
        """`outrelay tail -n 3 --type 'order.*'` prints three matching events from a real broker and exits 0."""
        key = f"outrelay:tail:{time.time_ns()}"
        cfg = tmp_path / "outrelay.toml"
        cfg.write_text(f'[destinations.bus]\ntransport = "redis"\nurl = "{redis_url}"\nstream = "{key}"\n')
        cmd = [sys.executable, "-m", "outrelay", "tail", "-d", "bus", "-n", "3", "--type", "order.*", "-c", str(cfg)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        dest = {"transport": "redis", "url": redis_url, "stream": key}
        bus = EventBus.from_config(parse_config({"destinations": {"bus": dest}}), destination="bus")

        async def feed() -> None:
            async with bus:
                deadline = time.monotonic() + 30
                while proc.poll() is None and time.monotonic() < deadline:
                    await bus.publish([Event(type="user.seen", stream="u"), Event(type="order.paid", stream="o")])
                    await asyncio.sleep(0.2)

        asyncio.run(feed())
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        lines = out.strip().splitlines()
        assert len(lines) == 3 and all(" order.paid stream=o " in line for line in lines), out


@pytest.fixture
def redis_url() -> str:
    if not port_open("127.0.0.1", 6379):
        need("Redis", "nothing listens on 127.0.0.1:6379")
    return "redis://127.0.0.1:6379/0"


class TestUpcasting:
    async def test_handlers_see_the_current_version(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """An event stored at v1 reaches the handler at v2 through the registered upcaster; one with no
        path is dead-lettered with the reason."""
        from outrelay.core.history import upcasting

        registry = upcasting.Upcasters()
        registry.register("order.placed", "1", lambda d: {**d, "currency": "EUR"})
        monkeypatch.setattr(upcasting, "_default", registry)
        got: list[Event] = []
        async with EventBus.memory() as bus:
            sub = await bus.subscribe(got.append, group="g")
            await bus.publish([Event(type="order.placed", stream="o", data={"n": 1}, event_version="0")])
            for _ in range(200):
                if sub.stats.dead_lettered:
                    break
                await asyncio.sleep(0.01)
            dlq = bus.dead_letters
            assert dlq is not None
            [dl] = dlq.entries(consumer="g")
        assert got == [] and "no upcaster goes from 0 towards 2" in dl.reason
        async with EventBus.memory() as bus:
            await bus.subscribe(got.append, group="g")
            await bus.publish([Event(type="order.placed", stream="o", data={"n": 1}, event_version="1")])
            for _ in range(200):
                if got:
                    break
                await asyncio.sleep(0.01)
        assert [(e.event_version, e.json()) for e in got] == [("2", {"n": 1, "currency": "EUR"})]
