"""The shared conformance suite against a real Kafka-API broker (tansu, or OUTRELAY_KAFKA_BOOTSTRAP).

The credential checks use private tansu brokers of their own (``tests/peers/kafka.py``), never the
shared one:

* ``make_forbidden`` is SCRAM-SHA-512 against a tansu started with ``--authentication``. That build
  keeps no SCRAM credentials and has no ACLs, so the login is refused outright — the "wrong
  credentials" case; "authenticated but not allowed to write" cannot be had from tansu.
* ``secret_never_leaks`` needs a transport that works *and* holds a secret. No SASL login can
  succeed on tansu, so its transports use TLS through a proxy with a client key file encrypted by
  the secret (``ssl_password``); its unreachable and forbidden transports hold the same secret (the
  forbidden one as its SASL password, which the failed SCRAM exchange uses).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.conformance._binding import KAFKA
from outrelay.conformance._harness import run_check
from outrelay.transports.kafka._transport import KafkaConfig, KafkaTransport
from tests.peers.conformance_hooks import VIA_TIMEOUT, long_secret, skip_fault_checks
from tests.peers.kafka import KafkaPeer, KafkaTlsPeer, new_topic
from tests.services import free_port


def transport(**options: Any) -> KafkaTransport:
    """A transport on tansu (no idempotent producer), with short bounds so failures come quickly."""
    opts: dict[str, Any] = {"enable_idempotence": False, "connect_timeout": 3.0, "request_timeout": 8.0}
    return KafkaTransport(KafkaConfig.model_validate({**opts, **options}), destination="conformance")


def refused_login(topic: str, bootstrap: str, password: str) -> KafkaTransport:
    """SCRAM-SHA-512 as ``relay`` against the tansu with ``--authentication``: the broker refuses the login."""
    return transport(
        bootstrap_servers=bootstrap,
        topic=topic,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="relay",
        sasl_password=password,
    )


#: the hooks no Kafka target here can give, and why (both targets below)
UNSUPPORTED = {
    "throttle": (
        "Kafka throttles by delaying responses (quota throttle_time_ms), never by refusing with a retry hint; "
        "tansu has no quotas"
    ),
    "refuse_target": (
        "Kafka refuses no topic per message permanently (an unknown topic or a leader election is retryable); "
        "too-large messages are the max_message_bytes checks'"
    ),
    "upstream": "Kafka clients reconnect to the broker's advertised listener, bypassing any proxy",
}


class TestKafkaConformance(ConformanceSuite):
    """Every check of the suite, one fresh 4-partition topic per check."""

    @pytest.fixture(autouse=True)
    def _no_fault_proxy(self, request: pytest.FixtureRequest) -> None:
        # A Kafka client bootstraps, then connects to the listener the broker advertises in its
        # metadata; tansu advertises the fixed --advertised-listener-url it was started with, and the
        # suite's proxy listens on a port of its own choosing per check, so the producer would bypass it.
        skip_fault_checks(request, "Kafka clients reconnect to the broker's advertised listener, bypassing the proxy")

    @pytest.fixture
    def conformance_target(self, kafka_peer: KafkaPeer, kafka_auth_bootstrap: str) -> ConformanceTarget:
        async def provision(name: str) -> str:
            return await new_topic(kafka_peer, prefix="conf")

        def make(topic: str, bootstrap: str, connect_timeout: float = 3.0) -> KafkaTransport:
            opts = kafka_peer.options(
                topic, bootstrap_servers=bootstrap, connect_timeout=connect_timeout, request_timeout=8.0
            )
            return KafkaTransport(KafkaConfig.model_validate(opts), destination="conformance")

        async def publish_foreign(topic: str) -> None:
            from aiokafka import AIOKafkaProducer

            producer = AIOKafkaProducer(bootstrap_servers=kafka_peer.bootstrap)
            await producer.start()
            try:
                await producer.send_and_wait(topic, b"not a cloudevent", key=b"s0")  # no ce_* headers
            finally:
                await producer.stop()

        password = long_secret()
        return ConformanceTarget(
            make_transport=lambda topic: make(topic, kafka_peer.bootstrap),
            provision=provision,
            make_unreachable=lambda topic: make(topic, f"127.0.0.1:{free_port()}"),
            unsupported=UNSUPPORTED,
            label=kafka_peer.label,
            read_timeout=10.0,
            binding=KAFKA,
            make_forbidden=lambda topic: refused_login(topic, kafka_auth_bootstrap, password),
            publish_foreign=publish_foreign,
            claim_timeout=2.0,  # the session timeout; tansu accepts 2 s (stock Kafka's least is 6 s)
            late_reader=lambda t, topic: t.reader(topic, from_beginning=True),
            # no proxy can stay in front of Kafka (upstream unsupported), but an address that drops SYNs can
            make_transport_via=lambda topic, host, port: make(topic, f"{host}:{port}", connect_timeout=VIA_TIMEOUT),
        )

    @pytest.fixture
    def secret_target(self, kafka_tls_peer: KafkaTlsPeer, kafka_auth_bootstrap: str) -> ConformanceTarget:
        """Transports holding one secret: a TLS client key passphrase, and the refused login's SASL password."""
        tls = kafka_tls_peer
        peer = KafkaPeer(tls.bootstrap, tansu=True)

        async def provision(name: str) -> str:
            ca = ssl.create_default_context(cafile=str(tls.cafile))
            return await new_topic(peer, prefix="cred", security_protocol="SSL", ssl_context=ca)

        def make(topic: str, bootstrap: str) -> KafkaTransport:
            return transport(
                bootstrap_servers=bootstrap,
                topic=topic,
                security_protocol="SSL",
                ssl_cafile=str(tls.cafile),
                ssl_certfile=str(tls.client_cert),
                ssl_keyfile=str(tls.client_key),
                ssl_password=tls.passphrase,
            )

        return ConformanceTarget(
            make_transport=lambda topic: make(topic, tls.bootstrap),
            provision=provision,
            make_unreachable=lambda topic: make(topic, f"127.0.0.1:{free_port()}"),
            unsupported=UNSUPPORTED,
            label="tansu 0.6 over TLS (client key encrypted with the secret), and tansu --authentication",
            read_timeout=10.0,
            make_forbidden=lambda topic: refused_login(topic, kafka_auth_bootstrap, tls.passphrase),
            secret=tls.passphrase,
            late_reader=lambda t, topic: t.reader(topic, from_beginning=True),
        )

    def test_secret_never_leaks(
        self, secret_target: ConformanceTarget, tmp_path: Path, request: pytest.FixtureRequest
    ) -> None:
        """The secret (TLS key passphrase and SASL password) never appears in results, exceptions, check() output,
        reprs or log records — over TLS, against a broker that is down, and with a login the broker refuses."""
        run_check(secret_target, "secret_never_leaks", tmp_path, request.node)
