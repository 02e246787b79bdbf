"""Backup, restore, and who may replace a ledger (PRODUCT.md §4, §6)."""

from __future__ import annotations

import shlex

from better_compute.errors import Damaged, Forbidden, InvalidInput
from better_compute.model import LedgerCopy
from better_compute.service.authz import require_admin
from better_compute.service.context import NO_NOW_ON_REAL_CLOCK, Ctx, open_ctx
from better_compute.storage.backup import backup_runs_on_manual_clock, backup_to, restore_from
from better_compute.storage.db import ledger_exists


def backup(ctx: Ctx, dest: str, force: bool) -> LedgerCopy:
    """Anyone who can read the ledger may copy it: on SQLite the file's permissions are the
    boundary, and whoever may read the file can copy it anyway (only less consistently)."""
    return backup_to(ctx.db, dest, force=force)


def replacer(
    path: str,
    me: str,
    as_name: str | None,
    what: str,
    *,
    pinned_clock: str | None = None,
    now_asked: bool = False,
) -> str:
    """Who replaces the ledger at `path` (`init --force`, `restore`): one of its admins, checked
    before the file is touched. Where no ledger exists yet there is nobody to check `--as`
    against, so the user acts as itself (and becomes the first admin of what it creates).

    `pinned_clock`: the new ledger would run on a manual clock, and this says why a real-clock
    ledger refuses to be replaced so: its time would stop for good, and its cron `tick` would
    never release anything again (a stale BETTER_COMPUTE_NOW to `init --force`, a what-if
    backup to `restore`). `now_asked`: the command was given --now (or
    BETTER_COMPUTE_NOW), which a real-clock ledger refuses on every write (§2), this one too."""
    if ledger_exists(path):
        try:
            old = open_ctx(path, None, me, as_name)
        except Damaged as exc:  # its admins cannot be read: nobody could be checked
            raise Damaged(
                f"{exc.message}; so its admins cannot be checked and it is not replaced. To"
                f" {what} there anyway, move the file aside first (with its -wal and -shm),"
                f" e.g. `mv {shlex.quote(path)} {shlex.quote(path + '.damaged')}`"
            ) from None
        try:
            require_admin(old.who, what)
            if pinned_clock is not None and not old.manual_clock:
                raise InvalidInput(pinned_clock)
            if now_asked and not old.manual_clock:
                raise InvalidInput(NO_NOW_ON_REAL_CLOCK)
            return old.who.name
        finally:
            old.db.close()
    if as_name is not None and as_name != me:
        raise Forbidden(
            f"--as {as_name!r}: a new ledger has no admins yet to allow acting as someone else;"
            f" you ({me!r}) become its first admin, then `admin add` others"
        )
    return me


def restore(
    path: str, source: str, me: str, as_name: str | None, *, now_asked: bool = False
) -> LedgerCopy:
    """Replacing the ledger rewrites everyone's reservations: its admins only. It writes, so a
    real-clock ledger refuses it with --now (`now_asked`), as every other write."""
    pinned = None
    if backup_runs_on_manual_clock(source):
        pinned = (
            f"backup {source!r} runs on a manual clock (a what-if ledger made by `init --now`)"
            " and this ledger on the real clock: restored over it, its time would stop; restore"
            " it to another --db, or remove this one first"
        )
    replacer(path, me, as_name, "restore a ledger", pinned_clock=pinned, now_asked=now_asked)
    return restore_from(path, source)
