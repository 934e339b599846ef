"""Payload stores (directory, S3 on moto, the outbox on SQLite and PostgreSQL), the resolver's checks, and the
relay's claim-check transform on the in-memory transport."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from outrelay import ConfigError, Event, EventBus, EventError, Outbox, Relay, parse_config
from outrelay.plugins import claimcheck
from outrelay.plugins.claimcheck import DirectoryStore, OutboxStore, PayloadStore, Resolver, S3Store
from outrelay.plugins.claimcheck._reference import digest_of, key_for, reference
from outrelay.transports.memory import MemoryTransport
from tests.peers.moto import DUMMY, aws_client, unique
from tests.stores.conftest import pg_schema, pg_url  # noqa: F401 - fixture

DATA = os.urandom(300_000)


@pytest.fixture(autouse=True)
def _no_resolver() -> Iterator[None]:
    yield
    claimcheck.uninstall()


@pytest.fixture(params=["directory", "s3", "outbox-sqlite", "outbox-postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> PayloadStore:
    """An empty payload store of each kind."""
    kind = request.param
    if kind == "directory":
        return DirectoryStore(str(tmp_path / "payloads"))
    if kind == "outbox-sqlite":
        return OutboxStore(f"sqlite:///{tmp_path / 'o.db'}")
    if kind == "outbox-postgres":
        url = pg_url(request.getfixturevalue("pg_schema"))
        Outbox.open(url).close()  # the outbox (and its schema) exists before a payload goes into it
        return OutboxStore(url)
    endpoint = request.getfixturevalue("moto_endpoint")
    mp = request.getfixturevalue("monkeypatch")
    if not os.environ.get("OUTRELAY_AWS_ENDPOINT_URL"):
        mp.setenv("AWS_ACCESS_KEY_ID", DUMMY["aws_access_key_id"])
        mp.setenv("AWS_SECRET_ACCESS_KEY", DUMMY["aws_secret_access_key"])
    bucket = unique("payloads")
    aws_client("s3", endpoint).create_bucket(Bucket=bucket)
    return S3Store(f"s3://{bucket}/p", endpoint_url=endpoint, region="us-east-1")


async def until(predicate: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def stored(store: PayloadStore, event: Event) -> Event:
    """What the relay does for one event: store its data, return the reference."""
    digest = digest_of(event.data)
    key = key_for(event.id, digest)
    store.put(key, event.data)
    return reference(event, store.location(key), len(event.data), digest)


class TestStores:
    def test_round_trip_and_a_key_is_stored_once(self, store: PayloadStore) -> None:
        """A reference resolves to the original event; putting a key again leaves the first bytes alone."""
        event = Event(type="t", stream="s", data=DATA, metadata={"k": "v"})
        ref = stored(store, event)
        assert ref.data == b"" and store.owns(ref.metadata["dataref"])
        store.put(key_for(event.id, digest_of(DATA)), b"other bytes")
        assert Resolver([store]).fetch(ref) == event

    def test_retention_removes_old_payloads_and_nothing_else(self, store: PayloadStore, tmp_path: Path) -> None:
        """prune(cutoff) deletes outrelay's payloads stored before the cutoff, none after it, and no other file
        or object; a pruned payload's reference then fails with a reason."""
        ref = stored(store, Event(type="t", stream="s", data=DATA))
        if isinstance(store, DirectoryStore):
            (store.root / "notes.txt").write_text("not a payload")
            os.utime(store.root / "notes.txt", (0, 0))
        if isinstance(store, S3Store):
            aws_client("s3", str(store._endpoint)).put_object(Bucket=store.bucket, Key="p/notes.txt", Body=b"x")
        assert store.prune(time.time() - 3600) == 0
        assert store.prune(time.time() + 5) == 1
        with pytest.raises(EventError, match="gone"):
            Resolver([store]).fetch(ref)
        if isinstance(store, DirectoryStore):
            assert (store.root / "notes.txt").exists()
        if isinstance(store, S3Store):
            listed = aws_client("s3", str(store._endpoint)).list_objects_v2(Bucket=store.bucket)["Contents"]
            assert [o["Key"] for o in listed] == ["p/notes.txt"]

    def test_locations_outside_the_store_are_refused(self, store: PayloadStore, tmp_path: Path) -> None:
        """A reference naming anything but a payload of the installed stores is not fetched."""
        (tmp_path / "secret").write_text("private")
        for location in (
            f"file://{tmp_path}/secret",
            f"file://{tmp_path}/payloads/../secret",
            "s3://someone-elses-bucket/p/e1-" + "0" * 64,
            "outbox:payloads/../../etc/passwd",
        ):
            ref = Event(type="t", stream="s", metadata={"dataref": location, "datarefdigest": "sha256:" + "0" * 64})
            with pytest.raises(EventError, match="not in a payload store this process reads"):
                Resolver([store]).fetch(ref)


class TestResolver:
    def test_size_and_digest_are_checked(self, tmp_path: Path) -> None:
        """A payload whose bytes differ from the reference's size or digest is refused, saying which."""
        store = DirectoryStore(str(tmp_path))
        ref = stored(store, Event(type="t", stream="s", data=DATA))
        path = Path(ref.metadata["dataref"].removeprefix("file://"))
        path.write_bytes(DATA[:-1])
        with pytest.raises(EventError, match="299999 bytes, the reference says 300000"):
            Resolver([store]).fetch(ref)
        path.write_bytes(DATA[::-1])
        with pytest.raises(EventError, match="SHA-256 differs"):
            Resolver([store]).fetch(ref)

    def test_events_that_are_not_references_pass_unchanged(self) -> None:
        """An event without dataref is returned as it is (the same object)."""
        event = Event(type="t", stream="s", data={"a": 1})
        assert Resolver([]).fetch(event) is event


