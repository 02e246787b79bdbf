"""Opening the file: recognise it, migrate it, WAL, busy timeout, one BEGIN IMMEDIATE per write."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
import sqlite3
import stat
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from better_compute import clock
from better_compute.errors import Damaged, Forbidden, InvalidInput, Replaced, Unavailable
from better_compute.storage import files
from better_compute.storage.conn import SQLITE, Commits, Ledger
from better_compute.storage.schema import (
    APPLICATION_ID,
    MIGRATIONS,
    SCHEMA_DIGEST,
    SCHEMA_VERSION,
    migration_text,
)

if TYPE_CHECKING:
    import sqlite_utils

SQLITE_MAGIC = b"SQLite format 3\x00"
DEFAULT_BUSY_TIMEOUT_MS = 30_000
#: Rows per multi-row INSERT in bulk writes; sqlite-utils lowers it to fit 999 bound parameters
#: (the limit of older SQLite builds): 166 GPU rows of 6 columns, 333 node rows of 3.
BULK_BATCH = 1000


#: Descriptors used to read headers, kept open for the life of the process, by (device, inode).
#: Closing any descriptor of a file drops every POSIX lock this process holds on it, including
#: those of an open SQLite connection, so a header read must never close its descriptor.
_HEADER_FDS: dict[tuple[int, int], int] = {}


def _read_header(path: Path) -> bytes:
    info = path.stat()
    key = (info.st_dev, info.st_ino)
    if key not in _HEADER_FDS:
        _HEADER_FDS[key] = os.open(path, os.O_RDONLY)
    return os.pread(_HEADER_FDS[key], 100, 0)


#: What names a PostgreSQL ledger rather than an SQLite file (libpq's two URL schemes).
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(path: str) -> bool:
    return path.strip().lower().startswith(POSTGRES_SCHEMES)


#: libpq's connection keywords: a `--db` of `keyword=value` pairs is a connection string.
_LIBPQ_KEYWORDS = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "service",
        "sslmode",
        "options",
        "connect_timeout",
        "application_name",
        "target_session_attrs",
    }
)
_PAIR = re.compile(r"(?:^|\s)(\w+)\s*=")


def _refuse_key_value(path: str) -> None:
    """A ledger is a file path or a postgresql:// URL (PRODUCT.md §3). A libpq key/value string
    (`host=db user=ops`: two or more pairs, or any with a password) would otherwise become an
    SQLite file of that name, password and all, while a file named like `user=alice.db` stays a
    file. The message never repeats the value, since it may hold a password."""
    words = [w.lower() for w in _PAIR.findall(path)]
    if not words or words[0] not in _LIBPQ_KEYWORDS or not path.lstrip().startswith(words[0]):
        return
    if len(words) > 1 or "password" in words:
        raise InvalidInput(
            "a libpq key/value connection string (key=value ...) does not name a ledger: give"
            " a file path or a URL, postgresql://USER@HOST:PORT/DBNAME, with any password in"
            " ~/.pgpass or PGPASSWORD, never on the command line"
        )


#: A URL's scheme: one that is not postgresql:// would otherwise become a relative file path.
_SCHEME = re.compile(r"\s*([A-Za-z][A-Za-z0-9+.-]*)://")


def refuse_foreign_url(path: str, flag: str = "--db") -> None:
    """A `mysql://` or `sqlite://` URL names no ledger: say so rather than look for a folder
    named `mysql:`. The message never repeats the value, since it may hold a password."""
    match = _SCHEME.match(path)
    if match is not None and not is_postgres_url(path):
        raise InvalidInput(
            f"{flag} is a {match.group(1)}:// URL; a ledger is an SQLite file path or a"
            " postgresql:// URL"
        )


def _require_path(path: str) -> None:
    if not path.strip():
        raise InvalidInput("--db (or BETTER_COMPUTE_DB) is empty; name a database file")
    if path == ":memory:":  # SQLite's name for a database gone when the command ends
        raise InvalidInput(
            "':memory:' would be a ledger in memory, gone when the command ends; name a file"
            " (./:memory: is a file of that name)"
        )
    refuse_foreign_url(path)
    _refuse_key_value(path)
    if is_postgres_url(path):
        raise InvalidInput(
            f"this command works on an SQLite ledger file; for {path.split('@')[-1]!r} use"
            " PostgreSQL's own tools (pg_dump, or `better-compute migrate --to FILE`)"
        )
    refuse_sidecar(path)


#: The files SQLite keeps beside a database, named after it (WAL, shared memory, rollback).
_SIDECARS = {
    "-wal": "write-ahead log",
    "-shm": "shared-memory index",
    "-journal": "rollback journal",
}


def refuse_sidecar(path: str) -> None:
    """A ledger (or a backup) is never made or read under the name of a file SQLite keeps beside
    a database (`X.db-wal`, `-shm`, `-journal`), nor through a link to one: opening X.db, SQLite
    would delete it, or replay it onto X.db, as X.db's own. Whether X.db exists yet does not
    matter: it may be made later."""
    for name in (path, os.path.realpath(path)):
        for suffix, kind in _SIDECARS.items():
            base = name[: -len(suffix)]
            if name.endswith(suffix) and base and not base.endswith("/"):
                raise InvalidInput(
                    f"{path!r} is the name SQLite gives the {kind} of a database {base!r}, which"
                    " it would delete or replay as that database's own; name the file another way"
                    " (a ledger already there: rename it with its own -wal and -shm)"
                )


def _header_kind(path: Path) -> str:
    """'missing', 'empty', 'ours' or 'foreign', from the header: never opened as a DB."""
    if not path.exists():
        return "missing"
    if not path.is_file():  # a folder, a FIFO (would block), a device (never to be replaced)
        return "foreign"
    try:
        header = _read_header(path)
    except PermissionError:
        raise Forbidden(
            f"you may not read the ledger {str(path)!r} (its file permissions): ask its owner"
            " for access, e.g. `init --group`"
        ) from None
    except OSError as exc:
        raise InvalidInput(f"cannot read {str(path)!r}: {exc.strerror}") from None
    if len(header) == 0:
        return "empty"
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return "foreign"
    app_id = int.from_bytes(header[68:72], "big")
    return "ours" if app_id == APPLICATION_ID else "foreign"


def file_identity(path: Path) -> tuple[int, int] | None:
    """Which file the path names now: (device, inode), or None when nothing is there."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def _like_the_ledger(fd: int, ledger: Path) -> None:
    """A file just made beside the ledger gets its mode bits (read and write only), its group,
    and, when made by root, its owner. Best effort: a group this user is not in stays its own."""
    info = os.stat(ledger)
    with contextlib.suppress(OSError):
        os.fchown(fd, info.st_uid if os.geteuid() == 0 else -1, info.st_gid)
    with contextlib.suppress(OSError):
        os.fchmod(fd, info.st_mode & 0o660)


