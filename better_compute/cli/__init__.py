"""The command line: `app` (Typer) and `main` (the entry point). One module per group of commands:
parse -> service call -> render -> exit code. No SQL and no placement logic here.

Start-up (issue 8): building every command of the Typer app costs more than most commands run.
`main` reads the command word from argv and loads only the module that registers it (COMMANDS);
any other word, no word, or `--help` loads them all, in the order that fixes the help's order.
`app`, for tests and tools, is always the whole app.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from better_compute.cli import app as _app_module
from better_compute.cli import examples

if TYPE_CHECKING:
    import typer

    app: typer.Typer

del globals()["app"]  # importing the submodule bound its name: `app` is the Typer app (below)

#: Every command module, in help order (backup_commands itself loads the others first).
MODULES: tuple[str, ...] = (
    "advice_commands",
    "backup_commands",
    "hardware_commands",
    "migrate_commands",
    "reserve_commands",
    "launch_commands",
    "run_commands",
    "setup_commands",
    "simulate_commands",
    "webhook_commands",
    "completion_commands",
)

#: Command words whose commands live wholly in one module (tests/test_speed.py checks it).
COMMANDS: dict[str, str] = {
    "reserve": "reserve_commands",
    "preview": "reserve_commands",
    "get": "reserve_commands",
    "list": "reserve_commands",
    "cancel": "reserve_commands",
    "extend": "reserve_commands",
    "release": "reserve_commands",
    "launch": "launch_commands",
    "update": "launch_commands",
    "completion": "completion_commands",
    "tick": "run_commands",
    "timeline": "run_commands",
    "events": "run_commands",
    "pool": "setup_commands",
    "webhook": "webhook_commands",
    "advice": "advice_commands",
    "migrate": "migrate_commands",
}

#: Set by the completion script when a shell asks for completions.
_COMPLETE_VAR = "_BETTER_COMPUTE_COMPLETE"

#: Global options that take a value (see cli/app.py main_options).
_VALUED = ("--db", "--now", "--as")


def load(modules: tuple[str, ...] = MODULES) -> None:
    for name in modules:
        importlib.import_module(f"better_compute.cli.{name}")
    examples.attach(_app_module.app)
    examples.tidy_help()


def command_word(argv: list[str]) -> str | None:
    """The first argument that is not a global option or its value; None if there is none."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _VALUED:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return arg
    return None


def main() -> None:
    """Entry point: load what the command needs, then run it (cli/app.py main)."""
    import os
    import sys

    argv = sys.argv[1:]
    word = command_word(argv)
    if word is None and "--version" in argv and "--help" not in argv:
        pass  # answered by an eager option, before any command is looked up
    elif word in COMMANDS and "--help" not in argv:
        load((COMMANDS[word],))
    else:
        load()
    if _COMPLETE_VAR in os.environ:  # a shell asking for completions (cli/completion_commands.py)
        from better_compute.cli import completion_commands

        _app_module.main(prepare=completion_commands.prepare)
    else:  # a mapped word builds only its own command (cli/app.py `only`)
        _app_module.main(word=word if word in COMMANDS and "--help" not in argv else None)


def __getattr__(name: str) -> Any:
    if name == "app":
        load()
        return _app_module.app
    raise AttributeError(name)


__all__ = ["app", "main"]
