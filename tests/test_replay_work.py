"""Issue 8, replay: what a replay's ticks skip is work that provably is not there.

A tick of `simulate` looks for expiring notices only where something can have changed since its
last look, asks in one statement whether steps 1 and 2 have anything to read, and hands what
step 3 read on to steps 4 to 6. These tests replay a contended workload (waits, retries,
time-outs, preemption, calendar starts, gangs, notices at once and later) twice on copies of one
ledger, once with those shortcuts turned off, and require the same ledger row for row; and they
check that another process's commit makes the next tick look everywhere again.
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import ME
from test_fleet_memory import ENTRY, HOUR, T0, _node

from better_compute.inventory import parse_inventory
from better_compute.lifecycle.tick import due_release
from better_compute.model import Principal, Window
from better_compute.service import booking, setup, simulate, ticking
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.service.fleet import Fleet
from better_compute.storage import repo, tickwork, webhooks
from better_compute.storage.db import Database, open_database

MIN = 60_000
#: Tables whose rows a replay writes (or must leave alone), compared row for row.
TABLES = (
    "reservations",
    "allocations",
    "bookings",
    "events",
    "notices",
    "usage",
    "held_charges",
    "atom_bookings",
    "meta",
)


def _ledger(path: Path) -> Database:
    """Pool p: four 8-GPU nodes; tenant acme; requests wait at most 25 minutes."""
    db = setup.init(str(path), T0, force=True, manual=True, admin=ME, group=None)[0]
    doc = {
        "pools": [{"name": "p", "nodes": [_node(f"n{i}") for i in range(4)]}],
        "tenants": [{"id": "acme"}],
    }
    setup.inventory_import(Ctx(db, T0), parse_inventory(doc))
    setup.config_set(Ctx(db, T0), "pending.maxWaitMs", str(25 * MIN))
    return db


def _workload(path: Path, count: int = 90, seed: int = 3) -> Path:
    """More demand than the pool holds over three hours on a 30 s grid: short work (an expiring
    notice as soon as it runs), long work (a notice later), spot work, calendar starts, gangs."""
    rng = random.Random(seed)
    lines = []
    for n in range(count):
        at = T0 + rng.randrange(0, 360) * 30_000
        line: dict[str, Any] = {
            "at": at,
            "tenant": rng.choice(["acme", "globex"]),
            "gpus": rng.choice([1, 2, 4, 4, 8]),
            "duration": rng.choice([5, 20, 39, 41, 60, 90, 150]) * MIN,
        }
        if rng.random() < 0.35:
            line["spot"] = True
        if rng.random() < 0.2:
            line["start"] = at + rng.randrange(1, 90) * 30_000
        if n % 11 == 5:
            line.update(gang=2, gpus=4, spot=False)
        lines.append(line)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _replay(path: Path, workload: Path) -> dict[str, Any]:
    db = open_database(str(path))
    try:
        ctx = Ctx(db, T0, who=Principal(ME, admin=True))
        report = simulate.simulate(ctx, str(workload), "jsonl", Fraction(1))
    finally:
        db.close()
    machine = ("wall_seconds", "requests_per_second")
    return {k: v for k, v in vars(report).items() if k not in machine}


def _rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(path)
    try:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in TABLES}
    finally:
        conn.close()


def _release_in_full(ctx: Ctx) -> None:
    """Step 1 as it was before the narrow release: whole reservations, booking.finish."""
    for rsv in repo.reservations_ending(ctx.db.conn, ctx.now):
        reason = due_release(rsv, ctx.now)
        if reason is not None and rsv.during is not None:
            booking.finish(ctx, rsv, reason, min(rsv.during.end, ctx.now))


def _plain(mp: pytest.MonkeyPatch) -> None:
    """The shortcuts off: every tick reads steps 1 to 5 and every expiring notice in full,
    releases through booking.finish, saves every move with repo.save_reservation and reads
    every node's reachability and every binding row again in step 5."""
    mp.setattr(tickwork, "due_first", lambda *a: tickwork.Due(True, True, True, True, True))
    mp.setattr(ticking, "_release_due", _release_in_full)
    mp.setattr(ticking, "_save_move", lambda ctx, rsv: repo.save_reservation(ctx.db.conn, rsv))
    bind = ticking._bind
    mp.setattr(
        ticking, "_bind", lambda ctx, moved, _known, **_kw: bind(ctx, moved, {}, others=True)
    )

    def everywhere(
        conn: Any, now: int, by: int, _t: int, _s: int, states: Any
    ) -> tuple[list[str], int]:
        return webhooks.ending_between(conn, now, by, states), repo.last_event_seq(conn)

    mp.setattr(tickwork, "expiring_since", everywhere)


