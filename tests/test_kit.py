"""``outrelay.kit``: the plugin author's one module — its surface, the lifecycle base, the error table."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

import outrelay.kit as kit
from outrelay.conformance.runner import load_plugin, parse_option
from outrelay.kit import (
    Delivered,
    ErrorMap,
    Event,
    LifecycleTransport,
    Message,
    PermanentError,
    Registry,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    TransportConfig,
    UsageError,
)

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "transports.md"


class TestSurface:
    def test_every_exported_name_exists_and_comes_from_outrelay(self) -> None:
        """Each name of outrelay.kit.__all__ exists and is defined inside outrelay."""
        for name in kit.__all__:
            obj = getattr(kit, name)
            if name in ("hookimpl", "STRUCTURED_CONTENT_TYPE", "Kind", "State", "outrelay_version"):
                continue
            assert getattr(obj, "__module__", "").startswith("outrelay"), name

    def test_every_kit_name_the_docs_use_is_public(self) -> None:
        """Every name docs/transports.md imports from outrelay.kit or spells outrelay.kit.X is in __all__,
        and its code never reaches into outrelay.core."""
        blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
        assert blocks, "docs/transports.md has no python code blocks"
        code = "\n".join(blocks)
        names: set[str] = set()
        for group in re.findall(r"from outrelay\.kit import \(?([^)]*?)\)?\n(?!\s)", code + "\n", re.S):
            names |= {n.strip() for n in group.replace("\n", ",").split(",") if n.strip()}
        names |= set(re.findall(r"outrelay\.kit\.([A-Za-z_]+)", code))
        assert len(names) >= 10, names
        assert sorted(names - set(kit.__all__)) == []
        assert "outrelay.core" not in code


class Probe(LifecycleTransport[TransportConfig]):
    """A transport whose broker work only counts calls (or fails on demand)."""

    name = "probe"

    def __init__(self, fail_open: BaseException | None = None, fail_send: BaseException | None = None) -> None:
        super().__init__(TransportConfig(), destination="d")
        self.calls: list[str] = []
        self.fail_open, self.fail_send = fail_open, fail_send

    async def _open(self) -> None:
        self.calls.append("open")
        if self.fail_open is not None:
            raise self.fail_open

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        self.calls.append(f"send{len(batch)}")
        if self.fail_send is not None:
            raise self.fail_send
        return [Delivered() for _ in batch]

    async def _close(self) -> None:
        self.calls.append("close")


def one() -> list[Message]:
    ev = Event(type="t", stream="s")
    return [Message(ev, "x", ev.stream)]


class TestLifecycle:
    def test_state_machine(self) -> None:
        """new → open → closed → open again; open and close are idempotent; _open/_close run once each time."""

        async def main() -> Probe:
            t = Probe()
            with pytest.raises(UsageError, match=r"probe transport \(destination 'd'\) is new, not open: call open"):
                await t.send(one())
            await t.open()
            await t.open()
            assert await t.send(one()) == [Delivered()]
            assert await t.send([]) == []
            await t.close()
            await t.close()
            with pytest.raises(UsageError, match="is closed, not open: send\\(\\) after close\\(\\)"):
                await t.send(one())
            await t.open()
            assert t.state == "open"
            await t.close()
            return t

        assert asyncio.run(main()).calls == ["open", "send1", "close", "open", "close"]

    def test_close_before_open_touches_nothing(self) -> None:
        """close() on a never-opened transport calls no _close and leaves it closed."""
        t = Probe()
        asyncio.run(t.close())
        assert t.calls == [] and t.state == "closed"

    def test_failed_open_releases_and_maps_the_error(self) -> None:
        """A vendor exception from _open becomes RetryableError (default rule); _close ran; state unchanged."""
        t = Probe(fail_open=ConnectionRefusedError("refused"))
        with pytest.raises(RetryableError, match=r"probe transport \(destination 'd'\): open \(ConnectionRefused"):
            asyncio.run(t.open())
        assert t.calls == ["open", "close"] and t.state == "new"

    def test_send_failure_is_a_batch_error(self) -> None:
        """A vendor exception escaping _send is raised as an outrelay error for the whole batch."""
        t = Probe(fail_send=ValueError("boom"))

        async def main() -> None:
            await t.open()
            try:
                await t.send(one())
            finally:
                await t.close()

        with pytest.raises(RetryableError, match="boom"):
            asyncio.run(main())

    def test_check_closes_what_it_opened(self) -> None:
        """check() on a closed transport opens, probes and closes again."""
        t = Probe()
        assert asyncio.run(t.check()) == "reachable"
        assert t.calls == ["open", "close"] and t.state == "closed"


class AuthError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"code {code}")
        self.code = code


class TestErrorMap:
    table = ErrorMap(
        (lambda e: isinstance(e, AuthError) and e.code == 5, "reject", "fix the credentials"),
        (AuthError, "retry"),
        (ValueError, "reject"),
        kit.Rule(TimeoutError, "retry", "slow broker", retry_after=2.5),
    )

    def test_first_matching_rule_wins(self) -> None:
        """Rules apply in order: a predicate before a class; unmatched exceptions get the default (retry)."""
        assert isinstance(self.table.result(AuthError(5)), Rejected)
        assert isinstance(self.table.result(AuthError(7)), RetryLater)
        assert isinstance(self.table.result(KeyError("k")), RetryLater)
        assert self.table.result(TimeoutError()) == RetryLater("slow broker (TimeoutError)", 2.5)

    def test_errors_and_boundary(self) -> None:
        """boundary() raises RetryableError/PermanentError from the vendor exception; outrelay errors pass."""
        expected = r"^open: fix the credentials \(AuthError: code 5\)$"
        with pytest.raises(PermanentError, match=expected) as info, self.table.boundary("open", destination="d"):
            raise AuthError(5)
        assert isinstance(info.value.__cause__, AuthError) and info.value.destination == "d"
        with pytest.raises(UsageError), self.table.boundary("send"):
            raise UsageError("mine")

    def test_messages_mask_credentials(self) -> None:
        """URL user info and password=/token= values never reach a message."""
        text = self.table.error(ValueError("amqp://bob:hunter2@h/ x token=abc password=pw"), "open").args[0]
        assert "hunter2" not in text and "abc" not in text and "pw " not in text + " "
        assert "***@h/" in text and "token=***" in text

    def test_a_bad_kind_is_refused(self) -> None:
        """A rule kind other than retry/reject is a ValueError at definition time."""
        with pytest.raises(ValueError, match="kind must be 'retry' or 'reject'"):
            ErrorMap((ValueError, "drop"))  # type: ignore[arg-type]


class TestPluginLoading:
    def test_module_class_file_and_hook(self, tmp_path: Path) -> None:
        """--plugin accepts module:Class, a .py file, and a module whose hook registers transports."""
        registry = Registry(autoload=False)
        assert load_plugin("tests.test_kit:Probe", registry) == ["probe"]
        src = tmp_path / "mine.py"
        src.write_text(
            "from outrelay.kit import Registry, hookimpl\nfrom outrelay.transports.memory import MemoryTransport\n"
            "class Mine(MemoryTransport):\n    name = 'mine'\n"
            "@hookimpl\ndef outrelay_add_transports(registry: Registry) -> None:\n"
            "    registry.add_transport('mine', Mine)\n"
        )
        assert load_plugin(str(src), registry) == ["mine"]
        assert registry.transport_spec("mine").load().__name__ == "Mine"

    def test_bad_specs_are_config_errors(self) -> None:
        """An unimportable module, a non-transport attribute, a missing file: one ConfigError line each."""
        registry = Registry(autoload=False)
        for spec, message in [
            ("no_such_mod_q", "cannot import it"),
            ("outrelay.kit:Event", "'Event' is not a Transport subclass"),
            ("nowhere/x.py", "no such file"),
            ("outrelay.kit", "registers no transport"),
        ]:
            with pytest.raises(kit.ConfigError, match=message):
                load_plugin(spec, registry)

    def test_options_are_read_as_toml_values(self) -> None:
        """--option values are TOML scalars when they parse, else strings; no '=' is an error."""
        assert parse_option("port=1883") == ("port", 1883)
        assert parse_option("fsync=true") == ("fsync", True)
        assert parse_option("topic=events/{type}") == ("topic", "events/{type}")
        with pytest.raises(kit.ConfigError, match="is not key=value"):
            parse_option("topic")


def test_the_mqtt_example_uses_only_the_kit() -> None:
    """examples/outrelay-mqtt imports outrelay.kit (and the conformance suite in tests), never outrelay.core."""
    files = sorted((ROOT / "examples" / "outrelay-mqtt").rglob("*.py"))
    assert len(files) >= 6
    for path in files:
        imports = re.findall(r"^\s*(?:from|import) (outrelay(?:\.[\w.]*)?)\b", path.read_text(), re.M)
        assert all(m in ("outrelay.kit", "outrelay.conformance") for m in imports), (path, imports)


class TestChecking:
    def test_checking_is_true_only_while_check_opens(self) -> None:
        """``checking`` is True inside ``_open`` when check() opens the transport, False when open() does
        or when check() finds it open already, and False again after check()."""
        seen: list[bool] = []

        class Seeing(Probe):
            async def _open(self) -> None:
                seen.append(self.checking)
                await super()._open()

            async def _check(self) -> str:
                seen.append(self.checking)
                return "reachable"

        async def main() -> None:
            t = Seeing()
            assert await t.check() == "reachable"
            assert not t.checking
            await t.open()
            assert await t.check() == "reachable"
            await t.close()

        asyncio.run(main())
        assert seen == [True, False, False, False]

    def test_an_open_in_another_task_during_a_check_is_not_checking(self) -> None:
        """``checking`` belongs to the task running check(): the relay's open() racing a check creates
        what it must (its ``_open`` sees False)."""
        seen: list[bool] = []

        class Slow(Probe):
            async def _open(self) -> None:
                await asyncio.sleep(0.05)  # the check starts meanwhile and waits for this open
                seen.append(self.checking)

        async def main() -> None:
            t = Slow()
            opening = asyncio.create_task(t.open())
            await asyncio.sleep(0.01)
            assert await t.check() == "reachable"
            await opening
            await t.close()

        asyncio.run(main())
        assert seen == [False]

    def test_checking_is_reset_when_open_fails(self) -> None:
        """A check whose open fails leaves ``checking`` False."""
        t = Probe(fail_open=ConnectionRefusedError("refused"))
        with pytest.raises(RetryableError):
            asyncio.run(t.check())
        assert not t.checking


class TestReadUntil:
    def test_reads_until_count_timeout_or_error(self) -> None:
        """read_until asks for what is still wanted, stops at count, on TimeoutError or at the deadline
        (``[]`` polls again), and hands back what it read when an error follows; an error first is raised."""
        from outrelay.kit import Received, read_until

        def received(n: int) -> list[Received]:
            events = [Event(type="t", stream="s") for _ in range(n)]
            return [Received(e, "x", e.stream, {}, b"", None) for e in events]

        async def main() -> None:
            asked: list[int] = []
            script: list[list[Received] | BaseException] = [received(2), [], received(5)]

            async def fetch(wanted: int, seconds: float) -> list[Received]:
                assert seconds > 0
                asked.append(wanted)
                step = script.pop(0) if script else TimeoutError()
                if isinstance(step, BaseException):
                    raise step
                return step[:wanted]

            assert len(await read_until(4, 5.0, fetch)) == 4 and asked == [4, 2, 2]
            script[:] = [received(1)]
            assert len(await read_until(4, 5.0, fetch)) == 1  # then TimeoutError: the read ends
            script[:] = [received(1), ConnectionError("gone")]
            assert len(await read_until(4, 5.0, fetch)) == 1
            script[:] = [ConnectionError("gone")]
            with pytest.raises(ConnectionError):
                await read_until(4, 5.0, fetch)

            async def nothing(wanted: int, seconds: float) -> list[Received]:
                await asyncio.sleep(min(seconds, 0.01))
                return []

            assert await read_until(3, 0.05, nothing) == []

        asyncio.run(main())


def test_mask_url_keeps_the_user_and_masks_the_password() -> None:
    """mask_url masks a URL's password and keeps its user; a bare user info is a user, or a token when told."""
    from outrelay.kit import mask_url

    assert mask_url("amqp://relay:hunter2@h:5672/vh") == "amqp://relay:***@h:5672/vh"
    assert mask_url("amqp://relay@h/") == "amqp://relay@h/"
    assert mask_url("nats://tok@h:4222", bare_is_secret=True) == "nats://***@h:4222"
    assert mask_url("nats://a:1@h1,nats://b:2@h2") == "nats://a:***@h1,nats://b:***@h2"
    assert mask_url("h:4222") == "h:4222"


