"""The command line: `app` (Typer) and `main` (the entry point). One module per group of commands:
parse -> service call -> render -> exit code. No SQL and no placement logic here."""

from better_compute.cli import (  # noqa: F401  (importing registers the commands, in help order)
    backup_commands,
    hardware_commands,
    reserve_commands,
    run_commands,
    setup_commands,
    simulate_commands,
)
from better_compute.cli.app import app, main

__all__ = ["app", "main"]
