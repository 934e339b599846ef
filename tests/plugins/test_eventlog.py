"""Event logs: one structured line per published event (seed §23)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.cli._jsonlog import JsonFormatter, TextFormatter
from outrelay.core.config.hookspecs import hookimpl
from outrelay.core.contract.transport import Delivered, Message, Rejected, RetryLater
from outrelay.core.model.errors import ConfigError
from outrelay.plugins.eventlog import LOGGER_NAME, EventLines, EventLog, sampled

SEED_FIELDS = ("eventId", "workflowId", "executionId", "tenantId", "eventType", "producer", "timestamp")


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """The ``outrelay.events`` logger at INFO, formatted as ``outrelay run --log-format json`` does."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(LOGGER_NAME)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


def _config(tmp_path: Path, **event_log: Any) -> Any:
    return parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 0.05},
            "destinations": {"mem": {"transport": "memory", "broker": "m", "reject_types": ["bad"]}},
            "event_log": event_log,
        }
    )


async def _relay_drain(tmp_path: Path, events: list[Event], **event_log: Any) -> None:
    cfg = _config(tmp_path, **event_log)
    outbox = Outbox.open(cfg.outbox.url)
    outbox.append(events)
    await Relay(outbox, cfg).run(drain=True)
    outbox.close()


class TestRelayEventLog:
    async def test_every_published_event_has_one_json_line(self, tmp_path: Path, json_lines: io.StringIO) -> None:
        """Each event the relay published gives exactly one valid JSON line with the seed fields; rejected ones none."""
        events = [
            Event(
                type="workflow.started",
                stream=f"exec-{i % 4}",
                tenant="acme",
                source="engine",
                labels={"workflowId": "wf-9"},
            )
            for i in range(40)
        ] + [Event(type="bad", stream="x")]
        await _relay_drain(tmp_path, events)
        lines = _lines(json_lines)
        assert sorted(d["eventId"] for d in lines) == sorted(e.id for e in events[:40])
        for d in lines:
            assert set(SEED_FIELDS) <= d.keys()
            assert d["logger"] == LOGGER_NAME and d["level"] == "info" and d["msg"] == "published"
        by_id = {e.id: e for e in events}
        first = lines[0]
        e = by_id[first["eventId"]]
        assert first["workflowId"] == "wf-9"
        assert first["executionId"] == e.stream
        assert first["tenantId"] == "acme"
        assert first["eventType"] == "workflow.started"
        assert first["producer"] == "engine"
        assert first["timestamp"] == e.time_text
        assert first["destination"] == "mem"

    async def test_sampling_is_deterministic_by_id(self, tmp_path: Path, json_lines: io.StringIO) -> None:
        """sample = 0.25 logs exactly the events whose id hash falls under it (about a quarter)."""
        events = [Event(type="t", stream=f"s{i % 8}") for i in range(400)]
        await _relay_drain(tmp_path, events, sample=0.25)
        logged = {d["eventId"] for d in _lines(json_lines)}
        assert logged == {e.id for e in events if sampled(e.id, 0.25)}
        assert 50 < len(logged) < 150

    async def test_disabled_in_config(self, tmp_path: Path, json_lines: io.StringIO) -> None:
        """enabled = false: no event log lines, and no EventLog registered."""
        await _relay_drain(tmp_path, [Event(type="t", stream="s")], enabled=False)
        assert json_lines.getvalue() == ""

    async def test_plugin_removed_when_the_relay_stops(self, tmp_path: Path) -> None:
        """The per-relay EventLog lives from relay start to relay stop."""
        cfg = _config(tmp_path)
        relay = Relay(Outbox.open(cfg.outbox.url), cfg)
        seen: list[bool] = []

        class Probe:
            @hookimpl(trylast=True)
            def outrelay_relay_started(self, relay: Any) -> None:
                seen.append(any(isinstance(p, EventLog) for p in relay.registry.pm.get_plugins()))

        relay.registry.pm.register(Probe())
        await relay.run(drain=True)
        relay.outbox.close()
        assert seen == [True]
        assert not any(isinstance(p, EventLog) for p in relay.registry.pm.get_plugins())

    def test_bad_sample_is_one_config_error(self, tmp_path: Path) -> None:
        """sample outside [0, 1] is a ConfigError naming the key."""
        with pytest.raises(ConfigError, match=r"event_log\.sample"):
            _config(tmp_path, sample=1.5)


class TestEventLogHook:
    def _batch(self) -> tuple[list[Message], list[Any]]:
        ev = [Event(type="t", stream=f"s{i}", id=f"id-{i}") for i in range(3)]
        return [Message(e, "t", e.stream) for e in ev], [Delivered(), RetryLater("down"), Rejected("no")]

    def test_only_delivered_results_are_logged(self, json_lines: io.StringIO) -> None:
        """Retries and rejections are not published events."""
        msgs, results = self._batch()
        EventLog().outrelay_batch_settled(destination="d", messages=msgs, results=results, elapsed=0.0)
        assert [d["eventId"] for d in _lines(json_lines)] == ["id-0"]

    def test_logger_off_costs_no_records(self) -> None:
        """Below INFO nothing is built: the hook returns before the loop."""
        logger = logging.getLogger("outrelay.events.test-off")
        logger.setLevel(logging.WARNING)
        made: list[Any] = []
        logger.makeRecord = lambda *a, **k: made.append(a)  # type: ignore[method-assign]
        msgs, results = self._batch()
        EventLog(logger=logger).outrelay_batch_settled(destination="d", messages=msgs, results=results, elapsed=0.0)
        assert made == []

    def test_other_relays_destinations_are_skipped(self, json_lines: io.StringIO) -> None:
        """An EventLog bound to destinations logs only theirs."""
        msgs, results = self._batch()
        EventLog(destinations=["mine"]).outrelay_batch_settled(
            destination="theirs", messages=msgs, results=results, elapsed=0.0
        )
        assert json_lines.getvalue() == ""

    def test_text_form_quotes_awkward_values(self) -> None:
        """The text line is key=value pairs; values with spaces or quotes are JSON-quoted, absent ones '-'."""
        e = Event(type="t", stream="exec 1", source="svc", metadata={"workflowId": 'w"1'})
        text = str(EventLines([e], "d"))
        assert text.startswith(f"published eventId={e.id} ")
        assert 'workflowId="w\\"1"' in text
        assert 'executionId="exec 1"' in text
        assert "tenantId=- " in text

    async def test_text_log_line_through_the_cli_formatter(self, tmp_path: Path) -> None:
        """In text mode (outrelay run's formatter) each event is one prefixed line carrying every seed field."""
        out = io.StringIO()
        handler = logging.StreamHandler(out)
        handler.setFormatter(TextFormatter("%(levelname)s %(name)s: %(message)s"))
        logger = logging.getLogger(LOGGER_NAME)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            events = [Event(type="t", stream=f"s{i % 2}", tenant="x") for i in range(5)]
            await _relay_drain(tmp_path, events)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(logging.NOTSET)
        lines = out.getvalue().splitlines()
        assert sorted(line.split("eventId=")[1].split()[0] for line in lines) == sorted(e.id for e in events)
        for line in lines:
            assert line.startswith(f"INFO {LOGGER_NAME}: published ")
            for key in SEED_FIELDS:
                assert f" {key}=" in line
