"""Issue 8, replay (migration 12): indexes hold only the rows their queries can ask for.

A row that fails a partial index's WHERE has no entry in it, so writing the row never touches
that index: a reservation without a name, a series, a preemption deadline or a retry due, or one
released, costs no page in those indexes. That only pays if every query the index serves still
uses it (SQLite and PostgreSQL use a partial index only when the query implies its WHERE), so
each is checked here by its plan on both backends, and the entries are counted on SQLite.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pgtest
import pytest
from conftest import HOUR, NOW_MS, Cli, at

from better_compute.model import ReleaseReason, Reservation, State
from better_compute.storage import budgets, calendar, fleet, listing, repo, tickwork
from better_compute.storage.conn import Conn, Ledger
from better_compute.storage.db import open_ledger


@pytest.fixture
def ledger(solo: Cli) -> Iterator[Ledger]:
    """`solo` holding one reservation of each kind: named and active, placed for later,
    released, and pending (it does not fit beside the others)."""
    solo.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "2h", "--key", "a")
    solo.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--name", "train")
    later = solo.ok(
        "reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--start", at(5 * HOUR)
    )
    gone = solo.ok("reserve", "--tenant", "globex", "--gpus", "2", "--for", "1h", "--key", "g")
    solo.ok("cancel", gone["id"])
    solo.ok("reserve", "--tenant", "globex", "--gpus", "6", "--for", "3h", "--key", "w")
    solo.ok("tick")
    assert later["state"] == "placed"
    opened = open_ledger(pgtest.ledger(str(solo.db)))
    yield opened
    opened.close()


def _plan(ledger: Ledger, sql: str, args: Any) -> str:
    """The plan of one statement, as text: SQLite's EXPLAIN QUERY PLAN, or PostgreSQL's EXPLAIN
    with sequential scans priced out (a tiny table is otherwise read whole whatever its
    indexes: the question is whether the index can serve the query at all)."""
    conn = ledger.conn
    if pgtest.active():
        conn.execute("SET enable_seqscan = off")
        return "\n".join(str(r[0]) for r in conn.execute("EXPLAIN " + sql, args))
    return "\n".join(str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))


def _statements(
    ledger: Ledger, call: Callable[[], object], kind: str = "SELECT"
) -> list[tuple[str, Any]]:
    """The statements `call` runs on the ledger's connection that begin with `kind` (the
    SELECTs by default), with their arguments."""
    seen: list[tuple[str, Any]] = []
    cls = type(ledger.conn)
    if pgtest.active():
        plain = cls.execute

        def recording(self: Any, sql: str, parameters: Any = None, /) -> Any:
            seen.append((sql, parameters or ()))
            return plain(self, sql, parameters)

        cls.execute = recording
        try:
            call()
        finally:
            cls.execute = plain
    else:
        # SQLite's trace gives the statement with its arguments written in.
        texts: list[str] = []
        ledger.conn.set_trace_callback(texts.append)
        try:
            call()
        finally:
            ledger.conn.set_trace_callback(None)
        seen = [(t, ()) for t in texts]
    return [(s, a) for s, a in seen if s.lstrip().upper().startswith(kind)]


#: The indexes led by the state, each holding every live row: any of them serves a read by state.
BY_STATE = ("reservations_state", "reservations_starts", "reservations_ends")


def _uses(ledger: Ledger, call: Callable[[], object], *indexes: str) -> None:
    """The first statement `call` runs reads one of `indexes`."""
    sql, args = _statements(ledger, call)[0]
    plan = _plan(ledger, sql, args)
    assert any(index in plan for index in indexes), f"{sql}\n{plan}"
    assert "Seq Scan on reservations" not in plan, plan


def test_every_query_of_a_partial_index_still_uses_it(ledger: Ledger) -> None:
    conn = ledger.conn
    pool = str(repo.pool_rows(conn)[0]["id"])
    with ledger.read():
        _uses(ledger, lambda: _listed(conn, listing.Query(name="train")), "_name")
        _uses(ledger, lambda: calendar.series_members(conn, "ser_x"), "reservations_series")
        _uses(ledger, lambda: repo.held_charge(conn, "acme", pool), "reservations_charge")
        _uses(ledger, lambda: repo.held_charge(conn, "acme", ""), "reservations_charge")
        wants = budgets.pending_wants
        for ignore in (None, "rsv_x"):
            _uses(ledger, lambda i=ignore: wants(conn, "acme", pool, i), "reservations_charge")
            _uses(ledger, lambda i=ignore: wants(conn, "acme", "", i), "reservations_charge")
        for state in State:
            if state != State.RELEASED:
                _uses(ledger, lambda s=state: repo.reservations_in(conn, s), *BY_STATE)
                _uses(ledger, lambda s=state: tickwork.ids_in_state(conn, s), *BY_STATE)
        _uses(ledger, lambda: repo.pending_created_by(conn, NOW_MS), *BY_STATE)
        # PostgreSQL may price another index lower on so few rows: these two it must only not
        # read whole (SQLite's choice is checked, and tests/test_replay_queries.py has more).
        due = ("Index",) if pgtest.active() else ("reservations_retries",)
        _uses(ledger, lambda: repo.pending_due(conn, NOW_MS), *due)
        due = ("Index",) if pgtest.active() else ("reservations_deadlines",)
        _uses(ledger, lambda: repo.reservations_ending(conn, NOW_MS), *due)
        active = listing.Query(states=("active", "binding"))
        _uses(ledger, lambda: _listed(conn, active), *BY_STATE)
        where, args = listing.selected(listing.Query(states=("active",)), NOW_MS)
        plan = _plan(ledger, f"SELECT id FROM reservations WHERE {where}", args)
        assert any(index in plan for index in BY_STATE), plan
        # The joins from a node's allocations read no reservation but those they name.
        for call in (
            lambda: repo.live_gang_keys(conn, "n1"),
            lambda: repo.node_assignment_rows(conn, "n1"),
        ):
            sql, args = _statements(ledger, call)[0]
            plan = _plan(ledger, sql, args)
            assert "SCAN r\n" not in plan + "\n" and "Seq Scan on reservations" not in plan, plan
        # A node's live gangs and lease start from the node's bookings, not from every live
        # reservation through the state index (0.15 s a node on the big pool: an inventory
        # import relabelling the fleet took 10 minutes).
        for call in (
            lambda: repo.live_gang_keys(conn, "n1"),
            lambda: repo.live_lease_on(conn, "n1"),
        ):
            sql, args = _statements(ledger, call)[0]
            plan = _plan(ledger, sql, args)
            if not pgtest.active():
                assert "(node_id=?)" in plan and "(state=?)" not in plan, plan


def test_the_answers_are_those_of_every_row(ledger: Ledger) -> None:
    """`list --state released` reads no index of live rows, and still finds the released."""
    conn = ledger.conn
    with ledger.read():
        released = _listed(conn, listing.Query(states=("released",)))
        assert [r.idempotency_key for r in released] == ["g"]
        both = _listed(conn, listing.Query(states=("released", "pending")))
        assert {r.idempotency_key for r in both} == {"g", "w"}
        assert [r.name for r in _listed(conn, listing.Query(name="train"))] == ["train"]
        assert {r.state for r in repo.reservations_in(conn, State.RELEASED)} == {State.RELEASED}
        assert tickwork.ids_in_state(conn, "released") == [r.id for r in released]


def _listed(conn: Conn, q: listing.Query) -> list[Reservation]:
    """`list`'s reservations for `q`, every page."""
    return [rsv for page in fleet.reservation_pages(conn, q, NOW_MS) for rsv in page]