def _share_sidecars(ledger: Path, *, make: bool) -> None:
    """The ledger's `-wal` and `-shm` with the ledger's group, where that group is not this
    user's own (a ledger shared with `init --group`). SQLite gives the files it makes the
    ledger's mode bits but this user's primary group (owner and group only when run by root):
    while one member held the ledger open, or after a member's killed command left them, every
    other member's commands, reads too, failed with "unable to open database file" (a review).

    `make` (before this connection opens): a missing one is made here first, new and empty as
    SQLite leaves them, like the ledger (_like_the_ledger). Either way, one that is there and
    this user's gets the ledger's group, by its path (SQLite may have made it, when another
    process's last close removed ours). A file that exists is never opened: closing any
    descriptor of a file drops every POSIX lock this process holds on it (_HEADER_FDS), SQLite's
    on `-shm` included, and another process then took the ledger for closed and reset `-shm`
    under it (a review: bus errors, "locking protocol"). Contents are never touched, and nothing
    is made for a user who may not write the ledger (reads use a snapshot then)."""
    try:
        info = os.stat(ledger)
    except OSError:
        return
    if info.st_gid == os.getegid() or not os.access(ledger, os.W_OK):
        return
    real = Path(os.path.realpath(ledger))  # SQLite's files are beside the file a symlink names
    for suffix in ("-wal", "-shm"):  # never a `-journal`: one there means a rollback to make
        path = files.sidecar(real, suffix)
        if make and _made_like_the_ledger(path, ledger):
            continue
        with contextlib.suppress(OSError):
            mine = os.lstat(path)
            ours = mine.st_uid == os.geteuid() and stat.S_ISREG(mine.st_mode)
            if ours and mine.st_gid != info.st_gid:
                os.chown(path, -1, info.st_gid, follow_symlinks=False)


