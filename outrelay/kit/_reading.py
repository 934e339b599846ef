"""The loop every :class:`~outrelay.kit.Reader` writes for ``read(count, timeout)``, written once.

::

    async def read(self, count: int, timeout: float) -> list[Received]:
        return await read_until(count, timeout, self._fetch)   # _fetch(wanted, seconds) -> list[Received]
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from outrelay.core.reading import Received

__all__ = ["read_until"]


async def read_until(
    count: int, timeout: float, fetch: Callable[[int, float], Awaitable[Sequence[Received]]]
) -> list[Received]:
    """Read up to ``count`` messages within ``timeout`` seconds, in the order ``fetch`` returns them.

    ``fetch(wanted, seconds)`` returns at most ``wanted`` messages, waiting at most ``seconds``
    (always > 0) for the first. ``[]`` means nothing came yet: fetch again while time is left
    (a client that polls in short waits); :class:`TimeoutError` ends the read. An exception
    from ``fetch`` once something was read ends the read with what was read (it is expected
    to repeat on the next read); before that it is raised.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    out: list[Received] = []
    while len(out) < count:
        left = deadline - loop.time()
        if left <= 0:
            break
        try:
            got = await fetch(count - len(out), left)
        except TimeoutError:
            break
        except Exception:
            if out:
                break
            raise
        out.extend(got)
    return out