class TestReading:
    async def test_read_until_collects_across_polls_and_stops_at_count(self) -> None:
        """read_until asks each poll for what is still wanted and stops once count items arrived."""
        asked: list[int] = []
        source = iter([[1, 2], [], [3, 4, 5], [6]])

        async def poll(room: int, seconds: float) -> list[int]:
            asked.append(room)
            assert 0 < seconds <= 0.5
            return next(source)

        assert await kit.read_until(4, 5.0, poll, step=0.5) == [1, 2, 3, 4, 5]  # each poll waits <= step
        assert asked == [4, 2, 2]

    async def test_read_until_returns_what_it_got_at_the_timeout(self) -> None:
        """A poll that keeps returning nothing ends the read after about the timeout, never past it."""
        loop = asyncio.get_running_loop()
        waits: list[float] = []

        async def poll(room: int, seconds: float) -> list[int]:
            waits.append(seconds)
            await asyncio.sleep(seconds)
            return []

        began = loop.time()
        assert await kit.read_until(3, 0.3, poll, step=0.1) == []
        assert 0.25 <= loop.time() - began < 1.0 and max(waits) <= 0.1
        assert await kit.read_until(3, 0.0, poll) == []

    def test_event_from_record_reads_both_modes(self) -> None:
        """Binary attributes (content type from the protocol field) and a structured body give the event back."""
        event = Event(type="order.created", stream="o-1", data={"n": 1}, tenant="acme")
        attrs = kit.attributes(event)
        ctype = attrs.pop("datacontenttype")
        assert kit.event_from_record(attrs, event.data, ctype) == event
        assert "datacontenttype" not in attrs  # the caller's mapping is left as it was
        body = kit.to_structured(event)
        assert kit.event_from_record({}, body, kit.STRUCTURED_CONTENT_TYPE) == event
        with pytest.raises(kit.EventError):
            kit.event_from_record({"type": "x"}, b"", None)

    def test_received_equals_the_constructor(self) -> None:
        """kit.received builds the same (equal, frozen) Received as the dataclass constructor."""
        event = Event(type="t", stream="s", data=b"x")
        args = (event, "topic", "s", {"ce_id": event.id}, b"x", "application/octet-stream")
        fast = kit.received(*args)
        assert fast == kit.Received(*args) and type(fast) is kit.Received
        assert kit.received(*args[:5]) == kit.Received(*args[:5])
        with pytest.raises(AttributeError):
            fast.target = "other"  # type: ignore[misc]