def _made_like_the_ledger(path: Path, ledger: Path) -> bool:
    """Make `path`, new (a new file holds no lock of this process), like the ledger; False when
    it is there already or cannot be made."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        return False
    try:
        _like_the_ledger(fd, ledger)
    finally:
        os.close(fd)
    return True


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


#: How long a writer waits for the write lock before saying again that it waits
#: (Database._begin_write), and the most a replay stands aside for it (let_writers_in).
WAIT_STEP_MS = 50
STAND_ASIDE_S = 0.25

#: A replay's connection settings (Database.replaying says why each).
REPLAY = {"synchronous": 0, "wal_autocheckpoint": 10000, "temp_store": 2, "cache_size": -65536}


class Database:
    """One connection in autocommit mode; transactions are explicit.

    It remembers which file (device, inode) it opened: `init --force` and `restore` rename a new
    file onto the path, and a connection opened before that still points at the old, unlinked
    file. Writing there would report success for rows nobody will ever see, so every transaction
    checks the path still names the same file (a stat: cheap next to the transaction itself).
    """

    #: True for a snapshot opened by a user who may only read the file (see _open_snapshot).
    read_only = False

    def __init__(self, path: Path, busy_timeout_ms: int, *, snapshot: bool = False) -> None:
        self.path = path
        self._writing = False  # inside write(): a write nested in it is a savepoint
        self.memo: dict[str, Any] = {}  # see conn.Ledger.memo
        self._where = Path(os.path.abspath(path))  # as SQLite resolved it, whatever the cwd later
        self.identity = file_identity(self._where)
        if snapshot:  # read-only and immutable: see _open_snapshot
            uri = "file:" + urllib.parse.quote(str(self._where)) + "?mode=ro&immutable=1"
            self.conn = sqlite3.connect(uri, uri=True, isolation_level=None)
            self.read_only = True
        else:
            _share_sidecars(self._where, make=True)
            self.conn = sqlite3.connect(  # the absolute path: Path('./:memory:') prints ':memory:'
                str(self._where), isolation_level=None, timeout=busy_timeout_ms / 1000
            )
        self.conn.row_factory = sqlite3.Row
        self._busy_ms = int(busy_timeout_ms)
        self.conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        self.conn.execute("PRAGMA foreign_keys = ON")
        #: Where a writer kept waiting for the write lock says so (its time): see _begin_write.
        self._waiting = files.sidecar(Path(os.path.realpath(self._where)), files.WAITING)
        self._stepped = False  # True while replaying: its busy timeout is the step (replaying)
        #: The word on the waiting file last looked at (None: not in this run), or this
        #: connection's own.
        self._waits_seen: float | None = None

    @property
    def where(self) -> str:
        return str(self.path)

    @property
    def where_opened(self) -> Path:
        """The ledger's absolute path, as SQLite resolved it when it opened."""
        return self._where

    @property
    def writing(self) -> bool:
        return self._writing

    def principal(self, os_user: str) -> str:
        """On SQLite the operating system is the authority: the process's user acts."""
        return os_user

    def sweep_temps(self) -> None:
        """Temp copies of this ledger whose process died (storage/replace): a killed `init
        --force` or `restore` left one, up to a ledger's size, until the next replace."""
        files.sweep_stale(Path(os.path.realpath(self._where)))

    def set_busy_timeout(self, busy_timeout_ms: int) -> None:
        self._busy_ms = int(busy_timeout_ms)
        wait = min(WAIT_STEP_MS, self._busy_ms) if self._stepped else self._busy_ms
        self.conn.execute(f"PRAGMA busy_timeout = {wait}")

    def let_writers_in(self, *, first: bool = False) -> None:
        """Between two of a replay's transactions (or of `tick --until`'s): when another writer
        has said, since the last look, that it waits for the write lock (_begin_write), stand
        aside until it has committed (data_version moves), for at most STAND_ASIDE_S. The run's
        `first` look only notes the word: a wait said before the run began is not one to stand
        aside for, nor is this connection's own (_say_waiting notes it; another writer's word
        said within the same tick of the file's clock passes for it, and is seen at its next
        word, WAIT_STEP_MS later). A writer that waited and then commits nothing (a refusal, a
        tick with nothing due) holds the run up for the whole STAND_ASIDE_S.

        A replay commits back to back, microseconds apart, and SQLite's busy handler sleeps
        between its tries (up to 100 ms), so without this a writer almost never finds the lock
        free and fails after the whole busy timeout. One stat per transaction when nobody
        waits. data_version is read only after a new word: a writer that commits in the few
        microseconds between the two costs one wasted wait, where reading it first would cost a
        statement per transaction of every replay."""
        if first:
            self._waits_seen = None
        if self.conn.in_transaction:  # never while holding the lock itself
            return
        try:
            said = os.stat(self._waiting).st_mtime
        except OSError:
            said = 0.0  # no word at all
        if said == self._waits_seen:
            return
        looked, self._waits_seen = self._waits_seen is not None, said
        if not looked or not said:
            return
        version = self.conn.execute("PRAGMA data_version").fetchone()[0]
        stop = clock.elapsed_s() + STAND_ASIDE_S
        while clock.elapsed_s() < stop:
            time.sleep(0.001)
            if self.conn.execute("PRAGMA data_version").fetchone()[0] != version:
                return

    @contextmanager
    def replaying(self) -> Iterator[None]:
        """A long replay of what-if writes (`simulate`: only ledgers on a manual clock, never the
        commands people and cron run), on this connection; on the way out, everything it wrote
        is on disk.

        Inside, commits and checkpoints hand pages to the operating system without waiting for
        the disk (`synchronous = OFF`, 0). A killed or crashed replay still leaves the file whole:
        the operating system holds what was written. A power cut or an OS crash during the
        replay can damage the ledger; running the same simulate on a copy of the ledger it
        started from gives it again (the replay is deterministic). Syncing cost most of each
        checkpoint: a replay writes about a gigabyte of WAL (openb at --compress 100: some
        36 pages for each of 7,000 commits), and each checkpoint (then every 50,000 pages)
        waited for its 200 MB to reach the disk, about 120 ms of its 125; the replay took
        10.0 s with syncing, 8.9 s without. On the way out it checkpoints and syncs the file
        (and the WAL, when a reader kept the checkpoint from emptying it): tens of milliseconds,
        since the WAL's pages are dropped unwritten.

        Checkpoints come every 10,000 pages (about 40 MB of WAL, removed when the replay closes)
        rather than 1,000: each one writes back every page it holds. Without syncing, 2,000 to
        50,000 pages measured alike (openb: medians of four from 8.7 to 9.0 s, within the noise);
        10,000 keeps the WAL a fifth of 50,000's. Statement journals (a savepoint's undo,
        thousands of them) stay in memory (`temp_store`, 2) instead of a temporary file each.
        The page cache is 64 MiB instead of 2: a replay's ledger outgrows 2 MiB early, and each
        page read again after that came from the WAL (32,000 reads in openb's replay, 7,000 with
        64 MiB). It is a ceiling, not an allocation: a small ledger uses what it holds. On the
        way out the connection gets its own settings back."""
        before = {name: int(self.conn.execute(f"PRAGMA {name}").fetchone()[0]) for name in REPLAY}
        for name, value in REPLAY.items():
            self.conn.execute(f"PRAGMA {name} = {value}")
        # The replay stands aside for other writers (let_writers_in): a wait said before it
        # began is not one to stand aside for. It says its own waits as every writer does
        # (_begin_write), so that a second replay, or a `tick --until`, stands aside for it in
        # turn: a replay that took the lock the plain way, against another one committing back
        # to back, failed UNAVAILABLE after the busy timeout (a review, 3 runs in 3). Its busy
        # timeout is the step for the whole replay, not set and reset around each BEGIN.
        self.conn.execute(f"PRAGMA busy_timeout = {min(WAIT_STEP_MS, self._busy_ms)}")
        self._stepped = True
        self.let_writers_in(first=True)
        try:
            yield
        except BaseException:
            self._stepped = False
            with contextlib.suppress(Exception):  # the replay's own error is the one to report
                self._settle(before)
            raise
        self._stepped = False
        self._settle(before)

    def _settle(self, before: dict[str, int]) -> None:
        """The end of a replay: its writes on disk, the connection's own settings back."""
        try:
            self._to_disk()
        finally:
            for name, value in before.items():
                self.conn.execute(f"PRAGMA {name} = {value}")
            self.conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")

    def _to_disk(self) -> None:
        """Everything committed so far on the disk, for a connection that wrote without syncing:
        a checkpoint that empties the WAL into the file, then the file and what is left of the
        WAL synced. The checkpoint does not wait: a reader in a transaction would keep it from
        emptying the WAL for as long as the busy timeout, holding off every writer meanwhile,
        and the sync of what it leaves does the same work. SQLite puts the WAL beside the file
        a symlinked path names."""
        if not self.conn.in_transaction:
            with self._busy_timeout(0):
                self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        real = Path(os.path.realpath(self._where))
        for path in (real, files.sidecar(real, "-wal")):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        self.conn.close()

    def insert_rows(
        self, table: str, columns: Sequence[str], rows: Iterable[Sequence[object]]
    ) -> None:
        """Many rows at once, inside the write transaction: sqlite-utils' insert_all, a few
        hundred rows per INSERT (BULK_BATCH). The table must exist: the migrations made it,
        never the rows' shape."""
        head: list[Sequence[object]] = [list(columns)]
        sqlite_tools(self.conn).table(table).insert_all(
            itertools.chain(head, rows), batch_size=BULK_BATCH
        )

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE: take the write lock up front so writers queue, not deadlock.

        The file check runs once the lock is held (a replace holds this lock until its rename is
        done, so a writer that waited sees the new name) and again just before COMMIT.
        """
        if self.read_only:
            raise read_only_refusal(self.path)
        if self._writing:  # inside a write (simulate's request): a savepoint of it
            with self.savepoint("nested_write"):
                yield self.conn
            return
        self._begin("BEGIN IMMEDIATE")  # inside a read, SQLite refuses it, as it should
        self._writing = True
        self.memo.clear()
        try:
            self.require_same_file()
            yield self.conn
            self.require_same_file()
        except BaseException as exc:
            self._writing = False
            self.memo.clear()
            if self.conn.in_transaction:  # SQLite may have rolled back already (I/O error, full)
                self.conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.IntegrityError) and not self._intact():
                raise Unavailable(
                    f"database {self.path} is damaged: its tables and indexes disagree"
                    f" ({exc}); restore a backup"
                ) from None
            raise
        self._writing = False
        self.memo.clear()
        self._commit()

    def _intact(self) -> bool:
        """PRAGMA integrity_check (only after a failed constraint, so its cost is rare): a
        constraint that fails on a damaged file is damage, not a bug."""
        try:
            rows = self.conn.execute("PRAGMA integrity_check(1)").fetchall()
        except (sqlite3.DatabaseError, UnicodeDecodeError):
            return False
        return [tuple(r) for r in rows] == [("ok",)]

    def require_same_file(self) -> None:
        """UNAVAILABLE when the path no longer names the file this connection opened."""
        if file_identity(self._where) != self.identity:
            raise Replaced(
                f"database {self.path} was replaced while this command waited; nothing was"
                " written, run it again",
                str(self.path),
            )

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A deferred transaction: one consistent snapshot for everything a command reads."""
        if self.conn.in_transaction:  # inside a transaction already: its snapshot
            yield self.conn
            return
        self._begin("BEGIN")
        try:
            if file_identity(self._where) != self.identity:
                raise Replaced(
                    f"database {self.path} was replaced; run the command again", str(self.path)
                )
            yield self.conn
        except BaseException:
            if self.conn.in_transaction:  # SQLite may have ended it already after an error
                with contextlib.suppress(sqlite3.Error):  # the body's error is the one to tell
                    self.conn.execute("ROLLBACK")
            raise
        if self.conn.in_transaction:
            self.conn.execute("COMMIT")

    @contextmanager
    def savepoint(self, name: str) -> Iterator[None]:
        """All or nothing inside a transaction (a gang, a preemption)."""
        self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self.memo.clear()
            self.conn.execute(f"ROLLBACK TO {name}")
            self.conn.execute(f"RELEASE {name}")
            raise
        self.conn.execute(f"RELEASE {name}")

    def _begin(self, statement: str) -> None:
        try:
            if statement == "BEGIN IMMEDIATE":
                self._begin_write()
            else:
                self.conn.execute(statement)
        except sqlite3.OperationalError as exc:
            if _read_only(exc):
                raise read_only_refusal(self.path) from None
            if _is_locked(exc):
                raise Unavailable(
                    f"database {self.path} stayed locked past the busy timeout; try again"
                ) from None
            raise

    def _begin_write(self) -> None:
        """BEGIN IMMEDIATE, waiting up to the busy timeout as SQLite's busy handler does, but in
        steps of WAIT_STEP_MS: after each, the writer says it is still waiting by touching the
        file beside the ledger (`<file>-waiting`), which a replay looks at between its
        transactions (let_writers_in). Best effort: a file that cannot be written is no
        error."""
        deadline = clock.elapsed_s() + self._busy_ms / 1000
        with (
            contextlib.nullcontext()  # a replay's busy timeout is the step already
            if self._stepped
            else self._busy_timeout(min(WAIT_STEP_MS, self._busy_ms))
        ):
            while True:
                try:
                    self.conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    if not _is_locked(exc) or clock.elapsed_s() >= deadline:
                        raise
                    self._say_waiting()

    @contextmanager
    def _busy_timeout(self, ms: int) -> Iterator[None]:
        """SQLite's busy timeout `ms` for what runs inside; the connection's own after it."""
        self.conn.execute(f"PRAGMA busy_timeout = {int(ms)}")
        try:
            yield
        finally:
            self.conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")

    def _say_waiting(self) -> None:
        """Touch `<file>-waiting`. Only a regular file is touched, never through a symlink and
        never blocking (a FIFO): anyone who may write the folder may have put something there.
        Made fresh, it takes the ledger file's mode bits and group (and owner, for root), as
        SQLite does for its own files beside it, so every writer of the ledger can touch it."""
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        with contextlib.suppress(OSError):
            try:
                fd, made = os.open(self._waiting, flags | os.O_CREAT | os.O_EXCL, 0o600), True
            except FileExistsError:
                fd, made = os.open(self._waiting, flags), False
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return
                if made:
                    _like_the_ledger(fd, self._where)
                os.utime(fd)
                self._waits_seen = os.fstat(fd).st_mtime  # our own word: not one to yield to
            finally:
                os.close(fd)

    def _commit(self) -> None:
        try:
            self.conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            if _is_locked(exc):
                raise Unavailable(
                    f"database {self.path} stayed locked; nothing was written"
                ) from None
            raise
        Commits.made += 1


