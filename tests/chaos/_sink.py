"""A webhook receiver in its own process, for kill -9 tests: ``python -m tests.chaos._sink PORT FILE``.

Every decodable request appends ``<event id>\\t<stream>`` to FILE (line-buffered: in the kernel's
hands before the 204 is sent, so a kill -9 loses no acknowledged event) and is answered 204; a
request without a CloudEvent is answered 400. Listens on 127.0.0.1:PORT until killed.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

from outrelay.transports.webhook.receiver import WebhookReceiver, WebhookRequest


async def serve(port: int, out: TextIO) -> None:
    def respond(request: WebhookRequest) -> int:
        if request.event is None:
            return 400
        out.write(f"{request.event.id}\t{request.event.stream}\n")
        request.body = b""  # keep the process small over a long soak
        return 204

    async with WebhookReceiver(port=port, respond=respond):
        await asyncio.Event().wait()


if __name__ == "__main__":
    with open(sys.argv[2], "a", buffering=1, encoding="utf-8") as records:
        asyncio.run(serve(int(sys.argv[1]), records))
