"""Replacing the ledger file atomically (init, init --force, restore): a kill -9 or a full disk at
any moment leaves either the old ledger or the new one, whole, never a half-built file.

The order, and why each step is where it is:

1. Build the new ledger in a temp file beside the old one (same file system, so the rename is
   atomic), with its mode set before anything is written. Checkpoint its WAL into it (TRUNCATE),
   close it, insist no `-wal` is left, fsync it. A crash or a full disk here leaves a stray temp
   file (swept by a later run) and the old ledger untouched.
2. Take the old ledger's write lock (BEGIN IMMEDIATE, waiting its busy timeout; else UNAVAILABLE,
   nothing changed), then check the path still names the file we locked (another replace may have
   won the race). Writers now queue behind us.
3. Checkpoint the old WAL fully into the old file: PASSIVE, from a second connection (ours is in a
   transaction and may not checkpoint), retried while a reader holds an older snapshot. SQLite
   fsyncs the old file once the whole WAL is in it. From here the old `-wal` holds nothing the old
   file lacks, so removing it loses nothing even if we die the next instant.
4. Remove the old `-wal`, `-shm` (and a stray `-journal`). They must go before the rename: SQLite
   pairs a WAL with its database by name only, so a `-wal` left behind would be replayed onto the
   new file, and a shared `-shm` would mix two files' indexes. Connections already open keep their
   unlinked copies and go on reading the old ledger.
5. Rename the temp file onto the ledger's name and fsync the folder. This is the commit point.
6. Release the lock. Writers that queued get it on the unlinked old file; `Database.write` sees the
   path now names another file and rolls back with UNAVAILABLE. Closing a connection to a moved
   file neither checkpoints into nor deletes the new file's `-wal` (SQLite checks that the file
   has not moved first).

A new ledger (where the caller found no file, or an empty one) skips steps 2 to 4: it takes the
name under a lock on the folder, and only if the name is still free (storage/files.folder_lock),
so of two processes creating one file the second gets a CONFLICT and the first's ledger stays.

Known limit: a process that *first opens* the ledger in the microseconds between steps 4 and 5
creates fresh sidecars our lock does not cover; it would have to open, begin and finish a write in
that window for its pages to reach the new file's WAL.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path

from better_compute.errors import BetterComputeError, Conflict, Forbidden, Unavailable
from better_compute.storage import files
from better_compute.storage.db import DEFAULT_BUSY_TIMEOUT_MS, Database, lock_out_writers

Build = Callable[[Database], None]


def build_temp(target: Path, mode: int, build: Build) -> Path:
    """Step 1: a complete, closed, synced new database beside `target`; the caller renames it."""
    temp = files.new_temp(target, mode)
    try:
        db = Database(temp, DEFAULT_BUSY_TIMEOUT_MS)
        try:
            build(db)
            busy, log, done = db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if busy or log != done:
                raise Unavailable(f"could not finish the new database beside {target}")
        finally:
            db.close()
        if files.sidecar(temp, "-wal").exists():
            raise Unavailable(f"could not finish the new database beside {target}")
        files.fsync_file(temp)
    except BetterComputeError:
        files.discard(temp)
        raise
    except (sqlite3.DatabaseError, OSError) as exc:
        files.discard(temp)
        kept = "the old one is untouched" if target.exists() else "nothing was written"
        raise Unavailable(
            f"cannot write the new database beside {str(target)!r}: {exc} (disk full?); {kept}"
        ) from None
    except BaseException:
        files.discard(temp)
        raise
    return temp


def swap_in(target: Path, temp: Path, *, replacing: bool) -> None:
    """Steps 2 to 6 (see the module docstring). `replacing` says a ledger of ours is there now."""
    try:
        if not replacing:
            _place_new(target, temp)
            return
        _require_replaceable(target)
        old = lock_out_writers(target)
        try:
            _checkpoint_fully(target, old)
            files.remove_sidecars(target)
            try:
                os.replace(temp, target)
            except OSError as exc:  # an immutable file, a folder we may not write: refused
                said = (
                    f"cannot replace {str(target)!r}: {exc.strerror}; the old ledger is unchanged"
                )
                if exc.errno in (errno.EPERM, errno.EACCES):  # who you are, not the ledger's state
                    raise Forbidden(
                        f"{said} (replacing it needs a folder you may write, and in a sticky"
                        " folder such as /tmp, owning the file)"
                    ) from None
                raise Unavailable(said) from None
            files.fsync_dir(target.parent)
        finally:
            if old.conn.in_transaction:
                old.conn.execute("ROLLBACK")
            old.close()
    finally:
        files.discard(temp)  # nothing left if renamed; the unused temp if anything failed


def _require_replaceable(target: Path) -> None:
    """Step 0: what the rename (step 5) refuses for who this user is, refused before anything is
    touched: a folder this user may not write, or in a sticky one (a team's 1770, /tmp) a file
    of the ledger's that is another user's (only its owner may replace or remove it there).
    Found at the rename, after step 4 had removed the sidecars, the other members' open
    connections went on committing into the removed `-wal`: lost, and the ledger damaged once
    another member opened it (a review). Root may do both."""
    if os.geteuid() == 0:
        return
    folder = target.parent
    said = f"cannot replace {str(target)!r}"
    if not os.access(folder, os.W_OK | os.X_OK):
        raise Forbidden(
            f"{said}: you may not write its folder {str(folder)!r}; the old ledger is unchanged"
        )
    info = os.stat(folder)
    if not info.st_mode & stat.S_ISVTX or info.st_uid == os.geteuid():
        return
    for path in (target, *(files.sidecar(target, suffix) for suffix in files.SIDECARS)):
        try:
            owner = os.lstat(path).st_uid
        except FileNotFoundError:
            continue
        if owner != os.geteuid():
            raise Forbidden(
                f"{said}: its folder is sticky and {path.name} is another user's (there only a"
                " file's owner may replace or remove it): run it as that user, or once nobody"
                " holds the ledger open; the old ledger is unchanged"
            )


def _place_new(target: Path, temp: Path) -> None:
    """Give the new ledger the name where the caller found none (a missing or empty file).

    Another process may have placed a ledger there since the caller looked (two `init`, or two
    `migrate --to` the same new file): it may be in use already, so it is a CONFLICT and stays
    as it is, its `-wal` included. Under the folder lock the look, the sidecar sweep and the
    rename are one step for every process placing a new ledger there."""
    with files.folder_lock(target.parent):
        if target.exists() and (not target.is_file() or target.stat().st_size > 0):
            raise Conflict(
                f"{str(target)!r} is not empty any more: another process placed a file there"
                " meanwhile; it is left as it is, and nothing was written"
            )
        files.remove_sidecars(target)  # a missing or empty file: any -wal there is stale
        files.place(temp, target, overwrite=target.exists())


def _checkpoint_fully(target: Path, old: Database) -> None:
    """Step 3: copy every frame of the old WAL into the old file while we hold its write lock."""
    timeout_ms = int(old.conn.execute("PRAGMA busy_timeout").fetchone()[0])
    attempts = max(1, timeout_ms // 10)  # 10 ms apart: the busy timeout, without reading a clock
    conn = sqlite3.connect(str(target), isolation_level=None, timeout=timeout_ms / 1000)
    try:
        for _ in range(attempts):
            try:
                _busy, log, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.DatabaseError as exc:
                raise Unavailable(
                    f"cannot checkpoint {str(target)!r}: {exc}; nothing was replaced"
                ) from None
            if log == done:  # both -1 when the file is not in WAL mode: nothing to copy
                return
            time.sleep(0.01)
    finally:
        conn.close()
    raise Unavailable(
        f"readers kept {str(target)!r} busy past the busy timeout; nothing was replaced, try again"
    )
