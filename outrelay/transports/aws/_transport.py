"""What the ``sns`` and ``sqs`` transports share: one base on :class:`~outrelay.kit.LifecycleTransport`.

A subclass names its target option (``topic_arn`` / ``queue_url``), the
request parameter naming the target (``TopicArn`` / ``QueueUrl``), its
read-only attributes call (``GetTopicAttributes`` / ``GetQueueAttributes``)
and its batch call (``PublishBatch`` / ``SendMessageBatch``, with the
parameter holding the entries), and supplies the service-specific pieces —
:meth:`AWSTransport._entry` (one batch entry), :meth:`AWSTransport._describe`
(the ``outrelay check`` line) and ``reader()``. The lifecycle (the kit's),
batching (:func:`._batch.send_batch`, progress included), FIFO detection,
capabilities and ``_check`` are identical and live here.

``open()`` creates the client and, for a static target, probes it (a down
endpoint or a missing target raises RetryableError, saying to check that
it exists). ``check()`` delivers nothing, and AWS has no dry-run publish,
so after the attributes call it probes the publish permission with a batch
call of *no* entries, which cannot deliver anything: credentials that may
not publish are refused (``AccessDenied`` / ``AuthorizationError``: check
fails with :class:`~._errors.DeniedError` saying so), others get the
service's ``EmptyBatchRequest`` (or, from moto's SNS, an empty success).
That moto authorizes before it validates the batch is tested here; AWS does
not document the order. Were it to validate first, the probe would prove
nothing more than the attributes call — it can never fail a permitted
principal — and a denial would show at the first send, as a Rejected result
saying what to grant.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from outrelay.kit import Capabilities, Event, LifecycleTransport, Message, PermanentError, SendResult, TransportError

from ._batch import send_batch
from ._client import AWSClient
from ._config import AWSConfig
from ._errors import ERRORS, DeniedError

__all__ = ["AWSTransport"]

C = TypeVar("C", bound=AWSConfig)
_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")  # "PublishBatch" -> "publish_batch", boto3's method name


class AWSTransport(LifecycleTransport[C]):
    """Base of the SNS and SQS transports (see the module docstring)."""

    errors = ERRORS
    target_segment = "name"
    target_alphabet = r"A-Za-z0-9_\-"
    #: "topic" or "queue", for messages
    entity: ClassVar[str]
    #: the service's batch-send operation (named in messages and check()'s output)
    batch_call: ClassVar[str]
    #: the batch call's parameter holding the entries
    entries_param: ClassVar[str]
    #: the request parameter naming the target (topic ARN / queue URL)
    target_param: ClassVar[str]
    #: the read-only call returning the target's ``Attributes``, and its other arguments
    probe_call: ClassVar[str]
    probe_args: ClassVar[dict[str, Any]] = {}

    def __init__(self, config: C, *, destination: str | None = None) -> None:
        """``destination`` defaults to the transport's name."""
        destination = destination or self.name
        super().__init__(config, destination=destination)
        assert self.target_option is not None
        self.fifo = config.is_fifo(getattr(config, self.target_option))
        self.aws = AWSClient(self.name, config, destination)

    @property
    def capabilities(self) -> Capabilities:
        # a failed entry does not stop later entries of its group in one batch call: no ordered_batches
        return Capabilities(
            ordering_by_key=self.fifo,
            ordered_batches=False,
            native_dedupe=self.fifo,
            dedupe_window=300.0 if self.fifo else None,
            max_batch_count=100,
            max_message_bytes=self.cfg.max_data_bytes,
            cloudevents_modes=("structured",),
            reader=True,
        )

    async def _open(self) -> None:
        await self.aws.start()
        if self._template is not None and self._template.is_static:
            await self._reach(self._template.source)

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        return await send_batch(batch, self.cfg, self.fifo, self._entry, self._api, f"{self.name} {self.batch_call}")

    async def _close(self) -> None:
        await self.aws.stop()

    async def _check(self) -> str:
        """One line: the target is reachable (a read-only attributes call) and these credentials are
        not refused the batch call (an empty one, delivering nothing; see the module docstring).

        :raises DeniedError: the credentials are invalid or may not read or publish to the target; the
            message names the refused call and what to fix.
        :raises RetryableError: the endpoint is unreachable or busy, or the target does not exist.
        :raises PermanentError: no credentials or region, or the target is invalid.
        """
        target = self.target(Event(type="check", stream="check"))
        attrs = await self._reach(target)
        try:
            await self._api(target, [])
        except DeniedError:
            raise
        except PermanentError:
            pass  # the empty batch itself was refused (EmptyBatchRequest), after the call was allowed
        return f"{self._describe(target, attrs)}; an empty {self.batch_call} was not refused"

    async def _reach(self, target: str) -> dict[str, str]:
        """:meth:`_probe`, whose failure says to check that the target exists (a DeniedError
        keeps its own how-to-fix). :raises TransportError: unreachable, missing or refused."""
        try:
            return await self._probe(target)
        except DeniedError:
            raise
        except TransportError as exc:
            hint = f"; check that {self.entity} {target} exists, endpoint_url/region and credentials"
            raise type(exc)(f"{exc}{hint}", destination=self.destination) from exc

    async def _probe(self, target: str) -> dict[str, str]:
        """The target's attributes (:attr:`probe_call`). :raises TransportError: unreachable or missing."""
        resp = await self._call(self.probe_call, target, **self.probe_args)
        attrs: dict[str, str] = resp.get("Attributes", {})
        return attrs

    async def _api(self, target: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """The batch call's raw response (Successful/Failed). :raises TransportError: refused as a whole."""
        return await self._call(self.batch_call, target, **{self.entries_param: entries})

    async def _call(self, operation: str, target: str, **params: Any) -> dict[str, Any]:
        """The service's ``operation`` (its API name) on ``target``."""
        fn = getattr(self.aws.client, _SNAKE.sub("_", operation).lower())
        resp: dict[str, Any] = await self.aws.call(
            f"{self.name} {operation} {target}", fn, **{self.target_param: target}, **params
        )
        return resp

    @abstractmethod
    def _entry(self, m: Message, body: str) -> dict[str, Any]:
        """One batch entry (without Id/group/dedupe ids, which send_batch adds)."""

    @abstractmethod
    def _describe(self, target: str, attrs: dict[str, str]) -> str:
        """The ``outrelay check`` line."""
