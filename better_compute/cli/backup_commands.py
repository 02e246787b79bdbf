"""Backup and restore: a consistent copy while others write, checked before it replaces anything."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from better_compute.cli import (  # noqa: F401  (registered first: backup and restore end the help)
    advice_commands,
    hardware_commands,
    reserve_commands,
    run_commands,
    setup_commands,
)
from better_compute.cli.app import G, JsonFlag, app, ctx, emit, handled, me
from better_compute.lazy import lazy

if TYPE_CHECKING:
    from better_compute.render import human
    from better_compute.render import json as js
    from better_compute.service import backups
else:
    human = lazy("better_compute.render.human")
    js = lazy("better_compute.render.json")
    backups = lazy("better_compute.service.backups")


@app.command()
@handled
def backup(
    path: Annotated[str, typer.Argument(help="The file to write (mode 0600).")],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Copy the ledger to PATH, consistently, while others go on writing."""
    c = ctx()
    try:
        copy = backups.backup(c, path, force)
    finally:
        c.db.close()
    emit(
        as_json, js.ledger_copy(copy), f"backed up {G.db} to {copy.path}: {human.ledger_copy(copy)}"
    )


@app.command()
@handled
def restore(
    path: Annotated[str, typer.Argument(help="A file written by `backup`.")],
    as_json: JsonFlag = False,
) -> None:
    """Replace the ledger with a backup, after checking it (admin only)."""
    copy = backups.restore(G.db, path, me(), G.principal, now_asked=G.now_text is not None)
    doc = {"from": path, **js.ledger_copy(copy)}
    emit(as_json, doc, f"restored {G.db} from {path}: {human.ledger_copy(copy)}")
