"""Reader of the ``servicebus`` transport (receive-and-delete).

Receive-and-delete is at most once: a message that reaches the SDK after the
reader's last receive and before it closes a session receiver is lost. The
reader therefore leaves a session only after it stayed empty for 0.5 s.
(Peek-lock with a completion per message was tried: the SDK settles one
message per round trip, too slow for the 5,000-event end-to-end tests.)

A queue reader reads the queue itself, so it sees everything still in it,
not only what was published after :meth:`start` (the conformance suite
provisions a fresh queue per target). A topic reader needs
``subscription=NAME`` (an existing subscription). With ``sessions`` the
reader accepts the next available session, drains it, and moves on, so each
stream comes back in order.

Every SDK receiver is wrapped in a :class:`~._sockets.Guarded`: its sockets
are closed when an open times out or fails, after each session, and on
:meth:`stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION
from azure.servicebus.exceptions import OperationTimeoutError

from outrelay.kit import Reader, Received, UsageError
from outrelay.transports.servicebus._client import make_client, open_receiver
from outrelay.transports.servicebus._config import ServiceBusConfig
from outrelay.transports.servicebus._errors import ERRORS
from outrelay.transports.servicebus._sockets import Guarded
from outrelay.transports.servicebus._wire import decode

__all__ = ["ServiceBusReader"]

#: Session receivers drained at once; each is its own AMQP connection. More
#: starve a busy client, and a starved receive-and-delete receiver loses messages.
_PARALLEL_SESSIONS = 8


class ServiceBusReader(Reader):
    """See the module docstring."""

    def __init__(self, cfg: ServiceBusConfig, entity: str, *, subscription: str | None = None) -> None:
        if cfg.topic is not None and subscription is None:
            raise UsageError("a Service Bus topic reader needs subscription=NAME")
        self.cfg = cfg
        self.entity = entity
        self.subscription = subscription
        self._client: Any = None
        self._receiver: Guarded | None = None
        self._buffer: list[Received] = []

    async def start(self) -> None:
        """Connect, and attach the receiver unless sessions are read (one receiver per session).

        :raises RetryableError/PermanentError: as ``_errors.ERRORS`` (nothing left open).
        """
        self._client = make_client(self.cfg)
        if not self.cfg.sessions:
            try:
                with ERRORS.boundary(f"cannot attach a receiver to {self.entity!r}"):
                    self._receiver = await self._open_receiver(None)
            except BaseException:
                await self.stop()
                raise

    async def _open_receiver(self, session: Any, wait: float = 1.0) -> Guarded:
        """``wait``: seconds to wait for a session to become available (with a session)."""
        return await open_receiver(
            self._client, self.cfg, self.entity, subscription=self.subscription, session=session, wait=wait
        )

    async def read(self, count: int, timeout: float) -> list[Received]:
        if self._client is None:
            raise UsageError("reader is not started")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out, self._buffer = self._buffer, []  # received-and-deleted beyond an earlier count
        while len(out) < count and loop.time() < deadline:
            wait = max(0.2, min(1.0, deadline - loop.time()))
            if self.cfg.sessions:
                # drain several sessions at once: each is a new link (and connection)
                left = count - len(out)
                batches = await asyncio.gather(*(self._read_session(left, wait) for _ in range(_PARALLEL_SESSIONS)))
                for got in batches:
                    out += got
            else:
                assert self._receiver is not None  # start() opened it (no sessions)
                msgs = await self._receiver.sdk.receive_messages(max_message_count=count - len(out), max_wait_time=wait)
                out += [decode(m, self.entity) for m in msgs]
        out, self._buffer = out[:count], out[count:]
        return out

    async def _read_session(self, count: int, wait: float) -> list[Received]:
        """Accept the next available session and read it until it is empty (or ``count``)."""
        try:
            guarded = await self._open_receiver(NEXT_AVAILABLE_SESSION, wait)
        except (OperationTimeoutError, TimeoutError):  # no session available now
            await asyncio.sleep(wait / 4)
            return []
        except Exception as exc:
            raise ERRORS.error(exc, f"cannot accept a session on {self.entity!r}") from None
        out: list[Received] = []
        empty = 0
        try:
            # A locked session has messages: an empty answer before the first one means the
            # frames are still on their way (a busy client), so ask again. After the first
            # message, 0.5 s of silence means the session is drained.
            while len(out) < count and empty < (1 if out else 3):
                msgs = await guarded.sdk.receive_messages(
                    max_message_count=count - len(out), max_wait_time=wait if not out else 0.5
                )
                if not msgs:
                    empty += 1
                    continue
                empty = 0
                out += [decode(m, self.entity) for m in msgs]
        except OperationTimeoutError:  # the session could not be locked after all
            pass
        finally:
            await guarded.close()
        return out

    async def stop(self) -> None:
        receiver, self._receiver = self._receiver, None
        client, self._client = self._client, None
        if receiver is not None:
            await receiver.close()
        if client is not None:
            with contextlib.suppress(Exception):  # best effort
                await client.close()
