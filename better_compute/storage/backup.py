"""Backup and restore of the SQLite ledger.

A backup is taken with SQLite's online backup API in one step: one read snapshot, so it holds
every transaction committed before it began (including those still in the WAL, which a plain `cp`
of the main file misses) and none half-written, while writers go on. The copy is a standalone file
in rollback-journal mode (no -wal/-shm needed to read it), mode 0600.

A restore checks the copy before it replaces anything, in a temp file beside the ledger, then
swaps it in exactly as `init --force` does (storage/replace.py).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from better_compute.errors import Conflict, InvalidInput, Unavailable
from better_compute.model import LedgerCopy as Copy
from better_compute.storage import files, ledger, replace
from better_compute.storage.conn import Ledger
from better_compute.storage.db import (
    SQLITE_MAGIC,
    Database,
    _configure,
    _header_kind,
    _migrate,
    _require_our_schema,
    _require_path,
    file_identity,
    refuse_sidecar,
)
from better_compute.storage.schema import APPLICATION_ID, SCHEMA_VERSION

#: SQLite's primary result codes for a failed write of the copy (sqlite3 exposes only the number).
SQLITE_IOERR, SQLITE_FULL = 10, 13


def _summary(conn: sqlite3.Connection) -> tuple[int, str, int, int]:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    db_id = str(conn.execute("SELECT value FROM meta WHERE key = 'db_id'").fetchone()[0])
    reservations = int(conn.execute("SELECT COUNT(*) FROM reservations").fetchone()[0])
    events = int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    return version, db_id, reservations, events


def backup_to(db: Ledger, dest: str, *, force: bool, mode: int = 0o600) -> Copy:
    """Copy the open ledger to `dest` (a new file unless `force`), consistent while others write."""
    if not isinstance(db, Database):
        raise InvalidInput(
            "backup copies an SQLite ledger file; a PostgreSQL ledger is backed up with pg_dump,"
            " or copied to an SQLite file with `better-compute migrate --to FILE`"
        )
    if not dest.strip():
        raise InvalidInput("name a file to write the backup to")
    refuse_sidecar(dest)  # SQLite's own files beside any database, this ledger's among them
    target = files.real_target(dest)
    files.sweep_stale(target)
    ledger = files.real_target(str(db.path))
    if target.parent == ledger.parent and target.name == ledger.name + files.WAITING:
        raise InvalidInput(
            f"{dest!r} is one of the files better-compute keeps beside the ledger; name another"
            " file"
        )
    if target.exists():
        if not target.is_file():
            raise InvalidInput(f"{dest!r} is not a regular file; name a file for the backup")
        if db.identity == file_identity(target):
            raise InvalidInput(f"{dest!r} is the ledger itself; name another file")
        if not force:
            raise Conflict(f"{dest!r} already exists; add --force to replace it")
    with files.stopped_by_sigterm():
        summary = _write_copy(db, files.new_temp(target, mode), target, force, dest)
    version, db_id, reservations, events = summary
    return Copy(str(dest), target.stat().st_size, version, db_id, reservations, events)


def _write_copy(
    db: Database, temp: Path, target: Path, force: bool, dest: str
) -> tuple[int, str, int, int]:
    """The copy, built beside `target` and given its name: its summary."""
    try:
        out = sqlite3.connect(str(temp), isolation_level=None)
        try:
            db.require_same_file()
            db.conn.backup(out)  # pages=-1: the whole file in one step, from one snapshot
            summary = _summary(out)
            out.execute("PRAGMA journal_mode = DELETE")  # standalone: readable without sidecars
        finally:
            out.close()
        files.fsync_file(temp)
        _place(temp, target, force=force, shown=dest)
    except (sqlite3.DatabaseError, OSError) as exc:
        raise Unavailable(f"cannot write the backup {dest!r}: {exc}; nothing was written") from None
    finally:
        files.discard(temp)
    return summary


def _place(temp: Path, target: Path, *, force: bool, shown: str) -> None:
    """Give the copy its name. SQLite pairs a `-wal` with its database by name only, so one left
    beside the target (by the ledger that was there, or by one deleted without its sidecars)
    would be replayed onto the copy: it read back as that old ledger, or as damaged. So the
    sidecars go first: where no file is, under the folder lock, as `init` places a new ledger;
    over a file `--force` replaces, whatever it is (a damaged or newer backup included, and
    without waiting for a reader of it)."""
    if not force:  # no file was there (else CONFLICT already): one placed meanwhile stays
        replace.swap_in(target, temp, replacing=False)
        return
    files.remove_sidecars(target)
    files.place(temp, target, overwrite=True, shown=shown)


def _check_source(source: str, ledger: Path) -> Path:
    """The cheap checks, from the header, before anything is copied."""
    path = Path(source)
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a regular file"
        raise InvalidInput(f"backup {source!r} {what}")
    if file_identity(path) == file_identity(ledger):
        raise InvalidInput(f"backup {source!r} is the ledger itself")
    try:
        with path.open("rb") as handle:
            header = handle.read(100)
    except OSError as exc:
        raise InvalidInput(f"cannot read backup {source!r}: {exc.strerror}") from None
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise InvalidInput(f"backup {source!r} is not an SQLite file")
    app_id = int.from_bytes(header[68:72], "big")
    if app_id != APPLICATION_ID:
        raise InvalidInput(
            f"backup {source!r} is not a better-compute ledger (application_id {app_id:#x})"
        )
    return path


def backup_runs_on_manual_clock(source: str) -> bool:
    """Whether the backup `source` is a what-if ledger (`init --now`: meta clock 'manual'),
    read before anything is replaced from its header and meta row alone (the full integrity
    check comes with the copy). False when it cannot be read as a ledger, or has a newer schema:
    the restore's own checks then say why."""
    try:
        path = _check_source(source, Path(os.devnull))
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            row = conn.execute("SELECT value FROM meta WHERE key = 'clock'").fetchone()
        finally:
            conn.close()
    except (InvalidInput, sqlite3.DatabaseError):
        return False
    return version <= SCHEMA_VERSION and row is not None and row[0] == ledger.MANUAL