def _configure(db: Database) -> None:
    mode = db.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise Unavailable(f"could not switch {db.path} to WAL mode (got {mode})")
    _share_sidecars(db.where_opened, make=False)  # SQLite may have made them (_share_sidecars)


def _migrate(db: Database) -> None:
    """Run each pending migration in its own transaction; refuse a database newer than the code.

    An up-to-date ledger (every open but the first after an upgrade) costs one PRAGMA here:
    sqlite-utils, which runs the migrations, is imported only when one is pending."""
    version = _user_version(db.conn)
    if version > SCHEMA_VERSION:
        raise Unavailable(
            f"{db.path} has schema version {version}, newer than this better-compute "
            f"({SCHEMA_VERSION}); upgrade better-compute"
        )
    if version == SCHEMA_VERSION:
        return
    tools = sqlite_tools(db.conn)
    for number in range(version, SCHEMA_VERSION):
        with db.write():
            # Read again under the write lock: another process may have run it while we waited.
            if _user_version(db.conn) > number:
                continue
            # Inside a transaction sqlite-utils runs the script statement by statement (sqlite3's
            # executescript would COMMIT first): the migration and its number commit together.
            tools.executescript(migration_script(number))
            tools.execute(f"PRAGMA user_version = {number + 1}")


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def sqlite_tools(conn: sqlite3.Connection) -> sqlite_utils.Database:
    """sqlite-utils over this connection, in its transaction. Imported on first use only (it
    costs about 70 ms, which `get`, `reserve` and `tick` never pay); no plugins, and no `PRAGMA
    recursive_triggers`, sqlite-utils' default, which would change how this connection's
    triggers fire."""
    import sqlite_utils

    return sqlite_utils.Database(conn, recursive_triggers=False, execute_plugins=False)


