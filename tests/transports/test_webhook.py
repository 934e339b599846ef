"""The webhook transport against a real receiver on loopback (no mocks)."""

from __future__ import annotations

import asyncio
import email.utils
import time
import traceback
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from outrelay import Delivered, Event, EventError, PermanentError, Rejected, RetryableError, RetryLater, UsageError
from outrelay.core.model import cloudevents
from outrelay.kit import Progress, sending
from outrelay.transports.webhook._transport import classify, parse_retry_after
from outrelay.transports.webhook.receiver import WebhookReceiver, WebhookRequest
from tests.services import free_port
from tests.transports.webhook_support import (
    OTHER_SECRET,
    SECRET,
    RawServer,
    answer_bytes,
    event,
    make_transport,
    messages,
)


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver(secrets=SECRET) as rx:
        yield rx


def full_event() -> Event:
    return Event(
        type="order.created",
        stream="order-42",
        data={"total": 12.5, "items": ["a", "b"]},
        source="urn:shop",
        tenant="acme",
        correlation_id="corr-1",
        causation_id="cause-1",
        event_version="3",
        schema_version="https://schemas.example/order/3",
        producer_version="2.1.0",
        subject="orders/42",
        labels={"region": "eu"},
        tags=("vip", "web"),
        metadata={"trace": "abc"},
        sequence=17,
    )


async def send_one(url: str, ev: Event, **options: object) -> object:
    t = make_transport(url, **options)
    await t.open()
    try:
        [result] = await t.send(messages(t, [ev]))
    finally:
        await t.close()
    return result


class TestFidelity:
    async def test_structured_mode_round_trips_every_envelope_field(self, receiver: WebhookReceiver) -> None:
        """Structured mode posts application/cloudevents+json that decodes to the identical event."""
        ev = full_event()
        assert isinstance(await send_one(receiver.url + "/in", ev), Delivered)
        [req] = receiver.requests
        assert req.method == "POST" and req.path == "/in"
        assert req.headers["content-type"] == cloudevents.STRUCTURED_CONTENT_TYPE
        assert req.headers["webhook-id"] == ev.id
        assert req.body == cloudevents.to_structured(ev)
        assert req.event == ev

    async def test_binary_mode_sends_ce_headers_and_raw_data(self, receiver: WebhookReceiver) -> None:
        """Binary mode sends ce-* headers, the raw data and the event's content type, and round-trips."""
        ev = full_event().replace(data=b"\x00\x01binary", content_type="application/octet-stream")
        assert isinstance(await send_one(receiver.url, ev, mode="binary"), Delivered)
        [req] = receiver.requests
        assert req.body == b"\x00\x01binary"
        assert req.headers["content-type"] == "application/octet-stream"
        for name, value in cloudevents.binary_headers(ev, percent=True).items():
            assert req.headers[name] == value
        assert req.headers["ce-specversion"] == "1.0" and req.headers["ce-id"] == ev.id
        assert req.event == ev

    async def test_binary_mode_percent_encodes_non_ascii_for_the_cloudevents_sdk(
        self, receiver: WebhookReceiver
    ) -> None:
        """Non-ASCII attribute values go out percent-encoded (HTTP binding 3.1.3.2); the CloudEvents SDK
        and outrelay's receiver both decode them back exactly."""
        from cloudevents.core.bindings.http import HTTPMessage, from_http
        from cloudevents.core.formats.json import JSONFormat

        ev = full_event().replace(
            stream="Straße 7", tenant="café", subject='Euro € "😀" 100%', labels={"ort": "Zürich"}, data={"x": 1}
        )
        assert isinstance(await send_one(receiver.url, ev, mode="binary"), Delivered)
        [req] = receiver.requests
        ce_headers = {k: v for k, v in req.headers.items() if k.startswith("ce-")}
        assert all(v.isascii() and " " not in v and '"' not in v for v in ce_headers.values())
        assert req.headers["ce-subject"] == "Euro%20%E2%82%AC%20%22%F0%9F%98%80%22%20100%25"
        assert req.event == ev
        sdk = from_http(HTTPMessage(headers=req.headers, body=req.body), JSONFormat())
        assert sdk.get_subject() == 'Euro € "😀" 100%'
        assert sdk.get_attributes()["tenantid"] == "café"
        assert sdk.get_attributes()["streamid"] == "Straße 7"
        assert sdk.get_attributes()["labels"] == '{"ort":"Zürich"}'
        assert sdk.get_id() == ev.id and sdk.get_data() == {"x": 1}

    async def test_extra_headers_and_template_url(self, receiver: WebhookReceiver) -> None:
        """Static extra headers are sent and the URL template is rendered per event."""
        ev = event(stream="s9", tenant="t1")
        t = make_transport(receiver.url + "/tenants/{tenant}", headers={"Authorization": "Bearer tok"})
        assert t.target(ev) == receiver.url + "/tenants/t1"
        await t.open()
        try:
            await t.send(messages(t, [ev]))
        finally:
            await t.close()
        assert receiver.requests[0].path == "/tenants/t1"
        assert receiver.requests[0].headers["authorization"] == "Bearer tok"

    async def test_connections_are_kept_alive(self, receiver: WebhookReceiver) -> None:
        """Sequential requests of one stream reuse one pooled connection."""
        t = make_transport(receiver.url)
        await t.open()
        try:
            for i in range(5):
                await t.send(messages(t, [event(n=i)]))
        finally:
            await t.close()
        assert len(receiver.events()) == 5 and receiver.connections == 1