def _fill_from(source: Path, name: str, summary: list[tuple[int, str, int, int]]) -> replace.Build:
    """Copy the backup into the temp file, check it, migrate it forward: INVALID_INPUT if bad."""

    def bad(why: str) -> InvalidInput:
        return InvalidInput(f"backup {name!r} {why}; nothing was replaced")

    def build(db: Database) -> None:
        try:
            src = sqlite3.connect(source.resolve().as_uri() + "?mode=ro", uri=True)
            try:
                src.backup(db.conn)
            finally:
                src.close()
            problems = [row[0] for row in db.conn.execute("PRAGMA integrity_check(5)")]
        except sqlite3.DatabaseError as exc:
            if exc.sqlite_errorcode & 0xFF in (SQLITE_IOERR, SQLITE_FULL):  # writing the copy
                raise Unavailable(
                    f"cannot write the restored ledger in {str(db.path.parent)!r}: {exc} (disk"
                    " full?); nothing was replaced"
                ) from None
            raise bad(f"cannot be read: {exc}") from None
        if problems != ["ok"]:
            raise bad(f"is damaged (integrity_check: {'; '.join(problems)})")
        if int(db.conn.execute("PRAGMA application_id").fetchone()[0]) != APPLICATION_ID:
            raise bad("is not a better-compute ledger")
        version = int(db.conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise bad(
                f"has schema version {version}, newer than this better-compute"
                f" ({SCHEMA_VERSION}); upgrade better-compute first"
            )
        try:
            _configure(db)
            _migrate(db)
            row = db.conn.execute("SELECT value FROM meta WHERE key = 'db_id'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise bad(f"cannot be brought to schema version {SCHEMA_VERSION}: {exc}") from None
        try:  # what every command checks on opening: restoring it would lock everyone out
            _require_our_schema(db)
        except sqlite3.DatabaseError as exc:
            raise bad(
                f"cannot be used: {exc} (a table, view, index or trigger was added, dropped or"
                " changed); remove what was added to the copy, or restore another backup"
            ) from None
        if row is None or not str(row[0]):
            raise bad("has no db_id in its meta table")
        clock = ledger.clock_rows(db.conn)  # every command reads it first, restore included
        if "clock" not in clock:  # made by `init`, or by the migration that added it
            raise bad("has no clock in its meta table")
        try:
            ledger.clock_of(clock)
        except ValueError as exc:
            raise bad(f"has a clock that cannot be read ({exc})") from None
        summary.append(_summary(db.conn))

    return build


def restore_from(path: str, source: str, *, mode: int | None = None) -> Copy:
    """Replace the ledger at `path` (or create it) with a checked copy of the backup `source`.

    The restored file keeps the permission bits and the group of the ledger it replaces (0600
    for a new one): a team that shares the file must not lose access by restoring it.
    """
    _require_path(path)
    kind = _header_kind(Path(path))
    if kind == "foreign":
        raise InvalidInput(
            f"{path!r} exists and is not a better-compute database; not replacing it"
        )
    target = files.real_target(path)
    files.sweep_stale(target)
    if mode is None:
        mode = stat.S_IMODE(target.stat().st_mode) if kind == "ours" else 0o600
    group = target.stat().st_gid if kind == "ours" else None
    checked = _check_source(source, target)
    summary: list[tuple[int, str, int, int]] = []
    fill = _fill_from(checked, source, summary)

    def build(db: Database) -> None:
        if group is not None:  # a team's ledger stays the team's
            os.chown(db.path, -1, group)
        fill(db)

    with files.stopped_by_sigterm():
        temp = replace.build_temp(target, mode, build)
        replace.swap_in(target, temp, replacing=kind == "ours")
    version, db_id, reservations, events = summary[0]
    return Copy(path, target.stat().st_size, version, db_id, reservations, events)