def migration_script(number: int) -> str:
    """Migration `number` (from 0) for SQLite, its `--` comments removed: SQLite keeps each
    CREATE statement's text as written, comments included, and SCHEMA_DIGEST is of that text."""
    script = migration_text(MIGRATIONS[number], SQLITE)
    return "\n".join(line.split("--", 1)[0] for line in script.splitlines())


def _schema(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
    return [tuple(r) for r in conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")]


def expected_schema() -> list[tuple[object, ...]]:
    """What the migrations make, built in memory by this SQLite (a few ms: not on every open)."""
    fresh = sqlite3.connect(":memory:", isolation_level=None)
    try:
        tools = sqlite_tools(fresh)
        for number in range(SCHEMA_VERSION):
            tools.executescript(migration_script(number))
        return sorted(_schema(fresh), key=repr)
    finally:
        fresh.close()


def schema_digest(schema: list[tuple[object, ...]]) -> str:
    return hashlib.sha256(repr(sorted(schema, key=repr)).encode()).hexdigest()


def _require_our_schema(db: Database) -> None:
    """The tables and indexes must be exactly what the migrations make: damaged schema text that
    SQLite still parses (a renamed column) would otherwise fail deep in a command as a bug.

    Fast path: the digest of the file's schema equals SCHEMA_DIGEST, the digest of what the
    migrations make (a test keeps that constant true). Otherwise the migrations are built in
    memory and compared exactly, so another SQLite that words its schema text differently is
    still accepted, and damage is still refused."""
    actual = sorted(_schema(db.conn), key=repr)
    if schema_digest(actual) == SCHEMA_DIGEST:
        return
    if actual != expected_schema():
        raise sqlite3.DatabaseError("its schema is not the one better-compute created")


def postgres() -> Any:
    """storage/postgres.py, imported only for a PostgreSQL URL (psycopg is an optional extra)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise InvalidInput(
            "a postgresql:// ledger needs psycopg: pip install 'better-compute[postgres]' (from a"
            " clone: pip install -e '.[postgres]')"
        ) from None
    from better_compute.storage import postgres as module

    return module


def open_ledger(path: str, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Ledger:
    """Open the ledger `--db` names: an SQLite file, or a PostgreSQL database by URL."""
    if is_postgres_url(path):
        return postgres().open_database(path.strip(), busy_timeout_ms)  # type: ignore[no-any-return]
    return open_database(path, busy_timeout_ms)


def ledger_exists(path: str) -> bool:
    """Whether `path` already holds a ledger (or, for SQLite, any non-empty file)."""
    if is_postgres_url(path):
        return postgres().ledger_exists(path.strip())  # type: ignore[no-any-return]
    _refuse_key_value(path)
    refuse_sidecar(path)
    return Path(path).is_file() and Path(path).stat().st_size > 0


def principal_at(path: str, os_user: str) -> str:
    """Who acts on the ledger `path` names: the OS user on SQLite, the role on PostgreSQL."""
    if is_postgres_url(path):
        return postgres().session_role(path.strip())  # type: ignore[no-any-return]
    return os_user


def open_database(path: str, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Database:
    """Open an initialised database, migrating it forward; foreign files are refused untouched."""
    _require_path(path)
    file = Path(path)
    kind = _header_kind(file)
    if kind in ("missing", "empty"):
        raise Unavailable(
            f"no better-compute database at {path!r}; run `better-compute init` first"
        )
    if kind == "foreign":
        raise InvalidInput(f"{path!r} is not a better-compute database; choose another --db")
    db = Database(file, busy_timeout_ms)
    try:
        _configure(db)
        _migrate(db)
        db.conn.execute("SELECT value FROM meta WHERE key = 'db_id'").fetchone()
        _require_our_schema(db)
    except sqlite3.DatabaseError as exc:
        db.close()
        if _read_only(exc) and _checkpointed(file):
            return _open_snapshot(file)
        if isinstance(exc, sqlite3.OperationalError) and _is_locked(exc):
            raise Unavailable(f"database {path!r} stayed locked past the busy timeout") from None
        raise Damaged(f"database {path!r} cannot be used: {exc}") from None
    except UnicodeDecodeError:  # SQLite quoted damaged schema text in its error message
        db.close()
        raise Damaged(f"database {path!r} is damaged: its schema is not readable") from None
    except BaseException:
        db.close()
        raise
    if file_identity(file) != db.identity:
        # Replaced between our stat and SQLite's open: which file SQLite holds is unknown.
        db.close()
        raise Unavailable(f"database {path!r} was replaced while opening it; run it again")
    return db


def _read_only(exc: sqlite3.DatabaseError) -> bool:
    return "readonly" in str(exc).lower()


def read_only_refusal(path: Path | str) -> Forbidden:
    """On SQLite the file's permissions are the boundary: a reader may not write."""
    return Forbidden(
        f"database {str(path)!r} is read-only for you (its file permissions): reads work,"
        " changes need write access to the file and its folder"
    )


def _checkpointed(file: Path) -> bool:
    """No write-ahead log holds committed pages: the main file alone is the whole ledger."""
    wal = Path(str(file) + "-wal")
    return not wal.exists() or wal.stat().st_size == 0


def _open_snapshot(file: Path) -> Database:
    """For a user who may read the file but not write beside it (SQLite's WAL index, `-shm`,
    cannot be created): read the main file as it stands, which is whole when no writer has it
    open. A writer that checkpoints during the read can make the read fail; it never corrupts
    anything, and the command says to try again. Writes are refused by Database._begin."""
    db = Database(file, DEFAULT_BUSY_TIMEOUT_MS, snapshot=True)
    try:
        version = int(db.conn.execute("PRAGMA user_version").fetchone()[0])
        if version != SCHEMA_VERSION:
            raise Unavailable(
                f"database {str(file)!r} needs a migration that only a user who may write it can"
                " run; ask its owner to run any command once"
            )
        db.conn.execute("SELECT value FROM meta WHERE key = 'db_id'").fetchone()
    except sqlite3.DatabaseError as exc:
        db.close()
        raise Unavailable(f"database {str(file)!r} cannot be used: {exc}") from None
    return db


def lock_out_writers(file: Path) -> Database:
    """Take the database's write lock (else UNAVAILABLE, nothing changed) and hold it, so no writer
    commits into a file that is about to be replaced."""
    old = open_database(str(file))
    try:
        row = old.conn.execute("SELECT value FROM config WHERE key = 'db.busyTimeoutMs'").fetchone()
        if row is not None:  # wait as long as the database's own setting says
            old.set_busy_timeout(int(row[0]))
        old._begin("BEGIN IMMEDIATE")
        old.require_same_file()  # another replace may have won while we waited
    except BaseException:
        if old.conn.in_transaction:
            old.conn.execute("ROLLBACK")
        old.close()
        raise
    return old
