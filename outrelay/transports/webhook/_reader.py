"""The webhook "reader": what a :class:`WebhookReceiver` accepted.

A webhook has no broker to read back from; the consumer side *is* the
receiver. So the reader attaches to a receiver running in this process
(found by URL through :meth:`WebhookReceiver.serving`) and returns the
verified events it answered 2xx whose request path is the target's path,
in arrival order, starting with the first one after :meth:`start`;
``check()`` pings are not events and are never returned.

For the conformance suite, ``provision(name)`` starts a fresh receiver per
target and returns its URL (see :func:`provision_receiver`); the
transport under test posts there, and ``reader(url)`` reads it.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from typing import Any
from urllib.parse import urlsplit

from outrelay.kit import Reader, Received, UsageError
from outrelay.transports.webhook._signing import Secrets
from outrelay.transports.webhook.receiver import WebhookReceiver, WebhookRequest

__all__ = ["WebhookReader", "local_peer", "provision_receiver"]


class WebhookReader(Reader):
    """Reads accepted events of the receiver serving ``target`` (``from_beginning``: also those it
    accepted before the reader started, which is what the receiver keeps).

    :raises UsageError: on :meth:`start`, when no receiver in this process
        serves ``target`` (start a :class:`WebhookReceiver` first).
    """

    def __init__(self, target: str, *, from_beginning: bool = False) -> None:
        self.target = target
        self.path = urlsplit(target).path or "/"
        self._receiver: WebhookReceiver | None = None
        self._pos = 0
        self._from_beginning = from_beginning

    async def start(self) -> None:
        receiver = WebhookReceiver.serving(self.target)
        if receiver is None:
            raise UsageError(f"no WebhookReceiver in this process serves {self.target}; start one and post to its url")
        self._receiver = receiver
        self._pos = 0 if self._from_beginning else len(receiver.requests)

    def _matches(self, r: WebhookRequest) -> bool:
        return r.verified and r.event is not None and not r.ping and r.accepted and urlsplit(r.path).path == self.path

    async def read(self, count: int, timeout: float) -> list[Received]:
        rx = self._receiver
        if rx is None:
            raise UsageError("call start() (or use `async with`) before read()")

        def ready() -> list[WebhookRequest]:
            return [r for r in rx.requests[self._pos :] if self._matches(r)]

        await rx.wait_until(lambda: len(ready()) >= count, timeout)
        out: list[Received] = []
        # advance past what is returned, but not past requests still being answered
        for i in range(self._pos, len(rx.requests)):
            r = rx.requests[i]
            if r.status is None or len(out) >= count:
                break
            self._pos = i + 1
            if self._matches(r):
                assert r.event is not None
                ctype = r.headers.get("content-type")
                out.append(Received(r.event, rx.url + r.path, r.event.stream, dict(r.headers), r.body, ctype))
        return out

    async def stop(self) -> None:
        self._receiver = None


_KEEP: set[asyncio.Task[None]] = set()


async def provision_receiver(name: str, secrets: Secrets = None, *, host: str = "127.0.0.1") -> str:
    """Start a :class:`WebhookReceiver` for one target and return ``f"{url}/{name}"``.

    The receiver lives in a task of the running event loop until that task
    is cancelled — which ``asyncio.run`` (and pytest-asyncio) do to leftover
    tasks when the loop ends — and then stops cleanly. This suits the
    conformance suite, which runs each check in its own loop and has no
    "deprovision" step. :raises OSError: cannot listen on ``host``.
    """
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[str] = loop.create_future()

    async def serve() -> None:
        async with WebhookReceiver(secrets, host=host) as rx:
            ready.set_result(rx.url)
            await loop.create_future()  # until cancelled

    task = loop.create_task(serve(), name=f"webhook-receiver-{name}")
    _KEEP.add(task)
    task.add_done_callback(_KEEP.discard)
    either: list[asyncio.Future[Any]] = [task, ready]
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        task.result()  # re-raises why the receiver could not start
    return f"{ready.result()}/{name.strip('/')}"


def local_peer(secrets: Secrets) -> dict[str, Any]:
    """What ``outrelay conformance`` needs to certify a webhook destination without a broker to read
    back from: a local :class:`WebhookReceiver` per check (verifying ``secrets``, the destination's own),
    the option to point a copy of the destination at it (``url``, with ``allow_private_network``), an
    endpoint where nothing listens for the broker-down checks, and a note for the report."""

    def unreachable(name: str) -> dict[str, Any]:
        with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return {"url": f"http://127.0.0.1:{port}/{name}", "timeout": 2.0}

    return {
        "provision": functools.partial(provision_receiver, secrets=secrets),
        "option": "url",
        "overrides": {"allow_private_network": True},
        "unreachable": unreachable,
        "note": "a local WebhookReceiver per check, verifying the configured secret; the configured url is not "
        "contacted",
    }
