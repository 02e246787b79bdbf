"""The PostgreSQL backend: the same ledger, the same SQL, on a server a team shares.

Imported only for a `postgresql://` URL: psycopg 3 is the optional extra
`better-compute[postgres]`. Authentication is libpq's (the URL, the `PG*` variables, `.pgpass`),
never a password flag. The principal is the session's role (`current_user`): the server
authenticated it, so no flag can claim it.

Transactions mirror SQLite's (docs/postgres.md):
- a write takes the lock order's first lock up front, the ledger clock row (`meta` 'last_at',
  `FOR UPDATE`), as BEGIN IMMEDIATE takes SQLite's write lock: writers queue instead of racing,
  and the instant a write acts at is read once the lock is held (PRODUCT.md §2);
- a read is one REPEATABLE READ snapshot, as SQLite's deferred BEGIN gives;
- a lock held past `db.busyTimeoutMs` (lock_timeout), a serialization failure or a deadlock is
  UNAVAILABLE with nothing written: the command is safe to run again.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import lru_cache
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import tuple_row
from psycopg.types.numeric import Int8Dumper

from better_compute.errors import Conflict, Forbidden, InvalidInput, Replaced, Unavailable
from better_compute.storage.conn import POSTGRES, Commits
from better_compute.storage.schema import MIGRATIONS, SCHEMA_VERSION, migration_text

DEFAULT_LOCK_TIMEOUT_MS = 30_000

T = TypeVar("T")

#: The lock order's first lock: every write holds the ledger clock row (PRODUCT.md §2). Taking
#: it counts the write (meta.writes, migration 9), in the same statement: the count moves exactly
#: when a write transaction commits, which is what PgConn.data_version reads.
CLOCK_WRITE = "UPDATE meta SET writes = writes + 1 WHERE key = 'last_at' RETURNING writes, tableoid"

#: Which `meta` table a read sees (PgDatabase._same_ledger).
META_OID = "SELECT tableoid FROM meta WHERE key = 'last_at'"

#: The same lock for `init --force`, which replaces the ledger (whatever its schema version, so
#: whatever columns the row has).
CLOCK_LOCK = "SELECT * FROM meta WHERE key = 'last_at' FOR UPDATE"

#: Rows a server-side cursor fetches at a time (PgConn.stream).
STREAM_PAGE = 1000

#: How often taking the write lock may lose a deadlock or serialization check before UNAVAILABLE.
LOCK_ATTEMPTS = 5

#: Failures that say "try again", never "the ledger is wrong": nothing of the command was written.
_TRANSIENT = (
    pg_errors.SerializationFailure,
    pg_errors.DeadlockDetected,
    pg_errors.LockNotAvailable,
    pg_errors.QueryCanceled,
)


class Row(tuple[Any, ...]):
    """A result row read by index or by column name, as sqlite3.Row is."""

    _index: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


def _row_factory(cursor: Any) -> Any:
    description = cursor.description or []
    index = {c.name: i for i, c in enumerate(description)}
    row_type = type("Row", (Row,), {"_index": index})
    return lambda values: row_type(values)


_PLACEHOLDER = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|--[^\n]*|%|\?|(?<!:):([A-Za-z_]\w*)")


@lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """SQLite placeholders to psycopg's, once per statement text: `?` is `%s`, `:name` is
    `%(name)s`, a literal `%` is doubled. Quoted text, identifiers and comments keep their `?`
    and `:` as they are."""

    def one(match: re.Match[str]) -> str:
        text = match.group(0)
        if text == "?":
            return "%s"
        if text == "%":
            return "%%"
        if match.group(1) is not None:
            return f"%({match.group(1)})s"
        return text.replace("%", "%%")  # a quoted literal or identifier, or a comment

    return _PLACEHOLDER.sub(one, sql)


#: What PostgreSQL says when a statement this connection prepared reads a table whose columns
#: another process changed since (a newer version's migration, `init --force`).
_STALE_PLAN = "cached plan must not change result type"

#: A statement that selects a table's `*` (or returns it): its result has whatever columns the
#: table has when it runs, so a prepared plan of it would fail once another process added one.
_STAR = re.compile(r"(?i)(?:\bSELECT\s+(?:DISTINCT\s+)?|,\s*|\bRETURNING\s+)(?:\w+\.)?\*")


def _stale_plan(exc: BaseException) -> bool:
    return isinstance(exc, pg_errors.FeatureNotSupported) and _STALE_PLAN in str(exc)


@lru_cache(maxsize=1024)
def _preparable(sql: str) -> bool | None:
    """psycopg's `prepare` for a statement: None (once run five times) unless it selects `*`,
    False then. Naming its columns keeps a statement's result the same when a column is added."""
    return None if _STAR.search(sql) is None else False


