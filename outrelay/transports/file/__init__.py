"""The ``file`` transport plugin: CloudEvents JSON Lines appended to a file (the demo, debugging).

The public names are re-exported here: ``from outrelay.transports.file import FileTransport``.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin
from outrelay.transports.file._config import FileConfig
from outrelay.transports.file._reader import FileReader
from outrelay.transports.file._transport import FileTransport

__all__ = ["FileConfig", "FileReader", "FileTransport", "outrelay_add_transports"]

outrelay_add_transports = transport_plugin("file", FileTransport)
