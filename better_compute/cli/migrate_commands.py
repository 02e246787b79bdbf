"""`migrate --to`: the ledger from SQLite to PostgreSQL or back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from better_compute.cli.app import G, JsonFlag, app, ctx, emit, handled
from better_compute.lazy import lazy

if TYPE_CHECKING:
    from better_compute.render import copies
    from better_compute.service import migrating
else:
    copies = lazy("better_compute.render.copies")
    migrating = lazy("better_compute.service.migrating")


@app.command()
@handled
def migrate(
    to: Annotated[
        str, typer.Option("--to", help="The new ledger: a postgresql:// URL or an SQLite file.")
    ],
    as_json: JsonFlag = False,
) -> None:
    """Copy the whole ledger into a new, empty one on the other backend (admin only)."""
    c = ctx()
    try:
        report, added = migrating.migrate(c, to)
    finally:
        c.db.close()
    emit(
        as_json,
        copies.doc(G.db, to, report, added),
        lambda: copies.table(G.db, to, report, added),
    )