class TestClassification:
    @pytest.mark.parametrize("status", [200, 201, 202, 204])
    async def test_2xx_is_delivered(self, receiver: WebhookReceiver, status: int) -> None:
        """Any 2xx answer means delivered."""
        receiver.respond = lambda req: status
        assert await send_one(receiver.url, event()) == Delivered()

    async def test_302_is_permanent_and_not_followed(self, receiver: WebhookReceiver) -> None:
        """A redirect is a permanent failure, names the location and is not followed."""
        receiver.respond = lambda req: (302, {"location": "http://127.0.0.1:9/elsewhere?token=x"})
        result = await send_one(receiver.url, event())
        assert isinstance(result, Rejected) and not result.disable_destination
        assert "302" in result.reason and "/elsewhere" in result.reason and "token" not in result.reason
        assert len(receiver.requests) == 1

    async def test_400_is_permanent(self, receiver: WebhookReceiver) -> None:
        """A 400 answer is a permanent rejection naming the status."""
        receiver.respond = lambda req: 400
        result = await send_one(receiver.url, event())
        assert isinstance(result, Rejected) and "answered 400" in result.reason and not result.disable_destination

    @pytest.mark.parametrize("status", [408, 429, 500, 503])
    async def test_retryable_statuses_honour_retry_after_seconds(self, receiver: WebhookReceiver, status: int) -> None:
        """408, 429 and 5xx are retryable, with Retry-After seconds passed on."""
        receiver.respond = lambda req: (status, {"retry-after": "7"})
        result = await send_one(receiver.url, event())
        assert isinstance(result, RetryLater) and result.retry_after == 7.0 and str(status) in result.error

    async def test_retry_after_http_date(self, receiver: WebhookReceiver) -> None:
        """A Retry-After HTTP-date becomes the seconds until that date."""
        when = email.utils.format_datetime(datetime.fromtimestamp(time.time() + 120, UTC), usegmt=True)
        receiver.respond = lambda req: (503, {"retry-after": when})
        result = await send_one(receiver.url, event())
        assert isinstance(result, RetryLater) and result.retry_after is not None
        assert 100 <= result.retry_after <= 121

    async def test_410_disables_the_destination(self, receiver: WebhookReceiver) -> None:
        """410 Gone is a rejection that asks the relay to disable the destination."""
        receiver.respond = lambda req: 410
        result = await send_one(receiver.url, event())
        assert isinstance(result, Rejected) and result.disable_destination and "410" in result.reason

    async def test_connection_refused_is_retryable(self) -> None:
        """Nothing listening on the port is a retryable failure naming the URL."""
        url = f"http://127.0.0.1:{free_port()}/hook"
        result = await send_one(url, event())
        assert isinstance(result, RetryLater) and "cannot deliver to" in result.error and "/hook" in result.error

    async def test_timeout_is_retryable(self, receiver: WebhookReceiver) -> None:
        """A receiver slower than the configured timeout gives a retryable failure."""

        async def slow(req: WebhookRequest) -> int:
            await asyncio.sleep(2)
            return 204

        receiver.respond = slow
        started = time.monotonic()
        result = await send_one(receiver.url, event(), timeout=0.3)
        assert isinstance(result, RetryLater) and "did not answer within 0.3s" in result.error
        assert time.monotonic() - started < 1.5

    def test_parse_retry_after(self) -> None:
        """Retry-After parses delta-seconds and HTTP-dates; junk and past dates are handled."""
        now = 1_700_000_000.0
        assert parse_retry_after("120", now) == 120.0
        assert parse_retry_after(" 0 ", now) == 0.0
        assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now) == 30.0
        assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0
        assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None

    def test_classify_table(self) -> None:
        """Every status class maps to the documented outcome."""
        url = "https://user:pw@example.com/hook?sig=secret"
        assert classify(204, {}, url) == Delivered()
        assert isinstance(classify(301, {}, url), Rejected)
        assert isinstance(classify(404, {}, url), Rejected)
        assert isinstance(classify(502, {}, url), RetryLater)
        gone = classify(410, {}, url)
        assert isinstance(gone, Rejected) and gone.disable_destination
        assert "pw" not in gone.reason and "sig=" not in gone.reason


