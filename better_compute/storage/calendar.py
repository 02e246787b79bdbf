"""Calendar SQL (issue 10): pool policies, commitments, series, and the instants where a pool's
free capacity changes (what `advice` tries as starts and ends).

Written portably (`?` placeholders, `"end"` quoted) for the PostgreSQL backend to come.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence

from better_compute.model import CalendarPolicy, Reservation, Window
from better_compute.storage import repo, settled
from better_compute.storage.conn import Row
from better_compute.storage.repo import Conn

# ---------------------------------------------------------------- policies


def policy(conn: Conn, pool_id: str) -> CalendarPolicy | None:
    return settled.kept(conn, ("policy", pool_id), lambda: _policy(conn, pool_id))


def _policy(conn: Conn, pool_id: str) -> CalendarPolicy | None:
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


def uncommit_reservation(conn: Conn, rsv_id: str) -> None:
    conn.execute("DELETE FROM calendar_commitments WHERE reservation_id = ?", (rsv_id,))


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


# ---------------------------------------------------------------- free time, counted in SQL

#: Every booking of the pool in the span [:lo, :hi), one row per node and (start, end) with the
#: GPUs it holds summed into a bit mask (GPU i is bit i; DISTINCT, so a sum is an OR), in no
#: particular order (engine/freetime.py sorts what it needs). The covering index bookings_window
#: reads it; "end" < :bound (the span's end plus the pool's longest booking) keeps that read to
#: the span. Portable to PostgreSQL (its SUM of BIGINT is NUMERIC, read back as an integer).
HELD_SQL = """
SELECT node_id, start, "end", SUM(DISTINCT CAST(1 AS BIGINT) << CAST(atom AS INTEGER)) FROM bookings
WHERE pool_id = :pool AND "end" > :lo AND "end" < :bound AND start < :hi
GROUP BY node_id, start, "end"
"""

#: HELD_SQL for some nodes only (`{marks}`: one placeholder per node): each node's bookings are
#: read through the index bookings_node_window, so a batch costs its nodes, not the pool. No
#: pool_id test: it would steer SQLite to bookings_window, the whole pool's span (a node's
#: bookings hold its GPUs whatever pool they were made in, as the planner's snapshots count).
HELD_OF_SQL = """
SELECT node_id, start, "end", SUM(DISTINCT CAST(1 AS BIGINT) << CAST(atom AS INTEGER)) FROM bookings
WHERE node_id IN ({marks}) AND "end" > ? AND "end" < ? AND start < ?
GROUP BY node_id, start, "end"
"""

#: What a request for whole nodes reads instead (any booking holds the whole node, so which
#: GPUs it holds does not matter): no sum to work out, about half the cost.
WHOLE_SQL = """
SELECT DISTINCT node_id, start, "end" FROM bookings
WHERE pool_id = :pool AND "end" > :lo AND "end" < :bound AND start < :hi
"""
WHOLE_OF_SQL = """
SELECT DISTINCT node_id, start, "end" FROM bookings
WHERE node_id IN ({marks}) AND "end" > ? AND "end" < ? AND start < ?
"""

#: Every GPU: the mask of a booking read for whole nodes.
ALL_GPUS = (1 << 64) - 1

#: A mask read back: bit 63 comes back as a negative BIGINT.
_MASK64 = (1 << 64) - 1


#: Per eligible node (schedulable, reachable): its labels, GPUs and the fabric of its GPUs (for
#: fabric.domain); and, separately, its unhealthy GPUs.
NODES_SQL = """
SELECT n.name, n.labels, COUNT(*),
       MIN(a.fabric_cluster), MAX(a.fabric_cluster), MIN(a.fabric_clique), MAX(a.fabric_clique),
       COUNT(a.fabric_cluster), COUNT(a.fabric_clique)
