"""``python -m outrelay`` runs the CLI."""

from outrelay.core.cli.main import main

main()
