"""Does a replicated JetStream stream keep acknowledging after an order-guard refusal?

    .venv/bin/python tests/cluster/probe_order_guard.py            # the machine's nats-server
    OUTRELAY_NATS_SERVER_BIN=/path/to/nats-server .venv/bin/python tests/cluster/probe_order_guard.py

Not a test (pytest does not collect it): a probe to run against a new
nats-server before reconsidering ``order_guard`` on replicated streams (see
docs/clusters.md). Starts a private 3-node cluster on loopback (or uses
``OUTRELAY_NATS_CLUSTER_URLS``), creates an R3 file stream, publishes a
chain of ``Nats-Expected-Last-Msg-Id`` messages, makes the stream refuse one
(a wrong expected id: error 10070), then publishes a correctly chained
message and one without any expected header, each with a 2 s timeout. Prints
each outcome and a verdict; exits 1 when the stream stopped acknowledging.
On nats-server 2.9.10 the stream goes on; on 2.14.0 it acknowledged nothing
more.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import nats
import nats.errors
import nats.js.api
import nats.js.errors

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.cluster._nats_cluster import running_cluster


async def probe(urls: list[str]) -> bool:
    """True when the stream acknowledged both publishes after the refusal."""
    nc = await nats.connect(urls)
    js = nc.jetstream(timeout=2)
    name = f"PROBE_{uuid.uuid4().hex[:8]}".upper()
    subject = f"probe.{name.lower()}"
    await js.add_stream(name=name, subjects=[subject], num_replicas=3, storage=nats.js.api.StorageType.FILE)
    print(f"nats-server {nc.connected_server_version}, stream {name} (R3, file)")

    async def publish(label: str, msg_id: str, expected: str | None) -> bool | None:
        headers = {"Nats-Msg-Id": msg_id}
        if expected is not None:
            headers["Nats-Expected-Last-Msg-Id"] = expected
        try:
            ack = await js.publish(subject, b"x", headers=headers)
        except nats.js.errors.APIError as exc:
            print(f"  {label}: refused ({exc.err_code}: {exc.description})")
            return None
        except nats.errors.TimeoutError:
            print(f"  {label}: no ack within 2 s")
            return False
        print(f"  {label}: stored at sequence {ack.seq}")
        return True

    try:
        await publish("a (first)", "a", None)
        await publish("b after a", "b", "a")
        await publish("c after b", "c", "b")
        await publish("d expecting b (wrong: the last is c)", "d", "b")
        chained = await publish("e expecting c (right)", "e", "c")
        plain = await publish("f without an expected id", "f", None)
        return bool(chained) and bool(plain)
    finally:
        try:
            await js.delete_stream(name)
        except nats.errors.Error as exc:  # a wedged stream may not answer this either (2.14.0 did not)
            print(f"  deleting the stream failed too: {exc}")
        await nc.close()


def main() -> int:
    with running_cluster() as cluster:
        ok = asyncio.run(probe(cluster.urls))
    print("verdict:", "the stream went on after the refusal" if ok else "the stream stopped acknowledging")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
