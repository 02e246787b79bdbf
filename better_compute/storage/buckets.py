"""`timeline` at fleet scale (issue 8): GPUs booked per bucket, counted from one row a window.

A week at 30-minute steps on 4,000 nodes overlaps 118,000 bookings, one row per GPU. But a
reservation books its GPUs of a node for one window, so those rows come as 31,000 windows of a
node: SQLite walks each of the pool's nodes through the bookings' node index (sorting nothing),
groups the rows of a node that share a start and an end into one atom mask, and hands the
groups over as four JSON arrays. Python then counts a mask's GPUs once per window, not once per
GPU (`fold_windows`). repo.booking_buckets's rows, one per GPU and sorted by SQLite, and
`fold` are the path PostgreSQL takes (tests compare the two, and both with a count GPU by GPU).

The grouped read relies on what the ledger guarantees: no GPU is booked twice at one instant
(tests/test_properties.py checks it after every step, past bookings included). On SQLite, while
a node that left the pool still holds bookings of it (`_strays`), the plain rows are folded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from better_compute.model import Window
from better_compute.storage import repo
from better_compute.storage.conn import SQLITE, Conn, dialect


def booked_per_bucket(conn: Conn, pool_id: str, window: Window, step: int) -> list[int]:
    """Per `step`-wide bucket of `window` (the last ends at the window's end), the pool's GPUs
    with any booking overlapping it, each counted once (PRODUCT.md §5.7)."""
    count = -(-(window.end - window.start) // step)
    if dialect(conn) == SQLITE and not _strays(conn, pool_id):
        return fold_windows(_windows(conn, pool_id, window, step, count), count)
    return fold(repo.booking_buckets(conn, pool_id, window, step), count)


def booked_among(
    conn: Conn, pool_id: str, window: Window, step: int, gpus: dict[str, frozenset[int]]
) -> list[int]:
    """booked_per_bucket's counts of these GPUs (by node) only: through the node index, for
    the few GPUs that are not allocatable."""
    count = -(-(window.end - window.start) // step)
    names = sorted(gpus)
    totals = [0] * count
    for first in range(0, len(names), 500):
        rows = repo.booking_buckets(conn, pool_id, window, step, nodes=names[first : first + 500])
        mine = (r for r in rows if int(r[1]) in gpus[str(r[0])])
        totals = [a + b for a, b in zip(totals, fold(mine, count), strict=True)]
    return totals


def _strays(conn: Conn, pool_id: str) -> bool:
    """Whether some node holds bookings of this pool but now sits in another (an inventory
    import moves a node once its bookings are past). The grouped read walks the pool's nodes of
    today, so it would miss them: the plain read counts them. One pass over the pool's GPU
    summary (`atom_bookings`), a seek per node."""
    row = conn.execute(
        "SELECT 1 FROM (SELECT DISTINCT node_id FROM atom_bookings WHERE pool_id = ?) AS held"
        " WHERE NOT EXISTS (SELECT 1 FROM nodes n WHERE n.name = held.node_id AND n.pool_id = ?)"
        " LIMIT 1",
        (pool_id, pool_id),
    ).fetchone()
    return row is not None


#: A node's GPUs 0..63 (inventory.MAX_GPUS) fit one 64-bit mask; SQLite's integers are signed,
#: so GPU 63's bit arrives as the sign and is put back with this.
_UNSIGNED = 1 << 64


def _windows(
    conn: Conn, pool_id: str, window: Window, step: int, count: int
) -> Iterator[tuple[str, int, int, int]]:
    """(node, first bucket, last bucket, atom mask) per window of a node that overlaps
    `window`: the node's bookings with one start and one end, their atoms as bits. Grouped by
    node and ordered by end within it: the order of the node index SQLite walks
    (bookings_node_window), so the ORDER BY sorts nothing (a test reads the plan).

    One JSON array per column. On the big pool, with the fold, 53–55 ms against 65–68 for one
    packed integer a booking, sorted in Python (docs/speed.md, "timeline by window")."""
    first, last = repo.bucket_span("")
    sql = (
        "SELECT json_group_array(node_id), json_group_array(f), json_group_array(l),"
        " json_group_array(m) FROM ("
        f"SELECT node_id, {first} AS f, {last} AS l, SUM(1 << atom) AS m FROM bookings"
        " WHERE node_id IN (SELECT name FROM nodes WHERE pool_id = :pool)"
        # `+`: the pool's test must not steer SQLite off the nodes' index (bookings_node_window)
        ' AND "end" > :from AND "end" < :bound AND start < :to AND +pool_id = :pool'
        ' GROUP BY node_id, "end", start ORDER BY node_id, "end", start)'
    )
    columns = conn.execute(sql, repo.bucket_args(conn, pool_id, window, step, count)).fetchone()
    nodes, firsts, lasts, masks = (json.loads(c) for c in columns)
    return zip(nodes, firsts, lasts, masks, strict=True)


def fold_windows(windows: Iterable[tuple[str, int, int, int]], count: int) -> list[int]:
    """Per bucket, the GPUs with any of `windows` over it, each once. `windows` are (node, first
    bucket, last bucket, atom mask), grouped by node and ordered by end within it.

    A difference array adds a window's GPUs over its buckets. A GPU whose earlier booking ended
    in the bucket where its next one starts would be counted twice there, so that bucket takes
    it back: `ended[b]` holds the node's GPUs whose latest booking so far ends in bucket b. In
    end order a GPU's bookings come one after another (none overlaps the next), so the GPUs of
    `ended[first]` that a window holds are exactly those it continues."""
    delta = [0] * (count + 1)
    node: str | None = None
    ended: dict[int, int] = {}
    for name, first, last, mask in windows:
        if name != node:
            node, ended = name, {}
        if mask < 0:
            mask += _UNSIGNED
        gpus = mask.bit_count()
        delta[first] += gpus
        delta[last + 1] -= gpus
        again = ended.get(first, 0) & mask
        if again:
            twice = again.bit_count()
            delta[first] -= twice
            delta[first + 1] += twice
        ended[last] = ended.get(last, 0) | mask
    return _running(delta, count)


def fold(ranges: Iterable[tuple[str, int, int, int]], count: int) -> list[int]:
    """Per bucket, the GPUs with any of `ranges` over it, each once. `ranges` are (node, atom,
    first bucket, last bucket) by node, atom, first (repo.booking_buckets): one GPU's ranges
    that share a bucket are merged first, then a difference array counts the merged ranges."""
    delta = [0] * (count + 1)
    gpu: tuple[str, int] | None = None
    lo = hi = -1
    for node, atom, first, last in ranges:
        if (node, atom) == gpu and first <= hi:
            hi = max(hi, last)
            continue
        if gpu is not None:
            delta[lo] += 1
            delta[hi + 1] -= 1
        gpu, lo, hi = (node, atom), first, last
    if gpu is not None:
        delta[lo] += 1
        delta[hi + 1] -= 1
    return _running(delta, count)


def _running(delta: list[int], count: int) -> list[int]:
    out, running = [], 0
    for i in range(count):
        running += delta[i]
        out.append(running)
    return out
