"""The order guard: a chain of ``Nats-Expected-Last-Msg-Id`` headers, enforced by the server.

Every message the transport publishes to the guarded JetStream stream names
the id of the message it published there just before (``Nats-Expected-Last-Msg-Id``).
The stream applies messages in the order of its (raft) log and refuses one
whose expected id is not the id of the last message it stored (JetStream
error 10070, "wrong last msg ID: <id>"). So if message *k* is lost — a
stream leader change drops what the old leader had not committed, a full
``discard = new`` stream refuses it, a connection dies with it — then *k+1*,
already on the wire, is refused too, and so is everything after it: nothing
can be stored past a hole, whatever stream (outrelay stream) it belongs to.

The check is on the JetStream stream's last message, not on a subject's, so
the chain runs over every message this transport publishes to that stream,
in the order they are written to the connection (one connection: the order
the server receives them). A refusal tells the server's actual last id; the
chain restarts from it (a new *generation*): messages of the broken
generation still in flight fail by themselves and are ignored for resyncing.
A message with no known predecessor (first after open, or the stream keeps
no last id) carries no header.

Costs and limits: one more header per message, checked at apply time.
Another publisher writing to the same JetStream stream moves its last id
and breaks the chain (each break costs a retry of what was in flight; never
a wrong order): guard one stream with one relay destination. A resend the
duplicate window drops keeps the stream's last id where it was, which may
break the chain once.

Server versions: every refusal is a message that failed *at apply time*,
which a clustered stream counts on each replica (``clfs``) to keep its
sequence numbers in step. nats-server before 2.9.21 let that count drift
between replicas across a leader takeover, and a replica then skipped
messages it should have stored (nats-io/nats-server#4365; more fixes of the
same count up to 2.10.19, #5821). Our cluster test on 2.9.10 lost confirmed
messages only with the guard on (13,700 of 20,000 stored in one run; rare),
which matches that defect (not caught in the act). Those fixes did not make
it usable: on nats-server 2.14.0 an R3 file stream that refused one message
with 10070 acknowledged nothing more — neither a correctly chained message
nor one without any expected header, seconds later (an R1 stream of the
same server went on normally). So the guard is refused at open on every
replicated stream, ``auto`` leaves it off there, and ``pipeline = "auto"``
falls back to one message in flight per stream.

Why not ``Nats-Expected-Last-Subject-Sequence``: nats-server 2.9 checks it,
in a cluster, *before* proposing, against what the leader has applied, so a
second message of a subject sent before the first one's ack is refused —
it cannot pipeline, and one message in flight per subject is what
``pipeline = false`` already gives.
"""

from __future__ import annotations

import re

from nats.aio.client import Client

__all__ = ["WRONG_LAST_MSG_ID", "Chain", "server_last_id", "server_version"]

WRONG_LAST_MSG_ID = 10070  # JSStreamWrongLastMsgIDErrF
_LAST_ID = re.compile(r"wrong last msg ID: ?(.*)$", re.IGNORECASE | re.DOTALL)


def server_last_id(description: str | None) -> str | None:
    """The stream's last message id from a 10070 error's description ("" = the stream keeps none);
    None when the description is not that error's."""
    m = _LAST_ID.search(description or "")
    return m.group(1).strip() if m else None


def server_version(nc: Client) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of the server ``nc`` is connected to; ``(0, 0, 0)`` when unknown."""
    try:
        v = nc.connected_server_version
        return (v.major, v.minor, v.patch)
    except (ValueError, TypeError, AttributeError):
        return (0, 0, 0)


class Chain:
    """The last message id published to one JetStream stream, and the chain's generation."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.last: str | None = None
        self.generation = 0

    def link(self, msg_id: str) -> tuple[str | None, int]:
        """Make ``msg_id`` the next link; returns ``(expected last id or None, generation)``.

        Call immediately before writing the message (no await in between).
        """
        previous, self.last = self.last, msg_id
        return previous, self.generation

    def unlink(self, msg_id: str, previous: str | None, generation: int) -> None:
        """``msg_id`` was not written after all: its predecessor is the last link again."""
        if self.last == msg_id and self.generation == generation:
            self.last = previous

    def broken(self, generation: int, server_last: str) -> bool:
        """The server refused a message of ``generation``; restart the chain from ``server_last``.

        Returns False (and changes nothing) when that generation was already restarted.
        """
        if generation != self.generation:
            return False
        self.last = server_last or None
        self.generation += 1
        return True
