"""Issue 8 item 2: the fleet-scale reads (storage/fleet.py) answer exactly what the plain queries
answer, through a ledger's real history: reservations now and later, extended, cancelled,
released, ticked past their end."""

from __future__ import annotations

import contextlib
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import DAY, HOUR, NOW_MS, Cli
from hypothesis import given
from hypothesis import strategies as st

from better_compute.demo import DEMO_INVENTORY
from better_compute.errors import BetterComputeError, Forbidden, InvalidInput, QuotaExceeded
from better_compute.identity import os_user
from better_compute.model import JsonValue, Window
from better_compute.render import json as js
from better_compute.service import booking, setup, ticking
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.storage import fleet, repo
from better_compute.storage.db import Database


@pytest.fixture()
def db(tmp_path: Path) -> Database:
    path = tmp_path / "ledger.db"
    made, _ = setup.init(
        str(path), NOW_MS, False, manual=True, admin=os_user(), group=None, fill=DEMO_INVENTORY
    )
    made.close()
    return Database(path, 5000)


def _pool_use_agrees(db: Database, now: int) -> None:
    conn = db.conn
    for row in repo.pool_rows(conn):
        plain = (
            repo.count_atoms_in_use(conn, row["id"], now),
            repo.atoms_reserved_later(conn, row["id"], now),
        )
        assert fleet.pool_use(conn, row["id"], now) == plain, (row["name"], now)


def _summary_is_the_latest_end(db: Database) -> None:
    """atom_bookings holds, for every GPU with bookings, the latest end of them."""
    conn = db.conn
    kept = {
        (p, n, a): e
        for p, n, a, e in conn.execute("SELECT pool_id, node_id, atom, last_end FROM atom_bookings")
    }
    latest = {
        (p, n, a): e
        for p, n, a, e in conn.execute(
            'SELECT pool_id, node_id, atom, MAX("end") FROM bookings GROUP BY 1, 2, 3'
        )
    }
    assert {k: v for k, v in kept.items() if v or k in latest} == latest


def _held_charges_agree(db: Database) -> None:
    conn = db.conn
    for tenant in repo.tenant_ids(conn):
        for pool_id in ["", *(row["id"] for row in repo.pool_rows(conn))]:
            plain = repo.held_charge(conn, tenant, pool_id)
            assert fleet.held_charge(conn, tenant, pool_id) == plain, (tenant, pool_id)


def test_summaries_agree_through_a_ledgers_history(db: Database) -> None:
    rng = random.Random(8)
    ctx = Ctx(db, NOW_MS)
    tenants = repo.tenant_ids(db.conn)
    pools = [None, *(row["name"] for row in repo.pool_rows(db.conn))]
    live: list[str] = []
    for step in range(40):
        now = NOW_MS + step * 2 * HOUR
        ctx = Ctx(db, now)
        ticking.tick(ctx)
        for _ in range(3):
            start = None if rng.random() < 0.4 else now + rng.randrange(1, 5 * 24) * HOUR
            lease = rng.random() < 0.1
            args = ReserveArgs(
                tenant=rng.choice(tenants),
                pool=rng.choice(pools),
                gpus=None if lease else rng.choice((1, 2, 4)),
                duration_ms=rng.choice((1, 3, 8, 30)) * HOUR,
                start=start,
                spot=rng.random() < 0.3,
                node_lease=lease,
            )
            try:
                rsv = booking.reserve(ctx, args)
            except (QuotaExceeded, InvalidInput, Forbidden):  # over a cap, a policy: skipped
                continue
            if rsv.allocations:
                live.append(rsv.id)
        if live and rng.random() < 0.5:
            victim = live.pop(rng.randrange(len(live)))
            state = repo.get_reservation(db.conn, victim).state.value
            if state in ("pending", "placed"):
                booking.cancel(ctx, victim)
            elif state in ("binding", "active"):
                booking.release(ctx, victim)
        if live and rng.random() < 0.3:
            # A collision or a finished reservation is not this test's business.
            with contextlib.suppress(BetterComputeError):
                booking.extend(ctx, rng.choice(live), 2 * HOUR)
        _summary_is_the_latest_end(db)
        _held_charges_agree(db)
        for ahead in (0, HOUR, DAY, 3 * DAY):
            _pool_use_agrees(db, ctx.now + ahead)
    states = dict(db.conn.execute("SELECT state, COUNT(*) FROM reservations GROUP BY state"))
    assert states.get("released", 0) > 5 and states.get("placed", 0) > 5, states
    # An earlier --now than the ledger's clock reads history: the plain query answers it.
    for back in (HOUR, DAY, 3 * DAY):
        _pool_use_agrees(db, ctx.now - back)
    db.close()