def _read(path: Path, sql: str, args: tuple[object, ...] = ()) -> list[Any]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.execute(sql, args))
    finally:
        conn.close()


def _entries(path: Path, index: str) -> int:
    sql = "SELECT SUM(ncell) FROM dbstat WHERE name = ? AND pagetype = 'leaf'"
    return int(_read(path, sql, (index,))[0][0] or 0)


@pytest.mark.sqlite_only(reason="counts index entries with SQLite's dbstat table")
def test_the_indexes_hold_only_the_rows_their_queries_ask_for(ledger: Ledger, solo: Cli) -> None:
    ledger.close()
    states = dict(_read(solo.db, "SELECT state, COUNT(*) FROM reservations GROUP BY state"))
    assert states == {"active": 2, "placed": 1, "released": 1, "pending": 1}, states
    assert _entries(solo.db, "reservations_name") == 1
    assert _entries(solo.db, "reservations_series") == 0
    assert _entries(solo.db, "reservations_deadlines") == 0
    assert _entries(solo.db, "reservations_retries") == 1  # the pending one's retry
    assert _entries(solo.db, "reservations_state") == 4  # every row but the released one
    assert _entries(solo.db, "reservations_charge") == 4


def test_a_state_move_leaves_the_quota_summary_alone(ledger: Ledger) -> None:
    """placed -> binding -> active holds the same charge: the summary's triggers write nothing
    (they took the charge off and added it back), and it still agrees with the reservations."""
    conn = ledger.conn
    with ledger.write():
        (placed,) = repo.reservations_in(conn, State.PLACED)
        before = list(conn.execute("SELECT tenant_id, pool_id, held FROM held_charges"))
        if not pgtest.active():
            changes = ledger.conn.total_changes
        tickwork.set_state(conn, placed.id, State.BINDING)
        tickwork.set_state(conn, placed.id, State.ACTIVE)
        if not pgtest.active():  # trigger writes count too: only the two rows' own
            assert ledger.conn.total_changes - changes == 2
        after = list(conn.execute("SELECT tenant_id, pool_id, held FROM held_charges"))
        assert [tuple(r) for r in after] == [tuple(r) for r in before]
        tickwork.mark_released(conn, placed.id, ReleaseReason.CANCELLED, None)
        held = dict(
            ((str(t), str(p)), int(h))
            for t, p, h in conn.execute("SELECT tenant_id, pool_id, held FROM held_charges")
        )
        summed = dict(
            ((str(t), str(p)), int(h))
            for t, p, h in conn.execute(
                "SELECT tenant_id, pool_id, SUM(quota_charge) FROM reservations"
                " WHERE state <> 'released' GROUP BY tenant_id, pool_id"
            )
        )
        assert {k: v for k, v in held.items() if v} == summed
