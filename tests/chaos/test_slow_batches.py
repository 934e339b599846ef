"""A lane slower than ``attempt_timeout`` progresses, and nothing confirmed is sent twice.

Transports send a stream's events one after another, so a lane of
``per_stream`` events needs ``per_stream`` round trips. When that exceeds the
attempt deadline, the send starts no message that would end past it (the
kit's ordering helpers ask ``progress.may_start``), and what was confirmed
before a cut is settled as delivered: the lane moves on by what it delivered,
and no event id reaches the broker twice.
"""

from __future__ import annotations

from pathlib import Path

from tests.chaos._harness import Rig, run_chaos


async def test_a_lane_slower_than_the_attempt_deadline_gets_each_event_once(tmp_path: Path, webhook_rig: Rig) -> None:
    """One stream behind 100 ms of latency each way, 20 events per lane (≥ 4 s a lane) and a 2 s attempt
    deadline: all 30 events arrive in order, each exactly once, and no attempt failed."""
    webhook_rig.options |= {"per_stream": 20, "attempt_timeout": 2.0, "timeout": 10.0}
    webhook_rig.proxy.latency = 0.1
    outcome = await run_chaos(tmp_path, webhook_rig, [], events=30, streams=1, limit=30)
    outcome.check()
    assert outcome.duplicates == 0, outcome.report()
    assert outcome.summary.counts["d"]["retried"] == 0, outcome.report()


async def test_delayed_broker_acks_never_publish_an_event_twice(tmp_path: Path, nats_rig: Rig) -> None:
    """NATS JetStream with one unacked message per stream (``pipeline = false``), its acks delayed 50 ms each
    way by the proxy and a 1 s attempt deadline against lanes of 20 (≥ 2 s): every event arrives in order and
    the broker never saw one twice (JetStream answers a re-sent Nats-Msg-Id with ``duplicate``)."""
    nats_rig.options |= {"per_stream": 20, "attempt_timeout": 1.0, "pipeline": False}
    nats_rig.proxy.latency = 0.05
    outcome = await run_chaos(tmp_path, nats_rig, [], events=60, streams=3, limit=40)
    outcome.check()
    assert outcome.duplicates == 0, outcome.report()
    assert outcome.summary.counts["d"]["duplicates"] == 0, outcome.report()
    assert outcome.summary.counts["d"]["retried"] == 0, outcome.report()


async def test_delayed_rabbitmq_confirms_never_publish_an_event_twice(tmp_path: Path, rabbitmq_rig: Rig) -> None:
    """RabbitMQ with one unconfirmed message per stream (``pipeline = false``), its confirms delayed 50 ms each
    way by the proxy and a 1 s attempt deadline against lanes of 20 (≥ 2 s): every event arrives in order,
    none is published twice, and no attempt failed (the cut lane keeps what was confirmed)."""
    rabbitmq_rig.options |= {"per_stream": 20, "attempt_timeout": 1.0, "pipeline": False}
    rabbitmq_rig.proxy.latency = 0.05
    outcome = await run_chaos(tmp_path, rabbitmq_rig, [], events=60, streams=3, limit=40)
    outcome.check()
    assert outcome.duplicates == 0, outcome.report()
    assert outcome.summary.counts["d"]["retried"] == 0, outcome.report()
