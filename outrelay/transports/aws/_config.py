"""Options shared by the ``sns`` and ``sqs`` transports (each adds its target in its own module).

Credentials and region come from the standard AWS chain (environment,
profile, instance role) unless given explicitly; ``endpoint_url`` points at
an emulator (moto, LocalStack). Secrets are :class:`~pydantic.SecretStr` and
never printed.
"""

from __future__ import annotations

from pydantic import Field, SecretStr

from outrelay.kit import TransportConfig

__all__ = ["SERVICE_LIMIT", "AWSConfig"]

SERVICE_LIMIT = 262_144  # 256 KiB: one message (body + attributes) and one batch request


class AWSConfig(TransportConfig):
    """Options shared by ``sns`` and ``sqs``.

    ``message_limit`` is the service's size limit for one encoded message
    (body + attributes) and for one batch request; the declared
    ``max_message_bytes`` of event data is derived from it, leaving room for
    the envelope and base64. botocore's own retries are off by default
    (``sdk_max_attempts = 1``): the relay owns backoff (with jitter and
    circuit breaking), so a throttled batch frees its thread at once instead
    of sleeping inside boto3.
    """

    region: str | None = None
    endpoint_url: str | None = None
    profile: str | None = None
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    fifo: bool | None = Field(None, description="None: a target ending in '.fifo' is FIFO")
    max_workers: int = Field(4, ge=1, le=64, description="threads = concurrent API calls")
    connect_timeout: float = Field(5.0, gt=0, le=120)
    read_timeout: float = Field(30.0, gt=0, le=600)
    sdk_max_attempts: int = Field(1, ge=1, le=10)
    message_limit: int = Field(SERVICE_LIMIT, ge=16_384, le=1_048_576)

    @property
    def max_data_bytes(self) -> int:
        return (self.message_limit - 8192) * 3 // 4

    def is_fifo(self, target: str) -> bool:
        """``fifo`` when set, else whether ``target`` (the template source) ends in ``.fifo``."""
        return self.fifo if self.fifo is not None else target.endswith(".fifo")
