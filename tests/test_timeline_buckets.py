"""Issue 8 item 2: `timeline` counts booked GPUs per bucket from one row per window of a node, its
GPUs as a mask (storage/buckets.py). The reference is a count GPU by GPU, bucket by bucket, and
the plain rows' fold (repo.booking_buckets, the path PostgreSQL takes)."""

from __future__ import annotations

import random
import sqlite3

import pgtest
import pytest
from conftest import HOUR, ME, NOW, NOW_MS, Cli, at
from hypothesis import given
from hypothesis import strategies as st

from better_compute.model import Window
from better_compute.service.context import open_ctx
from better_compute.storage import buckets, repo
from better_compute.storage.conn import plain_rows

MINUTE = 60_000


def _by_gpu(
    conn: object, pool_id: str, window: Window, step: int, tenant: str | None = None
) -> list[int]:
    """The definition (PRODUCT.md §5.7): per bucket, the distinct GPUs with a booking over it
    (of the tenant's reservations, if given: read through the reservations)."""
    rows = plain_rows(
        conn,
        'SELECT b.node_id, b.atom, b.start, b."end" FROM bookings b'
        " JOIN reservations r ON r.id = b.reservation_id"
        " WHERE b.pool_id = ? AND r.tenant_id = COALESCE(?, r.tenant_id)",
        (pool_id, tenant),
    )
    spans = [(str(n), int(a), int(s), int(e)) for n, a, s, e in rows]
    out = []
    for lo in range(window.start, window.end, step):
        hi = min(lo + step, window.end)
        out.append(len({(n, a) for n, a, s, e in spans if s < hi and e > lo}))
    return out


def test_booked_per_bucket_is_the_count_gpu_by_gpu(run: Cli) -> None:
    rng = random.Random(8)
    for tenant in ("acme", "globex"):
        run.ok("quota", "set", "--tenant", tenant, "--gpus", 10_000)
    for k in range(40):
        gpus = rng.choice((1, 2, 3, 4, 8))
        start = at(rng.randrange(-2, 60) * 7 * MINUTE) if k % 3 else None
        flags = ["--start", start] if start else []
        length = f"{rng.randrange(5, 600)}m"
        tenant = rng.choice(("acme", "globex"))
        rsv = run.ok("reserve", "--tenant", tenant, "--gpus", gpus, "--for", length, *flags)
        if k % 7 == 0 and rsv["state"] != "pending":
            run.ok("cancel", rsv["id"])
    ctx = open_ctx(pgtest.ledger(str(run.db)), NOW, ME, None)
    try:
        with ctx.db.read() as conn:
            pool_id = str(repo.find_pool(conn, None)["id"])
            for _ in range(25):
                start = NOW_MS + rng.randrange(-4 * HOUR, 8 * HOUR, 7 * MINUTE)
                end = start + rng.randrange(5 * MINUTE, 14 * HOUR, 3 * MINUTE)
                step = rng.choice((5, 7, 30, 60, 1440)) * MINUTE
                window = Window(start, end)
                count = -(-(end - start) // step)
                if count > 336:
                    continue
                want = _by_gpu(conn, pool_id, window, step)
                assert buckets.booked_per_bucket(conn, pool_id, window, step) == want
                plain = buckets.fold(repo.booking_buckets(conn, pool_id, window, step), count)
                assert plain == want
                for tenant in ("acme", "globex"):
                    rows = repo.booking_buckets(conn, pool_id, window, step, tenant)
                    assert buckets.fold(rows, count) == _by_gpu(conn, pool_id, window, step, tenant)
    finally:
        ctx.db.close()


_ranges = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 29), st.integers(0, 29)),
    max_size=40,
)


@given(_ranges)
def test_the_plain_fold_merges_what_shares_a_bucket(drawn: list[tuple[int, int, int, int]]) -> None:
    """Overlapping, nested and touching ranges of one GPU count it once per bucket."""
    count = 30
    rows = sorted((f"n{n}", a, min(f, la), max(f, la)) for n, a, f, la in drawn)
    want = [len({(n, a) for n, a, f, la in rows if f <= i <= la}) for i in range(count)]
    assert buckets.fold(rows, count) == want


#: Bookings of a few nodes of up to 64 GPUs: (node, start, length, gap before it, GPUs), in
#: minutes, laid one after another on each GPU as the ledger does (none overlaps the next).
_bookings = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.integers(-90, 700),
        st.integers(1, 400),
        st.sampled_from((0, 0, 1, 7, 29, 30, 45)),
        st.sets(st.integers(0, 63), min_size=1, max_size=6),
    ),
    max_size=40,
)