@pytest.mark.sqlite_only(reason="copies the ledger file and compares its rows")
def test_a_replay_with_its_shortcuts_writes_what_one_without_them_writes(db_dir: Path) -> None:
    first = db_dir / "fast.db"
    _ledger(first).close()
    second = db_dir / "plain.db"
    conn = sqlite3.connect(first)
    conn.execute("VACUUM INTO ?", (str(second),))
    conn.close()
    workload = _workload(db_dir / "w.jsonl")
    looks: list[int] = []
    real = tickwork.expiring_since

    def counted(*args: Any) -> tuple[list[str], int]:
        found, seen = real(*args)
        looks.append(len(found))
        return found, seen

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tickwork, "expiring_since", counted)
        fast = _replay(first, workload)
    with pytest.MonkeyPatch.context() as mp:
        _plain(mp)
        plain = _replay(second, workload)
    assert fast == plain
    assert _rows(first) == _rows(second)
    # The workload reached every kind of work the shortcuts could drop.
    types = [row[1] for row in _rows(first)["events"]]
    for kind in ("expiring", "starting", "pending", "preempting", "released"):
        assert f"reservation.{kind}" in types, kind
    reasons = {json.loads(row[5]).get("reason") for row in _rows(first)["events"]}
    assert {"expired", "timeout"} <= reasons
    assert fast["placed_after_waiting"] > 0
    assert sum(looks) > 0  # notices were found through the narrowed look


def _tick(db: Database, at: int, fleet: Fleet) -> None:
    ticking.tick(Ctx(db, at, fleet=fleet), shown=False)


