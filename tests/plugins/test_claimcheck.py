"""Claim-check end to end: a 5 MB event to SQS and to Redis through an S3 payload store (moto)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outrelay import Event, EventBus, Outbox, Relay, parse_config
from outrelay.core.model import cloudevents
from outrelay.plugins import claimcheck
from tests.peers.moto import DUMMY, aws_client, aws_options, unique
from tests.peers.redis import redis_url  # noqa: F401 - fixture

BIG = os.urandom(5 * 1024 * 1024)


@pytest.fixture
def sdk_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim-check store uses the SDK's credential chain: moto's dummy keys in the environment."""
    if not os.environ.get("OUTRELAY_AWS_ENDPOINT_URL"):
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", DUMMY["aws_access_key_id"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))


@pytest.fixture
def bucket(moto_endpoint: str, sdk_credentials: None) -> str:
    name = unique("payloads")
    aws_client("s3", moto_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture(autouse=True)
def _no_resolver() -> Iterator[None]:
    yield
    claimcheck.uninstall()


def claim_check(endpoint: str, bucket: str) -> dict[str, Any]:
    return {"store": f"s3://{bucket}/outrelay", "endpoint_url": endpoint}


async def test_a_5mb_event_reaches_sqs_as_a_reference_a_plain_boto3_consumer_resolves(
    tmp_path: Path, moto_endpoint: str, bucket: str
) -> None:
    """A 5 MB event (SQS takes 256 KB) arrives as a reference with its attributes, which boto3 alone resolves
    to the original bytes from the documented fields; the payload is stored once; a small event goes as it is."""
    sqs = aws_client("sqs", moto_endpoint)
    queue = sqs.create_queue(QueueName=unique("cc"))["QueueUrl"]
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path / 'o.db'}"},
            "destinations": {
                "q": {
                    "transport": "sqs",
                    "queue_url": queue,
                    **aws_options(moto_endpoint),
                    "claim_check": claim_check(moto_endpoint, bucket),
                }
            },
        }
    )
    big = Event(type="report.ready", stream="r1", data=BIG, subject="quarterly", metadata={"origin": "test"})
    small = Event(type="report.noted", stream="r1", data={"ok": True})
    with Outbox.open(cfg.outbox.url) as outbox:
        outbox.append([big, small])
    summary = await Relay(config=cfg).run(drain=True)
    assert summary.remaining == 0 and summary.dead_lettered == 0

    # --- the consumer, as docs/claim-check.md shows it: boto3 only ---------------------------------
    s3 = aws_client("s3", moto_endpoint)
    bodies = []
    for _ in range(20):
        if len(bodies) >= 2:
            break
        got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        bodies += [json.loads(m["Body"]) for m in got.get("Messages", [])]
    [ce] = [b for b in bodies if b["id"] == big.id]
    [plain] = [b for b in bodies if b["id"] == small.id]
    assert "dataref" not in plain and plain["data"] == {"ok": True}
    assert "data" not in ce and "data_base64" not in ce
    assert (ce["id"], ce["type"], ce["subject"], ce["datacontenttype"]) == (
        big.id,
        "report.ready",
        "quarterly",
        "application/octet-stream",
    )
    bucket_name, _, key = ce["dataref"].removeprefix("s3://").partition("/")
    payload = s3.get_object(Bucket=bucket_name, Key=key)["Body"].read()
    algorithm, _, hexdigest = ce["datarefdigest"].partition(":")
    assert algorithm == "sha256" and hashlib.sha256(payload).hexdigest() == hexdigest
    assert int(ce["datarefsize"]) == len(payload) and payload == BIG
    # -----------------------------------------------------------------------------------------------

    stored = s3.list_objects_v2(Bucket=bucket, Prefix="outrelay/")["Contents"]
    assert [o["Key"] for o in stored] == [key]
    # the function the EventBus uses gives the original event back
    restored = claimcheck.Resolver.from_config(cfg).fetch(cloudevents.from_structured(json.dumps(ce)))
    assert restored.data == BIG and restored.metadata == {"origin": "test"} and restored.id == big.id


async def test_an_eventbus_handler_gets_the_original_bytes_and_an_altered_payload_is_dead_lettered(
    tmp_path: Path,
    moto_endpoint: str,
    bucket: str,
    redis_url: str,  # noqa: F811
) -> None:
    """Relay -> Redis with the same S3 store: the handler receives the 5 MB data itself (digest checked);
    a payload changed in the store after it was sent is dead-lettered with the reason, not handed over."""
    stream = unique("outrelay-cc")
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path / 'o.db'}"},
            "bus": {"destination": "r"},
            "destinations": {
                "r": {
                    "transport": "redis",
                    "url": redis_url,
                    "stream": stream,
                    "claim_check": claim_check(moto_endpoint, bucket),
                }
            },
        }
    )
    intact = Event(type="blob.saved", stream="b1", data=BIG)
    altered = Event(type="blob.saved", stream="b2", data=BIG[::-1])
    handled: list[Event] = []
    done = asyncio.Event()

    async def handler(event: Event) -> None:
        handled.append(event)
        done.set()

    with Outbox.open(cfg.outbox.url) as outbox:
        outbox.append([intact, altered])
    summary = await Relay(config=cfg).run(drain=True)
    assert summary.remaining == 0
    s3 = aws_client("s3", moto_endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="outrelay/")["Contents"]]
    [altered_key] = [k for k in keys if k.startswith(f"outrelay/{altered.id}-")]
    s3.put_object(Bucket=bucket, Key=altered_key, Body=BIG)  # same size, other bytes, after it was sent

    bus = EventBus.from_config(cfg)  # installs the resolver: the config has a claim_check table
    assert claimcheck.installed() is not None
    async with bus:
        sub = await bus.subscribe(handler, group="cc", from_beginning=True)
        await asyncio.wait_for(done.wait(), 20)
        for _ in range(200):
            if sub.stats.dead_lettered + sub.stats.handled >= 2:
                break
            await asyncio.sleep(0.05)
        assert bus.dead_letters is not None
        [dl] = bus.dead_letters.entries(consumer="cc")
    assert [e.id for e in handled] == [intact.id] and handled[0].data == BIG
    assert "dataref" not in handled[0].metadata
    assert dl.event_id == altered.id and "SHA-256 differs" in dl.reason
    assert "dataref" in cloudevents.from_structured(dl.body).metadata  # kept as received: the reference
