"""Backup and restore (PRODUCT.md §4): who may do them, and what the commands report."""

from __future__ import annotations

from better_compute.service.admission import require_admin
from better_compute.service.context import Ctx
from better_compute.storage.backup import Copy, backup_to, restore_from


def backup(ctx: Ctx, dest: str, force: bool) -> Copy:
    """Anyone who can read the ledger may copy it: a backup reveals nothing a read does not."""
    return backup_to(ctx.db, dest, force=force)


def restore(path: str, source: str, principal: str) -> Copy:
    """Replacing the ledger rewrites everyone's reservations: admin only, checked before the file
    is touched (the one place restore's permission is decided)."""
    require_admin(principal, "restore a ledger")
    return restore_from(path, source)
