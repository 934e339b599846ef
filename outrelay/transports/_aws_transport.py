"""What the ``sns`` and ``sqs`` transports share: one base class.

A subclass names its target option (``topic_arn`` / ``queue_url``) and
batch call (``PublishBatch`` / ``SendMessageBatch``) and supplies the three
service-specific pieces — :meth:`_probe` (a read-only attributes call),
:meth:`_entry` (one batch entry) and :meth:`_api` (the batch call) — plus
the one-line :meth:`_describe` for ``outrelay check``. Lifecycle, batching
(:func:`~outrelay.transports._aws_batch.send_batch`), FIFO detection,
capabilities and ``check()`` are identical and live here.

``check()`` delivers nothing, and AWS has no dry-run publish, so it probes
the publish permission with a batch call of *no* entries, which cannot
deliver anything: credentials that may not publish are refused
(``AccessDenied`` / ``AuthorizationError``: check fails saying so), others
get the service's ``EmptyBatchRequest`` (or, from moto's SNS, an empty
success). That moto authorizes before it validates the batch is tested
here; AWS does not document the order. Were it to validate first, the probe
would prove nothing more than the attributes call — it can never fail a
permitted principal — and a denial would show at the first send, as a
Rejected result saying what to grant.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from outrelay.kit import Capabilities, Event, Message, PermanentError, SendResult, Template, Transport, TransportError
from outrelay.transports._aws import AWSBase, AWSConfig, DeniedError
from outrelay.transports._aws_batch import send_batch

__all__ = ["AWSTransport"]


class AWSTransport(Transport):
    """Base of the SNS and SQS transports (see the module docstring)."""

    #: the config field holding the (templated) topic ARN or queue URL
    target_option: ClassVar[str]
    #: "topic" or "queue", for messages
    entity: ClassVar[str]
    #: the service's batch-send operation (named in check()'s output)
    batch_call: ClassVar[str]

    def __init__(self, config: AWSConfig, *, destination: str) -> None:
        super().__init__(config, destination=destination)
        self.cfg = config
        source: str = getattr(config, self.target_option)
        self._template = Template(
            source, where=f"destinations.{destination}.{self.target_option}", segment="name", alphabet=r"A-Za-z0-9_\-"
        )
        self.fifo = config.fifo if config.fifo is not None else source.endswith(".fifo")
        self.aws = AWSBase(self.name, config, destination)

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

    def target(self, event: Event) -> str:
        return self._template.render(event)

    async def open(self) -> None:
        """Create the client; probe a static target (a down endpoint raises RetryableError)."""
        await self.aws.start()
        if self._template.is_static:
            try:
                await self._probe(self._template.source)
            except BaseException:
                await self.aws.stop()
                raise

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        self.aws.ensure_open()
        return await send_batch(batch, self.cfg, self.fifo, self._entry, self._api)

    async def close(self) -> None:
        await self.aws.stop()

    async def check(self) -> str:
        """One line: the target exists and is reachable (a read-only attributes call), and these credentials
        are not refused the batch call (an empty one, delivering nothing; see the module docstring).

        :raises DeniedError: the credentials are invalid or may not read or publish to the target; the
            message names the refused call and what to fix.
        :raises RetryableError: the endpoint is unreachable or busy, or the target does not exist.
        :raises PermanentError: no credentials or region, or the target is invalid.
        """
        target = self.target(Event(type="check", stream="check"))
        opened_here = self.aws.client is None
        try:
            if opened_here:
                await self.aws.start()
            attrs = await self._probe(target)
            await self._probe_publish(target)
        except TransportError as exc:
            raise self.aws.check_error(exc, f"that {self.entity} {target} exists") from exc
        finally:
            if opened_here:
                await self.aws.stop()
        return f"{self._describe(target, attrs)}; an empty {self.batch_call} was not refused"

    async def _probe_publish(self, target: str) -> None:
        """The batch call with no entries. :raises DeniedError: refused; any other refusal is of the empty
        batch itself (``EmptyBatchRequest``), after the call was allowed."""
        try:
            await self._api(target, [])
        except DeniedError:
            raise
        except PermanentError:
            pass

    @abstractmethod
    async def _probe(self, target: str) -> dict[str, str]:
        """The target's attributes. :raises TransportError: unreachable or missing."""

    @abstractmethod
    def _entry(self, m: Message, body: str) -> dict[str, Any]:
        """One batch entry (without Id/group/dedupe ids, which send_batch adds)."""

    @abstractmethod
    async def _api(self, target: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """The batch call's raw response (Successful/Failed)."""

    @abstractmethod
    def _describe(self, target: str, attrs: dict[str, str]) -> str:
        """The `outrelay check` line."""
