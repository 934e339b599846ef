"""Reader of the ``nats`` transport: a JetStream pull consumer.

``transport.reader(subject)`` makes an ephemeral consumer that sees only
messages stored after :meth:`NatsReader.start` (deliver policy ``new``);
``reader(subject, durable="name")`` binds a durable consumer that resumes
where it left off; ``deliver="all"`` reads the stream's history too.
Messages are acked as they are read. Each is rebuilt into an
:class:`~outrelay.Event` from its ``ce-*`` headers (percent-decoded, as the
NATS binding asks; ``ce-datacontenttype``, else ``Content-Type``, is the data's type).
"""

from __future__ import annotations

import contextlib
from typing import Literal

import nats.errors
import nats.js.api
from nats.aio.client import Client
from nats.js.client import JetStreamContext

from outrelay.kit import Reader, Received, UsageError, read_until
from outrelay.transports.nats._client import connect
from outrelay.transports.nats._config import NatsConfig
from outrelay.transports.nats._errors import mapped
from outrelay.transports.nats._wire import decode

__all__ = ["NatsReader"]


class NatsReader(Reader):
    """See the module docstring.

    :raises RetryableError: (start) server unreachable.
    :raises PermanentError: (start) no stream covers the subject.
    """

    def __init__(
        self,
        cfg: NatsConfig,
        subject: str,
        *,
        destination: str = "nats",
        durable: str | None = None,
        stream: str | None = None,
        deliver: Literal["new", "all"] = "new",
    ) -> None:
        self.cfg = cfg
        self.subject = subject
        self.destination = destination
        self.durable = durable
        self.stream = stream or cfg.expected_stream
        self.deliver = deliver
        self._nc: Client | None = None
        self._sub: JetStreamContext.PullSubscription | None = None

    async def start(self) -> None:
        self._nc = await connect(self.cfg, self.destination)
        js = self._nc.jetstream(timeout=self.cfg.ack_timeout)
        policy = nats.js.api.DeliverPolicy.NEW if self.deliver == "new" else nats.js.api.DeliverPolicy.ALL
        config = nats.js.api.ConsumerConfig(
            deliver_policy=policy,
            ack_policy=nats.js.api.AckPolicy.EXPLICIT,
            inactive_threshold=None if self.durable else 30.0,
        )
        try:
            with mapped(f"cannot consume {self.subject!r}", self.destination):
                self._sub = await js.pull_subscribe(
                    self.subject, durable=self.durable, stream=self.stream, config=config
                )
        except BaseException:
            await self.stop()
            raise

    async def read(self, count: int, timeout: float) -> list[Received]:
        sub = self._sub
        if sub is None:
            raise UsageError("NatsReader.read() before start()")

        async def fetch(wanted: int, seconds: float) -> list[Received]:
            with mapped(f"cannot read {self.subject!r}", self.destination):
                try:
                    msgs = await sub.fetch(batch=min(wanted, 1000), timeout=max(0.05, seconds))
                except TimeoutError:  # nats-py raises both its own and the builtin one here
                    msgs = None
                for msg in msgs or ():
                    await msg.ack()
            if msgs is None:
                raise TimeoutError  # nothing came: the read ends
            return [decode(msg) for msg in msgs]

        return await read_until(count, timeout, fetch)

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        nc, self._nc = self._nc, None
        if sub is not None and self.durable is None:
            # best effort: an ephemeral consumer also expires by itself (inactive_threshold)
            with contextlib.suppress(TimeoutError, nats.errors.Error, OSError):
                await sub.unsubscribe()
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(TimeoutError, nats.errors.Error, OSError):
                await nc.close()
