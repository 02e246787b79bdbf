"""`migrate --to`: copy the whole ledger to a new one on the other backend (issue 9)."""

from __future__ import annotations

from better_compute.errors import InvalidInput
from better_compute.identity import os_user
from better_compute.service.authz import require_admin
from better_compute.service.context import Ctx
from better_compute.storage.copy import TableCopy, copy_ledger
from better_compute.storage.db import refuse_foreign_url


def migrate(ctx: Ctx, target: str) -> tuple[list[TableCopy], str | None]:
    """Every table of the ledger into a new, empty ledger at `target` (a file or a URL); and the
    admin added there, if whoever acts on the target (its PostgreSQL role, or this OS user for a
    file) was not an admin of the source already.

    Admins only: the copy holds every tenant's reservations and the ledger's rules. The new
    ledger keeps the source's id, so it replays and names things exactly as the source would."""
    require_admin(ctx.who, "migrate the ledger")
    if not target.strip():
        raise InvalidInput("--to is empty; name an SQLite file or a postgresql:// URL")
    refuse_foreign_url(target, "--to")
    return copy_ledger(ctx.db, target, at=ctx.now, by=ctx.who.name, os_user=os_user())