class PgConn:
    """A psycopg connection speaking the storage interface (storage/conn.Conn).

    Parameters are bound on the server, so a statement this connection has run five times
    (psycopg's prepare_threshold) is prepared there and planned once, not at every call: a
    replay runs each of its few dozen statements thousands of times. Statements that select
    `*` are never prepared (_preparable), so a column another process adds (a newer
    version's migration) changes nothing for a long-running command; one whose type changes
    under a prepared statement is handled by _run. Every integer is sent as a bigint: the
    smallest type that holds it would make `:a + :b` of two small values overflow a smallint."""

    dialect = POSTGRES

    def __init__(self, raw: psycopg.Connection[Any], where: str) -> None:
        self.raw = raw
        self.where = where
        self._version = 0  # how often another connection's commits were seen: data_version()
        self._known: int | None = None  # meta.writes as this connection last knew it committed
        self._writing: int | None = None  # meta.writes inside this write transaction
        self._cursors = 0  # server-side cursors opened: each stream's own name
        self._streams: set[psycopg.ServerCursor[Any]] = set()  # those still open

    @property
    def writing(self) -> bool:
        return self._writing is not None

    def data_version(self) -> int:
        """PostgreSQL's PRAGMA data_version: a number that changes exactly when another
        connection has committed a write since this one last looked (its own commits do not
        change it). Inside a write transaction it costs nothing: the lock statement returned
        the count. Outside one, it reads the count in the current snapshot."""
        if self._writing is None:
            row = self.execute("SELECT writes FROM meta WHERE key = 'last_at'").fetchone()
            self._look(None if row is None else int(row[0]))
        return self._version

    def _look(self, committed: int | None) -> None:
        """`committed`: the count of write transactions committed, as seen now."""
        if committed is None or committed != self._known:
            self._version += 1
        self._known = committed

    def _began_write(self, writes: int | None) -> None:
        """The clock row is held: `writes` counts this transaction too (None: no clock row)."""
        self._look(None if writes is None else writes - 1)
        self._writing = writes

    def _ended_write(self, committed: bool | None) -> None:
        """After COMMIT (True), ROLLBACK (False), or a COMMIT whose outcome is unknown (None)."""
        if committed is None:
            self._known = None  # the next look counts as a change: never stale
        elif committed and self._writing is not None:
            self._known = self._writing
        self._writing = None

    def execute(self, sql: str, parameters: Any = None, /) -> psycopg.Cursor[Any]:
        cursor = self.raw.cursor()
        prepare = _preparable(sql)
        text, bound = _bound(sql, parameters)
        return self._run(lambda: cursor.execute(text, bound, prepare=prepare))

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> psycopg.Cursor[Any]:
        cursor = self.raw.cursor()
        rows = [tuple(p) for p in parameters]
        self._run(lambda: cursor.executemany(translate(sql), rows))
        return cursor

    def _run(self, call: Callable[[], T]) -> T:
        """The statement. If a column it reads changed its type since this connection prepared
        it, PostgreSQL refuses the prepared plan. Outside a transaction the connection forgets
        its prepared statements and runs it again; inside one, the transaction is lost, its
        rollback (PgDatabase: psycopg's rollback()) makes psycopg forget them, and the command
        is UNAVAILABLE (mapped)."""
        try:
            return call()
        except pg_errors.FeatureNotSupported as exc:
            if not _stale_plan(exc) or self.in_transaction:
                raise
        self.forget_prepared()
        return call()

    def forget_prepared(self) -> None:
        """Make psycopg forget this connection's prepared statements and DEALLOCATE them on the
        server, which its rollback() does, whatever it rolls back. (A ROLLBACK statement, or
        a DEALLOCATE ALL, is seen by psycopg only the first time its text runs.)"""
        if not self.in_transaction:
            self.raw.execute("BEGIN")
        self.raw.rollback()

    def cursor(self) -> psycopg.Cursor[Any]:
        return self.raw.cursor()

    def stream(self, sql: str, parameters: Any, /) -> Iterator[tuple[Any, ...]]:
        """The rows as plain tuples, fetched from a server-side cursor a page at a time as the
        caller reads them: a client-side cursor holds the whole result in this process (a
        migrate out of the big benchmark pool peaked at about 300 MB). A server-side cursor
        lives in a transaction; outside one, the rows come as execute gives them."""
        if not self.in_transaction:
            yield from (tuple(r) for r in self.execute(sql, parameters))
            return
        self._cursors += 1
        cursor = self.raw.cursor(name=f"bc_stream_{self._cursors}", row_factory=tuple_row)
        self._streams.add(cursor)
        try:
            cursor.execute(*_bound(sql, parameters))
            while page := cursor.fetchmany(STREAM_PAGE):
                yield from page
        finally:
            if cursor in self._streams:  # else end_streams has closed it, or tried to
                self._streams.discard(cursor)
                cursor.close()

    def end_streams(self) -> None:
        """Close the cursors of streams left unread, as their transaction ends (PgDatabase).
        Such a stream would otherwise close its cursor when it is collected, perhaps inside a
        later transaction, where the cursor is gone and the CLOSE aborts that transaction. Each
        is closed at most once, here, whatever another's CLOSE raises; the first error is
        raised after all were tried (the transaction is then rolled back)."""
        streams, self._streams = self._streams, set()
        failed: BaseException | None = None
        for cursor in streams:
            try:
                cursor.close()
            except psycopg.Error as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


