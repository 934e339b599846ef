"""Payload encryption (outrelay.plugins.crypto): sealing, keys, rules, at-rest, and no secret in any output."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from outrelay import Event, EventBus, Outbox, Relay, parse_config
from outrelay.core.config.config import OutrelayConfig
from outrelay.core.consumer.consumer_dlq import ConsumerDeadLetters
from outrelay.core.consumer.subscriber import Subscription
from outrelay.core.model import cloudevents
from outrelay.core.model._draft import copier
from outrelay.core.model.errors import ConfigError, EventError, MissingExtraError
from outrelay.plugins.crypto import ENCRYPTED_CONTENT_TYPE, PayloadCrypto, is_sealed, reveal, uninstall
from outrelay.plugins.crypto._keys import Keyring
from outrelay.plugins.crypto._seal import Opener, Sealer
from outrelay.transports.memory import MemoryTransport


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Two fresh keys in the environment: OR_TEST_K1, OR_TEST_K2."""
    out = {"k1": new_key(), "k2": new_key()}
    monkeypatch.setenv("OR_TEST_K1", out["k1"])
    monkeypatch.setenv("OR_TEST_K2", out["k2"])
    return out


def config(tmp_path: Path, crypto: dict[str, Any], **dests: dict[str, Any]) -> OutrelayConfig:
    destinations = dests or {"mem": {"transport": "memory", "broker": "sealed"}}
    return parse_config(
        {"outbox": {"url": f"sqlite:///{tmp_path}/o.db"}, "destinations": destinations, "crypto": crypto}
    )


def crypto_of(keys: dict[str, str], current: str = "k1", **extra: Any) -> dict[str, Any]:
    refs = {name: f"env:OR_TEST_{name.upper()}" for name in keys}
    return {"keys": refs, "encrypt_with": current, **extra}


def stored_bytes(tmp_path: Path) -> bytes:
    """Every byte of the SQLite outbox in ``tmp_path``: the database and its WAL."""
    return b"".join(p.read_bytes() for p in tmp_path.glob("o.db*"))


def sample(**kw: Any) -> Event:
    return Event(type="payment.captured", stream="order-1", data={"card": "4111-1111", "amount": 42}, **kw)


class TestSealing:
    def test_round_trip_restores_data_content_type_and_metadata(self, keys: dict[str, str]) -> None:
        """A sealed event hides its data, names its key in metadata keyid, and opens back to the original."""
        ring = Keyring.load({"k1": "env:OR_TEST_K1"}, "k1")
        e = sample(metadata={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "x": "y"})
        sealed = Sealer(ring).seal(e)
        assert is_sealed(sealed) and sealed.content_type == ENCRYPTED_CONTENT_TYPE
        assert sealed.metadata["keyid"] == "k1" and sealed.metadata["x"] == "y"
        assert b"4111" not in sealed.data and len(sealed.data) == len(e.data) + 91 + len(e.content_type or "")
        assert (sealed.id, sealed.type, sealed.stream, sealed.time) == (e.id, e.type, e.stream, e.time)
        opened = Opener(ring).open(sealed)
        assert opened.data == e.data and opened.content_type == "application/json"
        assert dict(opened.metadata) == dict(e.metadata)
        assert opened == e  # every field, including sequence and time, survives the round trip

    def test_sealed_event_survives_both_cloudevents_modes(self, keys: dict[str, str]) -> None:
        """Binary (keyid as the ce-keyid header) and structured (data_base64, keyid attribute) both decode
        to an event that still opens."""
        ring = Keyring.load({"k1": "env:OR_TEST_K1"}, "k1")
        sealed = Sealer(ring).seal(sample(metadata={"x": "y"}))
        headers = cloudevents.binary_headers(sealed)
        assert headers["ce-keyid"] == "k1" and "keyid" not in headers.get("ce-metadata", "")
        binary = cloudevents.from_binary(headers, sealed.data, content_type=sealed.content_type)
        structured = cloudevents.from_structured(cloudevents.to_structured(sealed))
        for decoded in (binary, structured):
            assert decoded.metadata["keyid"] == "k1"
            assert Opener(ring).open(decoded).json() == {"card": "4111-1111", "amount": 42}

    def test_moved_or_altered_ciphertext_does_not_open(self, keys: dict[str, str]) -> None:
        """Ciphertext put on another event (other id) or changed by one bit fails with a clear EventError."""
        ring = Keyring.load({"k1": "env:OR_TEST_K1"}, "k1")
        sealed = Sealer(ring).seal(sample())
        moved = sample().replace(data=sealed.data, content_type=sealed.content_type, metadata=sealed.metadata)
        flipped = sealed.replace(data=sealed.data[:-1] + bytes([sealed.data[-1] ^ 1]))
        for bad in (moved, flipped):
            with pytest.raises(EventError, match="does not decrypt with key 'k1'"):
                Opener(ring).open(bad)

    def test_rotation_old_keys_decrypt_new_key_encrypts(self, tmp_path: Path, keys: dict[str, str]) -> None:
        """Rotated to k2 with k1 kept: k1's events still open, new ones are sealed with k2; without k1 they fail."""
        old = PayloadCrypto.from_config(config(tmp_path, crypto_of(keys, "k1")))
        rotated = PayloadCrypto.from_config(config(tmp_path, crypto_of(keys, "k2")))
        only_new = PayloadCrypto.from_config(config(tmp_path, crypto_of({"k2": ""}, "k2")))
        before = old.encrypt([sample()])[0]
        after = rotated.encrypt([sample()])[0]
        assert (before.metadata["keyid"], after.metadata["keyid"]) == ("k1", "k2")
        assert rotated.decrypt(before).json() == rotated.decrypt(after).json() == {"card": "4111-1111", "amount": 42}
        with pytest.raises(EventError, match="key 'k1', which this process does not hold"):
            only_new.decrypt(before)


