"""The shared conformance suite against a real NATS JetStream server.

The secret and forbidden checks run against a private ``nats-server`` of this
module (:class:`TestNatsCredentials`) whose authorization block has two users
sharing one long random password: ``relay`` may publish, ``nopub`` may use
the JetStream API (it sees the stream) but publish to no subject. The shared
server has no authorization to test that with.

The refused target (``refuse_target``) is a subject of a second stream whose
``max_msg_size`` is 1 byte: JetStream refuses every message there with error
10054, which the transport answers Rejected (a message that can never fit).
A subject no stream takes (no responders) or a full ``discard=new`` stream
would not do: both are RetryLater by design (a stream may be created, room
may appear).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import nats
import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.conformance._binding import NATS
from outrelay.conformance._harness import run_check
from outrelay.transports.nats._config import NatsConfig, StreamSpec
from outrelay.transports.nats._group import names as group_names
from outrelay.transports.nats._transport import NatsTransport
from tests.peers.conformance_hooks import VIA_TIMEOUT, long_secret
from tests.peers.nats import NATS_ATOMIC_SERVER_BIN, NatsServer, StreamFactory, private_nats_server
from tests.services import free_port

IN_CREDENTIALS_TARGET = (
    "run by TestNatsCredentials against a private nats-server with users (the shared one has no authorization)"
)


def _timeouts(*, via: bool = False) -> dict[str, float]:
    """connect/ack timeouts of a conformance transport. ``via``: the transports the fault checks build
    through their proxy or point at a dead port, where every stalled call costs a check its timeout
    (nats-py tries a first connect twice: connect_timeout + reconnect_time_wait + connect_timeout)."""
    if via:
        return {"connect_timeout": 0.5, "reconnect_time_wait": 0.2, "ack_timeout": VIA_TIMEOUT}
    return {"connect_timeout": 1.0, "ack_timeout": 3.0}


def _target(
    make: Callable[..., NatsTransport],
    provision: Callable[[str], Awaitable[str]],
    refuse: Callable[[str], Awaitable[str]],
    url: str,
    upstream: tuple[str, int],
    label: str,
    streams: dict[str, str] | None = None,
) -> ConformanceTarget:
    """The conformance target of the server at ``url``: ``make(subject, servers)`` builds a transport;
    faults go through a proxy to ``upstream``; the credential checks run in :class:`TestNatsCredentials`.
    ``streams`` (subject -> stream) lets ``forget_group`` find a group's KV bucket."""

    async def publish_foreign(subject: str) -> None:
        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=1)
        try:
            await nc.jetstream().publish(subject, b"not a cloudevent")
        finally:
            await nc.close()

    async def forget_group(subject: str, group: str) -> None:
        if streams is None or subject not in streams:
            return
        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=1)
        try:  # the group's consumers go with the stream; its KV bucket is a stream of its own
            await nc.jetstream().delete_key_value(group_names(streams[subject], subject, group, 1)[0])
        finally:
            await nc.close()

    return ConformanceTarget(
        make_transport=lambda subject: make(subject, (url,)),
        provision=provision,
        make_unreachable=lambda subject: make(subject, (f"nats://127.0.0.1:{free_port()}",), via=True),
        unsupported={
            "throttle": "JetStream never throttles with a retry hint (a full stream refuses or discards instead)",
            **dict.fromkeys(("secret", "make_forbidden"), IN_CREDENTIALS_TARGET),
        },
        label=label,
        read_timeout=10.0,
        upstream=lambda subject: upstream,
        make_transport_via=lambda subject, host, port: make(subject, (f"nats://{host}:{port}",), via=True),
        refuse_target=refuse,
        binding=NATS,
        publish_foreign=publish_foreign,
        forget_group=forget_group,
        claim_timeout=2.0,
        late_reader=lambda t, subject: t.reader(subject, deliver="all"),
    )


class TestNatsConformance(ConformanceSuite):
    """Every check of the suite, one target (a stream of its own) per check."""

    @pytest.fixture
    async def conformance_target(self, nats_url: str) -> AsyncIterator[ConformanceTarget]:
        streams = StreamFactory(nats_url)
        names: dict[str, str] = {}  # subject -> stream

        async def provision(name: str) -> str:
            stream, prefix = await streams("conf", duplicate_window=120)
            subject = f"{prefix}.events"
            names[subject] = stream
            return subject

        async def refuse(subject: str) -> str:
            tag = uuid.uuid4().hex[:10]
            name, refused = f"OR_REFUSED_{tag}".upper(), f"or.refused.{tag}"
            nc = await nats.connect(nats_url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=1)
            try:  # every message exceeds max_msg_size: JetStream error 10054, permanent
                await nc.jetstream().add_stream(name=name, subjects=[f"{refused}.>"], max_msg_size=1)
            finally:
                await nc.close()
            streams.created.append(name)  # deleted with the others
            return f"{refused}.events"

        def make(subject: str, servers: tuple[str, ...], *, via: bool = False) -> NatsTransport:
            # create_stream names the provisioned stream (it exists: nothing is created) so that its
            # duplicate window is declared before open(); open() then reads the real one.
            spec = StreamSpec(name=names.get(subject, "ORC_" + uuid.uuid4().hex[:8].upper()), subjects=(subject,))
            cfg = NatsConfig(servers=servers, subject=subject, create_stream=spec, **_timeouts(via=via))
            return NatsTransport(cfg, destination="conformance")

        parts = urlsplit(nats_url)
        upstream = (parts.hostname or "127.0.0.1", parts.port or 4222)
        label = "nats (real nats-server 2.9 with JetStream)"
        yield _target(make, provision, refuse, nats_url, upstream, label, names)
        await streams.delete_all()


