"""Row locks a placement takes on PostgreSQL, where writers of different rows may run at once.

On SQLite a write transaction holds the whole database (BEGIN IMMEDIATE), so these take nothing:
the lock they name is already held. On PostgreSQL they are real `FOR UPDATE` locks, always taken
in one order (the ledger clock row by Ledger.write, then the pool row, then victims) so writers
queue instead of deadlocking.
"""

from __future__ import annotations

from collections.abc import Sequence

from better_compute.storage.conn import SQLITE, Conn, Ledger, dialect


def lock_pool(db: Ledger, pool_id: str) -> None:
    """Hold the pool's row until the transaction ends: placements in one pool queue here.
    Taken once per transaction (a tick's retries each asked again, a round trip apiece): the
    memo is emptied when the transaction ends and when a savepoint of it rolls back, which may
    give a lock taken inside it back."""
    key = f"locks.pool:{pool_id}"
    if dialect(db.conn) == SQLITE or db.memo.get(key):
        return
    db.conn.execute("SELECT id FROM pools WHERE id = ? FOR UPDATE", (pool_id,)).fetchall()
    db.memo[key] = True


def lock_victims(conn: Conn, ids: Sequence[str]) -> bool:
    """Lock the spot reservations a preemption would cut: True when every one is locked now.

    `SKIP LOCKED`: a victim another transaction holds is not waited for; the preemption then
    touches none of them (the caller rolls its savepoint back) and the request waits as usual."""
    if dialect(conn) == SQLITE or not ids:
        return True
    marks = ",".join("?" * len(ids))
    rows = conn.execute(
        f"SELECT id FROM reservations WHERE id IN ({marks}) AND spot = 1 ORDER BY id"
        " FOR UPDATE SKIP LOCKED",
        tuple(ids),
    ).fetchall()
    return len(rows) == len(set(ids))
