"""`migrate --to`: the whole ledger, every table, from one backend into a new ledger on the other.

The target is built the way `init` builds a ledger, so a failed copy leaves nothing behind: an
SQLite target is filled in a temporary file that takes its name only when whole (storage/replace),
a PostgreSQL target in the one transaction that creates its schema. Before either is kept, every
table is read back and compared with the source: its row count and a checksum of its rows (sha256
over their values, in the order of all their columns), so a value the other backend could not
hold exactly is caught rather than copied wrong. The source is only read, in one snapshot held
while the target fills.

Rows stream in an order both backends agree on (every column in turn, NULLs first, text by its
bytes), so the copy of a fleet's ledger holds a page of rows in memory, not every table (a review
measured 2.6 GB for the big benchmark pool when the tables were read whole and sorted in
Python). A PostgreSQL source is read from a server-side cursor (conn.plain_rows), a page of rows
at a time too.

sqlite-utils writes the SQLite side (bulk inserts into the new file); it is imported on first use
only (storage/db.sqlite_tools), so `get` and `reserve` never pay for it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from better_compute.errors import Conflict, Unavailable
from better_compute.storage import ledger
from better_compute.storage.conn import SQLITE, Conn, Ledger, dialect, plain_rows, where
from better_compute.storage.create import create_ledger
from better_compute.storage.db import ledger_exists, principal_at, sqlite_tools

#: Parents before children (foreign keys); a table not named here (a newer migration's) follows.
ORDER = (
    "meta",
    "config",
    "admins",
    "pools",
    "nodes",
    "atoms",
    "maintenance",
    "tenants",
    "quotas",
    "policies",
    "meters",
    "reservations",
    "allocations",
    "bookings",
    "booking_bounds",
    "events",
    "usage",
    "atom_bookings",
    "held_charges",
    "webhooks",
    "deliveries",
    "delivery_attempts",
    "notices",
    "calendar_policies",
    "calendar_commitments",
    "reservation_labels",
    "budgets",
    # Last: loading bookings and nodes fires their triggers, which write these two.
    "fit_nodes",
    "fit_levels",
)

#: Rows a backend keeps for itself: PostgreSQL records its schema version in meta.
_OWN_ROWS = {"meta": ("key", "schema_version")}


class TableCopy(NamedTuple):
    """One table copied: its rows and the checksum both ledgers agree on."""

    table: str
    rows: int
    checksum: str


def tables(conn: Conn) -> list[str]:
    """The ledger's tables, in copy order."""
    if dialect(conn) == SQLITE:
        sql = (
            "SELECT name FROM sqlite_master WHERE type = 'table'"
            " AND name NOT LIKE 'sqlite_%' ORDER BY name"
        )
    else:
        sql = (
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            " ORDER BY table_name"
        )
    names = [str(r[0]) for r in conn.execute(sql).fetchall()]
    return [t for t in ORDER if t in names] + [t for t in names if t not in ORDER]


def _columns(conn: Conn, table: str) -> list[str]:
    cursor: Any = conn.execute(f"SELECT * FROM {table} WHERE 1 = 0")
    return [str(d[0]) for d in cursor.description]


#: Rows read and written at a time.
PAGE = 1000


def _rows(conn: Conn, table: str, columns: list[str]) -> Iterator[tuple[Any, ...]]:
    """The table's rows (less what its backend keeps for itself), ordered by every column in
    turn, NULLs first: the same order on both backends for the same rows."""
    listed = ", ".join(f'"{c}"' for c in columns)
    text = _text_columns(conn, table)
    order = ", ".join(f'"{c}"{_BYTES if c in text else ""} NULLS FIRST' for c in columns)
    own = _OWN_ROWS.get(table)
    at = columns.index(own[0]) if own is not None else -1
    try:  # only the source is read here: the consumer's own errors never come back in
        for row in plain_rows(conn, f"SELECT {listed} FROM {table} ORDER BY {order}", ()):
            if own is None or row[at] != own[1]:
                yield tuple(row)
    except sqlite3.DatabaseError as exc:  # the source's own damage, not the new file's
        raise Unavailable(
            f"cannot read table {table!r} of {where(conn)!r}: {exc}; nothing was copied"
        ) from None


#: Text by bytes on PostgreSQL whatever the database's collation: a ledger made before `init`
#: refused databases that sort by a language's rules may live in one, and migrating out of it
#: is the way out. (SQLite compares text by bytes already.)
_BYTES = ' COLLATE "C"'


def _text_columns(conn: Conn, table: str) -> set[str]:
    """The table's text columns on PostgreSQL (none to name on SQLite)."""
    if dialect(conn) == SQLITE:
        return set()
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema ="
        " current_schema() AND table_name = ? AND data_type IN ('text', 'character varying',"
        " 'character')",
        (table,),
    )
    return {str(r[0]) for r in rows}