def test_as_of_before_a_release_the_gpus_it_held_were_in_use(db: Database) -> None:
    """§4: inUse is GPUs with a booking that covers now. As of an instant before a release, the
    released reservation's kept booking covers it: in use then, not neither in use nor reserved
    (the timeline of that instant says the same)."""
    pool_id = repo.pool_rows(db.conn)[0]["id"]
    args = ReserveArgs(tenant="acme", pool=None, gpus=8, duration_ms=2 * HOUR)
    held = booking.reserve(Ctx(db, NOW_MS), args)
    booking.release(Ctx(db, NOW_MS + 30 * 60_000), held.id)
    assert fleet.pool_use(db.conn, pool_id, NOW_MS + 10 * 60_000) == (8, 0)
    assert fleet.pool_use(db.conn, pool_id, NOW_MS + 40 * 60_000) == (0, 0)
    _pool_use_agrees(db, NOW_MS + 10 * 60_000)
    db.close()


def test_reserved_later_counts_an_index(db: Database) -> None:
    pool_id = repo.pool_rows(db.conn)[0]["id"]
    plan = [
        str(r[3])
        for r in db.conn.execute(
            "EXPLAIN QUERY PLAN SELECT COUNT(*) FROM atom_bookings WHERE pool_id = ?"
            " AND last_end > ?",
            (pool_id, NOW_MS),
        )
    ]
    assert any("atom_bookings_end (pool_id=? AND last_end>?)" in line for line in plan), plan
    db.close()


# ---------------------------------------------------------------- list, a page at a time


@pytest.mark.sqlite_only(reason="edits the SQLite file directly")
def test_list_json_is_every_reservation_in_order_across_pages(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`list --json` encodes page by page: the document is the same whatever the page size,
    and each reservation is exactly `get`'s document."""
    for k in range(7):
        run.ok("reserve", "--tenant", "acme" if k % 2 else "globex", "--gpus", 1, "--for", "2h")
    whole = run.ok("list")
    monkeypatch.setattr(fleet.reservation_pages, "__kwdefaults__", {"size": 2})
    assert run.ok("list") == whole
    assert [r["id"] for r in whole] == sorted((r["id"] for r in whole), key=_seq_of(run))
    assert whole == [run.ok("get", r["id"]) for r in whole]
    assert [r["id"] for r in run.ok("list", "--tenant", "acme")] == [
        r["id"] for r in whole if r["tenantId"] == "acme"
    ]


def _seq_of(run: Cli) -> Callable[[str], int]:
    conn = sqlite3.connect(run.db)
    seqs = dict(conn.execute("SELECT id, seq FROM reservations"))
    conn.close()
    return lambda rsv_id: int(seqs[rsv_id])


def test_list_bad_input_writes_nothing_on_stdout(run: Cli) -> None:
    assert "not a state" in run.fails(2, "list", "--state", "bogus")["message"]
    assert run.fails(3, "list", "--tenant", "nobody")["code"] == "NOT_FOUND"


@pytest.mark.sqlite_only(reason="damages the SQLite file by hand")
def test_list_of_a_damaged_row_is_unavailable_and_writes_nothing(run: Cli) -> None:
    run.ok("reserve", "--tenant", "acme", "--gpus", 1, "--for", "2h")
    conn = sqlite3.connect(run.db)
    conn.execute("UPDATE reservations SET duration_ms = 'long'")
    conn.commit()
    conn.close()
    error = run.fails(7, "list")
    assert error["code"] == "UNAVAILABLE" and "damaged" in error["message"], error


@given(
    st.lists(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3)
            ),
            max_leaves=8,
        ),
        max_size=5,
    )
)
def test_array_is_dumps_of_the_list(docs: list[JsonValue]) -> None:
    assert js.array(iter(docs)) == js.dumps(docs)


