"""``python -m outrelay`` runs the CLI."""

from outrelay.cli.main import main

main()
