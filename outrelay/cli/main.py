"""The ``outrelay`` command line.

Every command has ``--help``. Errors print one line on stderr
(``outrelay: error: what — where — how to fix``) and exit non-zero.
A traceback is a bug; set ``OUTRELAY_DEBUG=1`` to see one anyway.

Exit codes: 0 ok; 1 runtime failure (a broker or the outbox failed, a drain
left work, a command found nothing to do that was asked); 2 usage (a bad flag
or value, an invalid config or event); 130 interrupted.
"""

from __future__ import annotations

import os
import sys

import typer

try:  # typer >= 0.2x vendors click: its usage errors come from there
    from typer._click import exceptions as cx
except ImportError:  # pragma: no cover - older typer on the real click
    from click import exceptions as cx  # type: ignore[no-redef]

from outrelay._version import __version__
from outrelay.cli import attempts, audit, check, commands, config_cmd, dlq, ops, status
from outrelay.cli._common import err_console, error_line, quiet_stdout
from outrelay.core.model.errors import ConfigError, EventError, OutrelayError

__all__ = ["EXIT_CODES", "app", "main"]

EXIT_CODES = (
    "Exit codes: 0 ok; 1 runtime failure (broker or outbox failed, drain incomplete, nothing to do that was asked); "
    "2 usage (bad flag or value, invalid config or event); 130 interrupted."
)

app = typer.Typer(
    name="outrelay",
    help="Transactional-outbox relay: append events to an outbox, deliver them to every broker.",
    epilog=EXIT_CODES,
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # plain click help: no `<bool>` metavars on flags, stable at 80 columns, greppable
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"outrelay {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Transactional-outbox relay: append events to an outbox, deliver them to every broker."""


commands.register(app)
check.register(app)
status.register(app)
ops.register(app)
attempts.register(app)
app.add_typer(dlq.app, name="dlq")
app.add_typer(config_cmd.app, name="config")
app.add_typer(audit.app, name="audit")


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; every error (usage or outrelay's) becomes one line and an exit code."""
    try:
        # not standalone: click's own usage errors are multi-line panels; we print them as one line
        rv = app(args=argv, prog_name="outrelay", standalone_mode=False)
    except SystemExit:
        raise
    except cx.NoArgsIsHelpError as exc:
        # `outrelay` or `outrelay dlq` alone: the help, as a usage error
        if exc.ctx is not None:
            print(exc.ctx.get_help())
        sys.exit(2)
    except cx.ClickException as exc:
        path = exc.ctx.command_path if isinstance(exc, cx.UsageError) and exc.ctx else "outrelay"
        sub = path.removeprefix("outrelay").strip()
        hint = f" (see `{path} --help`)" if isinstance(exc, cx.UsageError) else ""
        msg = exc.format_message().replace("Value error, ", "")  # pydantic-style prefix of typer 0.2x
        _fail(f"{sub + ': ' if sub else ''}{msg}{hint}", exc.exit_code)
    except typer.Abort:  # a confirmation answered "no" (or stdin closed)
        _fail("aborted", 1)
    except (ConfigError, EventError) as exc:
        _fail(exc, 2)
    except OutrelayError as exc:
        _fail(exc, 1)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # `outrelay dlq list | head`: the reader closed the pipe on purpose
        quiet_stdout()
        sys.exit(0)
    sys.exit(rv if isinstance(rv, int) else 0)


def _fail(exc: Exception | str, code: int) -> None:
    if os.environ.get("OUTRELAY_DEBUG") and isinstance(exc, Exception):
        raise exc
    msg = str(exc).replace("\n", " ")
    err_console.print(error_line(msg), markup=False, soft_wrap=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