class TestDisablingErrorMap:
    """kit.DisablingErrorMap: a refused caller stops the destination instead of retrying or dead-lettering."""

    class Refused(Exception):
        pass

    def table(self, *, chain: bool = True) -> kit.DisablingErrorMap:
        return kit.DisablingErrorMap(
            (self.Refused, "reject", "not allowed to publish (grant the role)"),
            (TimeoutError, "retry"),
            disable=self.Refused,
            chain=chain,
        )

    def test_refused_is_rejected_with_disable_destination(self) -> None:
        """The refusal is Rejected(disable_destination=True) with the rule's hint; other errors as ErrorMap."""
        errors = self.table()
        r = errors.result(self.Refused("token=abc123 denied"), "publish")
        assert isinstance(r, Rejected) and r.disable_destination
        assert "grant the role" in r.reason and "abc123" not in r.reason
        assert isinstance(errors.result(TimeoutError("slow")), kit.RetryLater)
        assert not errors.disables(kit.PermanentError("ours"))  # OutrelayErrors are never re-mapped
        with pytest.raises(PermanentError, match="grant the role"), errors.boundary("open", destination="d"):
            raise self.Refused("no")

    def test_unchained_boundary_drops_the_vendor_text(self) -> None:
        """chain=False: the raised error has no __cause__ (a vendor text that may quote a secret)."""
        with pytest.raises(kit.RetryableError) as raised, self.table(chain=False).boundary("open"):
            raise TimeoutError("Endpoint=sb://x;SharedAccessKey=s3cr3t")
        assert raised.value.__cause__ is None and "s3cr3t" not in str(raised.value)
        with pytest.raises(kit.RetryableError) as chained, self.table().boundary("open"):
            raise TimeoutError("slow")
        assert isinstance(chained.value.__cause__, TimeoutError)


