"""Reads at fleet scale (issue 8): queries whose cost follows the answer, not the pool.

Each answers exactly what the plain query in repo.py answers; the tests compare the two.
"""

from __future__ import annotations

from better_compute.storage import ledger, repo
from better_compute.storage.repo import Conn


def atoms_reserved_later(conn: Conn, pool_id: str, now: int, in_use: int) -> int:
    """repo.atoms_reserved_later from the per-GPU summary `atom_bookings` (migration 4).

    At or after the ledger's latest instant every booking that ends after `now` belongs to a
    reservation not released: a release cuts its bookings back to the instant it acts at, never
    later than the ledger's clock. So the GPUs whose latest booking ends after `now` are exactly
    those in use now plus those reserved only later, and the second is the first less the
    in-use count (`in_use`, repo.count_atoms_in_use's answer): a count over an index. A read
    that asks an earlier `--now` (history, where a booking may outlive the release that later
    cut it) takes the plain query.
    """
    if now < ledger.clock_state(conn).last_at:
        return repo.atoms_reserved_later(conn, pool_id, now)
    row = conn.execute(
        "SELECT COUNT(*) FROM atom_bookings WHERE pool_id = ? AND last_end > ?", (pool_id, now)
    ).fetchone()
    return int(row[0]) - in_use
