"""Tenant isolation: hostile tenant/stream/type values never leave their segment of a rendered target.

Property tests (hypothesis) against every transport's real ``target()`` — the
transports are built from config, without I/O. A render either keeps each value
inside its own segment (and distinct values give distinct targets) or returns a
:class:`RejectedTarget` with a reason.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from outrelay.core.config.registry import Registry
from outrelay.core.contract.segments import RejectedTarget
from outrelay.core.contract.transport import Transport
from outrelay.core.model.envelope import Event

PROBES = ["..", ".", "../../victim/escaped", "acme.orders", "acme:s1", "s1:x", "a/b", "a\\b", "%2E%2E", "*", ">", "{x}"]
PROBES += ["a b", "a\u00a0b", "ü", "#", "?", "%", "-", "_", "~", "a..b", "a.*.>"]

# any text an Event accepts (no control characters, no lone surrogates), biased towards separators
hostile = st.one_of(
    st.sampled_from(PROBES),
    st.text(alphabet=st.sampled_from("./\\:%*>{}#?&= -_~aZ09ü"), min_size=1, max_size=10),
    st.text(alphabet=st.characters(exclude_categories=("Cc", "Cs")), min_size=1, max_size=8),
)
types = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:/\-]{0,12}", fullmatch=True)
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    database=None,  # no .hypothesis/ directory in the tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# names without an escape character reject most hostile values: mix in short plain ones to compare
near = st.one_of(
    hostile, st.text(alphabet="ab_-", min_size=1, max_size=4), st.text(alphabet="ab.:%-", min_size=1, max_size=4)
)

Split = Callable[[str], list[str] | None]


def _split_on(prefix: str, sep: str, n: int) -> Split:
    """Split the part after ``prefix`` on ``sep``; None if it does not give ``n`` non-empty segments."""

    def split(target: str) -> list[str] | None:
        if not target.startswith(prefix):
            return None
        parts = target[len(prefix) :].split(sep)
        return parts if len(parts) == n and all(parts) else None

    return split


def _rabbit_split(target: str) -> list[str] | None:
    exchange, _, key = target.partition("/")
    return _split_on("ev.", ".", 2)(key) if exchange == "ex" else None


KAFKA_NAME = re.compile(r"[A-Za-z0-9._\-]{1,249}")

# transport, options (the templated one with {tenant} and {stream}), splitter of the rendered target
CASES: dict[str, tuple[str, dict[str, Any], Split]] = {
    "nats": ("nats", {"servers": ["nats://127.0.0.1:1"], "subject": "ev.{tenant}.{stream}"}, _split_on("ev.", ".", 2)),
    "redis": ("redis", {"url": "redis://127.0.0.1:1", "stream": "ev:{tenant}:{stream}"}, _split_on("ev:", ":", 2)),
    "kafka": ("kafka", {"bootstrap_servers": "127.0.0.1:1", "topic": "ev.{tenant}.{stream}"}, _split_on("ev.", ".", 2)),
    "rabbitmq": (
        "rabbitmq",
        {"url": "amqp://guest:guest@127.0.0.1:1/", "exchange": "ex", "routing_key": "ev.{tenant}.{stream}"},
        _rabbit_split,
    ),
    "pulsar": (
        "pulsar",
        {"service_url": "pulsar://127.0.0.1:1", "topic": "persistent://public/default/ev-{tenant}-{stream}"},
        _split_on("persistent://public/default/ev-", "-", 2),
    ),
    "pubsub": (
        "pubsub",
        {"project": "p", "emulator_host": "127.0.0.1:1", "topic": "ev.{tenant}.{stream}"},
        _split_on("ev.", ".", 2),
    ),
    "servicebus": (
        "servicebus",
        {
            "connection_string": "Endpoint=sb://127.0.0.1/;SharedAccessKeyName=k;SharedAccessKey=s",
            "queue": "q.{tenant}.{stream}",
        },
        _split_on("q.", ".", 2),
    ),
    "sqs": (
        "sqs",
        {"queue_url": "http://127.0.0.1:1/123456789012/ev-{tenant}-{stream}", "region": "us-east-1"},
        _split_on("http://127.0.0.1:1/123456789012/ev-", "-", 2),
    ),
    "sns": (
        "sns",
        {"topic_arn": "arn:aws:sns:us-east-1:123456789012:ev-{tenant}-{stream}", "region": "us-east-1"},
        _split_on("arn:aws:sns:us-east-1:123456789012:ev-", "-", 2),
    ),
}


@pytest.fixture(scope="module")
def built() -> dict[str, tuple[Transport, Split]]:
    out: dict[str, tuple[Transport, Split]] = {}
    for key, (transport, options, split) in CASES.items():
        try:
            out[key] = (Registry().create_transport(transport, options, destination="iso"), split)
        except Exception:  # a transport whose optional extra is missing is skipped in the test
            continue
    return out


@pytest.mark.parametrize("key", sorted(CASES))
@SETTINGS
@given(tenant=hostile, stream=hostile, type_=types)
def test_each_value_stays_in_its_segment(  # type_ varies the event id/type only: {type} is tested below
    built: dict[str, tuple[Transport, Split]], key: str, tenant: str, stream: str, type_: str
) -> None:
    """A hostile tenant/stream renders into exactly its own segment of the target, or the message is rejected."""
    if key not in built:
        pytest.skip(f"transport {key} is not installed")
    transport, split = built[key]
    target = transport.target(Event(type=type_, stream=stream, tenant=tenant))
    if isinstance(target, RejectedTarget):
        assert target.reason and target == ""
        return
    parts = split(target)
    assert parts is not None, f"{key}: {tenant!r}/{stream!r} escaped its segment: {target!r}"
    if key == "kafka":
        assert KAFKA_NAME.fullmatch(target)


@pytest.mark.parametrize("key", sorted(CASES))
@SETTINGS
@given(a=st.tuples(near, near), b=st.tuples(near, near))
def test_distinct_tenants_get_distinct_targets(
    built: dict[str, tuple[Transport, Split]], key: str, a: tuple[str, str], b: tuple[str, str]
) -> None:
    """Two different (tenant, stream) pairs never render to the same target (no shared key or subject)."""
    if key not in built:
        pytest.skip(f"transport {key} is not installed")
    assume(a != b)
    transport, _ = built[key]
    ta = transport.target(Event(type="t", tenant=a[0], stream=a[1]))
    tb = transport.target(Event(type="t", tenant=b[0], stream=b[1]))
    if isinstance(ta, RejectedTarget) or isinstance(tb, RejectedTarget):
        return  # a rejected render reaches no target at all
    assert ta != tb, f"{key}: {a} and {b} share the target {ta!r}"


@pytest.fixture(scope="module")
def typed() -> dict[str, Transport]:
    """Each case's transport with ``{type}`` in place of ``{stream}``."""
    out: dict[str, Transport] = {}
    for key, (transport, options, _) in CASES.items():
        opts = {k: v.replace("{stream}", "{type}") if isinstance(v, str) else v for k, v in options.items()}
        try:
            out[key] = Registry().create_transport(transport, opts, destination="iso")
        except Exception:  # a transport whose optional extra is missing is skipped in the test
            continue
    return out