class _Sum:
    """The count and checksum of rows as they pass: sha256 over the columns, then each row."""

    def __init__(self, columns: list[str]) -> None:
        self.rows = 0
        self.digest = hashlib.sha256(json.dumps(columns).encode())

    def passing(self, rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
        for row in rows:
            self.rows += 1
            self.digest.update(json.dumps(row, separators=(",", ":")).encode() + b"\n")
            yield row


def copy_ledger(
    source: Ledger, target: str, *, at: int, by: str, os_user: str
) -> tuple[list[TableCopy], str | None]:
    """Copy the open ledger `source` into a new ledger at `target` (a file or a URL), then
    make sure whoever acts there (the PostgreSQL role, or `os_user` for a file) is one of its
    admins, added by `by` at `at` if it was not: a copy nobody may administer would be useless.
    Returns the tables copied and the admin added (None when none was needed)."""
    if ledger_exists(target):
        raise Conflict(
            f"{target.split('@')[-1]!r} is not empty; migrate copies into a new, empty ledger only"
        )
    report: list[TableCopy] = []
    principal = principal_at(target, os_user)
    added: list[str] = []
    with source.read() as conn:
        names = [(table, _columns(conn, table)) for table in tables(conn)]

        def fill(db: Ledger) -> None:
            sums = _load(db.conn, conn, names)
            report.extend(_verify(db.conn, names, sums))
            if ledger.add_admin(db.conn, principal, at, by):
                added.append(principal)

        created = create_ledger(target, force=False, seed_text=str(at), fill=fill)
    created.close()
    return report, (added[0] if added else None)


def _load(conn: Any, source: Conn, names: list[tuple[str, list[str]]]) -> list[_Sum]:
    """Replace what `init` wrote in the new ledger with the source's rows, table by table;
    returns the source's count and checksum of each table, taken as its rows passed."""
    mine = set(tables(conn))
    for table, _ in names:
        if table not in mine:
            raise Unavailable(f"the target has no table {table!r}: upgrade better-compute there")
    sums = [_Sum(columns) for _, columns in names]
    if dialect(conn) == SQLITE:
        _load_sqlite(conn, source, names, sums)
        return sums
    for table in mine:  # the copy brings booking_bounds as the source has it: no trigger needed
        conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
    for (table, columns), total in zip(names, sums, strict=True):
        own = _OWN_ROWS.get(table)
        if own is None:
            conn.execute(f"DELETE FROM {table}")
        else:  # what the backend keeps for itself stays
            conn.execute(f"DELETE FROM {table} WHERE {own[0]} != ?", (own[1],))
        listed = ", ".join(f'"{c}"' for c in columns)
        with conn.raw.cursor().copy(f"COPY {table} ({listed}) FROM STDIN") as stream:
            for row in total.passing(_rows(source, table, columns)):  # COPY: the bulk path
                stream.write_row(row)  # (row triggers still fire)
    for table in mine:
        conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")
    identities = conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND is_identity = 'YES'"
    ).fetchall()
    for table, column in identities:  # new rows continue after the copied ones
        conn.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'),"
            f" COALESCE((SELECT MAX({column}) FROM {table}), 0) + 1, false)"
        )
    return sums


def _load_sqlite(
    conn: Any, source: Conn, names: list[tuple[str, list[str]]], sums: list[_Sum]
) -> None:
    """sqlite-utils' bulk insert into the new file (not yet the ledger: nobody else sees it)."""
    db = sqlite_tools(conn)
    db.execute("PRAGMA defer_foreign_keys = ON")
    for (table, columns), total in zip(names, sums, strict=True):
        db.execute(f"DELETE FROM {table}")
        rows = total.passing(_rows(source, table, columns))
        db.table(table).insert_all(
            (dict(zip(columns, row, strict=True)) for row in rows), batch_size=PAGE
        )


def _verify(conn: Any, names: list[tuple[str, list[str]]], sums: list[_Sum]) -> list[TableCopy]:
    """Read every table back: the same rows, by count and checksum, or nothing is kept."""
    report = []
    for (table, columns), source in zip(names, sums, strict=True):
        copied = _Sum(columns)
        for _ in copied.passing(_rows(conn, table, columns)):
            pass
        want, got = source.digest.hexdigest(), copied.digest.hexdigest()
        if copied.rows != source.rows or got != want:
            raise Unavailable(
                f"the copy of table {table!r} differs from the source ({copied.rows} rows,"
                f" checksum {got[:12]}; the source has {source.rows}, {want[:12]}): nothing was"
                " kept"
            )
        report.append(TableCopy(table, source.rows, want))
    return report