def test_redact_masks_sas_signatures() -> None:
    """A Shared Access Signature's sig= value is masked like a SharedAccessKey."""
    text = kit.redact("SharedAccessSignature sr=sb%3a%2f%2fns&sig=AbC%2bd3f%3d&se=1700000000&skn=Root")
    assert "AbC" not in text and "sig=***" in text and "skn=Root" in text


class TestSendEach:
    """kit.send_each: one synchronous call per message, the order rule kept."""

    @staticmethod
    def batch(*keys: str) -> list[Message]:
        return [Message(Event(type=f"t{i}", stream=k), "t", k) for i, k in enumerate(keys)]

    def test_a_failed_key_holds_its_later_messages_and_others_go_on(self) -> None:
        """After a key's first failure its later messages are NotSent without a call; other keys go on."""
        calls: list[str] = []

        def publish(m: Message) -> SendResult:
            calls.append(m.event.type)
            return RetryLater("down") if m.event.type == "t0" else Delivered()

        results = kit.send_each(self.batch("a", "b", "a", "b"), publish, progress=kit.Progress())
        assert calls == ["t0", "t1", "t3"]
        assert isinstance(results[0], RetryLater) and isinstance(results[2], kit.NotSent)
        assert isinstance(results[1], Delivered) and isinstance(results[3], Delivered)

    def test_nothing_starts_once_stopped_or_halted(self) -> None:
        """A stopping relay or a halt() that turned true defers every message not yet started."""
        stopped = kit.Progress()
        stopped.stop()
        assert all(
            isinstance(r, kit.NotSent) and "stopping" in r.error
            for r in kit.send_each(self.batch("a", "b"), lambda m: Delivered(), progress=stopped)
        )
        seen: list[Message] = []

        def publish(m: Message) -> SendResult:
            seen.append(m)
            return Delivered()

        results = kit.send_each(self.batch("a", "a", "b"), publish, progress=kit.Progress(), halt=lambda: bool(seen))
        assert len(seen) == 1 and isinstance(results[0], Delivered)
        assert all(isinstance(r, kit.NotSent) for r in results[1:])


