"""The redis transport and its subscribers against a real 6-node Redis Cluster (``cluster = true``).

One cluster per session (``tests/cluster/_redis_cluster.py``, ~3 s to form); every test uses
its own key prefix. The fault test moves the cluster under the relay (a failover, a
resharding), so the tests after it see a different topology, as a client would.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from outrelay import Event, Message, PermanentError
from outrelay.core.contract.subscription import SubscriptionSpec
from outrelay.core.contract.transport import Delivered, Rejected, RetryLater
from outrelay.transports.redis._batch import HELD
from outrelay.transports.redis._reader import decode
from outrelay.transports.redis._slots import plan
from outrelay.transports.redis._transport import RedisConfig, RedisTransport
from tests.chaos._harness import Fault, Rig, run_chaos
from tests.cli.conftest import Cli, cli
from tests.cluster._redis_cluster import RedisClusterPeer, redis_cluster, redis_cluster_url
from tests.peers.proxy import TcpProxy

__all__ = ["cli", "redis_cluster", "redis_cluster_url"]  # fixtures used here


def prefix() -> str:
    return f"outrelay-test:{uuid.uuid4().hex[:8]}"


def make(url: str, stream: str, **extra: object) -> RedisTransport:
    cfg = RedisConfig.model_validate({"url": url, "stream": stream, "cluster": True, **extra})
    return RedisTransport(cfg, destination="rc")


def message(t: RedisTransport, event: Event) -> Message:
    return Message(event, t.target(event), event.stream)


async def read_streams(url: str, keys: dict[str, str]) -> list[tuple[str, str]]:
    """``(event id, stream)`` of every entry of ``keys`` (key -> stream), each key in entry order."""
    client = RedisCluster.from_url(url)
    try:
        out: list[tuple[str, str]] = []
        for key in keys:
            for _, fields in await client.xrange(key):
                got = decode(key, fields)
                out.append((got.event.id, got.event.stream))
        return out
    finally:
        await client.aclose()


class TestPlan:
    @staticmethod
    def msgs(*pairs: tuple[str, str]) -> list[Message]:
        return [Message(Event(type="t", stream=s), key, s) for s, key in pairs]

    def test_one_key_per_stream_is_one_phase(self) -> None:
        """Streams on their own keys make one phase with one group per slot, each in batch order."""
        ms = self.msgs(("a", "k:a"), ("b", "k:b"), ("a", "k:a"), ("c", "{k:a}"), ("b", "k:b"))
        (phase,) = plan(ms)
        assert sorted(phase) == sorted([[0, 2, 3], [1, 4]])  # "{k:a}" hashes like "k:a"

    def test_a_stream_changing_slots_waits_for_its_earlier_events(self) -> None:
        """A stream whose events alternate between two slots moves to the next phase at each change."""
        ms = self.msgs(("a", "x"), ("a", "y"), ("b", "y"), ("a", "x"), ("b", "y"))
        assert plan(ms) == [[[0], [2, 4]], [[1]], [[3]]]


async def test_relay_per_stream_keys(tmp_path: Path, redis_cluster_url: str) -> None:
    """2,000 events over 100 streams, one key per stream spread over every primary, arrive complete and
    in order per stream, through the script path and the pipeline path."""
    for batching in ("script", "pipeline"):
        p = prefix()
        keys = {f"{p}:s{i}": f"s{i}" for i in range(100)}
        rig = Rig(
            f"redis-cluster-{batching}",
            {"transport": "redis", "cluster": True, "url": redis_cluster_url, "stream": p + ":{stream}",
             "batching": batching},
            TcpProxy("127.0.0.1", 0),  # not started: the harness resets it, nothing goes through it
            lambda n, keys=keys: read_streams(redis_cluster_url, keys),  # type: ignore[misc]
        )  # fmt: skip
        (tmp_path / batching).mkdir()
        outcome = await run_chaos(tmp_path / batching, rig, [], events=2000, streams=100, limit=60)
        outcome.check()
        assert outcome.duplicates == 0


async def test_stream_over_two_slots_holds_after_a_failure(redis_cluster_url: str) -> None:
    """A stream whose events go to keys in different slots: once one XADD fails, its later events in
    another slot are held back, never appended before it."""
    p = prefix()
    t = make(redis_cluster_url, p + ":{type}")
    client = RedisCluster.from_url(redis_cluster_url)
    await client.set(f"{p}:bad", "not a stream")
    await t.open()
    try:
        evs = [Event(type=kind, stream="s") for kind in ("good", "bad", "good", "other")]
        other = Event(type="other", stream="z")
        results = await t.send([message(t, e) for e in [*evs, other]])
        assert results[0] == Delivered() and isinstance(results[1], Rejected) and "WRONGTYPE" in results[1].reason
        assert results[2] == results[3] == RetryLater(HELD)
        assert results[4] == Delivered()
        assert await client.xlen(f"{p}:good") == 1 and await client.xlen(f"{p}:other") == 1
    finally:
        await t.close()
        await client.delete(f"{p}:bad", f"{p}:good", f"{p}:other")
        await client.aclose()


async def test_script_flushed_from_every_node_is_loaded_again(redis_cluster_url: str) -> None:
    """After SCRIPT FLUSH on every primary (as on a replica promoted by a failover) the next batch still
    goes out whole: NOSCRIPT is answered by loading the script and re-sending those calls."""
    p = prefix()
    t = make(redis_cluster_url, p + ":{stream}")
    client = RedisCluster.from_url(redis_cluster_url)
    await t.open()
    try:
        evs = [Event(type="t", stream=f"s{i % 20}") for i in range(100)]
        assert await t.send([message(t, e) for e in evs[:50]]) == [Delivered()] * 50
        await client.script_flush()
        assert await t.send([message(t, e) for e in evs[50:]]) == [Delivered()] * 50
        keys = {f"{p}:s{i}": f"s{i}" for i in range(20)}
        assert sorted(await read_streams(redis_cluster_url, keys)) == sorted((e.id, e.stream) for e in evs)
    finally:
        await t.close()
        for i in range(20):
            await client.delete(f"{p}:s{i}")
        await client.aclose()


async def test_check_names_the_cluster(redis_cluster_url: str) -> None:
    """check() reports the cluster's primaries and the key's state."""
    t = make(redis_cluster_url, prefix() + ":fixed")
    result = await t.check()
    assert "cluster" in result and "3 primaries" in result and "will be created" in result, result


async def test_group_on_a_key_without_hash_tag(redis_cluster_url: str) -> None:
    """A consumer group on a cluster key without a hash tag: its gate lists share the key's slot, two
    members get every event once, each stream's events in order."""
    p = prefix()
    t = make(redis_cluster_url, f"{p}:events")
    spec = {"target": "", "group": "g", "claim_timeout": 5.0}
    a = t.subscription(SubscriptionSpec(member="a", **spec))  # type: ignore[arg-type]
    b = t.subscription(SubscriptionSpec(member="b", **spec))  # type: ignore[arg-type]
    await a.start()
    await b.start()
    await t.open()
    try:
        sent = [Event(type="t", stream=f"s{i % 10}", data={"i": i}) for i in range(600)]
        for lo in range(0, len(sent), 200):
            await t.send([message(t, e) for e in sent[lo : lo + 200]])
        got: dict[str, list[str]] = collections.defaultdict(list)

        async def drain(member: object) -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while sum(map(len, got.values())) < len(sent) and loop.time() < deadline:
                for m in await member.receive(50, 0.2):  # type: ignore[attr-defined]
                    assert m.received is not None
                    got[m.received.event.stream].append(m.received.event.id)
                    await m.ack()

        await asyncio.gather(drain(a), drain(b))
        want: dict[str, list[str]] = collections.defaultdict(list)
        for e in sent:
            want[e.stream].append(e.id)
        assert got == want
    finally:
        await a.stop()
        await b.stop()
        await t.close()


