"""File-system steps for writing a database file safely: private temp files, fsync, sidecars.

A database is never written in place when it is made whole (init, restore, backup): it is built in
a temporary file in the destination's folder (same file system, so rename is atomic) and renamed.
A crash leaves at worst a stray temp file, named so that a later run can tell it is stale.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from better_compute import clock
from better_compute.errors import Conflict, InvalidInput

#: SQLite finds a database's journals by name (the real path plus these suffixes), not by inode.
SIDECARS = ("-wal", "-shm", "-journal")
#: Beside the ledger too, but not SQLite's: the word a writer waiting for the lock leaves for a
#: replay (storage/db.Database._say_waiting). A replaced ledger starts without it.
WAITING = "-waiting"
_TEMP_MARK = ".bc-tmp-"


def sidecar(path: Path, suffix: str) -> Path:
    return Path(str(path) + suffix)


def real_target(path: str) -> Path:
    """The file SQLite really opens (it resolves symlinks, and names the -wal after the target)."""
    return Path(os.path.realpath(path))


def new_temp(target: Path, mode: int) -> Path:
    """Create an empty private file beside `target`, with exactly `mode` (umask does not apply)."""
    folder = target.parent
    if not folder.is_dir():
        raise InvalidInput(f"cannot create {str(target)!r}: folder {str(folder)!r} does not exist")
    sweep_stale(target)
    # os.urandom, not secrets: every command that opens a ledger imports this module, and
    # secrets brings random, hmac and base64 (about 2 ms)
    name = f".{target.name}{_TEMP_MARK}{os.getpid()}-{os.urandom(4).hex()}"
    temp = folder / name
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError as exc:
        raise InvalidInput(
            f"cannot create {str(target)!r}: {exc.strerror} in {str(folder)!r}"
        ) from None
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return temp


def sweep_stale(target: Path) -> None:
    """Remove temp files of `target` left by processes that died (a kill -9 mid-build). Each
    backup and restore sweeps its target first, whether or not it then writes: one refused
    (an existing file without --force) must not leave a killed run's copy lying there."""
    prefix = f".{target.name}{_TEMP_MARK}"
    with contextlib.suppress(OSError):
        for entry in target.parent.iterdir():
            if not entry.name.startswith(prefix):
                continue
            pid_text = entry.name[len(prefix) :].split("-", 1)[0]
            if pid_text.isdigit() and not _alive(int(pid_text)):
                with contextlib.suppress(OSError):
                    entry.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def discard(temp: Path) -> None:
    """Remove a temp file and any journal SQLite left beside it."""
    for suffix in ("", *SIDECARS):
        with contextlib.suppress(FileNotFoundError):
            sidecar(temp, suffix).unlink()


def remove_sidecars(path: Path) -> None:
    """SQLite's files beside the ledger, and the `-waiting` word, which is left where it may not
    be removed (another member's, in a sticky folder): it holds nothing."""
    for suffix in SIDECARS:
        with contextlib.suppress(FileNotFoundError):
            sidecar(path, suffix).unlink()
    with contextlib.suppress(OSError):
        sidecar(path, WAITING).unlink()


def fsync_file(path: Path) -> None:
    """Flush a file nobody in this process holds SQLite locks on (closing an fd of a file drops
    every POSIX lock the process holds on it, so never call this on a live ledger)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder: Path) -> None:
    """Make a rename durable. Some file systems refuse fsync on a folder; that is not an error."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive flock on `folder` (not SQLite's POSIX locks, which closing any fd of a
    file would drop): processes that give a *new* ledger its name take turns, so each sees what
    the one before it placed and none removes the sidecars of a ledger another just placed. A
    folder that cannot be opened or locked (no read permission, some network file systems), or
    that someone else holds locked past FOLDER_LOCK_WAIT_S (a cron job wrapped in `flock DIR`:
    better-compute itself holds it for a moment only), goes unlocked rather than waiting for
    ever: `place` without `overwrite` still never replaces a file that appeared."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        _try_flock(fd, clock.elapsed_s() + FOLDER_LOCK_WAIT_S)
        yield
    finally:
        os.close(fd)  # releases the flock


#: How long folder_lock waits for another holder of the folder's flock.
FOLDER_LOCK_WAIT_S = 2.0


def _try_flock(fd: int, deadline: float) -> None:
    """Take the exclusive flock, retrying until `deadline`; past it, or where the file system
    cannot lock, go on without it (folder_lock)."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if clock.elapsed_s() >= deadline:
                return
            time.sleep(0.01)
        except OSError:
            return


def place(temp: Path, target: Path, *, overwrite: bool, shown: str | None = None) -> None:
    """Rename `temp` onto `target` atomically. Without `overwrite`, an existing target (even one
    created a moment ago by another process) is a CONFLICT and is left alone."""
    taken = Conflict(f"{shown or str(target)!r} already exists; add --force to replace it")
    if overwrite:
        os.replace(temp, target)
    else:
        try:
            os.link(temp, target)  # fails if target exists: no check-then-rename race
        except FileExistsError:
            raise taken from None
        except OSError:  # a file system without hard links
            if target.exists():
                raise taken from None
            os.replace(temp, target)
        else:
            temp.unlink()
    fsync_dir(target.parent)


@contextlib.contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """While a new database file is built and given its name (`backup`, `restore`, `init`,
    `migrate --to FILE`), SIGTERM (systemd, `timeout`, a CI runner's cancel) stops the command
    as Ctrl-C does: the copy being built is removed on the way out, and the status is 143, as
    the default action's. A review found the half copy, its -wal and -shm left beside the target.
    Elsewhere the default stands (the process ends at once; SQLite's transactions are whole or
    absent), since an exception raised in the middle of a lazy import broke the module for the
    rest of the command (a second review: "a bug" after the work was done). A SIGTERM ignored by
    whoever started the process stays ignored; outside the main thread the default stands too."""
    try:
        before = signal.getsignal(signal.SIGTERM)
        if before is not signal.SIG_DFL:
            yield
            return
        signal.signal(signal.SIGTERM, _terminated)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)
