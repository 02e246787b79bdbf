"""Issue 8 item 3: a share's candidates from the nodes' free-GPU levels (storage/fitlevels.py,
migration 15) are fitting's query's rows, in its order, whatever was written or how much time
passed since the levels were made; the triggers make a node stale on every write that could
change its levels; and the level reads stay on their indexes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pgtest
import pytest
from conftest import HOUR, NOW_MS, Cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_shortlist import (
    T0,
    BookingSpec,
    NodeSpec,
    bookings,
    ledger,
    nodes,
    reservation,
    rolled_back,
    write_world,
)
from test_shortlist import Ask as ShortlistAsk

from better_compute.model import Atom, State, Window
from better_compute.storage import fitlevels, fitting, repo
from better_compute.storage.db import open_ledger
from better_compute.storage.repo import Conn

H = 3_600_000
NO_ASK = ShortlistAsk(1, False, (), None, None, None, frozenset(), 1)


def _levels(conn: Conn, pool_id: str, window: Window, need: int, limit: int | None) -> object:
    params = repo.window_params(conn, pool_id, window, None)
    return fitlevels.candidates(
        conn, pool_id, window, params, fitting._RECOUNTS, need=need, limit=limit
    )


def _plain(conn: Conn, pool_id: str, window: Window, need: int) -> list[tuple[str, int, int]]:
    return repo.fit_candidates(
        conn, pool_id, window, ignore_reservation=None, need=need, whole_node=False
    )


def _stale(conn: Conn) -> list[str]:
    rows = conn.execute("SELECT node_id FROM fit_nodes WHERE valid_until = 0 ORDER BY node_id")
    return [str(r[0]) for r in rows]


asks = st.tuples(
    st.integers(0, 80),  # window start, hours after the last refresh
    st.sampled_from([1, 5, 10, 30, 31, 60]),  # hours
    st.integers(1, 8),  # GPUs
    st.sampled_from([None, 1, 2, 3, 6]),  # limit
)


@st.composite
def histories(
    draw: st.DrawFn,
) -> tuple[list[NodeSpec], list[BookingSpec], int, list[BookingSpec], int, list[object]]:
    fleet = [draw(nodes(i)) for i in range(draw(st.integers(1, 12)))]
    held = draw(bookings(fleet))
    at = draw(st.sampled_from([0, 40, 90, 99, 100, 105, 129, 130]))
    later = draw(bookings(fleet))[:3]
    passed = draw(st.sampled_from([0, 0, 1, 10, 30, 60]))
    return fleet, held, at, later, passed, draw(st.lists(asks, min_size=1, max_size=5))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.booleans(), st.booleans())
def test_the_levels_answer_as_fittings_query(
    history: tuple[list[NodeSpec], list[BookingSpec], int, list[BookingSpec], int, list[object]],
    refresh_again: bool,
    sick: bool,
) -> None:
    """Levels made at `at`; then bookings written and time passed (stale nodes, counted from
    their bookings), a GPU gone unhealthy, and maybe a second refresh: every window asked from
    the last refresh on gets fitting's rows, and the first `limit` of them."""
    fleet, held, at, later, passed, windows = history
    db, pool_id = ledger()
    with rolled_back(db):
        conn = db.conn
        write_world(db, pool_id, fleet, held, NO_ASK)
        made = T0 + at * H
        fitlevels.refresh(conn, pool_id, made)
        assert _stale(conn) == []
        for k, b in enumerate(later):
            rsv = reservation(f"rsv_late{k}", 100 + k, pool_id, state=State.PLACED)
            repo.insert_reservation(conn, rsv, "{}")
            window = Window(made + b.start * H, made + (b.start + b.hours) * H)
            repo.insert_allocation(conn, rsv, fleet[b.node].name, b.atoms, window)
        if sick and fleet[0].atoms:
            repo.set_atom_health(conn, fleet[0].name, 0, False, "xid-79")
        now = made + passed * H
        if refresh_again:
            fitlevels.refresh(conn, pool_id, now)
            assert _stale(conn) == []
        for start, hours, need, limit in windows:  # type: ignore[misc]
            window = Window(now + start * H, now + (start + hours) * H)
            fast = _levels(conn, pool_id, window, need, limit)
            assert fast is not None  # never more than MOST_COUNTED to count here
            plain = _plain(conn, pool_id, window, need)
            assert fast == (plain if limit is None else plain[:limit])
            through = fitting.fit_candidates(
                conn,
                pool_id,
                window,
                ignore_reservation=None,
                need=need,
                whole_node=False,
                limit=limit,
            )
            assert through == fast


