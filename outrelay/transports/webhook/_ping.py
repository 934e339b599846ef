"""The signed ping that ``check()`` posts, shared by the transport and the receiver.

Following GitHub's webhook "ping", ``outrelay check`` proves more than
reachability: it POSTs one real CloudEvent of type :data:`PING_TYPE`,
encoded, signed and headed exactly as ``send`` would post a business event
(structured or binary mode, Standard Webhooks signature, static headers),
so the receiver verifies what it will verify in production. A receiver
should answer it 2xx and not hand it to its application;
:class:`~outrelay.transports.webhook.receiver.WebhookReceiver` does so.
The type ``outrelay.check`` is reserved for this ping.
"""

from __future__ import annotations

from outrelay.kit import Event

__all__ = ["PING_TYPE", "ping_event"]

#: the CloudEvents ``type`` of the ping (reserved: a receiver may acknowledge and drop it)
PING_TYPE = "outrelay.check"


def ping_event(destination: str) -> Event:
    """A fresh ping event (new id, so receivers that dedupe on ``webhook-id`` do not drop a second check).

    Its stream is ``check`` and it has no tenant, so a templated ``url`` renders for it
    as it always rendered for ``check()``.
    """
    return Event(
        type=PING_TYPE,
        stream="check",
        data={"ping": "outrelay check: acknowledge with 2xx, do not process", "destination": destination},
    )
