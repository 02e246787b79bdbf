"""SQL for finding reservations (issue 12): names, labels, and windows that overlap a range.

Kept apart from storage/repo.py. Portable SQL: `?` placeholders and CASE rather than SQLite's
MAX(a, b), so the PostgreSQL ledger runs the same statements.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from better_compute.model import Reservation
from better_compute.storage import repo
from better_compute.storage.listing import KEY_CLAUSE, key_args
from better_compute.storage.repo import Conn


def set_tags(conn: Conn, rsv_id: str, name: str | None, labels: Sequence[tuple[str, str]]) -> None:
    """Store a new reservation's name and labels (once, at creation)."""
    conn.execute(
        "UPDATE reservations SET name = ?, labels = ? WHERE id = ?",
        (name, json.dumps(dict(sorted(labels)), sort_keys=True), rsv_id),
    )
    conn.executemany(
        "INSERT INTO reservation_labels(reservation_id, key, value) VALUES (?, ?, ?)",
        [(rsv_id, k, v) for k, v in sorted(labels)],
    )


@dataclass(frozen=True)
class Query:
    """`list`'s filters; None or empty means "any"."""

    tenants: Sequence[str] | None = None
    pool_id: str | None = None
    key: str | None = None
    states: Sequence[str] = ()
    name: str | None = None
    labels: Sequence[tuple[str, str]] = ()
    since: int | None = None  # --from: windows that end after it
    until: int | None = None  # --to: windows that start before it


#: The window a reservation has or wants: its booked `during`, or for a pending one the window a
#: retry now would book, [max(start, now), + duration) (lifecycle.tick.retry_window). A released
#: reservation that never held time has none (NULL), so no range finds it.
_START = (
    "(CASE WHEN during_start IS NOT NULL THEN during_start WHEN state = 'pending' THEN"
    " (CASE WHEN start > ? THEN start ELSE ? END) END)"
)
_END = (
    "(CASE WHEN during_start IS NOT NULL THEN during_end WHEN state = 'pending' THEN"
    " (CASE WHEN start > ? THEN start ELSE ? END) + duration_ms END)"
)


def find(conn: Conn, q: Query, now: int) -> list[Reservation]:
    """Reservations matching every filter, oldest first."""
    clauses, args = ["1 = 1"], []  # type: tuple[list[str], list[object]]
    if q.tenants is not None:
        clauses.append(f"tenant_id IN ({','.join('?' * len(q.tenants)) or 'NULL'})")
        args.extend(q.tenants)
    for column, value in (("pool_id", q.pool_id), ("name", q.name)):
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    if q.key is not None:
        clauses.append(KEY_CLAUSE.format(column="idempotency_key"))
        args.extend(key_args(q.key))
    if q.states:
        clauses.append(f"state IN ({','.join('?' * len(q.states))})")
        if "released" not in q.states:  # the state index holds live rows only (migration 12)
            clauses.append("state <> 'released'")
        args.extend(q.states)
    for key, value in q.labels:
        clauses.append(
            "id IN (SELECT reservation_id FROM reservation_labels WHERE key = ? AND value = ?)"
        )
        args.extend((key, value))
    if q.since is not None:
        clauses.append(f"{_END} > ?")
        args.extend((now, now, q.since))
    if q.until is not None:
        clauses.append(f"{_START} < ?")
        args.extend((now, now, q.until))
    return repo.reservations_where(conn, " AND ".join(clauses), args)
