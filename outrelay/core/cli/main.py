"""The ``outrelay`` command line.

Every command has ``--help``. Errors print one line on stderr
(``outrelay: error: what — where — how to fix``) and exit non-zero:
2 for configuration and usage errors, 1 for everything else. A traceback
is a bug; set ``OUTRELAY_DEBUG=1`` to see one anyway.
"""

from __future__ import annotations

import os
import sys

import typer

from outrelay.core.cli import commands, dlq, ops
from outrelay.core.cli._common import err_console
from outrelay.core.errors import ConfigError, OutrelayError

__all__ = ["app", "main"]

app = typer.Typer(
    name="outrelay",
    help="Transactional-outbox relay: append events to an outbox, deliver them to every broker.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
commands.register(app)
ops.register(app)
app.add_typer(dlq.app, name="dlq")


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning outrelay errors into one line."""
    try:
        app(args=argv, prog_name="outrelay", standalone_mode=True)
    except SystemExit:
        raise
    except ConfigError as exc:
        _fail(exc, 2)
    except OutrelayError as exc:
        _fail(exc, 1)
    except KeyboardInterrupt:
        sys.exit(130)


def _fail(exc: Exception, code: int) -> None:
    if os.environ.get("OUTRELAY_DEBUG"):
        raise exc
    msg = str(exc).replace("\n", " ")
    err_console.print(f"outrelay: error: {msg}", markup=False, soft_wrap=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