class TopicConfig(TransportConfig):
    topic: str = "{stream}-{type}"


class Templated(Probe):
    """A probe whose target is one templated option."""

    target_option = "topic"

    def __init__(self) -> None:
        LifecycleTransport.__init__(self, TopicConfig(), destination="d")


class TestSendOrderedAndCheckTarget:
    def test_check_target_renders_the_placeholder_event(self) -> None:
        """check_target() is target() of a placeholder event on stream "check", of the type given."""
        t = Templated()
        assert t.check_target() == "check-check"
        assert t.check_target("outrelay_check") == "check-outrelay_check"
        assert Probe().check_target() == ""  # no target_option: the contract's default

    @pytest.mark.parametrize("pipeline", [True, False])
    async def test_pipeline_chooses_pipelined_or_chained(self, pipeline: bool) -> None:
        """pipeline=True starts a key's next message before the first is confirmed (send_pipelined);
        pipeline=False waits for it (send_chained). Every message is delivered either way."""
        loop = asyncio.get_running_loop()
        pending: list[asyncio.Future[None]] = []
        seen_pending: list[int] = []

        async def start(m: Message) -> asyncio.Future[None]:
            seen_pending.append(sum(not f.done() for f in pending))
            fut: asyncio.Future[None] = loop.create_future()
            loop.call_later(0.01, fut.set_result, None)
            pending.append(fut)
            return fut

        def outcome(m: Message, fut: asyncio.Future[None]) -> SendResult:
            return Delivered() if fut.done() and not fut.cancelled() else RetryLater("no confirm")

        batch = one() * 3  # one key
        results = await kit.send_ordered(
            batch, start, outcome, pipeline=pipeline, timeout=5.0, destination="d", log=logging.getLogger("t")
        )
        assert results == [Delivered()] * 3
        assert seen_pending == ([0, 1, 2] if pipeline else [0, 0, 0])
