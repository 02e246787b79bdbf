"""`migrate --to`: the whole ledger, every table, from one backend into a new ledger on the other.

The target is built the way `init` builds a ledger, so a failed copy leaves nothing behind: an
SQLite target is filled in a temporary file that takes its name only when whole (storage/replace),
a PostgreSQL target in the one transaction that creates its schema. Before either is kept, every
table is read back and compared with the source: its row count and a checksum of its rows (sha256
over the sorted rows' values), so a value the other backend could not hold exactly is caught
rather than copied wrong. The source is only read, in one snapshot.

sqlite-utils writes the SQLite side (bulk inserts into the new file); it is imported on first use
only (storage/db.sqlite_tools), so `get` and `reserve` never pay for it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, NamedTuple

from better_compute.errors import Conflict, Unavailable
from better_compute.storage import ledger
from better_compute.storage.conn import SQLITE, Conn, Ledger, dialect
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


def _rows(conn: Conn, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    listed = ", ".join(f'"{c}"' for c in columns)
    rows = [tuple(r) for r in conn.execute(f"SELECT {listed} FROM {table}").fetchall()]
    own = _OWN_ROWS.get(table)
    if own is not None:
        at = columns.index(own[0])
        rows = [r for r in rows if r[at] != own[1]]
    return sorted(rows, key=_sort_key)


def _sort_key(row: tuple[Any, ...]) -> list[tuple[int, Any]]:
    return [(0, "") if v is None else (1, v) if isinstance(v, int) else (2, str(v)) for v in row]


def _checksum(columns: list[str], rows: Iterable[tuple[Any, ...]]) -> str:
    digest = hashlib.sha256(json.dumps(columns).encode())
    for row in rows:
        digest.update(json.dumps(row, separators=(",", ":")).encode() + b"\n")
    return digest.hexdigest()


def snapshot(conn: Conn) -> dict[str, tuple[list[str], list[tuple[Any, ...]]]]:
    """Every table's columns and rows (sorted), read inside the caller's transaction."""
    out = {}
    for table in tables(conn):
        columns = _columns(conn, table)
        out[table] = (columns, _rows(conn, table, columns))
    return out


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
    with source.read() as conn:
        data = snapshot(conn)
    report: list[TableCopy] = []
    principal = principal_at(target, os_user)
    added: list[str] = []

    def fill(db: Ledger) -> None:
        _load(db.conn, data)
        report.extend(_verify(db.conn, data))
        if ledger.add_admin(db.conn, principal, at, by):
            added.append(principal)

    created = create_ledger(target, force=False, seed_text=str(at), fill=fill)
    created.close()
    return report, (added[0] if added else None)


def _load(conn: Any, data: dict[str, tuple[list[str], list[tuple[Any, ...]]]]) -> None:
    """Replace what `init` wrote in the new ledger with the source's rows, table by table."""
    if dialect(conn) == SQLITE:
        _load_sqlite(conn, data)
        return
    mine = set(tables(conn))
    for table in mine:  # the copy brings booking_bounds as the source has it: no trigger needed
        conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
    for table, (columns, rows) in data.items():
        if table not in mine:
            raise Unavailable(f"the target has no table {table!r}: upgrade better-compute there")
        own = _OWN_ROWS.get(table)
        if own is None:
            conn.execute(f"DELETE FROM {table}")
        else:  # what the backend keeps for itself stays
            conn.execute(f"DELETE FROM {table} WHERE {own[0]} != ?", (own[1],))
        listed = ", ".join(f'"{c}"' for c in columns)
        with conn.raw.cursor().copy(f"COPY {table} ({listed}) FROM STDIN") as stream:
            for row in rows:  # COPY: the bulk path (row triggers still fire)
                stream.write_row(row)
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


def _load_sqlite(conn: Any, data: dict[str, tuple[list[str], list[tuple[Any, ...]]]]) -> None:
    """sqlite-utils' bulk insert into the new file (not yet the ledger: nobody else sees it)."""
    db = sqlite_tools(conn)
    db.execute("PRAGMA defer_foreign_keys = ON")
    for table, (columns, rows) in data.items():
        if table not in db.table_names():
            raise Unavailable(f"the target has no table {table!r}: upgrade better-compute there")
        db.execute(f"DELETE FROM {table}")
        db.table(table).insert_all(
            (dict(zip(columns, row, strict=True)) for row in rows), batch_size=1000
        )


def _verify(conn: Any, data: dict[str, tuple[list[str], list[tuple[Any, ...]]]]) -> list[TableCopy]:
    """Read every table back: the same rows, by count and checksum, or nothing is kept."""
    report = []
    for table, (columns, rows) in data.items():
        copied = _rows(conn, table, columns)
        want, got = _checksum(columns, rows), _checksum(columns, copied)
        if len(copied) != len(rows) or got != want:
            raise Unavailable(
                f"the copy of table {table!r} differs from the source ({len(copied)} rows,"
                f" checksum {got[:12]}; the source has {len(rows)}, {want[:12]}): nothing was kept"
            )
        report.append(TableCopy(table, len(rows), want))
    return report
