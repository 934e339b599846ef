"""The conformance suite as a test class a transport author subclasses.

::

    class TestMyTransport(ConformanceSuite):
        @pytest.fixture
        def conformance_target(self) -> ConformanceTarget:
            return ConformanceTarget(make_transport=lambda target: MyTransport(MyConfig(topic=target)))

Each ``test_<check>`` method runs one check of :data:`~outrelay.conformance.CHECKS`
against a fresh target (``orconf-<check>-<uuid8>``), so checks are isolated
and can run in any order. A check passes, fails with a message saying what
the transport did wrong, or skips with the reason (a capability the transport
does not declare, or a missing ``make_unreachable``). Override a method to
adapt one check (e.g. mark it ``xfail`` with the reason) — the report still
lists it. Every call into the transport is bounded by
``ConformanceTarget.timeout`` and every read by ``read_timeout``, so a broken
transport fails fast instead of hanging the run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import outrelay.conformance._checks_binding as _checks_binding
import outrelay.conformance._checks_faults as _checks_faults
import outrelay.conformance._checks_fidelity as _checks_fidelity
import outrelay.conformance._checks_flow as _checks_flow
import outrelay.conformance._checks_inproc as _checks_inproc
import outrelay.conformance._checks_lifecycle as _checks_lifecycle
import outrelay.conformance._checks_netfaults as _checks_netfaults
import outrelay.conformance._checks_robustness as _checks_robustness
import outrelay.conformance._checks_security as _checks_security
from outrelay.conformance._harness import run_check
from outrelay.conformance._suite_subscription import SubscriptionChecks
from outrelay.conformance._target import ConformanceTarget

__all__ = ["ConformanceSuite"]

CT = ConformanceTarget
Req = pytest.FixtureRequest
# importing them registers the checks, in this order (the report's rows)
_REGISTERED = (
    _checks_fidelity,
    _checks_flow,
    _checks_lifecycle,
    _checks_faults,
    _checks_security,
    _checks_robustness,
    _checks_binding,
    _checks_inproc,
    _checks_netfaults,
)


class ConformanceSuite(SubscriptionChecks):
    """Subclass in a test module and provide a ``conformance_target`` fixture
    returning a :class:`~outrelay.conformance.ConformanceTarget`. The consumer-side
    checks come from :class:`~outrelay.conformance._suite_subscription.SubscriptionChecks`."""

    # -- Fidelity ----------------------------------------------------------------------------------

    def test_payload_empty(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """An event with empty data is delivered and read back with empty data."""
        run_check(conformance_target, "payload_empty", tmp_path, request.node)

    def test_payload_binary(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Binary data that is not UTF-8 (every byte value, NULs included) round-trips byte for byte."""
        run_check(conformance_target, "payload_binary", tmp_path, request.node)

    def test_payload_unicode(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Text data with non-ASCII characters (accents, CJK, emoji) round-trips as the same UTF-8 bytes."""
        run_check(conformance_target, "payload_unicode", tmp_path, request.node)

    def test_payload_json(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Compact JSON data round-trips byte for byte and decodes to the same value."""
        run_check(conformance_target, "payload_json", tmp_path, request.node)

    def test_payload_max_size(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Data of exactly the declared max_message_bytes is delivered and read back intact."""
        run_check(conformance_target, "payload_max_size", tmp_path, request.node)

    def test_payload_over_max_rejected(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Data one byte over max_message_bytes is Rejected (permanent) and never delivered."""
        run_check(conformance_target, "payload_over_max_rejected", tmp_path, request.node)

    def test_metadata_roundtrip(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Metadata (string map passed through as headers/extensions) round-trips exactly, keys and values."""
        run_check(conformance_target, "metadata_roundtrip", tmp_path, request.node)

    def test_content_type(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """The content type of each event (JSON, text with charset, binary, vendor types) comes back unchanged."""
        run_check(conformance_target, "content_type", tmp_path, request.node)

    def test_cloudevents_envelope(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Every envelope field (id, type, source, time, stream, tenant, ids, versions, subject, labels, tags, content
        type, metadata, sequence) round-trips, and unset optional fields come back unset."""
        run_check(conformance_target, "cloudevents_envelope", tmp_path, request.node)

    def test_cloudevents_binding(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """The raw headers/body decode with the CloudEvents binding, in a declared mode, to the event that was sent."""
        run_check(conformance_target, "cloudevents_binding", tmp_path, request.node)

    def test_unicode_attributes(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Non-ASCII stream, subject, tenant, labels and metadata round-trip exactly."""
        run_check(conformance_target, "unicode_attributes", tmp_path, request.node)

    def test_event_id(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Event ids of every allowed shape (UUIDv7, 200 characters, punctuation) come back as sent."""
        run_check(conformance_target, "event_id", tmp_path, request.node)

    def test_ordering_key(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """The ordering key the reader reports (Received.key) is the event's stream."""
        run_check(conformance_target, "ordering_key", tmp_path, request.node)

    # -- Batches, order, concurrency, dedupe, end to end -------------------------------------------

    def test_batch_send(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """A batch of several messages gives one Delivered per message, in order, and all are read back."""
        run_check(conformance_target, "batch_send", tmp_path, request.node)

    def test_batch_partial_failure(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """In a batch with one oversized message, that one is Rejected and every other message is Delivered."""
        run_check(conformance_target, "batch_partial_failure", tmp_path, request.node)

    def test_ordered_batch_halts_key(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """With ordered_batches, once a message of a key fails no later message of that key in the batch is delivered
        (RetryLater), while other keys go through."""
        run_check(conformance_target, "ordered_batch_halts_key", tmp_path, request.node)

    def test_per_key_order(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Order per key holds with 16 keys interleaved, several concurrent send() calls in flight (each with different
        keys), and several messages per key in one batch when ordered_batches is declared."""
        run_check(conformance_target, "per_key_order", tmp_path, request.node)

    def test_concurrent_senders(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Eight tasks sending on one transport at once lose, duplicate and (per key) reorder nothing."""
        run_check(conformance_target, "concurrent_senders", tmp_path, request.node)

    def test_dedupe_same_id(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """With native_dedupe, sending the same event id twice is accepted both times and read back once."""
        run_check(conformance_target, "dedupe_same_id", tmp_path, request.node)

    def test_end_to_end_relay(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Outbox (SQLite) -> Relay.run(drain=True) -> transport -> reader: a few hundred events over several streams
        all arrive, each once, in order per stream when ordering_by_key."""
        run_check(conformance_target, "end_to_end_relay", tmp_path, request.node)

    # -- Lifecycle and error classification --------------------------------------------------------

    def test_open_close(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """open(), send and read one message, then close() completes without error."""
        run_check(conformance_target, "open_close", tmp_path, request.node)

    def test_close_twice(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """close() is idempotent: on a never-opened transport, and twice after open()."""
        run_check(conformance_target, "close_twice", tmp_path, request.node)

    def test_send_after_close(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """send() after close() raises outrelay.UsageError instead of sending or hanging."""
        run_check(conformance_target, "send_after_close", tmp_path, request.node)

    def test_start_while_broker_down(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Against a broker that is down, open() raises RetryableError within the bound, or (lazy connect) send()
        reports RetryLater/raises RetryableError; close() then works."""
        run_check(conformance_target, "start_while_broker_down", tmp_path, request.node)

    def test_check_unreachable(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """check() against a broker that is down raises a TransportError with a message, within the bound."""
        run_check(conformance_target, "check_unreachable", tmp_path, request.node)

    def test_malformed_target(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """A target the broker cannot accept (spaces, NUL, wildcards) yields outrelay errors or per-message results,
        never a vendor exception or a hang."""
        run_check(conformance_target, "malformed_target", tmp_path, request.node)

    # -- Faults through a TCP proxy the suite controls (hooks: upstream, make_transport_via) ---------------------------

    def test_fault_cut_idle(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """After open(), the proxy drops every connection; the next batch is Delivered or retryable, everything
        Delivered is readable, and resends succeed once the transport reconnects by itself."""
        run_check(conformance_target, "fault_cut_idle", tmp_path, request.node)

    def test_fault_reset_idle(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """After open(), the proxy resets every connection (TCP RST); the next batch is Delivered or retryable, never a
        vendor exception, and the transport recovers by itself."""
        run_check(conformance_target, "fault_reset_idle", tmp_path, request.node)

    def test_fault_cut_mid_batch(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """The connection is cut halfway through a batch: results are Delivered or retryable, every Delivered is
        readable, per key a tail is lost but never a hole, and resending the rest succeeds."""
        run_check(conformance_target, "fault_cut_mid_batch", tmp_path, request.node)

    def test_fault_reset_mid_batch(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """The connection is reset (RST) halfway through a batch: the same guarantees as a cut."""
        run_check(conformance_target, "fault_reset_mid_batch", tmp_path, request.node)

    def test_fault_stall_mid_batch(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """The link goes silent halfway through a batch: send() returns within the bound with retryable results, and
        after the link heals everything Delivered is readable and the rest goes through."""
        run_check(conformance_target, "fault_stall_mid_batch", tmp_path, request.node)

    def test_fault_black_hole_send(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """While the network is a black hole (connections accepted, nothing answered), send() returns within the bound
        with RetryLater or RetryableError; after it heals, resends succeed."""
        run_check(conformance_target, "fault_black_hole_send", tmp_path, request.node)

    def test_fault_black_hole_open(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """open() through a black hole raises RetryableError within the bound (or connects lazily and the first send()
        is retryable within the bound); close() then returns promptly."""
        run_check(conformance_target, "fault_black_hole_open", tmp_path, request.node)

    def test_fault_black_hole_check(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """check() through a black hole raises a TransportError with a message within the bound (no hang)."""
        run_check(conformance_target, "fault_black_hole_check", tmp_path, request.node)

    # -- Security: hostile values, secrets, credentials without permission (hooks: secret, make_forbidden) -------------

    def test_hostile_attributes(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Attribute values that look like header injection (``a: b``, ``%0D%0A``, ``;``, quotes), very long values and
        non-ASCII text round-trip exactly or are Rejected, and never add a header of their own."""
        run_check(conformance_target, "hostile_attributes", tmp_path, request.node)

    def test_secret_never_leaks(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """The secret the transport is configured with never appears in results, exceptions, check() output, reprs or
        log records — also against a broker that is down and with credentials that may not publish."""
        run_check(conformance_target, "secret_never_leaks", tmp_path, request.node)

    def test_forbidden_send_permanent(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """With credentials that may not publish, open() or send() fails permanently (Rejected or a non-retryable error)
        within the bound: never Delivered, never retried for ever."""
        run_check(conformance_target, "forbidden_send_permanent", tmp_path, request.node)

    def test_forbidden_check_says_what(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """check() with credentials that may not publish raises a TransportError within the bound whose message says
        what to fix (permission, credentials, access...)."""
        run_check(conformance_target, "forbidden_check_says_what", tmp_path, request.node)

    # -- Robustness: refused targets, throttling, retries, dedupe over time, reopen, sockets ---------------------------

    def test_refused_target_mixed(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """In a batch mixing messages for a target the broker refuses with messages for a good target, the refused ones
        are Rejected (permanent) and every other one is Delivered and read back."""
        run_check(conformance_target, "refused_target_mixed", tmp_path, request.node)

    def test_throttle_retry_after(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """A broker that throttles answers RetryLater carrying its retry hint (retry_after, in seconds)."""
        run_check(conformance_target, "throttle_retry_after", tmp_path, request.node)

    def test_retry_keeps_event_id(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """A retry (Message.attempt > 1) carries the same event: same id and fields; with native_dedupe a first attempt
        and its retry are read back once."""
        run_check(conformance_target, "retry_keeps_event_id", tmp_path, request.node)

    def test_dedupe_after_delay(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """With native_dedupe, a resend 1.5 s later, after 50 other messages, is still recognised (read back once):
        dedupe holds over its declared window, not only for an immediate resend."""
        run_check(conformance_target, "dedupe_after_delay", tmp_path, request.node)

    def test_reopen_after_close(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """open() after close() works: the reopened transport delivers, and its messages are read back."""
        run_check(conformance_target, "reopen_after_close", tmp_path, request.node)

    def test_sockets_released(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Three open/send/close cycles and two check() calls on new transport instances leave no more sockets or files
        open than before (counted in /proc/self/fd)."""
        run_check(conformance_target, "sockets_released", tmp_path, request.node)

    # -- CloudEvents protocol binding (hook: binding) ------------------------------------------------------------------

    def test_binding_rules(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """The raw headers/body follow the declared CloudEvents binding: attribute prefix, valid attribute names,
        percent-encoding where the binding wants it, datacontenttype in its carrier, or structured mode only."""
        run_check(conformance_target, "binding_rules", tmp_path, request.node)

    def test_binding_sdk_decode(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """The CloudEvents SDK's own binding (HTTP, Kafka or AMQP, as declared) decodes every raw message to the event
        that was sent: attributes, extensions and data."""
        run_check(conformance_target, "binding_sdk_decode", tmp_path, request.node)

    # -- Inside the process, delivery semantics, and the v3 network faults --------------------------------------------

    def test_cancel_mid_batch(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """A send cancelled mid-batch raises CancelledError, nothing it reported Delivered is missing, and the transport
        is usable afterwards (or closed itself and opens again)."""
        run_check(conformance_target, "cancel_mid_batch", tmp_path, request.node)

    def test_instances_isolated(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Two instances, each for a target of its own, sending at once: every message lands in its own target only."""
        run_check(conformance_target, "instances_isolated", tmp_path, request.node)

    def test_batch_left_unchanged(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """send() leaves the caller's batch as it was: same list, same order, same messages and events."""
        run_check(conformance_target, "batch_left_unchanged", tmp_path, request.node)

    def test_durable_late_reader(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """With delivery = at_least_once, messages sent while no reader is attached are found by a reader attached
        afterwards."""
        run_check(conformance_target, "durable_late_reader", tmp_path, request.node)

    def test_connect_black_hole(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Where TCP connections never complete, open() and check() fail within the bound (a connect timeout)."""
        run_check(conformance_target, "connect_black_hole", tmp_path, request.node)

    def test_fault_reply_lost(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """A reply lost after the broker applied the send: retryable results, resends succeed, with native_dedupe the
        event is stored once."""
        run_check(conformance_target, "fault_reply_lost", tmp_path, request.node)
