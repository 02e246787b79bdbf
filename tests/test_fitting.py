"""Issue 8 item 3 (growth3): placement's fleet-scale reads (storage/fitting.py) answer exactly
what the plain queries answer, and the node sizes they read (migration 10's nodes.gpus and
nodes.healthy_gpus) are exactly the GPU rows' counts after any inventory or health change.

The shortlist's own property (the shortlist answers as the full planner) is in test_shortlist.py
and runs through these reads; here each read is compared with its reference, row for row.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_shortlist import (
    T0,
    WINDOW,
    Ask,
    BookingSpec,
    NodeSpec,
    ledger,
    reservation,
    rolled_back,
    worlds,
    write_world,
)

from better_compute.engine import shortlist
from better_compute.engine.fit import plan_nodes
from better_compute.engine.scorers import busy_count
from better_compute.model import Atom, Window
from better_compute.storage import fitting, repo
from better_compute.storage.repo import Conn

H = 3_600_000


def _sizes(conn: Conn) -> list[tuple[str, int, int]]:
    """(node, gpus, healthy_gpus) as the node rows hold them, and as the GPU rows count them."""
    held = conn.execute("SELECT name, gpus, healthy_gpus FROM nodes ORDER BY name")
    return [(str(r[0]), int(r[1]), int(r[2])) for r in held]


def _counted(conn: Conn) -> list[tuple[str, int, int]]:
    rows = conn.execute(
        "SELECT n.name, (SELECT COUNT(*) FROM atoms a WHERE a.node_id = n.name),"
        " (SELECT COUNT(*) FROM atoms a WHERE a.node_id = n.name AND a.healthy != 0)"
        " FROM nodes n ORDER BY n.name"
    )
    return [(str(r[0]), int(r[1]), int(r[2])) for r in rows]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(worlds(), st.integers(1, 6))
def test_fitting_reads_answer_as_the_plain_queries(
    world: tuple[list[NodeSpec], list[BookingSpec], Ask], limit: int
) -> None:
    fleet, held, ask = world
    db, pool_id = ledger()
    with rolled_back(db):
        subject = write_world(db, pool_id, fleet, held, ask)
        conn = db.conn
        request = subject.request(WINDOW)
        args = {"need": request.gpus or 0, "whole_node": request.node_lease}
        plain = repo.fit_candidates(conn, pool_id, WINDOW, ignore_reservation=subject.id, **args)
        fast = fitting.fit_candidates(conn, pool_id, WINDOW, ignore_reservation=subject.id, **args)
        assert fast == plain
        first = fitting.fit_candidates(
            conn, pool_id, WINDOW, ignore_reservation=subject.id, limit=limit, **args
        )
        assert first == plain[:limit]
        assert _sizes(conn) == _counted(conn)

        # The name-order reading: every usable node in name order, with its GPUs booked in the
        # window exactly as its snapshot counts them, and no MAX_SCORE plan on a node it skips.
        rows = fitting.usable_after(
            conn, pool_id, WINDOW, ignore_reservation=subject.id, after="", limit=1000
        )
        usable = [s.name for s in fleet if s.schedulable and s.reachable]
        assert [r[0] for r in rows] == sorted(usable)
        snaps = {
            s.node.name: s
            for s in repo.snapshots(conn, pool_id, WINDOW, ignore_reservation=subject.id)
        }
        for name, gpus, healthy, busy in rows:
            atoms = snaps[name].node.atoms
            assert (gpus, healthy) == (len(atoms), sum(a.healthy for a in atoms))
            assert busy == busy_count(snaps[name])
        if request.gang_size is None:
            fits, _ = plan_nodes(request, list(snaps.values()))
            kept = {r[0] for r in rows if shortlist.could_be_perfect(request, *r[1:])}
            for _, plan in fits:
                if plan.score >= shortlist.MAX_SCORE and plan.node_id in usable:
                    assert plan.node_id in kept


def test_a_booking_on_a_gpu_the_node_no_longer_has_counts_as_the_plain_query_counts_it() -> None:
    """A node shrunk by an inventory update keeps bookings on GPUs it lost: the plain query
    ignores them (it joins the GPU rows), and so do the fast reads."""
    db, pool_id = ledger()
    with rolled_back(db):
        conn = db.conn
        atoms = tuple(Atom(j, "h100", j // 4, "c1", 1) for j in range(8))
        repo.insert_node(conn, "n00", pool_id, (), atoms)
        repo.insert_node(conn, "n01", pool_id, (), atoms)

        rsv = reservation("rsv_0001", 2, pool_id, gpus=4)
        repo.insert_reservation(conn, rsv, "{}")
        repo.insert_allocation(conn, rsv, "n00", (2, 3, 6, 7), WINDOW)
        repo.move_node(conn, "n00", pool_id, (), atoms[:4])
        assert _sizes(conn) == [("n00", 4, 4), ("n01", 8, 8)]
        for need in (1, 2, 3):
            args = {"need": need, "whole_node": False}
            plain = repo.fit_candidates(conn, pool_id, WINDOW, ignore_reservation=None, **args)
            fast = fitting.fit_candidates(conn, pool_id, WINDOW, ignore_reservation=None, **args)
            assert fast == plain
        rows = fitting.usable_after(
            conn, pool_id, WINDOW, ignore_reservation=None, after="", limit=10
        )
        assert rows == [("n00", 4, 4, 2), ("n01", 8, 8, 0)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "move", "health"]),
            st.integers(0, 3),
            st.integers(0, 8),
            st.booleans(),
        ),
        max_size=12,
    )
)
def test_node_sizes_follow_every_inventory_and_health_change(
    ops: list[tuple[str, int, int, bool]],
) -> None:
    """Migration 10's triggers: after any sequence of node inserts, inventory updates (grow,
    shrink, move to another pool) and GPU health changes, each node row's counts are its GPU
    rows' counts."""
    db, pool_id = ledger()
    with rolled_back(db):
        conn = db.conn
        other = repo.insert_pool(conn, "q", ())
        made: set[str] = set()
        for op, node, count, flag in ops:
            name = f"s{node}"
            atoms = tuple(Atom(j, "h100", 0, None, None) for j in range(count))
            if name not in made:
                repo.insert_node(conn, name, pool_id, (), atoms)
                made.add(name)
            elif op == "move":
                repo.move_node(conn, name, other if flag else pool_id, (), atoms)
            elif op == "health":
                repo.set_atom_health(conn, name, count, flag, None if flag else "xid-79")
            assert _sizes(conn) == _counted(conn)


