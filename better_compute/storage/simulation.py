"""What `simulate` reads besides the use cases it replays: the next instant a tick has work, and
the rows its report is computed from (reservations, events, bookings and usage of one run).

Kept apart from repo.py: these queries serve the replay only. Reservations of a run are named by
their `seq` range (seq grows with every reservation), then narrowed to the run's own ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from better_compute.model import LIVE_STATES, Maintenance, Window
from better_compute.storage.conn import POSTGRES, Ledger, dialect
from better_compute.storage.repo import PREEMPTIBLE, Conn, per_live_state

#: `state <> 'released'` lets SQLite use the partial indexes of what is due (migration 11).
_PENDING = "state = 'pending' AND state <> 'released'"
_PLACED = "state = 'placed' AND state <> 'released'"


def last_reservation_seq(conn: Conn) -> int:
    """The newest reservation's seq (0 for none): where a run's own reservations begin."""
    return int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM reservations").fetchone()[0])


#: next_due's statement, built once (it runs after every tick of a replay).
_NEXT_DUE = (
    "SELECT MIN(t) FROM ("
    + per_live_state(
        "SELECT MIN(during_end) AS t FROM reservations WHERE {live} AND during_end > :a"
    )
    + " UNION ALL "
    + per_live_state(
        "SELECT MIN(during_end) - :notice FROM reservations WHERE {live}"
        " AND during_end > :a + :notice"
    )
    + " UNION ALL "
    + per_live_state(
        "SELECT MIN(preempt_deadline) FROM reservations WHERE {live} AND preempt_deadline > :a"
    )
    + f" UNION ALL SELECT MIN(next_attempt_at) FROM reservations WHERE {_PENDING}"
    "  AND next_attempt_at > :a"
    f" UNION ALL SELECT MIN(created_at + :wait) FROM reservations WHERE {_PENDING}"
    "  AND created_at + :wait > :a"
    f" UNION ALL SELECT MIN(during_start) FROM reservations WHERE {_PLACED}"
    "  AND during_start > :a"
    f" UNION ALL SELECT (SELECT during_start - :lead FROM reservations WHERE {_PLACED}"
    "  AND during_start > :a + :lead AND lead_checked = 0 ORDER BY during_start LIMIT 1)"
    f" UNION ALL SELECT MIN(created_at) FROM reservations WHERE {_PLACED}"
    "  AND during_start > :a AND during_start <= :a + :lead AND lead_checked = 0"
    "  AND created_at > :a"
    ") AS due"
)


def next_due(
    conn: Conn, after: int, repair_lead_ms: int, max_wait_ms: int, notice_ms: int
) -> int | None:
    """The earliest instant later than `after` at which a tick has something to do: a live
    reservation's end, its expiring notice (`notice_ms` before the end, as a tick run every
    minute by cron gives it) or preemption deadline, a pending retry (`next_attempt_at`) or
    time-out, a placed reservation's start or its BookingRepair lead time. A reservation made
    inside its lead time (a start less than repair.leadMs ahead) has its lead check due at once,
    at its creation, as the next cron tick would do it (and give its starting notice), not at
    its start. None when nothing is ever due.

    Each part reads only live or pending rows (the state index), never the ledger's history. The
    lead time walks the placed reservations by start from `after + lead` and stops at the first
    not yet checked: a ledger with many calendar bookings ahead holds thousands of placed rows,
    and this runs after every tick of a replay."""
    row = conn.execute(
        _NEXT_DUE,
        {"a": after, "lead": repair_lead_ms, "wait": max_wait_ms, "notice": notice_ms},
    ).fetchone()
    return None if row[0] is None else int(row[0])


def reservation_starts(
    conn: Conn, lo_seq: int, hi_seq: int
) -> list[tuple[str, str, int, int | None]]:
    """(id, pool, createdAt, requested start) of the reservations with seq in [lo, hi]."""
    rows = conn.execute(
        "SELECT id, pool_id, created_at, start FROM reservations WHERE seq BETWEEN ? AND ?"
        " ORDER BY seq",
        (lo_seq, hi_seq),
    )
    return [(str(i), str(p), int(c), None if s is None else int(s)) for i, p, c, s in rows]


def placement_events(
    conn: Conn, since_seq: int, types: Sequence[str]
) -> list[tuple[str, str, int, dict[str, object]]]:
    """(type, reservation, at, data) of the reservation events of `types` after `since_seq`, in
    seq order."""
    rows = conn.execute(
        "SELECT type, reservation_id, at, data FROM events WHERE seq > ? AND reservation_id IS NOT"
        f" NULL AND type IN ({','.join('?' * len(types))}) ORDER BY seq",
        (since_seq, *types),
    )
    return [(str(t), str(r), int(a), json.loads(d)) for t, r, a, d in rows]


def booking_spans(conn: Conn, lo_seq: int, hi_seq: int) -> list[tuple[str, str, int, int]]:
    """(reservation, pool, start, end) of every booking of the reservations with seq in [lo, hi]."""
    rows = conn.execute(
        'SELECT b.reservation_id, b.pool_id, b.start, b."end" FROM reservations r'
        " JOIN bookings b ON b.reservation_id = r.id WHERE r.seq BETWEEN ? AND ?"
        " ORDER BY r.seq, b.id",
        (lo_seq, hi_seq),
    )
    return [(str(r), str(p), int(s), int(e)) for r, p, s, e in rows]


def usage_spans(conn: Conn, lo_seq: int, hi_seq: int) -> list[tuple[str, int, int, int | None]]:
    """(reservation, gpus, start, end or None while open) of the usage windows of the
    reservations with seq in [lo, hi]."""
    rows = conn.execute(
        'SELECT u.reservation_id, u.gpus, u.start, u."end" FROM reservations r'
        " JOIN usage u ON u.reservation_id = r.id WHERE r.seq BETWEEN ? AND ? ORDER BY u.id",
        (lo_seq, hi_seq),
    )
    return [(str(r), int(g), int(s), None if e is None else int(e)) for r, g, s, e in rows]


# ---------------------------------------------------------------- the fleet kept in memory


def data_version(conn: Conn) -> int:
    """A number that changes exactly when another connection has committed since this one last
    looked: SQLite's PRAGMA data_version; on PostgreSQL, the count of write transactions kept on
    the clock row that every write locks first (storage/postgres.PgConn.data_version)."""
    if dialect(conn) == POSTGRES:
        return int(conn.data_version())  # type: ignore[attr-defined]
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def data_version_of(db: Ledger) -> int:
    """data_version, read once per write transaction (kept in db.memo): while this connection
    holds the write lock no other can commit, and its own commits never change it. A replay
    asks at every step of its request and ticks. Outside a write, read each time."""
    if not db.writing:
        return data_version(db.conn)
    version = db.memo.get(_VERSION_MEMO)
    if not isinstance(version, int):
        version = db.memo[_VERSION_MEMO] = data_version(db.conn)
    return version


_VERSION_MEMO = "simulation.data_version"


def pool_maintenance_after(conn: Conn, pool_id: str, after: int) -> list[Maintenance]:
    """The pool's maintenance windows that end after `after`, in repo.maintenance_overlapping's
    order (node, start)."""
    rows = conn.execute(
        'SELECT m.id, m.node_id, m.start, m."end", m.reason FROM maintenance m'
        ' JOIN nodes n ON n.name = m.node_id WHERE n.pool_id = ? AND m."end" > ?'
        " ORDER BY m.node_id, m.start",
        (pool_id, after),
    )
    return [Maintenance(int(i), str(n), Window(int(s), int(e)), r) for i, n, s, e, r in rows]


_BOOKED = (
    f'SELECT b.reservation_id, b.node_id, b.atom, b.start, b."end", {PREEMPTIBLE},'
    f" r.state IN ({','.join(repr(s.value) for s in LIVE_STATES)}) FROM bookings b"
    " JOIN reservations r ON r.id = b.reservation_id"
)


#: (reservation, node, atom, start, end, spot flag (repo.PREEMPTIBLE), reservation live) of one
#: booking.
BookedRow = tuple[str, str, int, int, int, int, bool]


def _booking_rows(rows: Iterable[Any]) -> list[BookedRow]:
    return [
        (str(r), str(n), int(a), int(s), int(e), int(sp), bool(live))
        for r, n, a, s, e, sp, live in rows
    ]


def pool_bookings_after(conn: Conn, pool_id: str, after: int) -> list[BookedRow]:
    """Every booking of the pool that ends after `after`, with its reservation's liveness."""
    rows = conn.execute(f'{_BOOKED} WHERE b.pool_id = ? AND b."end" > ?', (pool_id, after))
    return _booking_rows(rows)