# -- the relay's side, on the in-memory transport ---------------------------------------------------


def config(tmp_path: Path, claim_check: dict[str, Any], **memory: Any) -> Any:
    return parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path / 'o.db'}"},
            "relay": {"poll_interval": 0.05, "drain_retry_bound": 2},
            "destinations": {
                "m": {
                    "transport": "memory",
                    "broker": "cc",
                    "retry": {"initial_delay": 0.05, "max_delay": 0.1, "max_attempts": 1000},
                    "claim_check": claim_check,
                    **memory,
                }
            },
        }
    )


class TestRelay:
    async def test_default_threshold_is_the_transports_largest_message(self, tmp_path: Path) -> None:
        """With no threshold, events above the transport's max_message_bytes go as references, others as they are."""
        cfg = config(tmp_path, {"store": f"file://{tmp_path}/p"}, max_message_bytes=1000)
        events = [Event(type="t", stream="s", data=b"x" * n) for n in (999, 1000, 1001)]
        with Outbox.open(cfg.outbox.url) as outbox:
            outbox.append(events)
        assert (await Relay(config=cfg).run(drain=True)).remaining == 0
        sent = MemoryTransport.broker("cc").all()
        assert [len(m.event.data) for m in sent] == [999, 1000, 0]
        assert Resolver.from_config(cfg).fetch(sent[2].event) == Outbox.open(cfg.outbox.url).store.events()[2]

    async def test_a_transport_without_a_size_limit_needs_a_threshold(self, tmp_path: Path) -> None:
        """A claim_check table on a transport that declares no largest message is refused with how to fix it."""
        cfg = config(tmp_path, {"store": f"file://{tmp_path}/p"})
        with pytest.raises(ConfigError, match=r"destinations\.m\.claim_check: set threshold"):
            await Relay(config=cfg).run(drain=True)

    async def test_an_unwritable_store_retries_the_batch_and_nothing_is_lost(self, tmp_path: Path) -> None:
        """While the store cannot be written the batch is retried (no reference goes out, nothing is
        dead-lettered); once it can, every event arrives in order."""
        blocker = tmp_path / "p"
        blocker.write_text("a file where the directory should be")
        cfg = config(tmp_path, {"store": f"file://{blocker}", "threshold": 10})
        events = [Event(type="t", stream="s", data={"i": i, "pad": "x" * 20}) for i in range(3)]
        with Outbox.open(cfg.outbox.url) as outbox:
            outbox.append(events)
        relay = Relay(config=cfg)
        running = asyncio.create_task(relay.run())
        await until(lambda: "m" in relay.workers and relay.workers["m"].counts["retried"] >= 2)
        assert MemoryTransport.broker("cc").all() == []
        blocker.unlink()
        await until(lambda: len(MemoryTransport.broker("cc").all()) >= 3)
        relay.stop()
        summary = await running
        assert summary.dead_lettered == 0
        refs = [m.event for m in MemoryTransport.broker("cc").all()]
        assert [Resolver.from_config(cfg).fetch(e).json()["i"] for e in refs] == [0, 1, 2]

    async def test_retention_runs_when_the_relay_starts(self, tmp_path: Path) -> None:
        """With retention_days, payloads stored longer ago are deleted when the relay starts; newer ones stay."""
        cfg = config(tmp_path, {"store": f"file://{tmp_path}/p", "threshold": 10, "retention_days": 1})
        store = DirectoryStore(str(tmp_path / "p"))
        old = stored(store, Event(type="t", stream="s", data=DATA))
        old_path = Path(old.metadata["dataref"].removeprefix("file://"))
        os.utime(old_path, (time.time() - 2 * 86400,) * 2)
        new = Event(type="t", stream="s", data=DATA)
        new_key = key_for(new.id, digest_of(DATA))
        with Outbox.open(cfg.outbox.url) as outbox:
            outbox.append([new])
        assert (await Relay(config=cfg).run(drain=True)).remaining == 0
        assert sorted(os.listdir(store.root)) == [new_key]  # the old payload is gone

    async def test_encrypted_events_are_stored_encrypted_and_handlers_get_plaintext(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With [crypto] too, the payload store holds ciphertext; the in-process bus resolves, then decrypts."""
        monkeypatch.setenv("OR_CC_KEY", base64.b64encode(os.urandom(32)).decode())
        cfg = parse_config(
            {
                "outbox": {"url": f"sqlite:///{tmp_path / 'o.db'}"},
                "crypto": {"keys": {"k": "env:OR_CC_KEY"}, "encrypt_with": "k"},
                "destinations": {
                    "m": {
                        "transport": "memory",
                        "broker": "bus",
                        "claim_check": {"store": f"file://{tmp_path}/p", "threshold": 100},
                    }
                },
            }
        )
        secret = b"attack at dawn " * 1000
        got: list[Event] = []
        async with EventBus.from_config(cfg) as bus:
            await bus.subscribe(got.append)
            with Outbox.open(cfg.outbox.url) as outbox:
                outbox.append([Event(type="t", stream="s", data=secret)])
            assert (await Relay(config=cfg).run(drain=True)).remaining == 0
            await until(lambda: bool(got))
        [payload] = list((tmp_path / "p").iterdir())
        assert b"attack at dawn" not in payload.read_bytes()
        assert got[0].data == secret
