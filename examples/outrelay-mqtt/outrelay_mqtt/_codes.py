"""MQTT 5 reason codes (CONNACK, PUBACK, DISCONNECT) classified for the relay.

A code below 0x80 is success (0x10 "no matching subscribers" included: the
broker stored the message). From 0x80 up:

* **reject** (the message or the configuration is wrong; retrying cannot
  help): not authorised (0x87), bad credentials (0x86), client id or
  protocol refused (0x84, 0x85), banned (0x8A), bad auth method (0x8C),
  topic name invalid (0x90), packet too large (0x95), payload format invalid
  (0x99), retain/QoS not supported (0x9A, 0x9B), server moved (0x9D);
* **retry** (transient): unspecified (0x80), malformed/protocol error
  (0x81, 0x82: the connection is reset), implementation specific (0x83),
  server unavailable/busy (0x88, 0x89), packet identifier in use (0x91),
  receive maximum exceeded (0x93), quota exceeded (0x97), administrative
  action (0x98), use another server (0x9C), connection rate exceeded (0x9F),
  and any code this table does not know.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["NAMES", "classify", "describe"]

NAMES: dict[int, str] = {
    0x80: "unspecified error",
    0x81: "malformed packet",
    0x82: "protocol error",
    0x83: "implementation specific error",
    0x84: "unsupported protocol version",
    0x85: "client identifier not valid",
    0x86: "bad user name or password",
    0x87: "not authorized",
    0x88: "server unavailable",
    0x89: "server busy",
    0x8A: "banned",
    0x8B: "server shutting down",
    0x8C: "bad authentication method",
    0x8D: "keep alive timeout",
    0x8E: "session taken over",
    0x90: "topic name invalid",
    0x91: "packet identifier in use",
    0x93: "receive maximum exceeded",
    0x95: "packet too large",
    0x97: "quota exceeded",
    0x98: "administrative action",
    0x99: "payload format invalid",
    0x9A: "retain not supported",
    0x9B: "QoS not supported",
    0x9C: "use another server",
    0x9D: "server moved",
    0x9F: "connection rate exceeded",
}

_REJECT = frozenset({0x84, 0x85, 0x86, 0x87, 0x8A, 0x8C, 0x90, 0x95, 0x99, 0x9A, 0x9B, 0x9D})

_FIX = {
    0x86: "fix username/password",
    0x87: "grant this client publish rights on the topic (broker ACL), or fix the credentials",
    0x90: "fix the topic template",
    0x95: "lower max_message_bytes or raise the broker's message size limit",
}


def classify(code: int) -> Literal["ok", "retry", "reject"]:
    """``"ok"`` below 0x80, else ``"reject"`` or ``"retry"`` (see the module docstring)."""
    if code < 0x80:
        return "ok"
    return "reject" if code in _REJECT else "retry"


def describe(code: int, where: str) -> str:
    """One line: ``"<where>: reason code 0x87 (not authorized); <fix>"``."""
    name = NAMES.get(code, "unknown reason code")
    fix = _FIX.get(code)
    return f"{where}: reason code 0x{code:02X} ({name})" + (f"; {fix}" if fix else "")