def test_placement_reads_named_nodes_through_their_index(db: Database) -> None:
    """The name-order reading plans a few named nodes: their bookings come from the nodes'
    index, not a walk over the pool's whole window (which SQLite picks for `b.pool_id = ?`)."""
    conn = db.conn
    pool_id = repo.pool_rows(conn)[0]["id"]
    names = fleet.usable_nodes_after(conn, pool_id, "", 3)
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        repo.snapshots(conn, pool_id, Window(NOW_MS, NOW_MS + HOUR), names=names)
    finally:
        conn.set_trace_callback(None)
    sql = next(s for s in seen if "FROM bookings" in s)
    plan = [str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql)]
    assert any("bookings_node_window (node_id=?" in line for line in plan), plan
    db.close()


def _counted_gpu_by_gpu(conn: sqlite3.Connection, pool_id: str, now: int) -> tuple[int, ...]:
    """pool_inventory_counts as it was written before nodes carried GPU counts: every GPU."""
    row = conn.execute(
        "SELECT (SELECT COUNT(*) FROM nodes WHERE pool_id = :pool),"
        " (SELECT COUNT(*) FROM nodes n JOIN atoms a ON a.node_id = n.name"
        "  WHERE n.pool_id = :pool),"
        " (SELECT COUNT(*) FROM nodes n JOIN atoms a ON a.node_id = n.name"
        "  WHERE n.pool_id = :pool AND n.schedulable != 0 AND a.healthy != 0 AND NOT EXISTS"
        '  (SELECT 1 FROM maintenance m WHERE m.node_id = n.name AND m."end" > :now'
        "   AND m.start < :now + 1))",
        {"pool": pool_id, "now": now},
    ).fetchone()
    return tuple(int(x) for x in row)


def test_pool_counts_from_the_nodes_agree_with_counting_every_gpu(db: Database) -> None:
    """repo.pool_inventory_counts reads the nodes' GPU counts (kept by triggers on atoms):
    through GPUs marked unhealthy and well again, added and removed, nodes cordoned and back,
    and maintenance windows, it answers what counting every GPU answers, at several instants."""
    rng = random.Random(11)
    conn = db.conn
    names = [str(r[0]) for r in conn.execute("SELECT name FROM nodes ORDER BY name")]
    pools = [str(row["id"]) for row in repo.pool_rows(conn)]
    for _ in range(80):
        node = rng.choice(names)
        with db.write():
            what = rng.randrange(5)
            if what == 0:
                conn.execute(
                    "UPDATE atoms SET healthy = 1 - healthy WHERE node_id = ? AND idx = ?",
                    (node, rng.randrange(8)),
                )
            elif what == 1:
                conn.execute(
                    "UPDATE nodes SET schedulable = 1 - schedulable WHERE name = ?", (node,)
                )
            elif what == 2:
                start = NOW_MS + rng.randrange(-2, 3) * HOUR
                conn.execute(
                    'INSERT INTO maintenance(node_id, start, "end", reason) VALUES (?, ?, ?, ?)',
                    (node, start, start + rng.choice((1, 5)) * HOUR, "test"),
                )
            elif what == 3:
                conn.execute(
                    "INSERT INTO atoms(node_id, idx, model, healthy) SELECT ?, MAX(idx) + 1,"
                    " 'h100', ? FROM atoms WHERE node_id = ?",
                    (node, rng.randrange(2), node),
                )
            else:
                conn.execute(
                    "DELETE FROM atoms WHERE node_id = ? AND idx ="
                    " (SELECT MAX(idx) FROM atoms WHERE node_id = ?) AND idx >= 8",
                    (node, node),
                )
        for now in (NOW_MS - HOUR, NOW_MS, NOW_MS + HOUR, NOW_MS + DAY):
            for pool_id in pools:
                got = repo.pool_inventory_counts(conn, pool_id, now)
                assert got == _counted_gpu_by_gpu(conn, pool_id, now), (pool_id, now)
    db.close()


def test_pool_counts_read_the_nodes_index_and_no_gpu(db: Database) -> None:
    conn = db.conn
    pool_id = repo.pool_rows(conn)[0]["id"]
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        repo.pool_inventory_counts(conn, pool_id, NOW_MS)
    finally:
        conn.set_trace_callback(None)
    sql = next(s for s in seen if "FROM nodes" in s)
    plan = " ".join(str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql))
    assert "nodes_fit (pool_id=?)" in plan and "atoms" not in plan, plan
    db.close()
