"""A subscription member in a process of its own, for the consumer-side checks.

The parent (:class:`outrelay.conformance._subscribe.ProcessMember`) runs
``python -m outrelay.conformance._member`` and writes one pickled job to its
stdin: the parent's ``sys.path``, the modules to import first (name and file,
for test modules that are not importable by name), and the transport as
``(class, config, destination)`` with the :class:`SubscriptionSpec`. The
member rebuilds the transport as ``cls(config, destination=destination)``,
starts ``transport.subscription(spec)``, prints ``ready`` on stdout once
``start`` returned, and then receives until SIGTERM (then ``stop``, exit 0) or
SIGKILL (nothing more: that is the point).

Every message received becomes a JSON line in the job's ``out`` file
(``n`` its number at this member, ``id``, ``s`` stream, ``t`` the
``time.monotonic()`` at which ``receive`` returned it, ``e`` the error of a
foreign message); every ack a line ``{"a": n, "t": ...}`` written just
before the ack is called. CLOCK_MONOTONIC is system-wide on Linux, so the
parent compares these times with its own. A failure prints one line on
stderr and exits 3.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import os
import pickle
import signal
import sys
import time
from typing import Any, BinaryIO

import orjson

__all__ = ["main"]


def _import(name: str, file: str | None) -> None:
    """Import module ``name``; when that name is not importable, from ``file`` under that name."""
    if name in sys.modules:
        return
    try:
        importlib.import_module(name)
        return
    except ImportError:
        if not file:
            raise
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {name!r} from {file!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = os.path.dirname(os.path.abspath(file))
    sys.path.insert(0, folder)  # its own sibling imports work, as with the runner's --plugin path/to/file.py
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)


async def _loop(backend: Any, job: dict[str, Any], out: BinaryIO, stopping: asyncio.Event) -> None:
    """Receive and record until ``stopping``; hold each message ``hold`` s, then ack it (unless ``ack`` is off)."""
    n = 0
    held = 0
    prefetch: int = job["spec"].prefetch
    while not stopping.is_set():
        room = prefetch - held
        if room <= 0:  # a member that acks nothing stops asking once its prefetch is full (as the runtime does)
            await asyncio.sleep(0.05)
            continue
        batch = await backend.receive(min(16, room), 0.2)
        now = time.monotonic()
        for m in batch:
            got = m.received
            doc = {"n": n, "id": got.event.id if got is not None else "", "s": m.stream, "t": now, "e": m.error}
            out.write(orjson.dumps(doc) + b"\n")
            if job["hold"]:
                await asyncio.sleep(job["hold"])
            if job["ack"]:
                out.write(orjson.dumps({"a": n, "t": time.monotonic()}) + b"\n")
                if not m.ack_nowait():
                    await m.ack()
            else:
                held += 1
            n += 1


async def _run(job: dict[str, Any]) -> None:
    cls, config, destination = job["transport"]
    backend = cls(config, destination=destination).subscription(job["spec"])
    await backend.start()
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    print("ready", flush=True)
    with open(job["out"], "ab", buffering=0) as out:  # noqa: ASYNC230 - a local file, opened once
        task = asyncio.ensure_future(_loop(backend, job, out, stopping))
        waiter = asyncio.ensure_future(stopping.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        task.cancel()
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task  # re-raises what ended the loop, if anything did
    await backend.stop()


def main() -> None:
    """Read the job from stdin and run the member (see the module docstring)."""
    try:
        outer = pickle.load(sys.stdin.buffer)  # written by the parent process
        sys.path[:] = outer["path"]
        for name, file in outer["imports"]:
            _import(name, file)
        job = pickle.loads(outer["job"])
        asyncio.run(_run(job))
    except BaseException as exc:  # the parent shows this line when the member fails
        print(f"member failed: {type(exc).__module__}.{type(exc).__qualname__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
