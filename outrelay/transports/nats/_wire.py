"""A message on the wire: the headers a JetStream message carries, and an :class:`~outrelay.kit.Received` back.

* :func:`encode_headers`: the CloudEvents binary headers of the NATS binding
  (every attribute a ``ce-*`` header, ``ce-datacontenttype`` included,
  values percent-encoded), ``Content-Type`` repeating the data's type,
  ``Nats-Msg-Id`` (the server's dedupe key) and ``Nats-Expected-Stream``;
* :func:`invalid_subject`: why a subject cannot be published to (a wildcard
  or empty token, whitespace that would split the ``HPUB`` line), or None;
* :func:`decode`: a stored message back into an event (the inverse).
"""

from __future__ import annotations

import re

from nats.aio.msg import Msg

from outrelay.kit import Event, Received, binary_headers, from_binary

__all__ = ["decode", "encode_headers", "invalid_subject"]

_WILDCARD = re.compile(r"(^|\.)([*>]|)(\.|$)")
_WHITESPACE = re.compile(r"\s")


def invalid_subject(subject: str) -> str | None:
    """Why ``subject`` cannot be published to, or None when it can."""
    if _WILDCARD.search(subject):
        return f"invalid subject {subject!r}: a message cannot be published to a wildcard or empty token"
    if _WHITESPACE.search(subject):  # on the wire it would split the HPUB line (protocol injection)
        return f"invalid subject {subject!r}: NATS subjects cannot contain whitespace"
    return None


def encode_headers(event: Event, msg_id: str, expected_stream: str | None) -> dict[str, str]:
    """The headers of ``event`` published under message id ``msg_id`` (see the module docstring)."""
    headers = binary_headers(event, content_type=True, percent=True)
    headers["Nats-Msg-Id"] = msg_id
    if event.content_type:
        headers["Content-Type"] = event.content_type
    if expected_stream:
        headers["Nats-Expected-Stream"] = expected_stream
    return headers


def decode(msg: Msg) -> Received:
    """Rebuild the :class:`Received` of a JetStream message from its ``ce-*`` headers.

    :raises EventError: (or another ValueError) the message is not an outrelay CloudEvent.
    """
    headers = dict(msg.headers or {})
    ctype = headers.get("Content-Type")
    event = from_binary(headers, msg.data, content_type=ctype, percent=True)
    return Received(event, msg.subject, event.stream, headers, bytes(msg.data), ctype)