class TestBatches:
    async def test_same_key_is_sequential_and_in_order(self, receiver: WebhookReceiver) -> None:
        """Events of one stream arrive in batch order, never two at once; streams interleave."""
        inflight: dict[str, int] = {}
        overlap: list[str] = []

        async def track(req: WebhookRequest) -> int:
            key = req.event.stream if req.event else "?"
            inflight[key] = inflight.get(key, 0) + 1
            if inflight[key] > 1:
                overlap.append(key)
            await asyncio.sleep(0.005)
            inflight[key] -= 1
            return 204

        receiver.respond = track
        evs = [event(stream=f"s{i % 4}", n=i) for i in range(40)]
        t = make_transport(receiver.url, concurrency=8)
        await t.open()
        try:
            results = await t.send(messages(t, evs))
        finally:
            await t.close()
        assert results == [Delivered()] * 40 and overlap == []
        for s in ("s0", "s1", "s2", "s3"):
            assert [e.id for e in receiver.events() if e.stream == s] == [e.id for e in evs if e.stream == s]

    async def test_after_a_failure_later_same_key_events_are_not_sent(self, receiver: WebhookReceiver) -> None:
        """Once an event of a stream fails, that stream's later events are NotSent (a RetryLater) and never sent."""
        evs = [event("a", 1), event("a", 2), event("b", 1), event("a", 3), event("b", 2)]
        receiver.respond = lambda req: 500 if req.event is not None and req.event.id == evs[1].id else 204
        t = make_transport(receiver.url)
        await t.open()
        try:
            results = await t.send(messages(t, evs))
        finally:
            await t.close()
        kinds = [type(r).__name__ for r in results]
        assert kinds == ["Delivered", "RetryLater", "Delivered", "NotSent", "Delivered"]
        assert isinstance(results[3], RetryLater) and "not sent" in results[3].error
        sent = {r.event.id for r in receiver.requests if r.event}
        assert evs[3].id not in sent and {evs[0].id, evs[1].id, evs[2].id, evs[4].id} <= sent

    async def test_oversized_event_is_rejected_unsent(self, receiver: WebhookReceiver) -> None:
        """Data over max_message_bytes is rejected without a request; exactly the limit is sent."""
        t = make_transport(receiver.url, max_message_bytes=100)
        await t.open()
        try:
            ok, big = await t.send(messages(t, [event("a", data=b"x" * 100), event("b", data=b"x" * 101)]))
        finally:
            await t.close()
        assert ok == Delivered()
        assert isinstance(big, Rejected) and "max_message_bytes=100" in big.reason
        assert len(receiver.requests) == 1


