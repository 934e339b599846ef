"""The ``sqs`` transport plugin; the implementation needs ``pip install "outrelay[sqs]"``.

Importing this package never imports the client library: the registry
loads ``_transport.py`` only when a destination uses ``sqs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outrelay.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from outrelay.core.registry import Registry


@hookimpl
def outrelay_add_transports(registry: Registry) -> None:
    registry.add_transport("sqs", "outrelay.transports.sqs._transport:SQSTransport", requires=("boto3",), extra="sqs")
