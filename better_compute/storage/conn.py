"""The storage interface the rest of the program sees, whichever database holds the ledger.

Two backends implement it: SQLite (storage/db.py; `sqlite3.Connection` is already such a
connection) and PostgreSQL (storage/postgres.py, a thin adapter over psycopg 3). SQL is written
once, portably: `?` or `:name` placeholders, the column `"end"` quoted, no SQLite-only functions.
Where the dialects really differ (a JSON field, where the ledger lives) the few helpers below say
it once, so no use case ever asks which backend it runs on.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

SQLITE = "sqlite"
POSTGRES = "postgresql"


class Cursor(Protocol):
    """What a statement returns: its rows (readable by index and by column name), its rowcount."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def fetchmany(self, size: int = ...) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """One connection: statements run inside the transaction its Ledger opened."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Cursor: ...

    @property
    def in_transaction(self) -> bool: ...


#: A row: `row[0]`, `row["name"]`, `row.keys()`, unpacking. sqlite3.Row and postgres.Row.
Row = Any


class Ledger(Protocol):
    """An open ledger: one connection and its transactions (storage/db.Database on SQLite,
    storage/postgres.PgDatabase on PostgreSQL)."""

    read_only: bool
    #: Facts read inside the current write transaction that only this connection could change
    #: (the ledger's clock: storage/ledger.clock_in_write). Emptied when the transaction ends
    #: and when a savepoint of it rolls back, so it never outlives what it was read from.
    memo: dict[str, Any]

    @property
    def writing(self) -> bool:
        """Inside a write transaction of this connection (a savepoint of one included)."""
        ...

    @property
    def conn(self) -> Any: ...

    @property
    def where(self) -> str: ...

    def write(self) -> AbstractContextManager[Any]: ...

    def read(self) -> AbstractContextManager[Any]: ...

    def savepoint(self, name: str) -> AbstractContextManager[None]: ...

    def close(self) -> None: ...

    def set_busy_timeout(self, busy_timeout_ms: int) -> None: ...

    def replaying(self) -> AbstractContextManager[None]: ...

    def let_writers_in(self, *, first: bool = False) -> None:
        """Between a replay's (or `tick --until`'s) transactions: let a writer that waits for
        the lock take it. `first`: the run begins; a wait said before it is not one to yield to."""
        ...

    def principal(self, os_user: str) -> str: ...

    def sweep_temps(self) -> None:
        """Remove what killed processes left beside the ledger (a file backend's temp copies
        of an `init --force` or `restore`); nothing on a server."""
        ...

    def insert_rows(
        self, table: str, columns: Sequence[str], rows: Iterable[Sequence[object]]
    ) -> None: ...


class Commits:
    """Write transactions this process has committed, on any ledger: a command whose output
    then fails says that its changes stand (cli/app.handled), so nobody runs it again blindly."""

    made = 0


def dialect(conn: object) -> str:
    """'sqlite' or 'postgresql': the one place a connection is asked which it is."""
    return SQLITE if isinstance(conn, sqlite3.Connection) else POSTGRES


def json_text(conn: object, column: str, key: str) -> str:
    """SQL for a JSON object column's text field `key` (NULL when absent)."""
    if dialect(conn) == SQLITE:
        return f"json_extract({column}, '$.{key}')"
    return f"(({column})::jsonb ->> '{key}')"


def where(conn: Any) -> str:
    """Where the ledger lives, for messages: the SQLite file, or the PostgreSQL URL."""
    if dialect(conn) == SQLITE:
        rows: Sequence[Any] = conn.execute("PRAGMA database_list").fetchall()
        return next((str(r[2]) for r in rows if r[1] == "main"), "")
    return str(conn.where)


def plain_rows(conn: Any, sql: str, parameters: Any) -> Iterator[Any]:
    """The rows as plain tuples, read as the caller consumes them: for results too many to build
    row objects for, or to hold in memory at once."""
    if dialect(conn) == SQLITE:
        cursor = conn.cursor()
        cursor.row_factory = None
        return iter(cursor.execute(sql, parameters))
    stream: Iterator[Any] = conn.stream(sql, parameters)  # PgConn: a server-side cursor
    return stream
