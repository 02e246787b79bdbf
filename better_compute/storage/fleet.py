"""Reads at fleet scale (issue 8): queries whose cost follows the answer, not the pool.

Each answers exactly what the plain query in repo.py answers; the tests compare the two.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from better_compute.model import Reservation
from better_compute.storage import listing, repo
from better_compute.storage.repo import Conn


def pool_use(conn: Conn, pool_id: str, now: int) -> tuple[int, int]:
    """(GPUs in use at `now`, GPUs reserved only later): what repo.count_atoms_in_use and
    repo.atoms_reserved_later answer, read from indexes alone.

    A release cuts its bookings back to the instant it acts at, so at any instant the bookings
    that cover it are the GPUs in use (§4), released reservations' kept history included when
    an earlier `--now` asks. The GPUs whose latest booking ends after `now` (`atom_bookings`,
    migration 4) are exactly those in use plus those reserved only later: the second is a
    count over an index less the first.
    """
    in_use = repo.count_atoms_in_use(conn, pool_id, now)
    booked = conn.execute(
        "SELECT COUNT(*) FROM atom_bookings WHERE pool_id = ? AND last_end > ?", (pool_id, now)
    ).fetchone()
    return in_use, int(booked[0]) - in_use


def unallocatable(conn: Conn, pool_id: str, now: int) -> dict[str, frozenset[int]]:
    """The pool's GPUs that are not allocatable at `now`, by node: every GPU of a node not
    schedulable, unreachable or under a maintenance window, and the unhealthy GPUs of the
    others (repo.pool_inventory_counts counts the rest). One pass over the pool's nodes, then
    the GPUs of only those nodes: usually none or a few."""
    rows = conn.execute(
        "SELECT name, usable FROM (SELECT n.name, n.gpus, n.healthy_gpus,"
        f" CASE WHEN {repo.USABLE_NOW} THEN 1 ELSE 0 END AS usable"
        " FROM nodes n WHERE n.pool_id = :pool) AS nodes_now"
        " WHERE usable = 0 OR healthy_gpus < gpus ORDER BY name",
        {"pool": pool_id, "now": now},
    ).fetchall()
    usable = {str(name): bool(ok) for name, ok in rows}
    found: dict[str, set[int]] = {}
    names = list(usable)
    for first in range(0, len(names), 500):
        chunk = names[first : first + 500]
        marks = ",".join("?" * len(chunk))
        atoms = conn.execute(
            f"SELECT node_id, idx, healthy FROM atoms WHERE node_id IN ({marks})", chunk
        )
        for node, idx, healthy in atoms:
            if not (usable[str(node)] and healthy):
                found.setdefault(str(node), set()).add(int(idx))
    return {node: frozenset(idx) for node, idx in found.items()}


def in_use_among(conn: Conn, pool_id: str, now: int, gpus: dict[str, frozenset[int]]) -> int:
    """How many of these GPUs (by node) have a booking of the pool that covers `now`: the GPUs
    repo.count_atoms_in_use counts, on these nodes only, through the node index."""
    held = 0
    names = sorted(gpus)
    bound = now + repo.longest_booking(conn, pool_id)
    for first in range(0, len(names), 500):
        chunk = names[first : first + 500]
        rows = conn.execute(
            "SELECT DISTINCT node_id, atom FROM bookings"
            f" WHERE node_id IN ({','.join('?' * len(chunk))}) AND pool_id || '' = ?"
            ' AND "end" > ? AND "end" <= ? AND start <= ?',
            (*chunk, pool_id, now, bound, now),
        )
        held += sum(1 for node, atom in rows if int(atom) in gpus[str(node)])
    return held


def usable_nodes_after(conn: Conn, pool_id: str, after: str, limit: int) -> list[str]:
    """Up to `limit` names, by name after `after`, of the pool's schedulable, reachable nodes:
    placement's reading of the pool in name order (service/placing.name_order_scan)."""
    rows = conn.execute(
        "SELECT name FROM nodes WHERE pool_id = ? AND name > ?"
        " AND schedulable = 1 AND reachable = 1 ORDER BY name LIMIT ?",
        (pool_id, after, limit),
    )
    return [str(r[0]) for r in rows]


def nodes_holding(conn: Conn, pool_id: str, models: Sequence[str], share: int, enough: int) -> int:
    """How many of the pool's nodes have at least `share` GPUs of the accepted models (all GPUs
    when none is given), whatever their state, counting no further than `enough`: the question
    repo.node_capacity answers in full, asked so that the usual answer stops at the first nodes."""
    match = f" AND a.model IN ({','.join('?' * len(models))})" if models else ""
    row = conn.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM nodes n WHERE n.pool_id = ?"
        f" AND (SELECT COUNT(*) FROM atoms a WHERE a.node_id = n.name{match}) >= ? LIMIT ?) AS big",
        [pool_id, *models, share, enough],
    ).fetchone()
    return int(row[0])


def largest_nvlink_group(conn: Conn, pool_id: str, models: Sequence[str]) -> int:
    """The most GPUs of the accepted models (of any model when none is given) in one NVLink
    group of one of the pool's nodes, whatever their state: the largest share `--topology
    nvlink-all` could ever take on a node. 0 for a pool without such GPUs."""
    match = f" AND a.model IN ({','.join('?' * len(models))})" if models else ""
    row = conn.execute(
        "SELECT COALESCE(MAX(c), 0) FROM (SELECT COUNT(*) AS c FROM nodes n"
        f" JOIN atoms a ON a.node_id = n.name{match} WHERE n.pool_id = ?"
        " GROUP BY a.node_id, a.nvlink_group) AS per_group",
        [*models, pool_id],
    ).fetchone()
    return int(row[0])


def held_charge(conn: Conn, tenant: str, pool_id: str) -> int:
    """repo.held_charge from `held_charges` (migration 4): GPUs a tenant holds now, in one pool
    or, with pool_id '', in every pool. One row per pool, however many reservations it holds."""
    sql = "SELECT COALESCE(SUM(held), 0) FROM held_charges WHERE tenant_id = ?"
    args: list[object] = [tenant]
    if pool_id:
        sql += " AND pool_id = ?"
        args.append(pool_id)
    return int(conn.execute(sql, args).fetchone()[0])


def reservation_pages(
    conn: Conn, q: listing.Query, now: int, size: int = 500
) -> Iterator[list[Reservation]]:
    """`list`: the reservations `q` selects, in its order, `size` at a time: one cursor read
    page by page, so a listing of thousands never holds them all as objects at once."""
    selection, args = listing.selected(q, now)
    cursor = conn.execute(f"SELECT * FROM reservations WHERE {selection}", args)
    while rows := cursor.fetchmany(size):
        yield repo.with_allocations(conn, rows)
