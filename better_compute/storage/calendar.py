"""Calendar SQL (issue 10): pool policies, commitments, series, and the instants where a pool's
free capacity changes (what `advice` tries as starts and ends).

Written portably (`?` placeholders, `"end"` quoted) for the PostgreSQL backend to come.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from better_compute.model import CalendarPolicy, Reservation
from better_compute.storage import repo
from better_compute.storage.repo import Conn

# ---------------------------------------------------------------- policies


def policy(conn: Conn, pool_id: str) -> CalendarPolicy | None:
    row = conn.execute(
        "SELECT pool_id, min_duration_ms, max_duration_ms, min_lead_ms, max_horizon_ms, sizes,"
        " no_changes FROM calendar_policies WHERE pool_id = ?",
        (pool_id,),
    ).fetchone()
    if row is None:
        return None
    return repo.decoded(
        conn,
        f"the calendar policy of pool {pool_id}",
        lambda: CalendarPolicy(
            pool_id=str(row[0]),
            min_duration_ms=repo._opt_int(row[1]),
            max_duration_ms=repo._opt_int(row[2]),
            min_lead_ms=repo._opt_int(row[3]),
            max_horizon_ms=repo._opt_int(row[4]),
            sizes=tuple(int(s) for s in json.loads(str(row[5]))),
            commit=bool(row[6]),
        ),
    )


def set_policy(conn: Conn, p: CalendarPolicy) -> None:
    conn.execute("DELETE FROM calendar_policies WHERE pool_id = ?", (p.pool_id,))
    conn.execute(
        "INSERT INTO calendar_policies(pool_id, min_duration_ms, max_duration_ms, min_lead_ms,"
        " max_horizon_ms, sizes, no_changes) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            p.pool_id,
            p.min_duration_ms,
            p.max_duration_ms,
            p.min_lead_ms,
            p.max_horizon_ms,
            json.dumps(list(p.sizes)),
            int(p.commit),
        ),
    )


def clear_policy(conn: Conn, pool_id: str) -> bool:
    cur = conn.execute("DELETE FROM calendar_policies WHERE pool_id = ?", (pool_id,))
    return cur.rowcount > 0


# ---------------------------------------------------------------- commitments and series


def commit_reservation(conn: Conn, rsv_id: str, pool_id: str) -> None:
    conn.execute(
        "INSERT INTO calendar_commitments(reservation_id, pool_id) VALUES (?, ?)"
        " ON CONFLICT (reservation_id) DO NOTHING",
        (rsv_id, pool_id),
    )


def is_committed(conn: Conn, rsv_id: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM calendar_commitments WHERE reservation_id = ?", (rsv_id,)
    ).fetchone()
    return row is not None


def set_series(conn: Conn, rsv_id: str, series_id: str) -> None:
    conn.execute("UPDATE reservations SET series_id = ? WHERE id = ?", (series_id, rsv_id))


def series_members(conn: Conn, series_id: str) -> list[Reservation]:
    """Every occurrence of a series, oldest first."""
    ids = [
        str(r[0])
        for r in conn.execute(
            "SELECT id FROM reservations WHERE series_id = ? ORDER BY seq", (series_id,)
        )
    ]
    return [repo.get_reservation(conn, rsv_id) for rsv_id in ids]


# ---------------------------------------------------------------- where free capacity changes


def change_ends(conn: Conn, pool_id: str, first: int, last: int) -> list[int]:
    """Every instant in [first, last] at which a booking or a maintenance window of the pool
    ends (capacity comes back), ascending and distinct."""
    rows = conn.execute(
        'SELECT DISTINCT b."end" FROM bookings b WHERE b.pool_id = ? AND b."end" >= ?'
        ' AND b."end" <= ?'
        ' UNION SELECT m."end" FROM maintenance m JOIN nodes n ON n.name = m.node_id'
        ' WHERE n.pool_id = ? AND m."end" >= ? AND m."end" <= ?',
        (pool_id, first, last, pool_id, first, last),
    )
    return sorted(int(r[0]) for r in rows)


def change_starts(conn: Conn, pool_id: str, after: int, until: int) -> list[int]:
    """Every instant in (after, until] at which a booking or a maintenance window of the pool
    begins (capacity is taken), ascending and distinct."""
    rows = conn.execute(
        "SELECT DISTINCT b.start FROM bookings b WHERE b.pool_id = ? AND b.start > ?"
        " AND b.start <= ?"
        " UNION SELECT m.start FROM maintenance m JOIN nodes n ON n.name = m.node_id"
        " WHERE n.pool_id = ? AND m.start > ? AND m.start <= ?",
        (pool_id, after, until, pool_id, after, until),
    )
    return sorted(int(r[0]) for r in rows)


def pool_ids(conn: Conn) -> list[tuple[str, str]]:
    """(id, name) of every pool, by name."""
    return [
        (str(r[0]), str(r[1])) for r in conn.execute("SELECT id, name FROM pools ORDER BY name")
    ]


def ids_in(conn: Conn, rsv_ids: Sequence[str]) -> list[Reservation]:
    return [repo.get_reservation(conn, rsv_id) for rsv_id in rsv_ids]
