"""Every code block of README.md and docs/*.md is marked, every config block is valid, and every example
runs as written against the real services — twice in a row, in the same directory (see tests/_docblocks.py
for the markers).

What an example names that only a reader has (a hostname, a key file) is replaced here by the test's own
(``SUBSTITUTIONS``): the local webhook receiver, the session's Kafka broker, the Redis of docs/testing.md,
a file in the example's directory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import sqlite3
import threading
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from outrelay import parse_config
from outrelay.core.config.registry import Registry
from outrelay.core.relay.relay import build_transports
from tests._docblocks import Background, Block, blocks, chdir, commands, run_command
from tests.services import need

ALL = blocks()
EXAMPLES = sorted({b.name for b in ALL if b.kind == "run"})
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def test_every_block_is_marked() -> None:
    """Each fenced block says whether it runs (and in which example), is a config, or is a fragment."""
    unmarked = [b.where for b in ALL if b.kind is None]
    assert not unmarked, f"add a <!-- docs-test: run NAME | config | fragment --> line before: {unmarked}"
    assert all(b.name for b in ALL if b.kind == "run"), [b.where for b in ALL if b.kind == "run" and not b.name]
    assert set(SUBSTITUTIONS) | set(CHECKS) <= set(EXAMPLES), "an example named here has no steps"


def check_config(text: str, registry: Registry) -> None:
    """Parse ``text`` as a whole config (variables it needs set to placeholders) and build every
    destination's transport, as `outrelay check --offline` does."""
    dummies = {name: "docs-test-value" for name in _VAR.findall(text) if name not in os.environ}
    os.environ.update(dummies)
    try:
        build_transports(parse_config(tomllib.loads(text)), registry)
    finally:
        for name in dummies:
            del os.environ[name]


def test_config_blocks_are_valid() -> None:
    """Every block marked config is a valid config whose destinations can all be built."""
    registry = Registry()
    configs = [b for b in ALL if b.kind == "config"]
    assert len(configs) >= 10
    for b in configs:
        try:
            check_config(b.text, registry)
        except Exception as exc:
            raise AssertionError(f"{b.where}: {exc}") from exc


# -- examples ------------------------------------------------------------------------------------

Context = dict[str, str]
SUBSTITUTIONS: dict[str, list[tuple[str, str]]] = {
    "readme": [
        ('url = "https://example.com/hook"', 'url = "{receiver}"\nallow_private_network = true'),
        ('bootstrap_servers = "kafka:9092"', 'bootstrap_servers = "{kafka}"\nenable_idempotence = false'),
        ('url = "redis://redis:6379/0"', 'url = "{redis}"'),
        ('stream = "shop:events"', 'stream = "{key}:events"'),
    ],
    "postgres-sql": [('"postgresql://admin@db/shop?schema=shop"', '"{postgres}"')],
    "worker": [
        ('url = "redis://redis:6379/0"', 'url = "{redis}"'),
        ('stream = "shop:events"', 'stream = "{key}:events"'),
    ],
}


def _readme(ctx: Context, attempt: int) -> None:
    """The webhook received the order (once per run), signed."""
    got = [e for e in RECEIVER.events() if e.type == "order.paid"]
    assert len(got) >= attempt and all(r.verified for r in RECEIVER.requests), got


def _worker(ctx: Context, attempt: int) -> None:
    """The three workers invoiced each of the 20 orders once (per run)."""
    db = Path(ctx["dir"]) / "app.db"
    deadline = time.monotonic() + 60
    while True:
        with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
            rows = conn.execute("SELECT COUNT(*), COUNT(DISTINCT event_id) FROM invoices").fetchone()
        if rows[0] >= 20 * attempt or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert tuple(rows) == (20 * attempt, 20 * attempt), rows


def _inbox(ctx: Context, attempt: int) -> None:
    """The handler ran once per run: the redelivery was skipped."""
    with contextlib.closing(sqlite3.connect(Path(ctx["dir"]) / "app.db")) as conn:
        assert conn.execute("SELECT paid FROM invoices").fetchall() == [(attempt,)]


def _encryption(ctx: Context, attempt: int) -> None:
    """The destination got the payment sealed (key id, no plaintext amount), once per run."""
    lines = (Path(ctx["dir"]) / "partners.jsonl").read_text().splitlines()
    assert len(lines) == attempt and all('"keyid":"k1"' in line and "1250" not in line for line in lines), lines


CHECKS: dict[str, Callable[[Context, int], None]] = {
    "readme": _readme,
    "worker": _worker,
    "inbox": _inbox,
    "encryption": _encryption,
}


