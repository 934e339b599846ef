"""The one boundary where ``pulsar-client`` failures become outrelay errors.

Permanent (retrying the same message cannot help): the message is too big
or invalid, the topic name is invalid or the topic terminated, the schema is
incompatible, the operation is not allowed, the credentials are refused or
may not produce (retrying would go on for ever: the conformance suite's
rule; ``open`` then fails with one line, and a send is Rejected with
``disable_destination``: the destination stops and its events stay pending
until an operator fixes the credentials and runs ``outrelay enable``). Everything else — timeouts, connection
errors, full queues — is retryable. The same rule
turns a ``send_async`` callback's result into a per-message outcome
(:func:`outcome`); :class:`Acks` gathers those callbacks for one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pulsar

from outrelay.kit import Delivered, PermanentError, Rejected, RetryableError, RetryLater, SendResult

__all__ = ["PERMANENT", "Acks", "call_blocking", "map_pulsar_errors", "outcome"]

T = TypeVar("T")

PERMANENT = frozenset(
    {
        "MessageTooBig",
        "InvalidMessage",
        "InvalidTopicName",
        "TopicTerminated",
        "IncompatibleSchema",
        "NotAllowedError",
        "OperationNotSupported",
        "InvalidConfiguration",
        "InvalidUrl",
        "CryptoError",
        "AuthenticationError",
        "AuthorizationError",
    }
)
#: refusals of who is asking, not of the message: stop the destination rather than dead-letter its events
DENIED = frozenset({"AuthenticationError", "AuthorizationError"})


@contextlib.contextmanager
def map_pulsar_errors(what: str, destination: str) -> Iterator[None]:
    """Raise RetryableError/PermanentError ``from`` any pulsar exception in the block."""
    try:
        yield
    except pulsar.PulsarException as exc:
        name = type(exc).__name__
        msg = f"{what}: {name}: {exc}"
        if name in PERMANENT:
            raise PermanentError(msg, destination=destination) from exc
        raise RetryableError(msg, destination=destination) from exc
    except (ValueError, TypeError) as exc:  # the client validates arguments with builtins
        raise PermanentError(f"{what}: {exc}", destination=destination) from exc


async def call_blocking(
    pool: ThreadPoolExecutor, bound: float, what: str, destination: str, fn: Callable[..., T], *args: Any, **kwargs: Any
) -> T:
    """Run a blocking client call in ``pool``; give up (retryably) after ``bound`` seconds."""

    def run() -> T:
        with map_pulsar_errors(what, destination):
            return fn(*args, **kwargs)

    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(loop.run_in_executor(pool, run), bound)
    except TimeoutError:
        raise RetryableError(f"{what}: no answer within {bound:.0f} s", destination=destination) from None


class Acks:
    """Collects ``send_async`` callbacks (client I/O thread) for one batch and
    wakes the event loop once, when the last one arrived, instead of once per
    message."""

    def __init__(self, loop: asyncio.AbstractEventLoop, n: int) -> None:
        self.loop = loop
        self.results: list[Any] = [None] * n
        self.remaining = n
        self.lock = threading.Lock()
        self.future: asyncio.Future[list[Any]] = loop.create_future()
        if n == 0:
            self.future.set_result(self.results)

    def done(self, index: int, result: Any, _msg_id: Any) -> None:
        self.results[index] = result
        with self.lock:
            self.remaining -= 1
            last = self.remaining == 0
        if last:
            self.loop.call_soon_threadsafe(self._finish)

    def _finish(self) -> None:
        if not self.future.done():
            self.future.set_result(self.results)

    async def wait(self) -> list[Any]:
        return await self.future


def outcome(result: Any) -> SendResult:
    if result == pulsar.Result.Ok:
        return Delivered()
    name = str(result).rsplit(".", 1)[-1]
    if name in DENIED:
        return Rejected(f"pulsar: {name}: fix the token/credentials or grant produce permission, then `outrelay "
                        "enable` the destination", disable_destination=True)  # fmt: skip
    if name in PERMANENT:
        return Rejected(f"pulsar: {name}")
    return RetryLater(f"pulsar: {name}")