@pytest.mark.sqlite_only(reason="EXPLAIN QUERY PLAN is SQLite's")
def test_fitting_reads_use_their_indexes() -> None:
    """The bound-order query reads the window's bookings and the nodes' sizes from covering
    indexes (no GPU row, no table row); the name-order reading walks the nodes by name and
    counts each one's bookings through the node's own index."""
    db, pool_id = ledger()
    window = Window(T0, T0 + 8 * H)
    params = {
        "pool": pool_id,
        "from": window.start,
        "to": window.end,
        "bound": window.end + H,
        "ignore": None,
        "need": 4,
        "whole": 0,
        "least": 4,
        "after": "",
        "limit": 8,
    }
    conn = db.conn

    def plan(sql: str) -> list[str]:
        return [str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]

    fit = plan(fitting.FIT_CANDIDATES_SQL + "LIMIT 64")
    assert any("COVERING INDEX bookings_window (pool_id=? AND end>? AND end<?)" in s for s in fit)
    assert any("COVERING INDEX nodes_fit (pool_id=?)" in s for s in fit), fit
    assert not any(s.startswith("SCAN") for s in fit), fit
    named = plan(fitting.NAME_ORDER_SQL)
    assert any("COVERING INDEX nodes_fit (pool_id=? AND name>?)" in s for s in named), named
    assert any("bookings_node_window (node_id=? AND end>? AND end<?)" in s for s in named), named
    assert not any(s.startswith("SCAN") for s in named), named
