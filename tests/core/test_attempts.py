"""The delivery-attempt log: written in the settle, read by `outrelay attempts`, pruned, and `outrelay retry`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from outrelay import Event, Outbox, Relay
from outrelay.core.config.config import AttemptsConfig
from outrelay.core.contract.transport import Delivered, NotSent, Rejected, RetryLater
from outrelay.core.relay.attempts import AttemptLog, encode_detail
from outrelay.core.stores.base import Settlement, Store
from outrelay.transports.webhook.receiver import WebhookReceiver
from tests.cli.conftest import Cli, cli_here  # noqa: F401 - fixture
from tests.stores.conftest import pg_schema, pg_url, store  # noqa: F401 - fixtures
from tests.transports.webhook_support import SECRET

T0 = 1_000_000.0


@pytest.fixture(params=["sqlite", "postgres"])
def outbox_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty outbox of each kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'outbox.db'}"
    else:
        yield pg_url(request.getfixturevalue("pg_schema"))


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver(secrets=SECRET) as rx:
        yield rx


def _config(tmp_path: Path, url: str, hook_url: str, **attempts: Any) -> Path:
    """Write outrelay.toml (one webhook destination, fast retries, the attempt log on unless
    ``enabled`` is given) and return its path."""
    attempts.setdefault("enabled", True)
    lines = [
        "[outbox]", f'url = "{url}"', "[relay]", "poll_interval = 0.05",
        "[destinations.hooks]", 'transport = "webhook"', f'url = "{hook_url}"', f'secret = "{SECRET}"',
        "allow_private_network = true", "batch_size = 1",
        "[destinations.hooks.retry]", "initial_delay = 0.05", "max_delay = 0.1", "max_attempts = 5", "jitter = 0",
        "[attempts]", *(f"{k} = {json.dumps(v)}" for k, v in attempts.items()),
    ]  # fmt: skip
    path = tmp_path / "outrelay.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


async def _drain(path: Path) -> None:
    from outrelay.core.config.config import load_config

    cfg = load_config(path)
    outbox = Outbox.open(cfg.outbox.url)
    try:
        await asyncio.wait_for(Relay(outbox, cfg).run(drain=True), 30)
    finally:
        outbox.close()


def _append(url: str, *events: Event) -> None:
    outbox = Outbox.open(url)
    try:
        outbox.append(list(events))
    finally:
        outbox.close()


async def test_500_500_200_leaves_three_attempts_with_status_codes_and_latencies(
    tmp_path: Path,
    outbox_url: str,
    receiver: WebhookReceiver,
    cli_here: Cli,  # noqa: F811
) -> None:
    """A receiver answering 500, 500, then 200 leaves three attempts, newest first, with their
    outcomes, status codes and latencies in `outrelay attempts --event ID --json`."""
    answers = iter([500, 500, 200])
    receiver.respond = lambda req: next(answers)
    _config(tmp_path, outbox_url, receiver.url)
    e = Event(type="order.created", stream="o-1", data={"n": 1})
    other = Event(type="order.created", stream="o-2", data={"n": 2})
    _append(outbox_url, e)
    await _drain(tmp_path / "outrelay.toml")
    receiver.respond = lambda req: 204
    _append(outbox_url, other)
    await _drain(tmp_path / "outrelay.toml")

    out = cli_here("attempts", "--event", e.id, "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["outcome"] for r in rows] == ["delivered", "retry", "retry"]
    assert [r["attempt"] for r in rows] == [3, 2, 1]
    assert [r["detail"]["status"] for r in rows] == [200, 500, 500]
    assert all(r["latency"] > 0 and r["event_id"] == e.id and r["destination"] == "hooks" for r in rows)
    assert rows[1]["error"] and "500" in rows[1]["error"] and rows[0]["error"] is None
    assert rows[0]["at"] >= rows[1]["at"] >= rows[2]["at"]

    by_stream = json.loads(cli_here("attempts", "--stream", "o-2", "--json").stdout)
    assert [(r["event_id"], r["outcome"], r["detail"]["status"]) for r in by_stream] == [(other.id, "delivered", 204)]
    assert len(json.loads(cli_here("attempts", "--destination", "hooks", "--json").stdout)) == 4
    assert json.loads(cli_here("attempts", "--since", "1h", "--limit", "2", "--json").stdout)[0]["event_id"] == other.id
    assert json.loads(cli_here("attempts", "--since", "2999-01-01T00:00:00Z", "--json").stdout) == []
    text = cli_here("attempts", "--event", e.id)
    assert text.returncode == 0 and text.stdout.count("status=500") == 2 and "status=200" in text.stdout


async def test_the_off_switch_writes_nothing(
    tmp_path: Path,
    receiver: WebhookReceiver,
    cli_here: Cli,  # noqa: F811
) -> None:
    """With [attempts] enabled = false nothing is recorded, and the command says why it shows none."""
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    _config(tmp_path, url, receiver.url, enabled=False)
    _append(url, Event(type="t", stream="s", data={}))
    await _drain(tmp_path / "outrelay.toml")
    assert len(receiver.accepted()) == 1
    out = cli_here("attempts")
    assert out.returncode == 0 and "no attempts logged ([attempts] enabled = false" in out.stdout


async def test_retry_sends_a_dead_lettered_event_again(
    tmp_path: Path,
    outbox_url: str,
    receiver: WebhookReceiver,
    cli_here: Cli,  # noqa: F811
) -> None:
    """A rejected (dead-lettered) event is sent again by `outrelay retry --event ID`; the log shows both
    attempts. A delivered event is left alone without --redeliver (exit 2, one line)."""
    receiver.respond = lambda req: 400
    _config(tmp_path, outbox_url, receiver.url)
    e = Event(type="t", stream="s", data={})
    _append(outbox_url, e)
    await _drain(tmp_path / "outrelay.toml")

    out = cli_here("retry", "--event", e.id)
    assert out.returncode == 0 and "hooks: event" in out.stdout and "queued again" in out.stdout, out.stderr
    receiver.respond = lambda req: 204
    await _drain(tmp_path / "outrelay.toml")
    rows = json.loads(cli_here("attempts", "--event", e.id, "--json").stdout)
    assert [(r["outcome"], r["detail"]["status"]) for r in rows] == [("delivered", 204), ("rejected", 400)]

    again = cli_here("retry", "--event", e.id)
    assert again.returncode == 1 and "--redeliver" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    forced = cli_here("retry", "--event", e.id, "--redeliver", "--destination", "hooks")
    assert forced.returncode == 0 and "queued again" in forced.stdout
    await _drain(tmp_path / "outrelay.toml")
    assert len(receiver.accepted()) == 2
    unknown = cli_here("retry", "--event", "no-such-event")
    assert unknown.returncode == 2 and "no event with id" in unknown.stderr


async def test_retry_makes_an_event_waiting_in_backoff_due_now(
    tmp_path: Path,
    outbox_url: str,
    receiver: WebhookReceiver,
    cli_here: Cli,  # noqa: F811
) -> None:
    """An event waiting an hour in backoff is made due at once and the next run delivers it."""
    receiver.respond = lambda req: 503
    path = _config(tmp_path, outbox_url, receiver.url)
    path.write_text(path.read_text().replace("initial_delay = 0.05", "initial_delay = 3600"))
    path.write_text(path.read_text().replace("max_delay = 0.1", "max_delay = 3600"))
    e = Event(type="t", stream="s", data={})
    _append(outbox_url, e)
    await _drain(path)  # one attempt; the retry is due in an hour, beyond drain_retry_bound
    receiver.respond = lambda req: 204
    out = cli_here("retry", "--event", e.id)
    assert out.returncode == 0 and "hooks: event" in out.stdout and "due now" in out.stdout, out.stderr
    await _drain(path)
    rows = json.loads(cli_here("attempts", "--event", e.id, "--json").stdout)
    assert [r["outcome"] for r in rows] == ["delivered", "retry"]


def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path,
    cli_here: Cli,  # noqa: F811
) -> None:
    """A --since that is no time and an unknown --destination are usage errors, without a traceback."""
    _config(tmp_path, f"sqlite:///{tmp_path / 'outbox.db'}", "http://127.0.0.1:9/hook")
    Outbox.open(f"sqlite:///{tmp_path / 'outbox.db'}").close()
    bad = cli_here("attempts", "--since", "yesterday")
    assert bad.returncode == 2 and "--since 'yesterday'" in bad.stderr and "Traceback" not in bad.stderr
    dest = cli_here("retry", "--event", "x", "--destination", "nope")
    assert dest.returncode == 2 and "unknown destination 'nope'" in dest.stderr
    neither = cli_here("retry")
    assert neither.returncode == 2 and "--event ID" in neither.stderr
    assert cli_here("retry", "--event", "x", "--redeliver").returncode == 2


# -- the store side: retention ----------------------------------------------------------------------


def _settle_attempts(
    db: Store, n_events: int, attempts_each: int, at: float, stream: str = "s", *, log: bool = True
) -> list[str]:
    """Append ``n_events`` events, then settle ``attempts_each`` retried attempts of each (the last one
    delivered), each with its attempt-log row unless ``log`` is false."""
    events = db.append([Event(type="t", stream=f"{stream}{i}", data={}) for i in range(n_events)])
    db.route(lambda e: ["d"], 1000, at)
    for k in range(1, attempts_each + 1):
        claimed = db.claim("d", limit=100, per_lane=1, owner="o", lease_seconds=60, now=at + 10 * k)
        last = k == attempts_each
        kind: Any = "delivered" if last else "retry"
        settlements = [
            Settlement(c.delivery_id, c.event.stream, kind, k, at + 10 * k + 1, None if last else "503")
            for c in claimed
        ]
        rows = [
            (at + 10 * k, c.event.id, c.event.sequence or 0, "d", c.event.stream, k, kind, 0.01,
             "" if last else "503", "")
            for c in claimed
        ]  # fmt: skip
        db.settle("d", "o", settlements, at + 10 * k, **({"attempts": rows} if log else {}))
    return [e.id for e in events]


def test_retention_by_age_removes_old_attempts_and_nothing_else(
    store: Store,  # noqa: F811
) -> None:
    """prune_attempts deletes the attempts logged before the cutoff, in batches, and keeps the rest."""
    old = _settle_attempts(store, 3, 2, T0, "old")  # attempts at T0+10 and T0+20
    new = _settle_attempts(store, 2, 1, T0 + 1000, "new")  # at T0+1010
    assert len(store.attempts(limit=100)) == 8  # type: ignore[attr-defined]
    assert store.prune_attempts(T0 + 15, batch=2) == 2  # type: ignore[attr-defined]
    assert store.prune_attempts(T0 + 15, batch=100) == 1  # type: ignore[attr-defined]
    assert store.prune_attempts(T0 + 15, batch=100) == 0  # type: ignore[attr-defined]
    rows = store.attempts(limit=100)  # type: ignore[attr-defined]
    assert sorted((r[2], r[6]) for r in rows) == sorted([*((i, 2) for i in old), *((i, 1) for i in new)])
    assert store.prune_attempts(T0 + 25, batch=100) == 3  # type: ignore[attr-defined]
    assert sorted(r[2] for r in store.attempts(limit=100)) == sorted(new)  # type: ignore[attr-defined]


def test_retention_by_count_keeps_the_newest_per_event(
    store: Store,  # noqa: F811
) -> None:
    """With keep_per_event = 3, an event attempted 5 times keeps its last 3; other events keep theirs."""
    store.attempts_keep = 3  # type: ignore[attr-defined]
    many = _settle_attempts(store, 1, 5, T0, "many")
    few = _settle_attempts(store, 2, 2, T0, "few")
    rows = store.attempts(event_id=many[0], limit=100)  # type: ignore[attr-defined]
    assert [r[6] for r in rows] == [5, 4, 3] and rows[0][7] == "delivered"
    for event_id in few:
        assert [r[6] for r in store.attempts(event_id=event_id, limit=100)] == [2, 1]  # type: ignore[attr-defined]


def test_the_store_writes_nothing_when_off(
    store: Store,  # noqa: F811
) -> None:
    """Settles without attempts (the relay's with the log off) leave no row."""
    _settle_attempts(store, 2, 2, T0, log=False)
    assert store.attempts(limit=100) == []  # type: ignore[attr-defined]


# -- the relay side: which results become which rows -------------------------------------------------


def test_mark_maps_results_to_outcomes_and_skips_what_was_not_sent(
    store: Store,  # noqa: F811
) -> None:
    """Delivered, retry, rejected and exhausted map to their outcomes; a NotSent message has no row;
    a mapping detail is JSON with its strings cut to detail_bytes."""
    events = store.append([Event(type="t", stream=f"s{i}", data={}) for i in range(5)])
    store.route(lambda e: ["d"], 100, T0)
    claimed = store.claim("d", limit=10, per_lane=1, owner="o", lease_seconds=60, now=T0)
    assert [c.event.id for c in claimed] == [e.id for e in events]
    results = [
        Delivered(detail={"status": 200, "body": "x" * 100}),
        RetryLater("503", detail={"status": 503}),
        Rejected("400", detail="bad request"),
        RetryLater("503 again"),
        NotSent("behind a failed one"),
    ]
    kinds = ["delivered", "retry", "dead", "dead", "hold"]
    settlements = [
        Settlement(c.delivery_id, c.event.stream, k, 1 if k != "delivered" else 0)
        for c, k in zip(claimed, kinds, strict=True)
    ]
    marked = AttemptLog(AttemptsConfig(detail_bytes=10)).mark("d", claimed, results, settlements, T0, 0.25)
    assert [a[6] for a in marked] == ["delivered", "retry", "rejected", "dead-lettered"]  # NotSent: no row
    first = marked[0]  # (at, event_id, event_seq, destination, stream, attempt, outcome, latency, error, detail)
    assert json.loads(first[9]) == {"status": 200, "body": "x" * 10}
    assert first[5] == 1 and first[7] == 0.25 and first[0] == T0 and first[1] == events[0].id and first[8] == ""
    assert marked[2][9] == "bad request"[:10] and marked[2][8] == "400"
    assert encode_detail(None, 5) == "" and time.time() > 0


def test_the_webhook_gives_each_result_its_status_and_a_bounded_answer_excerpt() -> None:
    """classify() puts the status and the first 512 bytes of the answer's body in every result's detail."""
    from outrelay.transports.webhook._answers import classify

    failed = classify(500, {}, "http://127.0.0.1:9/hook", b"x" * 2000)
    assert isinstance(failed, RetryLater) and failed.detail == {"status": 500, "body": "x" * 512}
    ok = classify(200, {}, "http://127.0.0.1:9/hook", b'{"ok": true}')
    assert isinstance(ok, Delivered) and ok.detail == {"status": 200, "body": '{"ok": true}'}
    assert ok == Delivered()  # the detail is no part of equality
    refused = classify(410, {}, "http://127.0.0.1:9/hook", b"")
    assert isinstance(refused, Rejected) and refused.detail == {"status": 410, "body": ""}


def test_plain_delivered_rows_of_missing_or_repeated_events_are_still_logged(
    store: Store,  # noqa: F811
) -> None:
    """A batch of plain delivered attempts logs one row per attempt given, with each event's id and
    stream, including an event listed twice and one no longer in the outbox (inserted as given).
    (The SQLite store's path that takes a batch's plain rows from the events' rows.)"""
    if type(store).__name__ != "SQLiteStore":
        pytest.skip("the SQLite store's INSERT ... SELECT path")
    events = store.append([Event(type="t", stream=f"s{i}", data={}) for i in range(3)])
    seqs = [e.sequence or 0 for e in events]
    rows: list[Any] = [
        (T0, e.id, seq, "d", e.stream, 1, "delivered", 0.01, "", "") for e, seq in zip(events, seqs, strict=True)
    ]
    rows.append(rows[0])  # the same event twice
    rows.append((T0, "gone-id", 10_000, "d", "gone-stream", 1, "delivered", 0.01, "", ""))  # not in the outbox
    rows.append((T0, events[1].id, seqs[1], "d", events[1].stream, 2, "retry", 0.01, "503", ""))  # not plain
    store.settle("d", "o", [], T0, attempts=rows)
    got = store.attempts(limit=100)  # type: ignore[attr-defined]
    logged = sorted((r[2], r[3], r[5], r[6], r[7]) for r in got)
    assert logged == sorted((r[1], r[2], r[4], r[5], r[6]) for r in rows)


def test_mark_says_when_every_row_is_plain_and_the_store_logs_those_rows_as_any_other(
    store: Store,  # noqa: F811
) -> None:
    """AttemptRows.plain/seqs are set only for a batch of plain delivered attempts of one attempt
    number; a store logs such rows exactly as it logs the same tuples in a plain list."""
    events = store.append([Event(type="t", stream=f"s{i % 2}", data={}) for i in range(4)])
    store.route(lambda e: ["d"], 100, T0)
    claimed = store.claim("d", limit=10, per_lane=10, owner="o", lease_seconds=60, now=T0)
    settlements = [Settlement(c.delivery_id, c.event.stream, "delivered") for c in claimed]
    log = AttemptLog(AttemptsConfig())
    marked = log.mark("d", claimed, [Delivered()] * 4, settlements, T0, 0.25)
    assert marked.plain == (T0, 1, 0.25) and marked.seqs == [c.event.sequence for c in claimed]
    detailed = log.mark(
        "d", claimed, [Delivered(), Delivered(detail="x"), Delivered(), Delivered()], settlements, T0, 0.25
    )
    assert detailed.plain is None and detailed.seqs == [] and len(detailed) == 4
    failed = [Settlement(claimed[0].delivery_id, claimed[0].event.stream, "retry", 1, T0 + 1, "503")]
    assert log.mark("d", claimed[:1], [RetryLater("503")], failed, T0, 0.25).plain is None
    store.attempts_keep = 1  # type: ignore[attr-defined]
    store.settle("d", "o", settlements, T0, attempts=marked)  # the AttemptRows path
    got = store.attempts(limit=100)  # type: ignore[attr-defined]
    assert sorted(r[2] for r in got) == sorted(e.id for e in events) and {r[6] for r in got} == {1}
    if type(store).__name__ == "SQLiteStore":  # the same tuples in a plain list: its row-by-row check
        store.settle("e", "o", [], T0, attempts=[(*r[:3], "e", *r[4:]) for r in marked])
        got = store.attempts(limit=100)  # type: ignore[attr-defined]
        by_dest = {d: sorted(r[1:4] + r[5:] for r in got if r[4] == d) for d in ("d", "e")}
        assert len(by_dest["d"]) == 4 and by_dest["d"] == by_dest["e"]