class TestModeMismatch:
    async def test_cluster_option_on_a_standalone_server(self, redis_url: str) -> None:
        """cluster = true against a standalone server: open() raises one PermanentError naming the fix."""
        t = make(redis_url, "k")
        with pytest.raises(PermanentError, match=r"standalone server .* remove `cluster = true`"):
            await t.open()

    async def test_standalone_option_on_a_cluster_node(self, redis_cluster_url: str) -> None:
        """A standalone config against a cluster node: open() raises one PermanentError naming the fix."""
        t = make(redis_cluster_url, "k", cluster=False)
        with pytest.raises(PermanentError, match=r"Redis Cluster node .* set `cluster = true`"):
            await t.open()

    def test_cli_check_and_run_say_it_in_one_line(
        self, cli: Cli, tmp_path: Path, redis_url: str, redis_cluster_url: str
    ) -> None:
        """`outrelay check` (exit 1) and `outrelay run` report a mode mismatch in either direction as one line,
        no traceback."""
        for url, cluster, needle in (
            (redis_cluster_url, "false", "is a Redis Cluster node"),
            (redis_url, "true", "is a standalone server"),
        ):
            (tmp_path / "outrelay.toml").write_text(
                f'[outbox]\nurl = "sqlite:///outbox.db"\n\n[relay]\ndrain_retry_bound = 1\n\n'
                f'[destinations.r]\ntransport = "redis"\n'
                f'url = "{url}"\ncluster = {cluster}\n'
            )
            checked = cli("check", "--timeout", "10")
            assert checked.returncode == 1, checked.stdout + checked.stderr
            lines = [line for line in checked.stdout.splitlines() if needle in line]
            assert len(lines) == 1 and lines[0].startswith("FAIL  r"), checked.stdout
            assert "Traceback" not in checked.stdout + checked.stderr
            # run keeps retrying a destination it cannot open (the relay's policy for every open failure),
            # logging the reason once
            ran = cli("run", "--drain", timeout=60)
            assert "Traceback" not in ran.stdout + ran.stderr, ran.stderr
            assert len([line for line in ran.stderr.splitlines() if needle in line]) == 1, ran.stderr


