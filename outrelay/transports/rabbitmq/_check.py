"""The RabbitMQ transport's ``check``: existence of the exchange and write permission, delivering nothing.

Existence: a passive declare (needs no permission). With ``declare_exchange =
true`` a missing exchange is reported as one the relay will declare; check
creates nothing, and whether the user may declare it (configure permission)
is not tested. Write permission: one empty message published in an AMQP
transaction on a side channel and rolled back. RabbitMQ checks write
permission when the publish arrives (403 ``ACCESS_REFUSED`` closes the
channel), before it looks the exchange up, but routes a transactional
message only on ``tx.commit``, which is never sent: no queue ever receives
the probe, also when the connection drops midway. Topic permissions are
checked for the probe's routing key: a refusal fails the check when
``routing_key`` is fixed; a templated key renders a made-up key, so the
check passes and says each real key is checked when it is published.

Not checked: whether a queue is bound. AMQP 0-9-1 shows bindings to no
client, and only a delivered (committed) message would tell (a mandatory
message comes back when no queue takes it), so an exchange without a bound
queue passes; with ``mandatory`` on, the line says so and what happens to
such events (dead-lettered, or retried with ``unroutable = "retryable"``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

import aio_pika.abc
import aiormq.abc
import aiormq.exceptions
from aiormq import spec

from outrelay.kit import PermanentError, RetryableError
from outrelay.transports.rabbitmq._config import RabbitMQConfig
from outrelay.transports.rabbitmq._errors import TOPIC_REFUSAL, VENDOR_ERRORS, classify, publish_refused

__all__ = ["Check"]


class Check:
    """One ``check`` of a destination (see the module docstring); :meth:`run` closes the connection."""

    def __init__(self, cfg: RabbitMQConfig, destination: str, secrets: Sequence[str], *, templated_key: bool) -> None:
        self.cfg = cfg
        self.destination = destination
        self.secrets = secrets
        self.templated_key = templated_key

    async def run(self, conn: aio_pika.abc.AbstractConnection, name: str, routing_key: str) -> str:
        """Reachability, credentials/vhost, that the exchange (or default-exchange queue) exists, and that
        the user may publish to it — proved without delivering anything.

        Existence: a passive declare (needs no permission). With ``declare_exchange = true`` a missing
        exchange is reported as one the relay will declare; check creates nothing, and whether the user
        may declare it (configure permission) is not tested. Write permission: :meth:`_probe_publish`
        publishes one empty message in an AMQP transaction on a side channel and rolls it back. The broker
        checks write permission when the publish arrives, before it looks the exchange up, but routes a
        transactional message only on ``tx.commit``, which check never sends: no queue ever receives the
        probe, also when the connection drops midway. Topic permissions (``set_topic_permissions``) are
        checked for the probe event's routing key: a refusal fails check when ``routing_key`` is fixed; for
        a templated key the probe's key is made up, so check succeeds and says the real keys are checked
        per publish.

        :raises RetryableError: unreachable, or a step got no answer within ``connect_timeout`` (a lossy
            network, or a broker blocking publishers for a resource alarm: it does not answer the probe).
        :raises PermanentError: credentials or vhost refused; the user may not publish to the exchange
            (the message names user, vhost and exchange and the ``rabbitmqctl`` command that fixes it);
            the exchange is internal; or it is missing and ``declare_exchange`` is off.
        """
        try:
            exists = await self._check_exists(conn, name, routing_key)
            caveat = await self._probe_publish(conn, name, routing_key)
        except TimeoutError as exc:
            raise RetryableError(
                f"check of {self.cfg.where}: no answer within connect_timeout = {self.cfg.connect_timeout:g} s: "
                "the broker is overloaded, the network drops packets, or the broker blocks publishers for a "
                "resource alarm (see rabbitmq-diagnostics alarms)",
                destination=self.destination,
            ) from exc
        finally:
            with contextlib.suppress(*VENDOR_ERRORS, RuntimeError):  # closes the side channels too
                await asyncio.wait_for(conn.close(), self.cfg.connect_timeout)
        if not exists:
            return (
                f"{self.cfg.where}: exchange {name!r} does not exist yet; the relay declares it at first use "
                "(declare_exchange = true); publishing to it is permitted; check created nothing"
            )
        where = f"exchange {name!r}" if name else f"queue {routing_key!r} via the default exchange"
        return (
            f"{self.cfg.where}: {where} exists and publishing to it is permitted "
            f"(probe rolled back, nothing delivered){caveat}{self._bindings_caveat(name)}"
        )

    def _bindings_caveat(self, name: str) -> str:
        """What check cannot see: AMQP shows an exchange's bindings to no client, and only a delivered
        message tells whether a queue is bound, so an exchange without a bound queue passes. Say so, with
        what happens to the events and how to look."""
        if not name or not self.cfg.mandatory:
            return ""
        fate = "retried" if self.cfg.unroutable == "retryable" else "dead-lettered"
        _, vhost = _login(self.cfg)
        return (
            f"; NOT checked: that a queue is bound to it (AMQP cannot show bindings without delivering) — "
            f"each event no queue is bound for is {fate} as unroutable; see "
            f"`rabbitmqctl list_bindings -p {vhost} source_name routing_key destination_name`"
        )

    async def _check_exists(self, conn: aio_pika.abc.AbstractConnection, name: str, routing_key: str) -> bool:
        """Whether the exchange (``name`` ``""``: the queue ``routing_key``) exists; ``False`` only when
        ``declare_exchange`` will create it. :raises PermanentError: missing otherwise, or refused.
        :raises TimeoutError: no answer within ``connect_timeout``."""
        try:
            channel = await asyncio.wait_for(conn.channel(publisher_confirms=False), self.cfg.connect_timeout)
            if name:
                await channel.declare_exchange(name, passive=True, timeout=self.cfg.connect_timeout)
            else:
                await channel.declare_queue(routing_key, passive=True, timeout=self.cfg.connect_timeout)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            if name and self.cfg.declare_exchange:  # what run would do; check itself creates nothing
                return False
            what = f"exchange {name!r}" if name else f"queue {routing_key!r} (default exchange)"
            raise PermanentError(
                f"{what} does not exist on {self.cfg.where}: declare it, or set declare_exchange = true",
                destination=self.destination,
            ) from exc
        except TimeoutError:
            raise
        except VENDOR_ERRORS as exc:
            raise self._check_error(exc) from exc
        return True

    async def _probe_publish(self, conn: aio_pika.abc.AbstractConnection, name: str, routing_key: str) -> str:
        """Prove that the broker lets this user publish to exchange ``name`` with ``routing_key``, without
        delivering: ``tx.select``, ``basic.publish`` of an empty message, ``tx.rollback`` on a side channel
        without publisher confirms. A refusal closes the channel (403); a missing exchange (404, checked
        after permission) still proves the permission. Nothing is ever committed.

        Returns ``""``, or a caveat for the summary line: topic permissions refused the made-up routing
        key of a templated ``routing_key`` (the exchange's write permission was checked before it).

        :raises PermanentError: 403 ACCESS_REFUSED, in one line saying what to grant to whom.
        :raises RetryableError: the connection was lost. :raises TimeoutError: no answer within ``connect_timeout``.
        """
        timeout = self.cfg.connect_timeout
        try:
            channel = await asyncio.wait_for(conn.channel(publisher_confirms=False), timeout)
            wire = await channel.get_underlay_channel()
        except TimeoutError:
            raise
        except VENDOR_ERRORS as exc:
            raise self._check_error(exc) from exc
        try:
            await wire.tx_select(timeout=timeout)
            await wire.basic_publish(
                b"",
                exchange=name,
                routing_key=routing_key,
                properties=spec.Basic.Properties(message_type="outrelay.check", delivery_mode=1),
                timeout=timeout,
            )
            await wire.tx_rollback(timeout=timeout)
            return ""
        except TimeoutError:
            raise
        except VENDOR_ERRORS as exc:
            # the 403 closes the channel while the publish or the rollback is under way; aiormq may then
            # raise "channel closed" for the rollback: the broker's reason is the channel's close reason
            reason = await _close_reason(wire, timeout) or exc
            if isinstance(reason, aiormq.exceptions.ChannelNotFoundEntity):
                return ""  # permission is checked first: the user may publish, the exchange is not there (yet)
            if isinstance(reason, aiormq.exceptions.ChannelAccessRefused):
                if TOPIC_REFUSAL in str(reason) and self.templated_key:
                    return (
                        f"; topic permissions refused the probe's made-up routing key {routing_key!r}: each "
                        f"event's key (routing_key {self.cfg.routing_key!r}) is checked when it is published"
                    )
                user, vhost = _login(self.cfg)
                raise PermanentError(
                    publish_refused(
                        reason,
                        user=user,
                        vhost=vhost,
                        exchange=name,
                        routing_key=routing_key,
                        where=self.cfg.where,
                        secrets=self.secrets,
                    ),
                    destination=self.destination,
                ) from reason
            raise self._check_error(reason) from reason

    def _check_error(self, exc: BaseException) -> RetryableError | PermanentError:
        retryable, message = classify(exc, self.secrets)
        return (RetryableError if retryable else PermanentError)(
            f"check of {self.cfg.where}: {message}", destination=self.destination
        )


def _login(cfg: RabbitMQConfig) -> tuple[str, str]:
    """``(user, vhost)`` the connection logs in with (aiormq's defaults: ``guest``, ``/``)."""
    parts = urlsplit(cfg.url)
    user = cfg.user if cfg.user is not None else unquote(parts.username or "")
    vhost = cfg.vhost if cfg.vhost is not None else unquote(parts.path[1:])
    return user or "guest", vhost or "/"


async def _close_reason(wire: aiormq.abc.AbstractChannel, timeout: float) -> aiormq.exceptions.AMQPError | None:
    """The broker's reason for closing ``wire`` (waiting up to ``timeout`` for the close to land), or None."""
    closing = wire.closing
    done, _ = await asyncio.wait({closing}, timeout=timeout)  # asyncio.wait never cancels ``closing``
    if not done or closing.cancelled():
        return None
    reason = closing.exception()
    return reason if isinstance(reason, aiormq.exceptions.AMQPError) else None
