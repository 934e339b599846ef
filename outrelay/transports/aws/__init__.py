"""The ``sns`` and ``sqs`` transport plugin (Amazon SNS topics and SQS queues through boto3).

The implementation needs ``pip install "outrelay[sns]"`` (or ``[sqs]``; both
install boto3). Importing this package never imports the client library:
the registry loads ``_sns.py`` / ``_sqs.py`` only when a destination uses
``sns`` / ``sqs``. One hook implementation registers both names (pluggy
takes one ``outrelay_add_transports`` per module).

Modules: ``_config`` (options), ``_errors`` (the one error table),
``_client`` (the boto3 client and its threads), ``_wire`` (a message's
body, attributes and FIFO ids), ``_batch`` (batch requests, progress),
``_transport`` (the shared base), ``_sns`` / ``_sqs`` (the transports) and
``_reader`` (reading back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outrelay.kit import hookimpl

if TYPE_CHECKING:
    from outrelay.kit import Registry

__all__ = ["outrelay_add_transports"]


@hookimpl
def outrelay_add_transports(registry: Registry) -> None:
    """Register ``sns`` and ``sqs`` (both need boto3)."""
    registry.add_transport("sns", "outrelay.transports.aws._sns:SNSTransport", requires=("boto3",), extra="sns")
    registry.add_transport("sqs", "outrelay.transports.aws._sqs:SQSTransport", requires=("boto3",), extra="sqs")