@given(_bookings, st.sampled_from((1, 7, 30, 60, 1440)))
def test_the_window_fold_is_the_count_gpu_by_gpu(
    drawn: list[tuple[int, int, int, int, set[int]]], step: int
) -> None:
    """fold_windows, fed what buckets._windows reads (a node's bookings sharing a start and an
    end as one signed 64-bit mask, by node then end), counts what a GPU-by-GPU count does:
    back-to-back bookings, bookings inside one bucket, ones that begin before the window or end
    after it, and GPU 63 (the sign bit) included."""
    free: dict[tuple[int, int], int] = {}
    spans: list[tuple[int, int, int, int]] = []  # node, atom, start, end (minutes)
    for node, start, length, gap, atoms in drawn:
        begin = max([start, *(free.get((node, a), start - gap) + gap for a in atoms)])
        for a in atoms:
            free[(node, a)] = begin + length
            spans.append((node, a, begin, begin + length))
    lo, hi = 0, 600
    count = -(-(hi - lo) // step)
    want = []
    for b in range(count):
        s, e = lo + b * step, min(lo + (b + 1) * step, hi)
        want.append(len({(n, a) for n, a, bs, be in spans if bs < e and be > s}))
    groups: dict[tuple[int, int, int], int] = {}
    for n, a, bs, be in spans:
        if be > lo and bs < hi:
            groups[(n, be, bs)] = groups.get((n, be, bs), 0) | 1 << a
    windows = []
    for (n, be, bs), mask in sorted(groups.items()):
        first = (max(bs, lo) - lo) // step
        last = min((be - lo - 1) // step, count - 1)
        windows.append((f"n{n}", first, last, mask - (1 << 64) if mask >= 1 << 63 else mask))
    assert buckets.fold_windows(windows, count) == want


@pytest.mark.sqlite_only(reason="EXPLAIN QUERY PLAN is SQLite's")
def test_the_window_read_walks_the_node_index_and_sorts_nothing(run: Cli) -> None:
    """_windows's GROUP BY and ORDER BY are the order of bookings_node_window: SQLite walks each
    node's bookings through it and sorts nothing (a sort of 118,000 rows is what it saves)."""
    for gpus in (8, 3, 2):
        run.ok("reserve", "--tenant", "acme", "--gpus", gpus, "--for", "3h")
    conn = sqlite3.connect(run.db)
    try:
        pool_id = str(conn.execute("SELECT id FROM pools").fetchone()[0])
        seen: list[str] = []
        conn.set_trace_callback(seen.append)
        windows = list(buckets._windows(conn, pool_id, Window(NOW_MS, NOW_MS + 4 * HOUR), HOUR, 4))
        conn.set_trace_callback(None)
        # 13 GPUs in at most three windows (two of them share a node and a window: one row)
        assert sum(bin(m).count("1") for _, _, _, m in windows) == 13 and len(windows) <= 3
        sql = next(s for s in seen if "json_group_array" in s)
        plan = [str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql)]
    finally:
        conn.close()
    assert any("bookings_node_window (node_id=?" in line for line in plan), plan
    assert not any("TEMP B-TREE" in line for line in plan), plan


@pytest.mark.sqlite_only(reason="EXPLAIN QUERY PLAN is SQLite's")
def test_a_tenants_timeline_reads_its_own_bookings_through_their_tenants_index(run: Cli) -> None:
    """Not every booking of the pool's window looked up in the reservations (a review found
    `timeline --tenant` at 2.5x `--version` on the big pool for that): the tenant's index."""
    run.ok("reserve", "--tenant", "acme", "--gpus", 2, "--for", "3h")
    conn = sqlite3.connect(run.db)
    try:
        pool_id = str(conn.execute("SELECT id FROM pools").fetchone()[0])
        seen: list[str] = []
        conn.set_trace_callback(seen.append)
        window = Window(NOW_MS, NOW_MS + 4 * HOUR)
        assert buckets.fold(repo.booking_buckets(conn, pool_id, window, HOUR, "acme"), 4) == [
            2
        ] * 3 + [0]
        conn.set_trace_callback(None)
        sql = next(s for s in seen if "tenant_id" in s)
        plan = " ".join(str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql))
    finally:
        conn.close()
    assert "bookings_tenant (tenant_id=?" in plan and "reservations" not in plan, plan


def test_a_node_that_changed_pool_is_counted_where_its_bookings_are(run: Cli) -> None:
    """Bookings keep the pool they were made in. A node moved to another pool (an inventory
    import does that once its bookings are past) is counted in its old pool's past, and its old
    bookings never in its new pool."""
    for _ in range(3):
        run.ok("reserve", "--tenant", "acme", "--gpus", 8, "--for", "3h")
    run.ok("pool", "create", "east")
    window, step = Window(NOW_MS - HOUR, NOW_MS + 5 * HOUR), 30 * MINUTE
    ctx = open_ctx(pgtest.ledger(str(run.db)), NOW, ME, None)
    try:
        with ctx.db.read() as conn:
            west = str(repo.find_pool(conn, "west")["id"])
            east = str(repo.find_pool(conn, "east")["id"])
            assert not buckets._strays(conn, west)
            booked = str(
                plain_rows(
                    conn, "SELECT node_id FROM bookings WHERE pool_id = ?", (west,)
                ).__next__()[0]
            )
        with ctx.db.write() as conn:
            node = repo.get_node(conn, booked)
            repo.move_node(conn, booked, east, node.labels, node.atoms)
        with ctx.db.read() as conn:
            assert buckets._strays(conn, west) and not buckets._strays(conn, east)
            for pool_id in (west, east):
                want = _by_gpu(conn, pool_id, window, step)
                assert buckets.booked_per_bucket(conn, pool_id, window, step) == want
            assert max(_by_gpu(conn, west, window, step)) == 24
            assert max(buckets.booked_per_bucket(conn, east, window, step)) == 0
    finally:
        ctx.db.close()
