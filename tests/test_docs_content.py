"""What the docs were found to leave out or get wrong (issue 31) is written down, and stays so."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from outrelay.core.consumer.consumer_dlq import ConsumerDeadLetter

DOCS = Path(__file__).parents[1] / "docs"


def text(name: str) -> str:
    return " ".join((DOCS / name).read_text().split())  # one line: phrases may wrap anywhere


def test_how_events_reach_a_subscriber() -> None:
    """subscribers.md says what reaches the in-process bus (a relay in another process never does) and how
    subscribers of a relay's events name a broker."""
    doc = text("subscribers.md")
    assert "What reaches the in-process bus." in doc
    assert "A relay in another process (`outrelay run`) never reaches it" in doc and "[bus] destination" in doc


def test_consumer_dead_letter_fields_and_non_events() -> None:
    """Every field `dlq list --consumer --json` prints is in the table of subscribers.md, and what a dead
    letter of a message that is not an event looks like is said."""
    doc = (DOCS / "subscribers.md").read_text()
    fields = [f.name for f in dataclasses.fields(ConsumerDeadLetter) if f.name not in ("body", "content_type")]
    table = doc.split("`dlq list --consumer NAME --json` prints one object per dead letter", 1)[1].split("\n\n")[1]
    missing = [f for f in fields if f"`{f}`" not in table]
    assert not missing, missing
    assert "A **non-event dead letter**" in doc and "(not an event)" in doc


def test_history_reads_and_upcasters_for_the_cli() -> None:
    """replay.md gives scan's filters (stream= included) and how the command line finds upcasters without
    an entry point (OUTRELAY_PLUGINS)."""
    doc = text("replay.md")
    assert "`scan(store, *, stream=, types=, tenant=, since=, until=, after=, limit=)`" in doc
    assert "`OUTRELAY_PLUGINS` names plugin modules" in doc and "the only way the CLI finds upcasters" in doc


def test_webhook_retry_rule() -> None:
    """design.md says a retry keeps its webhook-id and gets a fresh timestamp and signature."""
    doc = text("design.md")
    assert "same `webhook-id` (the event id)" in doc and "fresh `webhook-timestamp`" in doc
    assert "dedupe on `webhook-id`, never on the signature" in doc


def test_byte_layouts_are_exact() -> None:
    """encryption.md gives the content type length's byte order and both AADs; audit.md what the hash and
    the MAC cover, byte for byte."""
    enc = text("encryption.md")
    assert "the length of the original content type in 2 bytes, **big-endian**" in enc
    assert "The **AAD** of the wrapped DEK is the bytes `outrelay/dek/v1`, one zero byte and the key name" in enc
    audit = text("audit.md")
    assert "What the hash covers, byte for byte" in audit and "`mac` is the HMAC-SHA256 of the hash's" in audit


def test_no_claims_the_code_contradicts() -> None:
    """The statements found false are gone: tail and from_config do load the [crypto] keys, from_config does
    read [tracing], and check does read the keys."""
    enc, tracing = text("encryption.md"), text("tracing.md")
    assert not re.search(r"`outrelay tail` do not load the keys|`EventBus\.from_config` does not do it", enc)
    assert "`outrelay check` does not read them yet" not in enc
    assert "`EventBus.from_config` does not read `[tracing]`" not in tracing