FROM nodes n JOIN atoms a ON a.node_id = n.name
WHERE n.pool_id = ? AND n.schedulable != 0 AND n.reachable != 0
GROUP BY n.name, n.labels
"""


#: Per eligible node, its GPUs only: what a request without a topology key needs (the fabric
#: aggregates above sort every GPU of the pool; this reads the atoms' primary key alone).
COUNTS_SQL = """
SELECT n.name, COUNT(*) FROM nodes n JOIN atoms a ON a.node_id = n.name
WHERE n.pool_id = ? AND n.schedulable != 0 AND n.reachable != 0
GROUP BY n.name
"""


def eligible_nodes(
    conn: Conn, pool_id: str, *, topology: bool = True
) -> list[tuple[str, str, int, str | None]]:
    """(name, labels JSON, GPUs, fabric.domain or None) of each schedulable, reachable node.
    Without `topology`, labels read "{}" and the domain None (cheaper: GPU counts only)."""
    if not topology:
        return [
            (str(n), "{}", int(total), None) for n, total in conn.execute(COUNTS_SQL, (pool_id,))
        ]
    out = []
    for name, labels, total, c_lo, c_hi, q_lo, q_hi, n_c, n_q in conn.execute(
        NODES_SQL, (pool_id,)
    ):
        whole = n_c == total and n_q == total and c_lo == c_hi and q_lo == q_hi
        domain = f"{c_lo}.{q_lo}" if whole and c_lo is not None else None
        out.append((str(name), str(labels), int(total), domain))
    return out


def held(
    conn: Conn, pool_id: str, lo: int, hi: int, *, whole: bool = False
) -> dict[str, list[tuple[int, int, int]]]:
    """Per node, (start, end, GPUs as a bit mask) of its bookings overlapping [lo, hi). With
    `whole` (a request for whole nodes), each booking holds ALL_GPUS."""
    bound = hi + repo.longest_booking(conn, pool_id) + 1
    params = {"pool": pool_id, "lo": lo, "hi": hi, "bound": bound}
    return _by_node(conn.execute(WHOLE_SQL if whole else HELD_SQL, params), whole)


def held_of(
    conn: Conn, names: Sequence[str], lo: int, hi: int, *, whole: bool = False
) -> dict[str, list[tuple[int, int, int]]]:
    """`held`, for these nodes only (at most 1000 names). The bound on a booking's length is
    taken over every pool (see HELD_OF_SQL)."""
    if not names:
        return {}
    bound = hi + repo.longest_booking_anywhere(conn) + 1
    sql = (WHOLE_OF_SQL if whole else HELD_OF_SQL).format(marks=",".join("?" * len(names)))
    return _by_node(conn.execute(sql, (*names, lo, bound, hi)), whole)


def _by_node(rows: Iterable[Row], whole: bool) -> dict[str, list[tuple[int, int, int]]]:
    out: defaultdict[str, list[tuple[int, int, int]]] = defaultdict(list)
    if whole:
        for node, start, end in rows:
            out[node].append((start, end, ALL_GPUS))
    else:
        for node, start, end, mask in rows:
            out[node].append((start, end, int(mask) & _MASK64))
    return out


#: Per eligible node of the pool: its GPUs and how many of them have a booking in [:lo, :hi)
#: (the rest are free for the whole window). One pass over the window's bookings.
FREE_COUNTS_SQL = """
SELECT n.name, (SELECT COUNT(*) FROM atoms a WHERE a.node_id = n.name), COALESCE(b.booked, 0)
FROM nodes n LEFT JOIN (
  SELECT node_id, COUNT(DISTINCT atom) AS booked FROM bookings
  WHERE pool_id = :pool AND "end" > :lo AND "end" < :bound AND start < :hi
  GROUP BY node_id
) b ON b.node_id = n.name
WHERE n.pool_id = :pool AND n.schedulable != 0 AND n.reachable != 0
"""


def free_counts(conn: Conn, pool_id: str, window: Window) -> list[tuple[str, int, int]]:
    """(node, GPUs, GPUs with a booking in the window) of each eligible node of the pool."""
    bound = window.end + repo.longest_booking(conn, pool_id) + 1
    params = {"pool": pool_id, "lo": window.start, "hi": window.end, "bound": bound}
    return [(str(n), int(t), int(b)) for n, t, b in conn.execute(FREE_COUNTS_SQL, params)]


def node_models(conn: Conn, pool_id: str) -> list[tuple[str, str]]:
    """(node, model) of every distinct model on each node of the pool."""
    rows = conn.execute(
        "SELECT DISTINCT n.name, a.model FROM nodes n JOIN atoms a ON a.node_id = n.name"
        " WHERE n.pool_id = ?",
        (pool_id,),
    )
    return [(str(n), str(m)) for n, m in rows]


def maintenance_in(conn: Conn, pool_id: str, lo: int, hi: int) -> list[tuple[str, int, int]]:
    rows = conn.execute(
        'SELECT m.node_id, m.start, m."end" FROM maintenance m JOIN nodes n ON n.name = m.node_id'
        ' WHERE n.pool_id = ? AND m."end" > ? AND m.start < ?',
        (pool_id, lo, hi),
    )
    return [(str(n), int(s), int(e)) for n, s, e in rows]