@pytest.mark.parametrize("key", sorted(CASES))
@SETTINGS
@given(tenant=hostile, type_=types)
def test_a_hostile_type_does_not_reach_the_tenant_segment(
    typed: dict[str, Transport], key: str, tenant: str, type_: str
) -> None:
    """With {type} after {tenant}, the tenant's segment renders as with a plain type, and the type part holds
    no separator of the template (a dotted type may span subject tokens by design: dots aside)."""
    if key not in typed:
        pytest.skip(f"transport {key} is not installed")
    transport = typed[key]
    plain = transport.target(Event(type="t", stream="s", tenant=tenant))
    target = transport.target(Event(type=type_, stream="s", tenant=tenant))
    if isinstance(target, RejectedTarget) or isinstance(plain, RejectedTarget):
        return
    assert plain.endswith("t")
    head = plain[:-1]  # everything up to the type: prefix, tenant segment, separator
    assert target.startswith(head), f"{key}: type {type_!r} changed the tenant segment: {target!r}"
    sep = head[-1]
    rest = target[len(head) :]
    assert rest and (sep == "." or sep not in rest), f"{key}: type {type_!r} left its segment: {target!r}"


def test_probe_cases_from_the_issue(built: dict[str, tuple[Transport, Split]]) -> None:
    """The issue's probes: NATS tenant 'acme.orders' stays one token; Redis acme:s1/x and acme/s1:x differ."""
    nats, _ = built["nats"]
    assert nats.target(Event(type="t", tenant="acme.orders", stream="s")) == "ev.acme%2Eorders.s"
    redis, _ = built["redis"]
    k1 = redis.target(Event(type="t", tenant="acme:s1", stream="x"))
    k2 = redis.target(Event(type="t", tenant="acme", stream="s1:x"))
    assert k1 != k2 and k1.count(":") == k2.count(":") == 2
    kafka, _ = built["kafka"]
    rejected = kafka.target(Event(type="t", tenant="acme.orders", stream="s"))
    assert isinstance(rejected, RejectedTarget) and "tenant 'acme.orders'" in rejected.reason


@SETTINGS
@given(tenant=hostile, stream=hostile, type_=types)
def test_file_paths_stay_under_their_directory(
    tmp_path_factory: pytest.TempPathFactory, tenant: str, stream: str, type_: str
) -> None:
    """A file path template puts each value in one path component under the configured directory."""
    base = "/srv/out"
    transport = Registry().create_transport("file", {"path": base + "/{tenant}/{stream}/{type}.jsonl"}, destination="f")
    target = transport.target(Event(type=type_, stream=stream, tenant=tenant))
    assert not isinstance(target, RejectedTarget)
    parts = PurePosixPath(target).parts
    assert parts[:3] == ("/", "srv", "out") and len(parts) == 6, target
    assert all(p not in (".", "..") for p in parts), target
    assert os.path.normpath(target) == target


@SETTINGS
@given(tenant=hostile, stream=hostile)
def test_webhook_url_segments(tenant: str, stream: str) -> None:
    """A webhook URL template keeps tenant and stream in their own path segments; '.'/'..' are rejected."""
    transport = Registry().create_transport(
        "webhook", {"url": "https://hooks.example.com/api/t/{tenant}/s/{stream}/events"}, destination="w"
    )
    target = transport.target(Event(type="t", stream=stream, tenant=tenant))
    if isinstance(target, RejectedTarget):
        assert set(tenant) <= {"."} or set(stream) <= {"."}, target.reason
        return
    url = urlsplit(target)
    assert url.netloc == "hooks.example.com" and not url.query and not url.fragment, target
    parts = url.path.split("/")
    assert parts[:3] == ["", "api", "t"] and parts[4:] == ["s", parts[5], "events"], target
    assert unquote(parts[3]) == tenant and unquote(parts[5]) == stream
    assert all(unquote(p) not in (".", "..") for p in parts[1:])
