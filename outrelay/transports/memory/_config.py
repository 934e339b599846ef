"""Options of a ``memory`` destination."""

from __future__ import annotations

from outrelay.kit import TransportConfig

__all__ = ["MemoryConfig"]


class MemoryConfig(TransportConfig):
    """``[destinations.NAME]`` options of the memory transport.

    * ``broker`` — the name of the in-process broker (transports sharing it share messages).
    * ``target`` — the target template (``"{type}"``).
    * ``max_message_bytes`` — larger event data is rejected; ``None``: no limit.
    * ``dedupe`` — an event id the broker already stored is answered ``Delivered(duplicate=True)``.
    * ``reject_types`` — event types rejected permanently (for fault tests).
    * ``latency`` — seconds each ``send`` waits before storing its batch.
    * ``down`` — the broker is unreachable: ``open`` fails, sends are RetryLater.
    """

    broker: str = "default"
    target: str = "{type}"
    max_message_bytes: int | None = None
    dedupe: bool = True
    reject_types: tuple[str, ...] = ()
    latency: float = 0.0
    down: bool = False