def _bound(sql: str, parameters: Any) -> tuple[str, Any]:
    """The statement and its parameters as psycopg takes them. Without parameters psycopg reads
    no placeholders either, so the text goes as it is (a literal `%` stays one)."""
    if parameters is None or (isinstance(parameters, Sequence) and not parameters):
        return sql, None
    return translate(sql), parameters if isinstance(parameters, dict) else tuple(parameters)


def _scalar(conn: PgConn, sql: str) -> Any:
    """The one value a query without parameters returns."""
    row = conn.execute(sql).fetchone()
    if row is None:
        raise AssertionError(f"no row from {sql}")
    return row[0]


#: A password written into a URL: `user:secret@` or a `password=` parameter.
_PASSWORD = re.compile(r"://[^/@]*:[^/@]*@|[?&]password=", re.IGNORECASE)


#: What libpq (or the server, for `options=-c…`) says of a URL it cannot use as written, as
#: opposed to a server it cannot reach: libpq reports both as one OperationalError, but a port
#: `notaport` or `sslmode=bogus` is bad input (INVALID_INPUT), not an unreachable server.
_MALFORMED = re.compile(
    r'invalid (integer value "|port number: |\w+ value: ")|could not match \d+ '
    r"|invalid SSL protocol version range|when SSL support is not compiled in"
    r"|unrecognized configuration parameter|invalid value for parameter"
)


def _scheme_lowered(url: str) -> str:
    """The URL as libpq reads it: a scheme is case-insensitive (RFC 3986) and `PostgreSQL://`
    names a PostgreSQL ledger here (db.is_postgres_url), but libpq knows only the lower case."""
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    return f"{scheme.lower()}{sep}{rest}"


#: How long a server may take to accept a connection: libpq's connect_timeout, unless the URL,
#: a pg_service.conf entry (the URL's or PGSERVICE's) or PGCONNECT_TIMEOUT says. A server that
#: is up but does not answer (frozen, overloaded) kept every command, and the cron ticks behind
#: it, waiting psycopg's 130 s. The default db.busyTimeoutMs: the ledger's own is not read yet.
CONNECT_TIMEOUT_S = DEFAULT_LOCK_TIMEOUT_MS // 1000