@pytest.mark.parametrize(
    ("batching", "events", "streams", "slots"),
    [("script", 20_000, 200, 1000), ("pipeline", 20_000, 100, 500)],
)
async def test_relay_through_failover_and_resharding(
    tmp_path: Path, redis_cluster: RedisClusterPeer, batching: str, events: int, streams: int, slots: int
) -> None:
    """20,000 events over 200 streams (one key each) while a replica takes over a primary (CLUSTER FAILOVER)
    and then 1,000 slots move between primaries (redis-cli --cluster reshard): the relay recovers by itself,
    nothing is lost, every stream's first deliveries are in order; the same for the pipeline path over 100
    streams (with 5,000 events it was once all delivered before the resharding began).

    The faults run one after the other in a task of their own, started when 2% of the events are
    delivered, so the relay is never held up waiting for them; small batches, one in flight, keep the
    relay busy for longer than the faults take (asserted: events were delivered during each of them)."""
    # a prefix some of whose keys the resharding is sure to move (a random one left none of 100 keys in
    # the 500 slots moved about one run in twenty): a failover keeps the victim's slots with its replica
    while True:
        p = prefix()
        keys = {f"{p}:s{i}": f"s{i}" for i in range(streams)}
        victim = redis_cluster.primary_of(f"{p}:s0")
        first = redis_cluster.lowest_slots(victim, slots)
        if sum(key_slot(key.encode()) in first for key in keys) >= 3:
            break
    during: dict[str, int] = {}  # events delivered while each fault was under way
    moved: list[str] = []
    faults: list[asyncio.Task[None]] = []

    async def failover_then_reshard(delivered: Callable[[], int]) -> None:
        before = delivered()
        assert await redis_cluster.failover(victim) != victim
        during["failover"] = delivered() - before
        ports = [int(n["port"]) for n in redis_cluster.primaries()]
        source = redis_cluster.primary_of(f"{p}:s0")  # the primary promoted by the failover
        owners = redis_cluster.owners(keys)
        before = delivered()
        during["reshard started at"] = before
        await redis_cluster.reshard(source, next(port for port in ports if port != source), slots)
        during["reshard"] = delivered() - before
        moved.extend(key for key, port in redis_cluster.owners(keys).items() if port != owners[key])

    async def start(delivered: Callable[[], int]) -> None:
        faults.append(asyncio.create_task(failover_then_reshard(delivered)))

    rig = Rig(
        "redis-cluster",
        {"transport": "redis", "cluster": True, "url": redis_cluster.url, "stream": p + ":{stream}",
         "batching": batching, "batch_size": 10, "max_in_flight": 1, "connect_timeout": 1.0, "socket_timeout": 2.0},
        TcpProxy("127.0.0.1", 0),  # not started: the faults here are the cluster's own
        lambda n: read_streams(redis_cluster.url, keys),
    )  # fmt: skip
    outcome = await run_chaos(tmp_path, rig, [Fault(events // 50, "failover+reshard", start)], events=events,
                              streams=streams, limit=90)  # fmt: skip
    await asyncio.wait_for(faults[0], 60)  # raises what the faults raised
    outcome.check()
    assert moved, "the resharding moved none of the streams' keys"
    assert during["failover"] > 0 and during["reshard"] > 0, f"the relay was not running during both faults: {during}"
    print(f"{outcome.report()}; delivered during the faults: {during}; {len(moved)} keys moved")