def touched_since(
    conn: Conn, seq: int, unchanged: Sequence[str] = ()
) -> tuple[int, dict[str, set[str]]]:
    """(the latest event seq, the reservations named by events after `seq` with those events'
    types): every change to a reservation's bookings or state is written with an event on it.
    Events of the `unchanged` types (which change neither) do not count."""
    # A range of the primary key: the few newest events, never the reservation index.
    rows = conn.execute("SELECT seq, reservation_id, type FROM events WHERE seq > ?", (seq,))
    skip, last = set(unchanged), seq
    touched: dict[str, set[str]] = {}
    for at, rsv_id, type_ in rows:
        last = max(last, int(at))
        if rsv_id is not None and type_ not in skip:
            touched.setdefault(str(rsv_id), set()).add(str(type_))
    return last, touched


def bookings_of(conn: Conn, rsv_ids: Sequence[str]) -> dict[str, list[tuple[str, BookedRow]]]:
    """(pool, booking) of these reservations, by reservation (ids without bookings absent)."""
    found: dict[str, list[tuple[str, BookedRow]]] = {}
    for first in range(0, len(rsv_ids), 500):
        chunk = list(rsv_ids[first : first + 500])
        rows = conn.execute(
            f"{_BOOKED.replace('SELECT ', 'SELECT b.pool_id, ', 1)}"
            f" WHERE b.reservation_id IN ({','.join('?' * len(chunk))})",
            chunk,
        )
        for pool, *rest in rows:
            (row,) = _booking_rows([rest])
            found.setdefault(row[0], []).append((str(pool), row))
    return found