def _carries_password(url: str) -> bool:
    """`user:secret@`, or a `password` parameter however its name is written: libpq decodes
    `%70assword` to it and logs in with it (a review)."""
    if _PASSWORD.search(url) or any(_secret(name) for name in _query_names(url)):
        return True
    try:
        return "password" in conninfo_to_dict(_scheme_lowered(url))
    except psycopg.ProgrammingError:  # not a URL libpq reads: _connect says so
        return False


def _query_names(url: str) -> list[str]:
    """The names of the URL's query parameters, read here rather than by libpq, whose refusal
    of a malformed query quotes it, a password included (a review)."""
    query = url.partition("?")[2].partition("#")[0]
    return [pair.partition("=")[0] for pair in query.split("&")]


def _secret(name: str) -> bool:
    return urllib.parse.unquote(name).strip().lower() == "password"


def _connect(url: str) -> psycopg.Connection[Any]:
    if _carries_password(url):
        raise InvalidInput(
            f"the URL {redact(url)!r} carries a password, which would sit in shell history and"
            " process lists: leave it out and give it to libpq instead (~/.pgpass, or PGPASSWORD"
            " in the environment of cron and CI jobs)"
        )
    try:
        target = _scheme_lowered(url)
        said = {"connect_timeout", "service"} & conninfo_to_dict(target).keys()
        if not said and not {"PGCONNECT_TIMEOUT", "PGSERVICE"} & os.environ.keys():
            target = make_conninfo(target, connect_timeout=CONNECT_TIMEOUT_S)
        raw = psycopg.connect(target, autocommit=True, row_factory=_row_factory)
        raw.adapters.register_dumper(int, Int8Dumper)  # see PgConn
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        detail = " ".join(str(exc).split())[:300]
        if isinstance(exc, psycopg.ProgrammingError) or _MALFORMED.search(detail):
            raise InvalidInput(
                f"{redact(url)!r} is not a usable PostgreSQL URL: {detail}"
            ) from None
        if any(said in detail for said in _IDENTITY_REFUSED):
            raise Forbidden(
                f"{redact(url)} refused who you are: {detail}; running again will not help"
                " (check the role, its password in ~/.pgpass or PGPASSWORD, and pg_hba.conf)"
            ) from None
        raise Unavailable(f"cannot connect to {redact(url)}: {detail}") from None
    return raw


def redact(url: str) -> str:
    """The URL without a password, should one have been written into it (a parameter's name
    percent-encoded too: libpq decodes it)."""
    base, sep, query = url.partition("?")
    if sep:
        pairs = []
        for pair in query.split("&"):
            name, eq, _value = pair.partition("=")
            pairs.append(f"{name}{eq}***" if _secret(name) and eq else pair)
        url = base + sep + "&".join(pairs)
    # Up to the last `@` of the authority: a password may hold an `@` (a review saw its tail).
    return re.sub(r"(://[^:/@]*):[^/?#]*@", r"\1:***@", url)