class TestLifecycle:
    async def test_send_requires_open_and_close_is_idempotent(self, receiver: WebhookReceiver) -> None:
        """send before open or after close raises UsageError; close twice is fine."""
        t = make_transport(receiver.url)
        with pytest.raises(UsageError):
            await t.send(messages(t, [event()]))
        await t.open()
        await t.close()
        await t.close()
        with pytest.raises(UsageError):
            await t.send(messages(t, [event()]))

    async def test_check_connection_refused_is_retryable_error(self) -> None:
        """check() against a closed port raises RetryableError saying how to fix it."""
        with pytest.raises(RetryableError, match=r"cannot reach .* check the URL"):
            await make_transport(f"http://127.0.0.1:{free_port()}/").check()

    async def test_check_refused_address_is_permanent_error(self) -> None:
        """check() against a loopback URL without allow_private_network names the option."""
        with pytest.raises(PermanentError, match="allow_private_network"):
            await make_transport(f"http://127.0.0.1:{free_port()}/", allow_private_network=False).check()

    async def test_secrets_never_printed(self, receiver: WebhookReceiver) -> None:
        """Secrets and header values appear in no repr, config dump or failure reason."""
        receiver.respond = lambda req: 401
        t = make_transport(receiver.url + "/h", headers={"Authorization": "Bearer hidden-token"})
        await t.open()
        try:
            [result] = await t.send(messages(t, [event()]))
        finally:
            await t.close()
        texts = [repr(t), repr(t.config), str(t.config), str(result)]
        for text in texts:
            assert SECRET not in text and SECRET[6:] not in text and "hidden-token" not in text

    def test_invalid_config_is_refused(self) -> None:
        """A non-HTTP URL, a bad template, a bad whsec_ secret and reserved headers fail validation."""
        from pydantic import ValidationError

        for bad in (
            {"url": "ftp://x"},
            {"url": "https://x/{nope}"},
            {"url": "https://x", "secret": "whsec_***"},
            {"url": "https://x", "headers": {"webhook-id": "x"}},
            {"url": "https://x", "headers": {"bad name": "x"}},
            {"url": "https://x", "headers": {"X-Token": "a\r\nInjected: 1"}},
        ):
            with pytest.raises(ValidationError):
                make_transport(**bad)  # type: ignore[arg-type]

    def test_validation_errors_do_not_echo_secrets(self) -> None:
        """A rejected secret or header value is not repeated in the validation error."""
        from pydantic import ValidationError

        with pytest.raises(ValidationError) as info:
            make_transport("https://x", secret="whsec_sup3r*secret")
        with pytest.raises(ValidationError) as info2:
            make_transport("https://x", headers={"X-Token": "tok3n\n"})
        assert "sup3r" not in str(info.value) and "tok3n" not in str(info2.value)