class _ReceiverThread:
    """outrelay's webhook receiver, served from a thread (the examples run their own event loops)."""

    def __init__(self) -> None:
        from outrelay.transports.webhook.receiver import WebhookReceiver

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.receiver = WebhookReceiver(secrets="whsec_" + "ZG9jcy10ZXN0LXNlY3JldC1kb2NzLXRlc3Q=")
        asyncio.run_coroutine_threadsafe(self.receiver.start(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.receiver.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


RECEIVER: Any = None


@pytest.fixture
def services(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Context]:
    """Endpoints for the example being run (only those it names are started)."""
    global RECEIVER
    name = request.node.callspec.params["name"]
    subs = " ".join(new for _, new in SUBSTITUTIONS.get(name, []))
    ctx: Context = {"dir": str(tmp_path), "key": f"docs-test:{uuid.uuid4().hex[:12]}"}
    env = {
        "HOOK_SECRET": "whsec_ZG9jcy10ZXN0LXNlY3JldC1kb2NzLXRlc3Q=",
        "OUTRELAY_KEY_K1": base64.b64encode(os.urandom(32)).decode(),
    }
    receiver = _ReceiverThread() if "{receiver}" in subs else None
    if receiver is not None:
        RECEIVER, ctx["receiver"] = receiver.receiver, receiver.receiver.url
    if "{kafka}" in subs:
        ctx["kafka"] = request.getfixturevalue("kafka_peer").bootstrap
    if "{redis}" in subs:
        ctx["redis"] = request.getfixturevalue("redis_url")
    if "{postgres}" in subs:
        ctx["postgres"] = _postgres(ctx["key"].replace("docs-test:", "docs_"))
    ctx.update(env)
    try:
        yield ctx
    finally:
        if receiver is not None:
            receiver.close()
            RECEIVER = None
        if "redis" in ctx:
            _drop_redis_keys(ctx["redis"], ctx["key"])
        if "postgres" in ctx:
            _drop_schema(ctx["key"].replace("docs-test:", "docs_"))


def _postgres(schema: str) -> str:
    """The test PostgreSQL's URL with a schema of this example's own (see tests/stores/conftest.py)."""
    from tests.stores.conftest import _pg_available, pg_url

    why = _pg_available()
    if why:
        need("PostgreSQL", why)
    return pg_url(schema)


def _drop_schema(schema: str) -> None:
    import psycopg

    from tests.stores.conftest import pg_admin_url

    with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _drop_redis_keys(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"*{prefix}*"):
            client.delete(key)
    finally:
        client.close()


def _step(b: Block, ctx: Context, background: list[Background], namespace: dict[str, Any]) -> None:
    """Run one step; python steps of one run share ``namespace`` (a later snippet continues an earlier one)."""
    text = b.text
    for old, new in SUBSTITUTIONS.get(b.name, []):
        text = text.replace(old, new.format(**ctx))
    cwd, env = Path(ctx["dir"]), {k: v for k, v in ctx.items() if k.isupper()}
    if b.lang == "toml":
        (cwd / b.opts.get("file", "outrelay.toml")).write_text(text)
        check_config(text, Registry())
    elif b.lang == "python" and ("file" in b.opts or "background" in b.opts):
        script = cwd / b.opts.get("file", f"step_{b.line}.py")
        script.write_text(text)
        if "background" in b.opts:
            started = [Background(script, cwd, env, n) for n in range(int(b.opts["background"] or 1))]
            background += started
            for process in started:
                process.wait_for(b.opts.get("until", ""))
    elif b.lang == "python":
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with chdir(cwd):
                exec(compile(text, b.where, "exec"), namespace)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    else:
        for line in commands(Block(b.doc, b.line, b.lang, text, b.kind)):
            code, out = run_command(line, cwd, env)
            assert code == 0, f"{b.where}: `{line}` exited {code}:\n{out}"


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_twice(name: str, services: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's steps run in document order and succeed, and again in the same directory."""
    from outrelay import Outbox
    from outrelay.core.history import upcasting

    steps = [b for b in ALL if b.kind == "run" and b.name == name]
    stale = [old for old, _ in SUBSTITUTIONS.get(name, []) if not any(old in b.text for b in steps)]
    assert not stale, f"substitutions for text no longer in the example: {stale}"
    for attempt in (1, 2):
        monkeypatch.setattr(upcasting, "_default", None)  # what an example registers stays in it
        background: list[Background] = []
        namespace: dict[str, Any] = {"__name__": "__main__"}
        try:
            for b in steps:
                _step(b, services, background, namespace)
            if name in CHECKS:
                CHECKS[name](services, attempt)
        finally:
            for process in background:
                process.stop()
            for value in namespace.values():  # an example may leave its outbox open, as a script can
                if isinstance(value, Outbox):
                    value.close()