class PgDatabase:
    """An open PostgreSQL ledger; the same surface as storage/db.Database."""

    read_only = False

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = redact(url)
        self.path = self.where
        self.conn = PgConn(_connect(url), self.where)
        self.memo: dict[str, Any] = {}  # see conn.Ledger.memo
        #: Which `meta` table this connection opened (its oid, new with every `init`): the
        #: ledger's id would not do, as `init --force` at the same instant makes the same one.
        self.meta_oid: int | None = None
        self.set_busy_timeout(DEFAULT_LOCK_TIMEOUT_MS)

    @property
    def writing(self) -> bool:
        return self.conn.writing

    def sweep_temps(self) -> None:
        """A server's ledger leaves no files beside it."""

    def set_busy_timeout(self, busy_timeout_ms: int) -> None:
        """SQLite's busy timeout is PostgreSQL's lock_timeout: how long a lock may be awaited."""
        self.conn.raw.execute(f"SET lock_timeout = {int(busy_timeout_ms)}")

    @contextmanager
    def replaying(self) -> Iterator[None]:
        """As on SQLite, for what-if replays only: commits stop waiting for the WAL flush. A
        server crash can lose the last commits (never damage the database); the server's WAL
        writer flushes them within a fraction of a second anyway."""
        self.conn.raw.execute("SET synchronous_commit = off")
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # the replay's own error is the one to report
                self.conn.raw.execute("RESET synchronous_commit")
            raise
        self.conn.raw.execute("RESET synchronous_commit")

    def let_writers_in(self, *, first: bool = False) -> None:
        """Nothing to do: a writer waiting for the clock row's lock is queued by the server, and
        the replay's next transaction asks for that lock behind it."""

    def principal(self, os_user: str) -> str:
        """The session's role: who the server authenticated, whatever the OS user is."""
        return str(_scalar(self.conn, "SELECT current_user"))

    def close(self) -> None:
        self.conn.raw.close()

    def insert_rows(
        self, table: str, columns: Sequence[str], rows: Iterable[Sequence[object]]
    ) -> None:
        """Many rows at once, inside the write transaction: psycopg's executemany, which sends
        them pipelined rather than waiting for the server after each."""
        listed = ", ".join(f'"{c}"' for c in columns)
        marks = ", ".join("?" * len(columns))
        self.conn.executemany(f"INSERT INTO {table} ({listed}) VALUES ({marks})", rows)

    @contextmanager
    def write(self) -> Iterator[PgConn]:
        """One write transaction, holding the ledger clock row first (the lock order)."""
        if self.conn.in_transaction:  # init fills its new ledger inside the one that creates it
            try:
                with self._mapped(), self.conn.raw.transaction():  # a savepoint of it
                    yield self.conn
            except BaseException:
                self.memo.clear()
                raise
            return
        self._begin_write()
        self.memo.clear()
        try:
            with self._mapped(), self._committed():
                yield self.conn
        finally:
            self.memo.clear()

    @contextmanager
    def read(self) -> Iterator[PgConn]:
        """One consistent snapshot for everything a command reads, of the ledger this
        connection opened (_same_ledger: `events --follow` went on reading a rebuilt one from
        the old one's place in the log)."""
        if self.conn.in_transaction:
            yield self.conn
            return
        with self._mapped():
            self.conn.raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            with self._committed():
                row = self.conn.raw.execute(META_OID).fetchone()
                self._same_ledger(None if row is None else int(row[0]))
                yield self.conn

    def _begin_write(self) -> None:
        """BEGIN and take the clock row. Losing a deadlock or a serialization check here costs
        nothing yet, so it is retried a bounded number of times before UNAVAILABLE; a lock
        awaited past lock_timeout (db.busyTimeoutMs) is UNAVAILABLE at once, as on SQLite.
        Anything else the server says here (the connection lost while queued for the lock, a
        role that may read but not write) is mapped as inside any transaction: UNAVAILABLE,
        FORBIDDEN."""
        raw = self.conn.raw
        with self._mapped():
            for attempt in range(LOCK_ATTEMPTS):
                try:
                    with self._abandoned():
                        raw.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                        row = raw.execute(CLOCK_WRITE).fetchone()
                        self._same_ledger(None if row is None else int(row[1]))
                    self.conn._began_write(None if row is None else int(row[0]))
                    return
                except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected):
                    time.sleep(random.uniform(0, 0.02 * 2**attempt))
                except (pg_errors.LockNotAvailable, pg_errors.QueryCanceled):
                    raise Unavailable(
                        f"database {self.where} stayed locked past the busy timeout; try again"
                    ) from None
        raise Unavailable(
            f"database {self.where}: {LOCK_ATTEMPTS} attempts to take the write lock lost to"
            " deadlocks or serialization failures; nothing was written, run it again"
        )

    def _same_ledger(self, meta_oid: int | None) -> None:
        """UNAVAILABLE when the URL holds another ledger than the one this connection opened:
        `init --force` rebuilt it since, as each write finds when it takes the lock (the clock
        row's table is another) and each read as it begins. On SQLite the file's identity says
        the same. A long `simulate`, `tick --until` or `events --follow` stops there instead of
        carrying on into the new ledger."""
        if self.meta_oid is None or meta_oid is None:
            self.meta_oid = self.meta_oid or meta_oid
        elif meta_oid != self.meta_oid:
            raise Replaced(
                f"database {self.where} was replaced (init --force) since this command opened"
                " it; nothing of its transaction in progress was written: run the command again",
                self.where,
            )

    @contextmanager
    def _abandoned(self) -> Iterator[None]:
        """ROLLBACK what the body began if it raised, unless the connection is gone with it."""
        raw = self.conn.raw
        try:
            yield
        except BaseException:
            if self.conn.in_transaction and not raw.closed:
                with contextlib.suppress(psycopg.Error):
                    raw.rollback()  # forgets prepared statements too: see PgConn._run
            raise

    @contextmanager
    def _committed(self) -> Iterator[None]:
        """COMMIT after the body, ROLLBACK if it raised; the connection's write count learns
        which (PgConn.data_version)."""
        raw = self.conn.raw
        try:
            yield
            self.conn.end_streams()  # before COMMIT; a failure rolls back as the body's would
        except BaseException:
            self.conn._ended_write(False)
            if self.conn.in_transaction and not raw.closed:
                with contextlib.suppress(psycopg.Error):
                    self.conn.end_streams()
                raw.rollback()  # forgets prepared statements too: see PgConn._run
            raise
        wrote = self.conn.writing  # a read's snapshot ends here too
        try:
            raw.execute("COMMIT")
        except BaseException:
            self.conn._ended_write(None)
            raise
        self.conn._ended_write(True)
        if wrote:
            Commits.made += 1

    def _mapped(self) -> AbstractContextManager[None]:
        return mapped(self.where)

    @contextmanager
    def savepoint(self, name: str) -> Iterator[None]:
        """All or nothing inside a transaction (a gang, a preemption)."""
        raw = self.conn.raw
        raw.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self.memo.clear()
            if self.conn.in_transaction:
                raw.execute(f"ROLLBACK TO SAVEPOINT {name}")
                raw.execute(f"RELEASE SAVEPOINT {name}")
            raise
        raw.execute(f"RELEASE SAVEPOINT {name}")


