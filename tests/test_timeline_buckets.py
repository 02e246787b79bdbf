"""Issue 8 item 2: `timeline` counts booked GPUs per bucket from one packed integer a booking
(storage/buckets.py). The reference is a count GPU by GPU, bucket by bucket, and the plain rows'
fold (repo.booking_buckets, the path PostgreSQL takes)."""

from __future__ import annotations

import random

import pgtest
from conftest import HOUR, ME, NOW, NOW_MS, Cli, at
from hypothesis import given
from hypothesis import strategies as st

from better_compute.model import Window
from better_compute.service.context import open_ctx
from better_compute.storage import buckets, repo
from better_compute.storage.conn import plain_rows

MINUTE = 60_000


def _by_gpu(conn: object, pool_id: str, window: Window, step: int) -> list[int]:
    """The definition (PRODUCT.md §5.7): per bucket, the distinct GPUs with a booking over it."""
    rows = plain_rows(
        conn,
        'SELECT node_id, atom, start, "end" FROM bookings WHERE pool_id = ?',
        (pool_id,),
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
    finally:
        ctx.db.close()


_ranges = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 29), st.integers(0, 29)),
    max_size=40,
)


@given(_ranges)
def test_the_packed_fold_is_the_plain_fold(drawn: list[tuple[int, int, int, int]]) -> None:
    """Overlapping, nested and touching ranges of one GPU (a spot booking still running in its
    notice beside the one that took its place) merge the same way in both folds."""
    count, bits = 30, (30).bit_length()
    rows = sorted((f"n{n}", a, min(f, la), max(f, la)) for n, a, f, la in drawn)
    packed = sorted(
        (((int(n[1:]) << 16) + a) << 2 * bits) + (f << bits) + la for n, a, f, la in rows
    )
    want = [len({(n, a) for n, a, f, la in rows if f <= i <= la}) for i in range(count)]
    assert buckets.fold(rows, count) == want
    assert buckets._fold_packed(packed, bits, count) == want


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
