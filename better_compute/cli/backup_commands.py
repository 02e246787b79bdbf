"""Backup and restore: a consistent copy while others write, checked before it replaces anything."""

from __future__ import annotations

from typing import Annotated

import typer

from better_compute.cli import (  # noqa: F401  (registered first: backup and restore end the help)
    hardware_commands,
    reserve_commands,
    run_commands,
    setup_commands,
)
from better_compute.cli.app import G, JsonFlag, app, ctx, emit, handled, me
from better_compute.model import JsonValue
from better_compute.service import backups
from better_compute.storage.backup import Copy


def _doc(copy: Copy) -> JsonValue:
    return _doc_fields(copy)


def _doc_fields(copy: Copy) -> dict[str, JsonValue]:
    return {
        "path": copy.path,
        "bytes": copy.bytes,
        "schemaVersion": copy.schema_version,
        "dbId": copy.db_id,
        "reservations": copy.reservations,
        "events": copy.events,
    }


def _counts(copy: Copy) -> str:
    return (
        f"{copy.bytes} bytes, schema version {copy.schema_version},"
        f" {copy.reservations} reservations, {copy.events} events"
    )


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
    emit(as_json, _doc(copy), f"backed up {G.db} to {copy.path}: {_counts(copy)}")


@app.command()
@handled
def restore(
    path: Annotated[str, typer.Argument(help="A file written by `backup`.")],
    as_json: JsonFlag = False,
) -> None:
    """Replace the ledger with a backup, after checking it (admin only)."""
    copy = backups.restore(G.db, path, me(), G.principal)
    doc = {"from": path, **_doc_fields(copy)}
    emit(as_json, doc, f"restored {G.db} from {path}: {_counts(copy)}")
