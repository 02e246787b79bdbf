"""What `simulate` reads besides the use cases it replays: the next instant a tick has work, and
the rows its report is computed from (reservations, events, bookings and usage of one run).

Kept apart from repo.py: these queries serve the replay only. Reservations of a run are named by
their `seq` range (seq grows with every reservation), then narrowed to the run's own ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from better_compute.storage.repo import Conn

_LIVE = "state IN ('placed', 'binding', 'active')"


def last_reservation_seq(conn: Conn) -> int:
    """The newest reservation's seq (0 for none): where a run's own reservations begin."""
    return int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM reservations").fetchone()[0])


def next_due(conn: Conn, after: int, repair_lead_ms: int, max_wait_ms: int) -> int | None:
    """The earliest instant later than `after` at which a tick has something to do: a live
    reservation's end or preemption deadline, a pending retry (`next_attempt_at`) or time-out, a
    placed reservation's start or its BookingRepair lead time. None when nothing is ever due.

    Each part reads only live or pending rows (the state index), never the ledger's history."""
    row = conn.execute(
        "SELECT MIN(t) FROM ("
        f" SELECT MIN(during_end) AS t FROM reservations WHERE {_LIVE} AND during_end > :a"
        f" UNION ALL SELECT MIN(preempt_deadline) FROM reservations WHERE {_LIVE}"
        "  AND preempt_deadline > :a"
        " UNION ALL SELECT MIN(next_attempt_at) FROM reservations WHERE state = 'pending'"
        "  AND next_attempt_at > :a"
        " UNION ALL SELECT MIN(created_at + :wait) FROM reservations WHERE state = 'pending'"
        "  AND created_at + :wait > :a"
        " UNION ALL SELECT MIN(during_start) FROM reservations WHERE state = 'placed'"
        "  AND during_start > :a"
        " UNION ALL SELECT MIN(during_start - :lead) FROM reservations WHERE state = 'placed'"
        "  AND lead_checked = 0 AND during_start - :lead > :a"
        ") AS due",
        {"a": after, "lead": repair_lead_ms, "wait": max_wait_ms},
    ).fetchone()
    return None if row[0] is None else int(row[0])


def reservation_starts(conn: Conn, lo_seq: int, hi_seq: int) -> list[tuple[str, int, int | None]]:
    """(id, createdAt, requested start) of the reservations with seq in [lo, hi]."""
    rows = conn.execute(
        "SELECT id, created_at, start FROM reservations WHERE seq BETWEEN ? AND ? ORDER BY seq",
        (lo_seq, hi_seq),
    )
    return [(str(i), int(c), None if s is None else int(s)) for i, c, s in rows]


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