def _everything_shown(exc: BaseException) -> str:
    """str, repr and the formatted traceback of ``exc``: all a user could see of it."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc)])


class TestCheck:
    @pytest.mark.parametrize("mode", ["structured", "binary"])
    async def test_signed_ping_accepted_by_a_receiver_with_the_right_secret(
        self, receiver: WebhookReceiver, mode: str
    ) -> None:
        """check() POSTs an outrelay.check event signed and encoded as send would; the receiver verifies and
        acknowledges it itself, never handing it to respond() or events()."""
        receiver.respond = lambda req: 500  # the application's policy: a ping must not reach it
        line = await make_transport(receiver.url + "/hook", mode=mode).check()
        assert "accepted a signed ping" in line and "/hook" in line and f"{mode} mode" in line and "\n" not in line
        [req] = receiver.requests
        assert req.method == "POST" and req.path == "/hook" and req.verified and req.ping and req.status == 204
        assert req.event is not None and req.event.type == "outrelay.check" and "webhook-signature" in req.headers
        assert req.headers["webhook-id"] == req.event.id
        if mode == "binary":
            assert req.headers["ce-type"] == "outrelay.check" and req.headers["content-type"] == "application/json"
        else:
            assert req.headers["content-type"] == cloudevents.STRUCTURED_CONTENT_TYPE
        assert receiver.events(accepted_only=False) == [] and receiver.accepted() == []

    async def test_wrong_secret_is_a_one_line_permanent_error_without_the_secret(
        self, receiver: WebhookReceiver
    ) -> None:
        """A ping signed with a secret the receiver rejects (401) raises PermanentError: one line saying to check
        the signing secret, with neither secret in its message, repr or traceback."""
        with pytest.raises(PermanentError) as info:
            await make_transport(receiver.url + "/hook", secret=OTHER_SECRET).check()
        text = str(info.value)
        assert "\n" not in text and "answered 401 to a signed check ping" in text and "/hook" in text
        assert "rejected the signature or credentials" in text and "check that the destination's secret" in text
        assert info.value.destination == "hooks"
        shown = _everything_shown(info.value)
        for secret in (OTHER_SECRET, OTHER_SECRET[6:], SECRET, SECRET[6:]):
            assert secret not in shown
        [req] = receiver.requests
        assert req.ping and not req.verified and req.status == 401 and receiver.events(accepted_only=False) == []

    async def test_unsigned_ping_refused_says_to_set_a_secret(self, receiver: WebhookReceiver) -> None:
        """Without a secret, a 401 says the receiver wants credentials and to set the destination's secret."""
        with pytest.raises(
            PermanentError, match=r"answered 401 to an unsigned check ping.*set the destination's secret"
        ):
            await make_transport(receiver.url, secret=None).check()

    async def test_check_ping_false_keeps_the_head_probe(self, receiver: WebhookReceiver) -> None:
        """check_ping = false sends only a HEAD: any answer (here 401, the secret being wrong) means reachable."""
        line = await make_transport(receiver.url + "/hook", secret=OTHER_SECRET, check_ping=False).check()
        assert "reachable (HEAD answered 401" in line and "check_ping = false" in line and "\n" not in line
        [req] = receiver.requests
        assert req.method == "HEAD" and req.body == b"" and req.event is None

    @pytest.mark.parametrize(
        ("status", "words"),
        [
            (422, ["answered 422", "unknown event type", "not its signature", "check_ping = false"]),
            (400, ["answered 400", "not its signature", "outrelay.check"]),
            (404, ["answered 404", "check the destination's url"]),
        ],
    )
    async def test_other_4xx_names_the_status_and_is_told_apart_from_a_signature_failure(
        self, status: int, words: list[str]
    ) -> None:
        """A receiver refusing the ping itself (400/422: an unknown type; 404: a wrong path) gives a PermanentError
        naming the status and what the receiver said, not a message about the secret."""
        body = b"unknown event type"
        head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        async with RawServer(answer_bytes(head + body)) as server:
            with pytest.raises(PermanentError) as info:
                await make_transport(server.url).check()
        text = str(info.value)
        assert all(w in text for w in words), text
        assert "secret" not in text and "\n" not in text

    async def test_5xx_is_retryable_with_the_hint(self) -> None:
        """A 503 to the ping is a RetryableError carrying Retry-After: the receiver is up but failing."""
        answer = answer_bytes(b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 7\r\ncontent-length: 0\r\n\r\n")
        async with RawServer(answer) as server:
            with pytest.raises(RetryableError, match="answered 503 to a signed check ping") as info:
                await make_transport(server.url).check()
        assert info.value.retry_after == 7


class TestHeaderPercentEncoding:
    def test_decoding_accepts_quoted_and_lower_case_and_refuses_bad_utf8(self) -> None:
        """Decoding unquotes a double-quoted value first, accepts lower-case hex, keeps a stray '%',
        and refuses percent-encoded bytes that are not UTF-8 (an overlong space)."""
        assert cloudevents.percent_decode('"a \\"b\\" %e2%82%ac"') == 'a "b" €'
        assert cloudevents.percent_decode("50% off") == "50% off"
        with pytest.raises(EventError, match="not percent-encoded UTF-8"):
            cloudevents.percent_decode("%C0%A0")

    def test_plain_ascii_values_are_sent_unchanged(self) -> None:
        """Only values that need it are encoded: ids, times and types go out as they are."""
        ev = event(stream="s-1")
        plain = cloudevents.binary_headers(ev)
        assert cloudevents.binary_headers(ev, percent=True) == plain


class TestProgress:
    async def test_a_cut_send_keeps_every_answered_post(self, receiver: WebhookReceiver) -> None:
        """Each POST answered 2xx is recorded in the send's progress as its answer arrives: a send
        cancelled midway (attempt_timeout, shutdown) keeps them, so the relay never posts them again."""

        async def slow(req: WebhookRequest) -> int:
            await asyncio.sleep(0.05)
            return 204

        receiver.respond = slow
        t = make_transport(receiver.url)
        await t.open()
        batch = messages(t, [event("a", i) for i in range(20)])
        progress = Progress()
        try:
            with sending(progress):
                task = asyncio.create_task(t.send(batch))
                assert await receiver.wait_for(3, timeout=5)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        finally:
            await t.close()
        kept = [m.event.id for m in batch if isinstance(progress.outcome(m), Delivered)]
        accepted = [e.id for e in receiver.events()]
        assert len(kept) >= 3 and kept == accepted[: len(kept)] and len(accepted) < len(batch)
