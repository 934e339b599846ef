"""Relay faults: starting while PostgreSQL is unreachable, draining after a crashed relay,
and logging a destination outage once (not once per retry)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from pathlib import Path

import pytest

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.memory import MemoryTransport
from tests.peers.proxy import TcpProxy
from tests.services import free_port
from tests.stores.conftest import PG_URL, pg_schema, pg_url  # noqa: F401 - pg_schema is a fixture

CONFIG = """
[outbox]
url = "{url}"
[relay]
poll_interval = 0.1
drain_retry_bound = {bound}
[destinations.f]
transport = "file"
path = "{out}"
"""


def _config(tmp_path: Path, url: str, bound: float) -> Path:
    cfg = tmp_path / "outrelay.toml"
    cfg.write_text(CONFIG.format(url=url, bound=bound, out=tmp_path / "out.jsonl"))
    return cfg


async def _relay(cfg: Path, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "outrelay", "run", "-c", str(cfg), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


def _lines(tmp_path: Path) -> int:
    out = tmp_path / "out.jsonl"
    return len(out.read_text().splitlines()) if out.exists() else 0


async def test_relay_started_while_postgres_is_unreachable_waits_and_then_delivers(
    tmp_path: Path,
    pg_schema: str,  # noqa: F811
) -> None:
    """A relay started with PostgreSQL unreachable logs and retries, then delivers once it is reachable."""
    with Outbox.open(pg_url(pg_schema)) as outbox:
        outbox.append([Event(type="t", stream="s", data={"i": i}) for i in range(5)])
    port = free_port()
    host = PG_URL.split("@", 1)[1].split("/", 1)[0].split(":")[0]
    url = pg_url(pg_schema).replace(f"@{host}:5432/", f"@127.0.0.1:{port}/").replace(f"@{host}/", f"@127.0.0.1:{port}/")
    assert f":{port}/" in url
    proc = await _relay(_config(tmp_path, url, 60), "--drain")
    assert proc.stderr is not None
    retries = 0
    proxy = TcpProxy("127.0.0.1", 5432, listen_port=port)
    try:
        async with asyncio.timeout(30):
            while retries < 2:  # two attempts logged: it waits instead of exiting
                line = (await proc.stderr.readline()).decode()
                assert line, "the relay exited while PostgreSQL was unreachable"
                retries += "outbox unavailable" in line
        await proxy.start()
        async with asyncio.timeout(60):
            _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()[-2000:]
        assert _lines(tmp_path) == 5
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proxy.stop()


async def test_drain_after_a_crash_waits_for_the_dead_relays_leases(
    tmp_path: Path,
    pg_schema: str,  # noqa: F811
) -> None:
    """`run --drain` waits for lanes a crashed relay still leases, then delivers them and exits 0."""
    url = pg_url(pg_schema)
    lease = 3.0
    with Outbox.open(url) as outbox:
        outbox.append([Event(type="t", stream="s", data={"i": i}) for i in range(3)])
        store = outbox.store
        store.acquire_relay("dead")
        store.route(lambda e: ["f"], 100, time.time())
        taken = store.claim("f", limit=10, per_lane=10, owner="dead", lease_seconds=lease, now=time.time())
        assert len(taken) == 3  # the "dead" relay never settles nor releases them
    started = time.monotonic()
    proc = await _relay(_config(tmp_path, url, 0.5), "--drain")
    async with asyncio.timeout(60):
        _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert _lines(tmp_path) == 3
    assert time.monotonic() - started >= lease - 1.0
    assert "leased by another relay" in err.decode()


async def test_outage_is_logged_once_and_recovery_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An outage gives one WARNING naming destination and error, and one INFO on recovery, whatever the retries."""
    caplog.set_level(logging.DEBUG, logger="outrelay.relay")
    url = f"sqlite:///{tmp_path}/o.db"
    outbox = Outbox.open(url)
    cfg = parse_config(
        {
            "outbox": {"url": url},
            "relay": {"poll_interval": 0.05},
            "destinations": {
                "mem": {
                    "transport": "memory",
                    "broker": "outage-log",
                    "retry": {"initial_delay": 0.02, "max_delay": 0.05, "max_attempts": 1000},
                }
            },
        }
    )
    broker = MemoryTransport.broker("outage-log")
    relay = Relay(outbox, cfg)
    task = asyncio.create_task(relay.run())
    try:
        outbox.append(Event(type="t", stream="s", data={"i": 0}))
        async with asyncio.timeout(10):
            while len(broker.all()) < 1:
                await asyncio.sleep(0.02)
        broker.down = True
        outbox.append([Event(type="t", stream=f"s{i}", data={"i": i}) for i in range(3)])
        async with asyncio.timeout(10):
            while sum("still failing" in r.getMessage() for r in caplog.records) < 3:
                await asyncio.sleep(0.02)
        broker.down = False
        async with asyncio.timeout(10):
            while len(broker.all()) < 4:
                await asyncio.sleep(0.02)
    finally:
        broker.down = False
        relay.stop()
        await task
        outbox.close()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "destination mem failing" in warnings[0].getMessage() and "down" in warnings[0].getMessage()
    recovered = [r for r in caplog.records if r.levelno == logging.INFO and "recovered" in r.getMessage()]
    assert len(recovered) == 1 and "destination mem" in recovered[0].getMessage()