@pytest.fixture(scope="module")
def nats_atomic_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A private nats-server 2.12+ (atomic batches: ``NATS_ATOMIC_SERVER_BIN``)."""
    with private_nats_server(tmp_path_factory.mktemp("nats-atomic"), binary=NATS_ATOMIC_SERVER_BIN) as server:
        yield server


class TestNatsAtomicConformance(ConformanceSuite):
    """Every check of the suite with atomic batches: streams that allow them on nats-server 2.12+ and
    ``atomic = true`` (each batch one JetStream atomic batch, see ``_atomic.py``); the faults mid-batch
    go through a proxy to that server. The consumer side is TestNatsConformance's to certify."""

    @pytest.fixture(autouse=True)
    def _consumer_side_elsewhere(self, request: pytest.FixtureRequest) -> None:
        name = getattr(request.node, "originalname", request.node.name)
        if name.startswith("test_subscription_"):
            pytest.skip("atomic batches change publishing only: the consumer side is certified by TestNatsConformance")

    @pytest.fixture
    async def conformance_target(self, nats_atomic_server: NatsServer) -> AsyncIterator[ConformanceTarget]:
        url = nats_atomic_server.url
        streams = StreamFactory(url)
        names: dict[str, str] = {}  # subject -> stream

        async def provision(name: str) -> str:
            stream, prefix = await streams("confa", duplicate_window=120, allow_atomic=True)
            names[f"{prefix}.events"] = stream
            return f"{prefix}.events"

        async def refuse(subject: str) -> str:
            stream, prefix = await streams("refuseda", allow_atomic=True, max_msg_size=1)  # 10054: permanent
            names[f"{prefix}.events"] = stream
            return f"{prefix}.events"

        def make(subject: str, servers: tuple[str, ...], *, via: bool = False) -> NatsTransport:
            name = names.get(subject, "ORC_" + uuid.uuid4().hex[:8].upper())
            spec = StreamSpec(name=name, subjects=(subject,), allow_atomic=True)
            cfg = NatsConfig(servers=servers, subject=subject, create_stream=spec, atomic=True, **_timeouts(via=via))
            return NatsTransport(cfg, destination="conformance")

        upstream = ("127.0.0.1", nats_atomic_server.port)
        yield _target(make, provision, refuse, url, upstream, "nats (private nats-server 2.12+, atomic batches)")
        await streams.delete_all()


def _auth_conf(directory: Path, secret: str) -> Path:
    """A nats-server config: ``relay`` may do anything, ``nopub`` may use the JetStream API but publish
    to no subject (both ``secret``)."""
    conf = directory / "auth.conf"
    conf.write_text(
        "authorization {\n  users = [\n"
        f'    {{user: relay, password: "{secret}"}}\n'
        f'    {{user: nopub, password: "{secret}", permissions: {{publish: {{allow: "$JS.API.>"}}, '
        'subscribe: {allow: "_INBOX.>"}}}\n'
        "  ]\n}\n"
    )
    return conf


@pytest.fixture(scope="module")
def nats_auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsServer, str]]:
    """A private JetStream server with user/password authorization, and the password."""
    secret, directory = long_secret(), tmp_path_factory.mktemp("nats-auth")
    with private_nats_server(directory, args=("-c", str(_auth_conf(directory, secret)))) as server:
        yield server, secret


class TestNatsCredentials:
    """secret_never_leaks, forbidden_send_permanent, forbidden_check_says_what against the private server."""

    @pytest.fixture
    def target(self, nats_auth_server: tuple[NatsServer, str]) -> ConformanceTarget:
        server, secret = nats_auth_server
        streams = StreamFactory(f"nats://relay:{secret}@127.0.0.1:{server.port}")
        names: dict[str, str] = {}

        async def provision(name: str) -> str:
            stream, prefix = await streams("cred", duplicate_window=120)
            names[f"{prefix}.events"] = stream
            return f"{prefix}.events"

        def make(subject: str, port: int, user: str = "relay", *, via: bool = False) -> NatsTransport:
            spec = StreamSpec(name=names.get(subject, "ORC_" + uuid.uuid4().hex[:8].upper()), subjects=(subject,))
            cfg = NatsConfig(
                servers=(f"nats://127.0.0.1:{port}",),
                user=user,
                password=secret,
                subject=subject,
                create_stream=spec,
                **_timeouts(via=via),
            )
            return NatsTransport(cfg, destination="conformance")

        return ConformanceTarget(
            make_transport=lambda subject: make(subject, server.port),
            provision=provision,
            make_unreachable=lambda subject: make(subject, free_port(), via=True),
            unsupported={
                "throttle": "JetStream never throttles with a retry hint (a full stream refuses or discards instead)",
            },
            label="nats (private nats-server with user/password authorization)",
            read_timeout=10.0,
            make_forbidden=lambda subject: make(subject, server.port, user="nopub"),
            secret=secret,
        )

    @pytest.mark.parametrize(
        "check",
        [
            "secret_never_leaks",
            "forbidden_send_permanent",
            "forbidden_check_says_what",
        ],
    )  # fmt: skip
    def test_credentials(self, target: ConformanceTarget, check: str, tmp_path: Path) -> None:
        run_check(target, check, tmp_path)