@contextmanager
def mapped(where: str) -> Iterator[None]:
    """What the server refuses is the product's answer, never a bug: "try again" failures are
    UNAVAILABLE with nothing written; a missing GRANT is FORBIDDEN."""
    try:
        yield
    except _TRANSIENT as exc:
        raise Unavailable(
            f"database {where} was busy ({type(exc).__name__}): nothing was written,"
            " run the command again"
        ) from None
    except pg_errors.FeatureNotSupported as exc:
        if not _stale_plan(exc):
            raise
        raise Unavailable(
            f"database {where}: another process changed a column of the ledger's tables while"
            " this command ran; its transaction in progress was rolled back (what it had"
            " committed before stays): run the command again"
        ) from None
    except pg_errors.InsufficientPrivilege as exc:
        detail = " ".join(str(exc).split())[:200]
        raise Forbidden(f"the server refused your role ({detail}): {_who_can(detail)}") from None
    except pg_errors.ReadOnlySqlTransaction:  # a standby after a failover, or maintenance
        raise Unavailable(
            f"database {where} takes no writes now (a standby, or default_transaction_read_only"
            " set for this role or database): nothing was written; reads work, and changes work"
            " on the primary or once writes are allowed again"
        ) from None
    except psycopg.OperationalError as exc:
        detail = " ".join(str(exc).split())[:300]
        raise Unavailable(f"database {where} cannot be used: {detail}") from None


#: What the server says when it was reached and refused the role itself (libpq gives no SQLSTATE
#: for a failed connection, so its text is all there is): not "try again" (UNAVAILABLE, which
#: scripts retry) but FORBIDDEN, as §3 has it for a principal that may not act. A server that
#: says it in another language (lc_messages) is UNAVAILABLE, as before.
_IDENTITY_REFUSED = (
    "password authentication failed",
    "authentication failed for user",
    "no password supplied",
    "no pg_hba.conf entry",
    "pg_hba.conf rejects connection",
    "permission denied for database",
    "permission denied to set role",
    'FATAL: role "',
)


