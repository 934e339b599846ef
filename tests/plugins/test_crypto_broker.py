"""Payload encryption end to end: SQLite outbox -> relay -> a real Redis -> subscribers, and the CLI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from outrelay import Event, EventBus, Outbox, Relay, parse_config
from outrelay.core.config.config import OutrelayConfig
from outrelay.plugins.crypto import PayloadCrypto, is_sealed, uninstall
from tests.plugins.test_crypto import crypto_of, keys, new_key

__all__ = ["keys"]  # the fixture, shared with test_crypto

SECRET = b"4111-1111"


@pytest.fixture
async def stream_key(redis_url: str) -> AsyncIterator[str]:
    """A fresh Redis stream key, deleted afterwards."""
    key = f"outrelay-test:crypto:{uuid.uuid4().hex[:10]}"
    yield key
    client = aioredis.Redis.from_url(redis_url)
    await client.delete(key)
    await client.aclose()


@pytest.fixture(autouse=True)
def _no_installed_keys() -> None:
    """Every test starts and ends with no process-wide decryption keys."""
    uninstall()


def redis_config(tmp_path: Path, redis_url: str, key: str, crypto: dict[str, Any] | None) -> OutrelayConfig:
    return parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "destinations": {"r": {"transport": "redis", "url": redis_url, "stream": key}},
            **({"crypto": crypto} if crypto is not None else {}),
        }
    )


def payment(i: int) -> Event:
    return Event(type="payment.captured", stream=f"order-{i % 2}", data={"card": SECRET.decode(), "i": i})


async def collect(cfg: OutrelayConfig, name: str, n: int) -> tuple[list[Event], list[str]]:
    """Subscribe from the beginning until ``n`` events were handled or dead-lettered: (handled, dead reasons)."""
    got: list[Event] = []
    bus = EventBus.from_config(cfg, destination="r", dead_letters="memory")
    try:
        sub = await bus.subscribe(got.append, name=name, from_beginning=True, max_attempts=1)
        deadline = time.monotonic() + 15
        while sub.stats.handled + sub.stats.dead_lettered < n and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert bus.dead_letters is not None
        reasons = [d.reason for d in bus.dead_letters.entries(consumer=name)]
    finally:
        await bus.close()
    return got, reasons


async def test_round_trip_through_redis_with_rotation(
    tmp_path: Path, redis_url: str, stream_key: str, keys: Any
) -> None:
    """Sealed with k1, then k2 after rotation: Redis holds no plaintext; a subscriber holding both keys reads all,
    one holding only k2 dead-letters k1's events with the reason, one with no keys gets the sealed events."""
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    outbox.append([payment(i) for i in range(3)])
    await Relay(outbox, redis_config(tmp_path, redis_url, stream_key, crypto_of(keys, "k1"))).run(drain=True)
    rotated = redis_config(tmp_path, redis_url, stream_key, crypto_of(keys, "k2"))
    outbox.append([payment(i) for i in range(3, 6)])
    await Relay(outbox, rotated).run(drain=True)
    outbox.close()

    client = aioredis.Redis.from_url(redis_url)
    entries = await client.xrange(stream_key)
    await client.aclose()
    assert len(entries) == 6
    assert not any(SECRET in value for _, fields in entries for value in fields.values())
    assert sorted(fields[b"ce_keyid"] for _, fields in entries) == [b"k1"] * 3 + [b"k2"] * 3

    PayloadCrypto.from_config(rotated).install()
    got, reasons = await collect(rotated, "holder", 6)
    assert sorted(e.json()["i"] for e in got) == list(range(6)) and reasons == []
    assert all(e.content_type == "application/json" and "keyid" not in e.metadata for e in got)

    only_k2 = redis_config(tmp_path, redis_url, stream_key, crypto_of({"k2": ""}, "k2"))
    PayloadCrypto.from_config(only_k2).install()
    got, reasons = await collect(only_k2, "k2-only", 6)
    assert sorted(e.json()["i"] for e in got) == [3, 4, 5] and len(reasons) == 3
    assert all("cannot decode" in r and "key 'k1', which this process does not hold" in r for r in reasons)

    uninstall()  # and a config without [crypto]: EventBus.from_config installs the keys of the one it reads
    got, reasons = await collect(redis_config(tmp_path, redis_url, stream_key, None), "no-keys", 6)
    assert len(got) == 6 and all(is_sealed(e) and SECRET not in e.data for e in got)


def run_cli(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "COLUMNS": "200", **env}
    full.pop("OUTRELAY_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "outrelay", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=full
    )


async def test_cli_run_and_dlq_show_decrypt_without_printing_keys(
    tmp_path: Path, redis_url: str, stream_key: str, keys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`outrelay run` seals; `dlq show --consumer` decrypts when the keys are readable and says why not when not;
    no key appears in any output, even at DEBUG."""
    (tmp_path / "outrelay.toml").write_text(
        f"""
[outbox]
url = "sqlite:///{tmp_path}/o.db"
[bus]
dead_letters = "sqlite:///{tmp_path}/dlq.db"
[destinations.r]
transport = "redis"
url = "{redis_url}"
stream = "{stream_key}"
[crypto]
encrypt_with = "k1"
[crypto.keys]
k1 = "env:OR_TEST_K1"
"""
    )
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    outbox.append(payment(0))
    outbox.close()
    env = {"OR_TEST_K1": keys["k1"]}
    ran = await asyncio.to_thread(run_cli, tmp_path, "run", "--drain", "--log-level", "debug", env=env)
    assert ran.returncode == 0, ran.stderr

    # a subscriber holding another key dead-letters the event (as received: sealed) in dlq.db
    cfg = redis_config(tmp_path, redis_url, stream_key, {"keys": {"k9": "env:OR_TEST_K9"}, "encrypt_with": "k9"})
    monkeypatch.setenv("OR_TEST_K9", new_key())
    PayloadCrypto.from_config(cfg).install()
    bus = EventBus.from_config(cfg, destination="r", dead_letters=f"sqlite:///{tmp_path}/dlq.db")
    sub = await bus.subscribe(lambda e: None, name="billing", from_beginning=True)
    deadline = time.monotonic() + 15
    while sub.stats.dead_lettered < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await bus.close()
    assert sub.stats.dead_lettered == 1

    shown = await asyncio.to_thread(run_cli, tmp_path, "dlq", "show", "1", "--consumer", "billing", env=env)
    hidden = await asyncio.to_thread(run_cli, tmp_path, "dlq", "show", "1", "--consumer", "all", env={"OR_TEST_K1": ""})
    assert shown.returncode == 0 and hidden.returncode == 0, (shown.stderr, hidden.stderr)
    assert "\"decrypted with key 'k1'\"" in shown.stdout and SECRET.decode() in shown.stdout
    assert "not decrypted" in hidden.stdout and "OR_TEST_K1 is not set" in hidden.stdout
    assert SECRET.decode() not in hidden.stdout
    for out in (ran, shown, hidden):
        text = out.stdout + out.stderr
        assert keys["k1"] not in text and keys["k2"] not in text