class TestKeys:
    @pytest.mark.parametrize("form", ["base64", "hex", "raw", "urlsafe"])
    def test_file_keys_in_every_form(self, tmp_path: Path, form: str) -> None:
        """A key file may hold base64 (standard or URL-safe) or hex text, or the 32 raw bytes."""
        raw = os.urandom(32)
        text = {
            "base64": base64.b64encode(raw) + b"\n",
            "urlsafe": base64.urlsafe_b64encode(raw),
            "hex": raw.hex().encode(),
            "raw": raw,
        }[form]
        (tmp_path / "k").write_bytes(text)
        ring = Keyring.load({"k": f"file:{tmp_path / 'k'}"}, "k")
        other = Keyring.load({"k": f"file:{tmp_path / 'k'}"}, "k")
        assert Opener(other).open(Sealer(ring).seal(sample())).json()["amount"] == 42

    def test_unreadable_keys_are_one_line_naming_the_reference(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Unset variable, missing file and a short key: one ConfigError listing each, no key material."""
        short = base64.b64encode(b"s3cr3t-but-too-short").decode()
        monkeypatch.setenv("OR_TEST_SHORT", short)
        monkeypatch.delenv("OR_TEST_UNSET", raising=False)
        refs = {"a": "env:OR_TEST_UNSET", "b": f"file:{tmp_path}/nope", "c": "env:OR_TEST_SHORT"}
        with pytest.raises(ConfigError) as info:
            Keyring.load(refs, "a")
        msg = str(info.value)
        assert "\n" not in msg and short not in msg and "s3cr3t" not in msg
        assert "OR_TEST_UNSET is not set" in msg and "cannot read the key file" in msg
        assert "crypto.keys.c (env:OR_TEST_SHORT) is not a 32-byte key" in msg

    def test_config_refuses_a_literal_key_without_echoing_it(self, tmp_path: Path) -> None:
        """A key pasted into [crypto.keys] is refused and the error does not repeat it."""
        key = new_key()
        with pytest.raises(ConfigError) as info:
            config(tmp_path, {"keys": {"k1": key}, "encrypt_with": "k1"})
        assert "must be env:VAR or file:/path" in str(info.value) and key not in str(info.value)

    @pytest.mark.parametrize(
        ("crypto", "expected"),
        [
            ({"keys": {"k1": "env:X"}, "encrypt_with": "k9"}, "encrypt_with names key 'k9'"),
            ({"keys": {"k1": "env:X"}, "encrypt_with": "k1", "rules": [{"destinations": ["nope"]}]}, "'nope'"),
            ({"keys": {"k1": "env:X"}, "encrypt_with": "k1", "rules": []}, "rules is empty"),
            ({"keys": {}, "encrypt_with": "k1"}, "needs at least one key"),
        ],
    )
    def test_config_mistakes_are_named(self, tmp_path: Path, crypto: dict[str, Any], expected: str) -> None:
        """Each [crypto] mistake is one ConfigError naming the key or option."""
        with pytest.raises(ConfigError, match=expected):
            config(tmp_path, crypto)

    def test_missing_cryptography_names_the_extra(
        self, tmp_path: Path, keys: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without the cryptography package, using [crypto] fails with the pip install line."""
        monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
        with pytest.raises(MissingExtraError, match=r"pip install 'outrelay\[crypto\]'"):
            PayloadCrypto.from_config(config(tmp_path, crypto_of(keys)))


class TestRelay:
    async def test_rules_select_types_tenants_and_destinations(self, tmp_path: Path, keys: dict[str, str]) -> None:
        """Only events a rule selects are sealed, and only for the destinations it names; others go in clear."""
        rules = [{"types": ["payment.*"], "tenants": ["acme"], "destinations": ["sealed"]}]
        cfg = config(
            tmp_path,
            crypto_of(keys, rules=rules),
            sealed={"transport": "memory", "broker": "sealed"},
            plain={"transport": "memory", "broker": "plain"},
        )
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append(
            [sample(tenant="acme"), sample(tenant="other"), Event(type="order.placed", stream="o", tenant="acme")]
        )
        relay = Relay(outbox, cfg)
        summary = await relay.run(drain=True)
        outbox.close()
        assert summary.remaining == 0 and summary.dead_lettered == 0
        sealed = {r.event.tenant + ":" + r.event.type: r for r in MemoryTransport.broker("sealed").all()}
        assert is_sealed(sealed["acme:payment.captured"].event)
        assert sealed["acme:payment.captured"].headers["ce-keyid"] == "k1"
        assert not is_sealed(sealed["other:payment.captured"].event) and not is_sealed(
            sealed["acme:order.placed"].event
        )
        assert not any(is_sealed(r.event) for r in MemoryTransport.broker("plain").all())
        assert relay.workers["plain"].transforms == []  # no rule names it: no per-batch work at all

    async def test_without_crypto_no_transform_runs(self, tmp_path: Path) -> None:
        """A config without [crypto] gives destinations no transform (encryption costs nothing when off)."""
        cfg = parse_config(
            {"outbox": {"url": f"sqlite:///{tmp_path}/o.db"}, "destinations": {"m": {"transport": "memory"}}}
        )
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append(sample())
        relay = Relay(outbox, cfg)
        await relay.run(drain=True)
        outbox.close()
        assert relay.workers["m"].transforms == []

    async def test_at_rest_outbox_holds_ciphertext(self, tmp_path: Path, keys: dict[str, str]) -> None:
        """With at_rest, the outbox stores sealed data; selected destinations get it as is, the others in clear."""
        cfg = config(
            tmp_path,
            crypto_of(keys, at_rest=True, rules=[{"types": ["payment.*"], "destinations": ["sealed"]}]),
            sealed={"transport": "memory", "broker": "sealed"},
            plain={"transport": "memory", "broker": "plain"},
        )
        crypto = PayloadCrypto.from_config(cfg)
        outbox = Outbox.open(cfg.outbox.url, encode=crypto.outbox_encoder)
        [eid] = outbox.append(sample())
        outbox.append(Event(type="order.placed", stream="o", data={"n": 1}))
        db = stored_bytes(tmp_path)
        assert b"4111-1111" not in db and b'"n":1' in db
        await Relay(outbox, cfg).run(drain=True)
        outbox.close()
        [sealed] = [r.event for r in MemoryTransport.broker("sealed").all() if r.event.id == eid]
        [plain] = [r.event for r in MemoryTransport.broker("plain").all() if r.event.id == eid]
        assert is_sealed(sealed) and crypto.decrypt(sealed).json()["card"] == "4111-1111"
        assert not is_sealed(plain) and plain.json()["card"] == "4111-1111"

    async def test_undecryptable_at_rest_event_is_dead_lettered_with_reason(
        self, tmp_path: Path, keys: dict[str, str]
    ) -> None:
        """An event sealed at rest with a key the relay no longer holds is dead-lettered for a plain destination."""
        at_rest = crypto_of(keys, at_rest=True, rules=[{"destinations": ["sealed"]}])
        dests = {"sealed": {"transport": "memory", "broker": "s"}, "plain": {"transport": "memory", "broker": "p"}}
        cfg = config(tmp_path, at_rest, **dests)
        outbox = Outbox.open(cfg.outbox.url, encode=PayloadCrypto.from_config(cfg).outbox_encoder)
        outbox.append(sample())
        later = config(
            tmp_path,
            crypto_of({"k2": ""}, "k2", at_rest=True, rules=[{"destinations": ["sealed"]}]),
            **dests,
        )
        summary = await Relay(outbox, later).run(drain=True)
        [dl] = outbox.store.dead_letters(destination="plain", states=("dead",), limit=10)
        outbox.close()
        assert summary.counts["sealed"]["delivered"] == 1 and summary.counts["plain"]["dead_lettered"] == 1
        assert "encrypted with key 'k1', which this process does not hold" in dl.reason

    def test_reveal_decrypts_for_operators_or_says_why_not(self, tmp_path: Path, keys: dict[str, str]) -> None:
        """reveal() (dlq show) opens a sealed event with the config's keys, or leaves it sealed with a note."""
        cfg = config(tmp_path, crypto_of(keys))
        sealed = PayloadCrypto.from_config(cfg).encrypt([sample()])[0]
        opened, note = reveal(cfg, sealed)
        assert opened.json()["card"] == "4111-1111" and note == "decrypted with key 'k1'"
        other = config(tmp_path, crypto_of({"k2": ""}, "k2"))
        same, why = reveal(other, sealed)
        assert same is sealed and why is not None and "does not hold" in why
        plain = sample()
        assert reveal(cfg, plain) == (plain, None)


class TestNoSecrets:
    async def test_keys_appear_in_no_repr_error_or_log(
        self, tmp_path: Path, keys: dict[str, str], caplog: pytest.LogCaptureFixture
    ) -> None:
        """Reprs, errors and DEBUG logs of a whole encrypted relay run never contain a key (base64, hex or raw)."""
        caplog.set_level(logging.DEBUG)
        cfg = config(tmp_path, crypto_of(keys))
        crypto = PayloadCrypto.from_config(cfg)
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append([sample() for _ in range(5)])
        relay = Relay(outbox, cfg)
        await relay.run(drain=True)
        outbox.close()
        try:
            crypto.decrypt(sample().replace(content_type=ENCRYPTED_CONTENT_TYPE, metadata={"keyid": "k1"}))
        except EventError as exc:
            error = str(exc)
        seen = "\n".join(
            [repr(crypto), repr(crypto.keyring), repr(cfg), str(cfg.model_dump()), error, caplog.text]
            + [repr(r) for r in MemoryTransport.broker("sealed").all()]
        )
        assert "k1" in seen  # the key's *name* may show
        for key in keys.values():
            raw = base64.b64decode(key)
            assert key not in seen and raw.hex() not in seen and repr(raw)[2:-1] not in seen


class TestSubscribers:
    async def test_dead_letter_keeps_ciphertext_and_replays_once_the_key_is_held(
        self, tmp_path: Path, keys: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without the event's key it is dead-lettered at once, still sealed; after a restart holding the key,
        an operator's replay hands the handler the plaintext."""
        monkeypatch.setattr(Subscription, "poll_interval", 0.05)
        k1 = PayloadCrypto.from_config(config(tmp_path, crypto_of(keys, "k1")))
        only_k2 = PayloadCrypto.from_config(config(tmp_path, crypto_of({"k2": ""}, "k2")))
        dlq = ConsumerDeadLetters("memory")
        got: list[Event] = []
        try:
            only_k2.install()
            bus = EventBus.memory("crypto-sub", dead_letters=dlq)
            sub = await bus.subscribe(got.append, name="billing", max_attempts=3)
            await bus.publish(k1.encrypt([sample()]))
            await wait_for(lambda: sub.stats.dead_lettered == 1)
            await bus.close()
            [dl] = dlq.entries(consumer="billing")
            assert dl.attempts == 0 and "key 'k1', which this process does not hold" in dl.reason
            assert is_sealed(cloudevents.from_structured(dl.body)) and b"4111" not in dl.body

            k1.install()  # the restarted member holds k1
            bus = EventBus.memory("crypto-sub", dead_letters=dlq)
            sub = await bus.subscribe(got.append, name="billing")
            assert dlq.replay([dl.id], consumer="billing") == 1
            await wait_for(lambda: sub.stats.replayed == 1)
            await bus.close()
        finally:
            uninstall()
            dlq.close()
        assert [e.json()["card"] for e in got] == ["4111-1111"] and not is_sealed(got[0])

    async def test_bus_from_config_decrypts_with_the_configured_keys(
        self, tmp_path: Path, keys: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """EventBus.from_config installs the [crypto] keys: its handlers get plaintext without install()."""
        cfg = config(tmp_path, crypto_of(keys, "k1"))
        got: list[Event] = []
        try:
            async with EventBus.from_config(cfg) as bus:
                await bus.subscribe(got.append, name="billing")
                await bus.publish(PayloadCrypto.from_config(cfg).encrypt([sample()]))
                await wait_for(lambda: len(got) == 1)
        finally:
            uninstall()
        assert got[0].json()["card"] == "4111-1111" and not is_sealed(got[0])


async def wait_for(cond: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not cond() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert cond(), "timed out"


def test_copier_copies_every_field_and_refuses_unknown_ones() -> None:
    """The generated copy equals dataclasses.replace; naming a field the class lacks is a TypeError."""
    e = sample(tenant="t", labels={"a": "b"}, tags=("x",)).with_sequence(7)
    assert copier(Event, "subject")(e, "s") == e.replace(subject="s")
    with pytest.raises(TypeError, match="no field"):
        copier(Event, "nope")