def _who_can(detail: str) -> str:
    """What to do about a refusal: no GRANT can give what only a table's owner may do (drop and
    recreate the tables, as `init --force` does), so asking an admin for GRANTs would not help."""
    if "must be owner" in detail:
        return (
            "only the role that owns the ledger's tables (or a member of it) may do this;"
            " run it as that role"
        )
    return "an admin grants what docs/postgres.md lists for ordinary users"


# ---------------------------------------------------------------- schema


def _version(db: PgDatabase) -> int | None:
    """How many migrations ran: None when the schema holds no ledger at all."""
    raw = db.conn.raw
    if _scalar(db.conn, "SELECT to_regclass('meta')") is None:
        return None
    row = raw.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return 0 if row is None else int(row[0])


def _tables(db: PgDatabase) -> list[str]:
    rows = db.conn.raw.execute(
        "SELECT table_name FROM information_schema.tables"
        " WHERE table_schema = current_schema() ORDER BY table_name"
    )
    return [str(r[0]) for r in rows]


def _migrate(db: PgDatabase, version: int) -> None:
    """Each pending migration in its own transaction, as on SQLite; the version sits in meta."""
    if version > SCHEMA_VERSION:
        raise Unavailable(
            f"{db.where} has schema version {version}, newer than this better-compute "
            f"({SCHEMA_VERSION}); upgrade better-compute"
        )
    try:
        _run_migrations(db, version)
    except pg_errors.InsufficientPrivilege:
        raise Forbidden(
            f"{db.where} holds a ledger of schema version {version}, which this better-compute"
            f" upgrades to {SCHEMA_VERSION}: only the role that owns its tables may do that; run"
            " any command once as that role, and everyone's commands work again"
        ) from None


def _run_migrations(db: PgDatabase, version: int) -> None:
    raw = db.conn.raw
    for number in range(version, SCHEMA_VERSION):
        with raw.transaction():
            raw.execute("SELECT pg_advisory_xact_lock(1111706960)")  # one migrator at a time
            again = _version(db) or 0
            if again > number:
                continue
            raw.execute(migration_text(MIGRATIONS[number], POSTGRES))
            raw.execute(
                "INSERT INTO meta(key, value) VALUES ('schema_version', %s)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(number + 1),),
            )


def open_database(url: str, busy_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS) -> PgDatabase:
    """Open an initialised ledger, migrating it forward; a schema without one is refused."""
    db = PgDatabase(url)
    try:
        with mapped(db.where):
            _open(db, busy_timeout_ms)
    except BaseException:
        db.close()
        raise
    return db


def _open(db: PgDatabase, busy_timeout_ms: int) -> None:
    version = _version(db)
    if version is None:
        raise Unavailable(
            f"no better-compute ledger in {db.where}; run `better-compute init` first (or, if"
            " there is one, your role may not use its schema: see the GRANTs in docs/postgres.md)"
        )
    _migrate(db, version)
    row = db.conn.raw.execute("SELECT tableoid FROM meta WHERE key = 'db_id'").fetchone()
    if row is None:
        raise Unavailable(f"{db.where} holds a ledger that `init` never finished")
    db.meta_oid = int(row[0])
    db.set_busy_timeout(busy_timeout_ms)


def ledger_exists(url: str) -> bool:
    db = PgDatabase(url)
    try:
        return _version(db) is not None
    finally:
        db.close()


def session_role(url: str) -> str:
    db = PgDatabase(url)
    try:
        return db.principal("")
    finally:
        db.close()


def _made_by_migrations(kind: str) -> list[str]:
    """The names of every TABLE or FUNCTION the migrations create: what `init --force` drops
    before building anew, read from the migrations so a new one is never forgotten."""
    pattern = re.compile(rf"CREATE {kind} (\w+)")
    return [n for m in MIGRATIONS for n in pattern.findall(migration_text(m, POSTGRES))]