@pytest.mark.sqlite_only(reason="PostgreSQL has no data_version: every tick looks everywhere")
def test_a_commit_by_another_process_makes_the_next_tick_look_everywhere(db_dir: Path) -> None:
    path = db_dir / "look.db"
    db = _ledger(path)
    fleet = Fleet()
    args = ReserveArgs("acme", None, 1, HOUR)
    booking.reserve(Ctx(db, T0, who=Principal(ME, admin=True), fleet=fleet), args)
    full: list[int] = []
    real = webhooks.ending_between

    def spying(*a: Any) -> list[str]:
        full.append(1)
        return real(*a)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(webhooks, "ending_between", spying)
        _tick(db, T0, fleet)  # no look yet: everywhere
        assert fleet.looked is not None and len(full) == 1
        _tick(db, T0 + MIN, fleet)  # nothing else committed: only what changed
        assert len(full) == 1
        cordon = ["--db", str(path), "node", "cordon", "n3", "--reason", "x"]
        done = subprocess.run([*ENTRY, *cordon], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        _tick(db, T0 + 2 * MIN, fleet)
        assert len(full) == 2
    # The reservation ends at T0 + 1h: its notice came at T0 + 20 minutes, once.
    _tick(db, T0 + 20 * MIN, fleet)
    _tick(db, T0 + 21 * MIN, fleet)
    given = db.conn.execute("SELECT at FROM events WHERE type = 'reservation.expiring'").fetchall()
    assert [r[0] for r in given] == [T0 + 20 * MIN]
    db.close()


def test_the_tick_tells_notices_what_step_3_read(db_dir: Path) -> None:
    """A calendar reservation inside its lead window gets `reservation.starting` at the tick
    that checks it, from the list step 3 hands on (no read of its own)."""
    db = _ledger(db_dir / "start.db")
    fleet = Fleet()
    args = ReserveArgs("acme", None, 2, HOUR, start=T0 + 60 * MIN)
    booking.reserve(Ctx(db, T0, who=Principal(ME, admin=True), fleet=fleet), args)
    _tick(db, T0 + 50 * MIN, fleet)  # repair.leadMs is 15 minutes: the lead check is due
    rows = db.conn.execute("SELECT type, at FROM events WHERE type LIKE 'reservation.%'")
    assert ("reservation.starting", T0 + 50 * MIN) in [tuple(r) for r in rows]
    _tick(db, T0 + 60 * MIN, fleet)
    state = db.conn.execute("SELECT state FROM reservations").fetchone()[0]
    assert state == "active"
    db.close()


@pytest.mark.sqlite_only(reason="EXPLAIN QUERY PLAN is SQLite's")
def test_the_narrowed_notice_look_is_one_statement_of_seeks(db_dir: Path) -> None:
    """EXPLAIN QUERY PLAN of the look, one statement: a range of the ends index; and the newest
    events by their primary key, with their reservations by id (never the whole range of ends)."""
    db = _ledger(db_dir / "plan.db")
    statements: list[str] = []
    db.conn.set_trace_callback(statements.append)
    tickwork.expiring_since(db.conn, T0, T0 + HOUR, T0 + MIN, 0, ["binding", "active"])
    db.conn.execute("INSERT INTO events(type, at, reservation_id) VALUES ('x', 1, 'r1')")
    newest = repo.last_event_seq(db.conn)
    _, seen = tickwork.expiring_since(db.conn, T0, T0 + HOUR, T0 + MIN, 0, ["binding", "active"])
    db.conn.set_trace_callback(None)
    assert seen == newest  # the next look starts after the newest event this one read
    again = tickwork.expiring_since(db.conn, T0, T0 + HOUR, T0 + MIN, newest, ["active"])
    assert again[1] == newest
    plans = [
        " | ".join(str(r[3]) for r in db.conn.execute("EXPLAIN QUERY PLAN " + sql))
        for sql in statements[-1:]
    ]
    first, second = plans[0].split("UNION ALL")
    assert "reservations_ends (state=? AND during_end>? AND during_end<?)" in first, first
    assert "USING INTEGER PRIMARY KEY (rowid>?)" in second, second
    assert "sqlite_autoindex_reservations_1 (id=?)" in second, second
    assert "reservations_ends" not in second
    db.close()


def test_binding_takes_the_reachability_step_3_read(db_dir: Path) -> None:
    """A node lease is not judged once it has started, yet step 3 reads its node at the start:
    step 5 reuses that read, and an unreachable node is not bound (the lease stays binding)."""
    db = _ledger(db_dir / "reach.db")
    fleet = Fleet()
    args = ReserveArgs("acme", None, None, HOUR, start=T0 + 60 * MIN, node_lease=True)
    rsv = booking.reserve(Ctx(db, T0, who=Principal(ME, admin=True), fleet=fleet), args)
    _tick(db, T0 + 50 * MIN, fleet)  # the lead check passes
    node = rsv.allocations[0].node_id
    with db.write() as conn:
        repo.update_node(conn, node, reachable=0)
    seen: list[str] = []
    real = tickwork.reachable

    def spying(conn: Any, names: Any) -> dict[str, bool]:
        seen.extend(names)
        return real(conn, names)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tickwork, "reachable", spying)
        _tick(db, T0 + 60 * MIN, Fleet())
    assert seen == []  # step 3 read it already
    row = db.conn.execute("SELECT state FROM reservations").fetchone()
    bound = db.conn.execute("SELECT bound FROM allocations").fetchone()
    assert (row[0], bound[0]) == ("binding", 0)
    db.close()


