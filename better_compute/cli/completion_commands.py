"""Shell completion for bash, zsh and fish (issue 12): `completion SHELL` prints the script; the
script calls better-compute back with `_BETTER_COMPUTE_COMPLETE` set, and then (and only then)
prepare() teaches the command tree to complete pools, nodes, tenants and the principal's own
reservation ids from the ledger. A normal run checks one environment variable and imports
nothing of this (tests/test_speed.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from better_compute import identity
from better_compute.cli.app import G, JsonFlag, app, emit, handled
from better_compute.errors import InvalidInput
from better_compute.lazy import lazy

if TYPE_CHECKING:
    from better_compute.service import completing
else:
    completing = lazy("better_compute.service.completing")

PROG = "better-compute"
COMPLETE_VAR = "_BETTER_COMPUTE_COMPLETE"
SHELLS = ("bash", "zsh", "fish")

#: Parameter name -> what its values are. `node add NODE` names a new node: not completed.
DYNAMIC = {"pool": "pool", "node": "node", "tenant": "tenant", "rsv": "rsv", "reservation": "rsv"}
NOT_EXISTING = {("node add", "node")}
#: Fixed vocabularies.
STATIC = {
    ("launch", "fmt"): ("env", "hostfile", "torchrun", "json"),
    ("list", "sort"): ("created", "start"),
    ("list", "state"): ("pending", "placed", "binding", "active", "released"),
}


@app.command()
@handled
def completion(
    shell: Annotated[str, typer.Argument(help="bash, zsh or fish.", metavar="SHELL")],
    as_json: JsonFlag = False,
) -> None:
    """Print the shell completion script (commands, flags, pools, nodes, tenants, your ids)."""
    if shell not in SHELLS:
        raise InvalidInput(f"SHELL must be one of {', '.join(SHELLS)}, got {shell!r}")
    from typer._completion_shared import get_completion_script

    script = get_completion_script(prog_name=PROG, complete_var=COMPLETE_VAR, shell=shell)
    if as_json or G.json:
        emit(True, {"shell": shell, "script": script})
    else:
        typer.echo(script)


def asked() -> bool:
    """True while a shell is asking for completions."""
    return bool(os.environ.get(COMPLETE_VAR))


def prepare(command: Any, path: tuple[str, ...] = ()) -> None:
    """Register Typer's bash, zsh and fish completers and give every parameter that names a
    pool, node, tenant or reservation its values."""
    if not path:
        from typer._completion_classes import completion_init

        completion_init()
    where = " ".join(path)
    for param in command.params:
        kind = DYNAMIC.get(param.name or "")
        fixed = STATIC.get((where, param.name or ""))
        if fixed is not None:
            param._custom_shell_complete = _fixed(fixed)
        elif kind is not None and (where, param.name) not in NOT_EXISTING:
            param._custom_shell_complete = _from_ledger(kind)
    for name, sub in (getattr(command, "commands", None) or {}).items():
        prepare(sub, (*path, name))


Completer = Callable[[Any, Any, str], list[str]]


def _fixed(values: tuple[str, ...]) -> Completer:
    def complete(ctx: Any, param: Any, incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return complete


def _from_ledger(kind: str) -> Completer:
    def complete(ctx: Any, param: Any, incomplete: str) -> list[str]:
        root = ctx.find_root().params
        db = root.get("db") or os.environ.get("BETTER_COMPUTE_DB") or "better-compute.db"
        as_name = root.get("as_") or os.environ.get("BETTER_COMPUTE_PRINCIPAL")
        try:
            values = completing.candidates(kind, str(db), identity.os_user(), as_name)
        except Exception:  # a shell asking must never see an error: offer nothing
            return []
        return [v for v in values if v.startswith(incomplete)]

    return complete