def test_node_levels_steps() -> None:
    """Four GPUs: two busy from 5 to 9, one from 20, one never; now 0. Ends up to 5 leave all
    four free; up to 20, two; after 20, one. Valid until the first start after now (5)."""
    valid, levels = fitlevels.node_levels(4, [(0, 5, 9), (1, 5, 9), (2, 20, 30)], 0)
    never, always = fitlevels.FIT_NEVER, fitlevels.FIT_ALWAYS
    assert valid == 5
    assert levels == [(1, 20, never), (2, 5, 20), (4, always, 5)]
    # Busy now (started before now): its level of all four ends by now, so it is left out.
    valid, levels = fitlevels.node_levels(2, [(0, -5, 9), (5, 0, 3)], 0)
    assert valid == 3  # the booking on a GPU the node lost still bounds validity
    assert levels == [(1, -5, never)]


def _two_nodes(conn: Conn, pool_id: str) -> None:
    atoms = tuple(Atom(j, "h100", j // 4, "c1", 1) for j in range(8))
    repo.insert_node(conn, "n00", pool_id, (), atoms)
    repo.insert_node(conn, "n01", pool_id, (), atoms)


def test_every_write_to_a_nodes_bookings_or_size_makes_it_stale() -> None:
    db, pool_id = ledger()
    with rolled_back(db):
        conn = db.conn
        _two_nodes(conn, pool_id)
        assert _stale(conn) == ["n00", "n01"]  # new nodes: no levels yet
        fitlevels.refresh(conn, pool_id, T0)
        assert _stale(conn) == []
        assert conn.execute("SELECT COUNT(*) FROM fit_levels").fetchone()[0] == 2

        rsv = reservation("rsv_0001", 2, pool_id, gpus=4, state=State.PLACED)
        repo.insert_reservation(conn, rsv, "{}")
        repo.insert_allocation(conn, rsv, "n00", (0, 1, 2, 3), Window(T0 + H, T0 + 2 * H))
        assert _stale(conn) == ["n00"]
        assert (
            conn.execute("SELECT COUNT(*) FROM fit_levels WHERE node_id = 'n00'").fetchone()[0] == 0
        )
        fitlevels.refresh(conn, pool_id, T0)
        conn.execute('UPDATE bookings SET "end" = ? WHERE node_id = ?', (T0 + 3 * H, "n00"))
        assert _stale(conn) == ["n00"]
        fitlevels.refresh(conn, pool_id, T0)
        conn.execute("DELETE FROM bookings WHERE node_id = ?", ("n00",))
        assert _stale(conn) == ["n00"]
        fitlevels.refresh(conn, pool_id, T0)
        repo.set_atom_health(conn, "n01", 3, False, "xid-79")
        assert _stale(conn) == ["n01"]
        fitlevels.refresh(conn, pool_id, T0)
        # An unhealthy GPU: the node is counted from its bookings, so it keeps no levels, and
        # is not refreshed again until a write makes it stale.
        assert fitlevels.refresh(conn, pool_id, T0) == 0
        assert (
            conn.execute("SELECT COUNT(*) FROM fit_levels WHERE node_id = 'n01'").fetchone()[0] == 0
        )
        repo.move_node(
            conn, "n00", pool_id, (), tuple(Atom(j, "h100", 0, "c1", 1) for j in range(4))
        )
        assert _stale(conn) == ["n00"]
        repo.insert_node(conn, "n02", pool_id, (), ())
        assert _stale(conn) == ["n00", "n02"]
        conn.execute("DELETE FROM nodes WHERE name = 'n02'")
        assert [r[0] for r in conn.execute("SELECT node_id FROM fit_nodes ORDER BY 1")] == [
            "n00",
            "n01",
        ]


def test_a_window_before_the_refresh_asks_fittings_query() -> None:
    """Levels hold from their refresh on: an earlier window (a what-if clock set back) is
    answered by fitting's count of every node."""
    db, pool_id = ledger()
    with rolled_back(db):
        conn = db.conn
        _two_nodes(conn, pool_id)
        fitlevels.refresh(conn, pool_id, T0 + 10 * H)
        assert _levels(conn, pool_id, Window(T0, T0 + H), 4, None) is None
        assert _levels(conn, pool_id, Window(T0 + 10 * H, T0 + 11 * H), 4, None) == [
            ("n00", 0, 8),
            ("n01", 0, 8),
        ]


def test_too_many_nodes_to_count_ask_fittings_query(monkeypatch: pytest.MonkeyPatch) -> None:
    db, pool_id = ledger()
    with rolled_back(db):
        conn = db.conn
        _two_nodes(conn, pool_id)
        window = Window(T0, T0 + H)
        monkeypatch.setattr(fitlevels, "MOST_COUNTED", 1)
        fitlevels.refresh(conn, pool_id, T0)
        assert _levels(conn, pool_id, window, 4, None) is not None
        conn.execute("UPDATE fit_nodes SET valid_until = 0")
        assert _levels(conn, pool_id, window, 4, None) is None


def test_level_reads_use_their_indexes() -> None:
    db, pool_id = ledger()
    with rolled_back(db):
        conn = db.conn
        _two_nodes(conn, pool_id)
        params = {
            **repo.window_params(conn, pool_id, Window(T0, T0 + H), None),
            "least": 4,
            "need": 4,
            "free": 4,
            "always": fitlevels.FIT_ALWAYS,
        }

        def plan(sql: str) -> list[str]:
            return [str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]

        step = plan(fitlevels._STEP_ROWS)
        assert any(
            "INDEX fit_levels_scan (pool_id=? AND free=? AND lo>? AND lo<?)" in s for s in step
        ), step
        free = plan(fitlevels._ALL_FREE_ROWS + "LIMIT 8")
        assert any("INDEX fit_levels_scan (pool_id=? AND free=? AND lo=?)" in s for s in free), free
        assert not any("TEMP B-TREE" in s for s in free), free  # name order from the index
        counted = plan(fitlevels._COUNTED_NAMES)
        assert any("fit_nodes_stale (pool_id=? AND valid_until<?)" in s for s in counted), counted
        for sql, index in (
            ("SELECT MAX(t0) FROM fit_nodes WHERE pool_id = :pool", "fit_nodes_t0"),
            ("SELECT MAX(gpus) FROM fit_nodes WHERE pool_id = :pool", "fit_nodes_gpus"),
        ):
            assert any(index in s for s in plan(sql)), plan(sql)


def test_a_placement_refreshes_its_pools_levels_and_its_booking_makes_its_node_stale(
    run: Cli,
) -> None:
    """`reserve` recomputes the pool's stale nodes in its transaction; the booking it writes
    then makes its own node stale (the next placement recomputes it), and `preview` answers the
    same with the levels as fitting's count does."""
    before = run.ok("preview", "--tenant", "acme", "--gpus", "2", "--for", "1h")
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h")
    ledger = open_ledger(pgtest.ledger(str(run.db)))
    try:
        with ledger.read() as conn:
            rows = conn.execute("SELECT node_id, valid_until FROM fit_nodes").fetchall()
            stale = sorted(str(n) for n, valid in rows if int(valid) == 0)
            pool = conn.execute(
                "SELECT pool_id FROM bookings WHERE reservation_id = ?", (rsv["id"],)
            ).fetchone()[0]
            placed = sorted({a["nodeId"] for a in rsv["allocations"]})
            fresh = conn.execute(
                "SELECT COUNT(*) FROM fit_nodes WHERE pool_id = ? AND valid_until != 0", (pool,)
            ).fetchone()[0]
    finally:
        ledger.close()
    assert stale == placed and fresh > 0
    assert before["fits"] is True


def test_windows_that_end_where_a_booking_starts_or_start_where_one_ends() -> None:
    """Edges, exactly: a window that ends when four GPUs' booking starts has all eight free; a
    millisecond longer, four (and two more are booked from 7 h). A window starting when a
    booking ends finds its GPUs free (the node is stale then, and counted)."""
    db, pool_id = ledger()
    with rolled_back(db):
        conn = db.conn
        _two_nodes(conn, pool_id)
        rsv = reservation("rsv_0001", 2, pool_id, gpus=4, state=State.PLACED)
        repo.insert_reservation(conn, rsv, "{}")
        repo.insert_allocation(conn, rsv, "n00", (0, 1, 2, 3), Window(T0 + 5 * H, T0 + 9 * H))
        later = reservation("rsv_0002", 3, pool_id, gpus=2, state=State.PLACED)
        repo.insert_reservation(conn, later, "{}")
        repo.insert_allocation(conn, later, "n00", (4, 5), Window(T0 + 7 * H, T0 + 9 * H))
        fitlevels.refresh(conn, pool_id, T0)
        for window, need in (
            (Window(T0, T0 + 7 * H), 2),  # n00 at its level of 2 free until 7 h, inclusive
            (Window(T0, T0 + 7 * H + 1), 2),
            (Window(T0, T0 + 5 * H), 8),
            (Window(T0, T0 + 5 * H + 1), 8),
            (Window(T0, T0 + 5 * H + 1), 4),
            (Window(T0, T0 + 5 * H), 4),
            (Window(T0 + H, T0 + 5 * H), 5),
            (Window(T0 + 9 * H, T0 + 10 * H), 8),
        ):
            for limit in (None, 1):
                plain = _plain(conn, pool_id, window, need)
                assert _levels(conn, pool_id, window, need, limit) == plain[:limit], (window, need)
        assert [r[0] for r in _plain(conn, pool_id, Window(T0, T0 + 5 * H), 8)] == ["n00", "n01"]
        assert [r[0] for r in _plain(conn, pool_id, Window(T0, T0 + 5 * H + 1), 8)] == ["n01"]


def test_tick_keeps_every_pools_levels_fresh(run: Cli) -> None:
    """A tick recomputes each pool's stale nodes, as placement does for its pool."""
    ledger = open_ledger(pgtest.ledger(str(run.db)))
    try:
        with ledger.write() as conn:
            conn.execute("UPDATE fit_nodes SET valid_until = 0")
            assert len(_stale(conn)) == conn.execute("SELECT COUNT(*) FROM fit_nodes").fetchone()[0]
    finally:
        ledger.close()
    run.ok("tick")
    ledger = open_ledger(pgtest.ledger(str(run.db)))
    try:
        with ledger.read() as conn:
            assert _stale(conn) == []
    finally:
        ledger.close()


def test_reserve_and_preview_are_answered_by_the_levels(
    monkeypatch: pytest.MonkeyPatch, run: Cli
) -> None:
    """The levels are not merely right but used: after a placement refreshed the pool, a
    reserve and a preview get their candidates from them, not from fitting's count (a review
    switched them off in fitting.py and every other test here still passed)."""
    answered: list[bool] = []
    real = fitlevels.candidates

    def spy(*args: Any, **kwargs: Any) -> Any:
        rows = real(*args, **kwargs)
        answered.append(rows is not None)
        return rows

    monkeypatch.setattr(fitlevels, "candidates", spy)
    ask = ["--tenant", "acme", "--gpus", "2", "--for", "1h"]
    run.ok("reserve", *ask)
    run.ok("reserve", *ask)
    run.ok("preview", *ask)
    assert len(answered) >= 3 and all(answered), answered


def test_simulate_until_leaves_the_levels_fresh_at_its_end(run: Cli, tmp_path: Path) -> None:
    """`simulate --until` leaves a live ledger for the commands that follow: its levels too,
    as of the instant it stopped (a review found every node stale, so the next placement paid
    for the whole fleet)."""
    workload = tmp_path / "w.jsonl"
    lines = [
        f'{{"at": {NOW_MS + k * HOUR}, "tenant": "acme", "gpus": 2, "duration": "5h"}}'
        for k in range(3)
    ]
    workload.write_text("\n".join(lines) + "\n")
    until = NOW_MS + 4 * HOUR
    run.ok("simulate", "--workload", workload, "--format", "jsonl", "--until", str(until), now=None)
    ledger = open_ledger(pgtest.ledger(str(run.db)))
    try:
        with ledger.read() as conn:
            assert _stale(conn) == []
            t0s = {
                int(r[0]) for r in conn.execute("SELECT t0 FROM fit_nodes WHERE valid_until > 0")
            }
            assert t0s == {until}
    finally:
        ledger.close()