@pytest.mark.sqlite_only(reason="EXPLAIN QUERY PLAN is SQLite's")
def test_the_queries_of_what_is_due_keep_their_partial_indexes(db_dir: Path) -> None:
    """The indexes of what is due hold no released row (migration 11); SQLite uses them only
    for a query that says `state <> 'released'`, on each side of an OR. Without it a query
    still SEARCHes, through (state=?) alone: every live row."""
    db = _ledger(db_dir / "partial.db")
    statements: list[str] = []
    db.conn.set_trace_callback(statements.append)
    tickwork.endings_due(db.conn, T0)
    tickwork.due_first(db.conn, T0, T0, T0)
    repo.pending_due(db.conn, T0)
    repo.placed_starting_by(db.conn, T0)
    repo.placed_on_node_during(db.conn, "n0", Window(T0, T0 + HOUR))
    db.conn.set_trace_callback(None)
    plans = [
        " | ".join(str(r[3]) for r in db.conn.execute("EXPLAIN QUERY PLAN " + sql))
        for sql in statements
        if sql.startswith("SELECT")
    ]
    ending, first, pending, starting, on_node = plans
    assert "reservations_ends (state=? AND during_end<?)" in ending, ending
    assert "reservations_deadlines (state=? AND preempt_deadline<?)" in ending, ending
    for index in ("ends", "deadlines", "retries (state=? AND next_attempt_at<?)", "starts"):
        assert f"reservations_{index}" in first, first
    assert "reservations_retries (state=? AND next_attempt_at<?)" in pending, pending
    assert "reservations_starts (state=? AND during_start<?)" in starting, starting
    assert "reservations_starts (state=? AND during_start<?)" in on_node, on_node
    index_sql = db.conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'reservations_ends'"
    ).fetchone()[0]
    assert "WHERE state <> 'released'" in index_sql
    db.close()


@pytest.mark.sqlite_only(reason="copies the ledger file and compares its rows")
@pytest.mark.parametrize("start_min", [0, 50], ids=["started", "not-started"])
def test_a_release_at_a_deadline_inside_the_window_writes_what_finish_writes(
    db_dir: Path, start_min: int
) -> None:
    """A deadline before the end (set directly: the product cuts the window when it sets one)
    makes step 1 cut the window back to the tick that finds it, or drop it when it had not
    begun; the narrow release writes the same rows as booking.finish."""
    first = db_dir / "fast.db"
    db = _ledger(first)
    args = ReserveArgs("acme", None, 2, HOUR, start=T0 + start_min * MIN if start_min else None)
    booking.reserve(Ctx(db, T0, who=Principal(ME, admin=True)), args)
    ticking.tick(Ctx(db, T0), shown=False)
    with db.write() as conn:
        conn.execute("UPDATE reservations SET preempt_deadline = ?", (T0 + 30 * MIN,))
    db.close()
    second = db_dir / "plain.db"
    conn = sqlite3.connect(first)
    conn.execute("VACUUM INTO ?", (str(second),))
    conn.close()
    for path, plain in ((first, False), (second, True)):
        with pytest.MonkeyPatch.context() as mp:
            if plain:
                _plain(mp)
            db = open_database(str(path))
            ticking.tick(Ctx(db, T0 + 40 * MIN), shown=False)
            db.close()
    rows = _rows(first)
    assert rows == _rows(second)
    window = (
        sqlite3.connect(first)
        .execute("SELECT state, release_reason, during_start, during_end FROM reservations")
        .fetchone()
    )
    kept = (T0, T0 + 40 * MIN) if start_min == 0 else (None, None)  # cut back to the tick
    assert window == ("released", "preempted", *kept)