def create_database(url: str, *, force: bool, db_id: str, fill: Any = None) -> PgDatabase:
    """`init` on PostgreSQL: the schema, the ledger's id and `fill`, in one transaction, so a
    killed init leaves nothing (PostgreSQL's DDL is transactional). An existing ledger needs
    --force; a schema holding other tables is never touched."""
    db = PgDatabase(url)
    try:
        raw = db.conn.raw
        with mapped(db.where), raw.transaction():
            _require_schema(db)
            _require_byte_order(db)
            raw.execute("SELECT pg_advisory_xact_lock(1111706960)")
            version = _version(db)
            if version is None and _tables(db):
                raise InvalidInput(
                    f"{db.where} already holds tables that are not a better-compute ledger"
                    f" ({', '.join(_tables(db)[:5])}); choose an empty database or schema"
                )
            if version is not None and not force:
                raise Conflict(
                    f"{db.where} is not empty, it already holds a better-compute ledger:"
                    " `init --force` replaces it; `migrate` copies into a new, empty ledger only"
                )
            writes = 0
            if version is not None:
                # The lock order: writers finish or wait, never deadlock.
                clock = raw.execute(CLOCK_LOCK).fetchone()
                if clock is not None and "writes" in clock.keys():  # noqa: SIM118 (a Row's keys)
                    writes = int(clock["writes"])  # a ledger from version 9 on
                _drop_ledger(db)
            for script in MIGRATIONS:
                raw.execute(migration_text(script, POSTGRES))
            raw.execute(
                "INSERT INTO meta(key, value) VALUES ('schema_version', %s), ('db_id', %s)",
                (str(SCHEMA_VERSION), db_id),
            )
            if fill is not None:
                fill(db)
            if writes:  # the count goes on: a connection that knew the old ledger sees a change
                raw.execute("UPDATE meta SET writes = %s WHERE key = 'last_at'", (writes + 1,))
    except BaseException:
        db.close()
        raise
    return db


def _require_schema(db: PgDatabase) -> None:
    """A search_path naming no schema the role may use (a typo in `options=-csearch_path=…`)
    leaves nowhere to create the tables: say so, instead of the server's multi-line error."""
    if _scalar(db.conn, "SELECT current_schema()") is None:
        path = " ".join(str(_scalar(db.conn, "SELECT current_setting('search_path')")).split())
        raise InvalidInput(
            f"{db.where}: no schema on its search_path ({path}) exists, or your role may not use"
            " it; create the schema (CREATE SCHEMA) or correct the URL's search_path"
        )


#: Names whose order differs between comparing bytes and any language's collation.
_ORDER_PROBE = ("a", "B", "-", "_", ".", "Z", "\u00e4", "1", "A", "b", "aB", "ab", "a-b")


def _require_byte_order(db: PgDatabase) -> None:
    """A ledger compares names as bytes, as SQLite does: node names break placement's ties and
    page its name-order scan, and ids, tenants and nodes list in that order. A database whose
    collation follows a language (en_US, an ICU locale) would place and list differently from
    SQLite, and from a ledger migrated out of it, and even from itself where Python sorts. So a
    ledger is made only in a database that sorts text by code point (C, C.UTF-8, POSIX)."""
    probe = list(_ORDER_PROBE)
    got = db.conn.execute("SELECT x FROM unnest(?::text[]) AS x ORDER BY x", (probe,)).fetchall()
    if [r[0] for r in got] != sorted(probe):
        raise InvalidInput(
            f"{db.where} sorts text by a language's rules ('a' before 'B'), not by code point"
            " as a ledger needs (node names order placement); create its database with"
            " `createdb --locale=C.UTF-8 --template=template0 NAME` (or CREATE DATABASE …"
            " TEMPLATE template0 LOCALE 'C.UTF-8' LOCALE_PROVIDER libc)"
        )


def _drop_ledger(db: PgDatabase) -> None:
    raw = db.conn.raw
    mine = set(_tables(db))
    for table in _made_by_migrations("TABLE"):
        if table in mine:
            raw.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    for function in _made_by_migrations("FUNCTION"):
        raw.execute(f"DROP FUNCTION IF EXISTS {function}() CASCADE")
