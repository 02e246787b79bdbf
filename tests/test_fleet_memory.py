"""Issue 8, replay: the fleet `simulate` keeps in memory answers exactly as SQL does, and notices
every change another process commits.

The first property builds random fleets and bookings (test_shortlist's worlds) in a real ledger
and compares engine/fleet.PoolIndex with the storage queries it stands in for: snapshots, the
shortlist's candidates (less the nodes whose models the request refuses), the pool's capacity,
and the plan placement makes from each.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pgtest
import pytest
from conftest import ME
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_shortlist import (
    WINDOW,
    Ask,
    BookingSpec,
    NodeSpec,
    asks,
    context,
    ledger,
    nodes,
    reservation,
    rolled_back,
    worlds,
    write_world,
)

from better_compute.engine import fleet as fleet_engine
from better_compute.engine import shortlist
from better_compute.inventory import parse_inventory
from better_compute.model import Principal, Reservation, State, Window
from better_compute.service import booking, placing, setup, simulate, ticking
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.service.fleet import Fleet
from better_compute.storage import fitting, repo
from better_compute.storage import fleet as fleet_store
from better_compute.storage import simulation as store
from better_compute.storage.conn import Ledger
from better_compute.storage.db import open_ledger


def _accepts(models: tuple[str, ...], node_models: set[str]) -> bool:
    accepted = {m.casefold() for m in models}
    return not models or {m.casefold() for m in node_models} <= accepted


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(worlds(), st.sampled_from([0, 0, 1, 29, 30, 31, 60, 100]), st.integers(0, 100))
def test_the_fleet_in_memory_answers_as_sql(
    world: tuple[list[NodeSpec], list[BookingSpec], Ask], lead_h: int, earlier_h: int
) -> None:
    fleet, held, ask = world
    db, pool_id = ledger()
    with rolled_back(db):
        subject = write_world(db, pool_id, fleet, held, ask)
        conn = db.conn
        request = subject.request(WINDOW)
        # Held from an instant before the window's start, then moved on to another one (what
        # ended by then is dropped; what began by then is filed in a bucket).
        horizon = WINDOW.start - lead_h * 3_600_000
        kept = Fleet()
        kept.index(conn, pool_id, horizon - earlier_h * 3_600_000)
        pool = kept.index(conn, pool_id, horizon)
        assert pool.covers(WINDOW)

        sql_snaps = repo.snapshots(conn, pool_id, WINDOW, ignore_reservation=subject.id)
        assert pool.snapshots(WINDOW, subject.id) == sql_snaps
        names = [s.node.name for s in sql_snaps][::2]
        assert pool.snapshots(WINDOW, subject.id, names) == repo.snapshots(
            conn, pool_id, WINDOW, ignore_reservation=subject.id, names=names
        )

        rows = repo.fit_candidates(
            conn,
            pool_id,
            WINDOW,
            ignore_reservation=subject.id,
            need=request.gpus or 0,
            whole_node=request.node_lease,
        )
        models = {s.name: {a.model for a in s.atoms} for s in fleet}
        expected = [
            (shortlist.best_key(request, shortlist.Candidate(*row)), row[0])
            for row in rows
            if _accepts(request.models, models[row[0]])
        ]
        assert list(pool.candidates(request, subject.id)) == expected

        share = ask.gpus or 1
        assert pool.capacity(subject.models, share) == repo.node_capacity(
            conn, pool_id, subject.models, share
        )
        assert pool.largest_nvlink_group(subject.models) == fleet_store.largest_nvlink_group(
            conn, pool_id, subject.models
        )
        for key in ("fabric.domain", "rack", "zone"):  # what a gang's admission counts
            assert pool.topology_values(key, subject.models, share) == fitting.topology_values(
                conn, pool_id, key, holding=(subject.models, share)
            )

        # And so placement plans the same from either.
        ctx = context(db, ask.top_n)
        from_sql = placing.plan(ctx, subject, WINDOW, ask.exclude)
        ctx.fleet = Fleet()
        ctx.now = horizon
        assert placing.plan(ctx, subject, WINDOW, ask.exclude) == from_sql


# ---------------------------------------------------------------- many bookings ahead

MINUTE = 60_000


@dataclass(frozen=True)
class Ahead:
    """A booking in minutes from T0 (so its edges fall anywhere in the index's hourly slots)."""

    node: int
    atoms: tuple[int, ...]
    start: int
    minutes: int
    spot: bool
    state: State
    subject: bool


#: Where a booking may start, in minutes from the window's start or from the horizon: the
#: edges of both, of the hourly slots around them, and anywhere in the hours about them.
OFFSETS = st.one_of(
    st.sampled_from([-61, -60, -59, -1, 0, 1, 59, 60, 61]),
    st.integers(-3000, 3000),
)


@st.composite
def busy_worlds(draw: st.DrawFn) -> tuple[list[NodeSpec], list[Ahead], Ask, Window, int]:
    """Fleets where most nodes hold several bookings, many of them beginning after the horizon
    (calendar bookings, reserved ahead), of every length, starting about the window's edges and
    the horizon; with the window and the horizon (minutes from T0) drawn first."""
    start = draw(st.integers(90 * 60, 140 * 60))
    length = draw(st.sampled_from([1, 30, 60, 61, 300, 1800, 3000]))
    horizon = start - draw(st.sampled_from([0, 0, 0, 1, 59, 60, 61, 600, 3000]))
    fleet = [draw(nodes(i)) for i in range(draw(st.integers(1, 16)))]
    sized = [i for i, n in enumerate(fleet) if n.atoms]
    held: list[Ahead] = []
    for node in sized:
        count = len(fleet[node].atoms)
        for _ in range(draw(st.integers(0, 6))):
            atoms = draw(st.frozensets(st.integers(0, count - 1), min_size=1, max_size=count))
            edge = draw(st.sampled_from([start, start + length, horizon]))
            held.append(
                Ahead(
                    node,
                    tuple(sorted(atoms)),
                    max(0, edge + draw(OFFSETS)),
                    draw(st.sampled_from([1, 30, 59, 60, 61, 120, 600, 1800, 3600])),
                    spot=draw(st.booleans()),
                    state=draw(st.sampled_from([State.PLACED, State.ACTIVE])),
                    subject=draw(st.integers(0, 9)) == 0,
                )
            )
    window = Window(T0 + start * MINUTE, T0 + (start + length) * MINUTE)
    return fleet, held, draw(asks(fleet)), window, T0 + horizon * MINUTE


def write_busy_world(
    db: Ledger, pool_id: str, fleet: list[NodeSpec], held: list[Ahead], ask: Ask
) -> Reservation:
    subject = write_world(db, pool_id, fleet, [], ask)
    for k, b in enumerate(held):
        window = Window(T0 + b.start * MINUTE, T0 + (b.start + b.minutes) * MINUTE)
        rsv = subject
        if not b.subject:
            rsv = reservation(f"rsv_{k:04d}", k + 2, pool_id, spot=b.spot, state=b.state)
            repo.insert_reservation(db.conn, rsv, "{}")
        repo.insert_allocation(db.conn, rsv, fleet[b.node].name, b.atoms, window)
    return subject


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(busy_worlds(), st.integers(0, 600))
def test_the_fleet_answers_as_sql_with_many_bookings_ahead(
    world: tuple[list[NodeSpec], list[Ahead], Ask, Window, int], earlier_min: int
) -> None:
    """The index against SQL where nodes hold bookings ahead of the horizon, with windows and
    horizons at any minute (the hourly slots' edges): candidates in order, snapshots, the plan,
    and how long a search for spot work that found nothing stays true."""
    fleet, held, ask, window, horizon = world
    db, pool_id = ledger()
    with rolled_back(db):
        subject = write_busy_world(db, pool_id, fleet, held, ask)
        conn = db.conn
        request = subject.request(window)
        kept = Fleet()
        kept.index(conn, pool_id, horizon - earlier_min * MINUTE)
        pool = kept.index(conn, pool_id, horizon)
        assert pool.covers(window)
        assert pool.snapshots(window, subject.id) == repo.snapshots(
            conn, pool_id, window, ignore_reservation=subject.id
        )
        rows = repo.fit_candidates(
            conn,
            pool_id,
            window,
            ignore_reservation=subject.id,
            need=request.gpus or 0,
            whole_node=request.node_lease,
        )
        models = {s.name: {a.model for a in s.atoms} for s in fleet}
        expected = [
            (shortlist.best_key(request, shortlist.Candidate(*row)), row[0])
            for row in rows
            if _accepts(request.models, models[row[0]])
        ]
        assert list(pool.candidates(request, subject.id)) == expected
        # The nodes counted one by one are exactly those with a booking starting in the range,
        # not every node filed in the range's first or last hour.
        for lo, hi in ((horizon + 1, window.end), (window.start - pool.longest, window.end)):
            exact = {n for n, bs in pool.booked.items() if any(lo <= b[0] < hi for b in bs)}
            assert pool._starting(lo, hi) == exact

        spans = [(b[0], b[1]) for bs in pool.booked.values() for b in bs]
        spans += [(m.window.start, m.window.end) for ms in pool.maintenance.values() for m in ms]
        assert pool._pool_still(window) == pool._still(spans, window)

        ctx = context(db, ask.top_n)
        from_sql = placing.plan(ctx, subject, window, ask.exclude)
        ctx.fleet = Fleet()
        ctx.now = horizon
        assert placing.plan(ctx, subject, window, ask.exclude) == from_sql


# ---------------------------------------------------------------- kept equal to the ledger

T0 = 1_790_582_400_000
HOUR = 3_600_000
ENTRY = [sys.executable, "-c", "from better_compute.cli import main; main()"]


def _node(name: str) -> dict[str, Any]:
    gpus = {
        "count": 8,
        "model": "h100",
        "nvlinkGroups": 2,
        "fabric": {"cluster": "c1", "clique": 1},
    }
    return {"name": name, "gpus": gpus}


def _two_nodes(where: str) -> Ledger:
    """Pool p of two empty 8-GPU nodes n1 and n2 (topN 1: the best plan is the pick), tenant
    acme, in a new ledger at `where` (a file, or on the PostgreSQL run a schema of its own)."""
    db = setup.init(where, T0, force=True, manual=True, admin="admin", group=None)[0]
    doc = {"pools": [{"name": "p", "nodes": [_node("n1"), _node("n2")]}],
           "tenants": [{"id": "acme", "quota": {"gpus": 1000}}]}  # fmt: skip
    setup.inventory_import(Ctx(db, T0), parse_inventory(doc))
    setup.config_set(Ctx(db, T0), "placement.topN", "1")
    return db


@pytest.fixture
def fleet_ledger(db_dir: Path) -> str:
    return pgtest.ledger(str(db_dir / "fleet.db"))


@pytest.fixture
def two_nodes(fleet_ledger: str) -> Iterator[Ledger]:
    db = _two_nodes(fleet_ledger)
    yield db
    db.close()


def _reserve(db: Ledger, gpus: int, fleet: Fleet | None = None) -> Reservation:
    ctx = Ctx(db, T0, fleet=fleet)
    return booking.reserve(ctx, ReserveArgs("acme", None, gpus, HOUR))


def _nodes(rsv: Reservation) -> list[str]:
    return [a.node_id for a in rsv.allocations]


def test_its_own_commits_are_followed_without_reading_the_pool_again(
    two_nodes: Ledger,
) -> None:
    fleet = Fleet()
    first = _reserve(two_nodes, 6, fleet)
    second = _reserve(two_nodes, 4, fleet)  # n1 has 2 left: n2
    third = _reserve(two_nodes, 2, fleet)  # best fit: the last 2 of n1
    assert (_nodes(first), _nodes(second), _nodes(third)) == (["n1"], ["n2"], ["n1"])
    late = _reserve(two_nodes, 8, fleet)  # nothing left: the full planner's reason, from memory
    assert late.state == State.PENDING
    assert (
        late.conditions[0].message
        == "no node fits (2 nodes): 1 × fits: 0 of 8 gpu free, 1 × fits: 4 of 8 gpu free"
    )
    assert fleet.reloads == 0


def test_another_connections_commit_is_noticed_inside_the_next_write(
    two_nodes: Ledger, fleet_ledger: str
) -> None:
    fleet = Fleet()
    assert _nodes(_reserve(two_nodes, 4, fleet)) == ["n1"]
    other = open_ledger(fleet_ledger)  # another process, as far as the database can tell
    try:
        setup.node_flag(Ctx(other, T0), "n2", "node.cordoned", "bios", schedulable=0)
        booked = _reserve(other, 4)
    finally:
        other.close()
    assert _nodes(booked) == ["n1"]  # n1 is full now
    # A fleet that missed either commit would place this on n1's booked GPUs or on n2.
    late = _reserve(two_nodes, 1, fleet)
    assert late.state == State.PENDING
    assert (
        late.conditions[0].message
        == "no node fits (2 nodes): 1 × cordoned, 1 × fits: 0 of 1 gpu free"
    )
    assert fleet.reloads == 1


def _two_nodes_and_requests(
    db_dir: Path, name: str, count: int, every_ms: int, *, gpus: int
) -> tuple[str, Ledger, Path]:
    """A manual-clock ledger with pool p of nodes n1 and n2, and a jsonl workload of `count`
    3-hour requests by acme, one every `every_ms` from T0."""
    path = pgtest.ledger(str(db_dir / name))
    db = setup.init(path, T0, force=True, manual=True, admin=ME, group=None)[0]
    doc = {"pools": [{"name": "p", "nodes": [_node("n1"), _node("n2")]}]}
    setup.inventory_import(Ctx(db, T0), parse_inventory(doc))
    workload = db_dir / "w.jsonl"
    lines = [
        {"at": T0 + k * every_ms, "tenant": "acme", "gpus": gpus, "duration": "3h"}
        for k in range(count)
    ]
    workload.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path, db, workload


def test_simulate_notices_a_commit_by_another_process_between_requests(db_dir: Path) -> None:
    """A real second process cordons the node the replay would pick next, between two of
    simulate's requests (from its progress hook, so at a known point)."""
    path, db, workload = _two_nodes_and_requests(db_dir, "sim.db", 3, 60_000, gpus=2)
    setup.config_set(Ctx(db, T0), "placement.topN", "1")
    fleet_seen: list[Fleet] = []

    def between(done: int, total: int) -> None:
        if done == 1:  # after the first request (on n1): cordon n1 from another process
            cordon = ["--db", path, "node", "cordon", "n1", "--reason", "x"]
            done_ = subprocess.run([*ENTRY, *cordon], capture_output=True, text=True)
            assert done_.returncode == 0, done_.stderr

    real_index = Fleet.index

    def spying(self: Fleet, *args: Any, **kwargs: Any) -> Any:
        if self not in fleet_seen:
            fleet_seen.append(self)
        return real_index(self, *args, **kwargs)

    ctx = Ctx(db, T0, who=Principal(ME, admin=True))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Fleet, "index", spying)
        report = simulate.simulate(ctx, str(workload), "jsonl", Fraction(1), progress=between)
    assert report.placed_at_once == 3
    placed = {r.id: _nodes(r) for r in repo.reservations_where(db.conn)}
    # The first went to n1 and began there in its own transaction (the tick at its arrival
    # instant runs inside it), before the cordon; the others avoid the cordoned node. The
    # fleet saw the other process's commit and loaded the pool again, once.
    assert sorted(placed.values()) == [["n1"], ["n2"], ["n2"]]
    assert fleet_seen[0].reloads == 1
    db.close()


def test_simulate_reads_the_settings_another_process_changed_between_requests(
    db_dir: Path,
) -> None:
    """The replay keeps the settings it read (storage/settled.py) only while no other process
    commits: a quota another process sets between two requests binds the next ones, and
    raising it again lets the last one through."""
    path, db, workload = _two_nodes_and_requests(db_dir, "settled.db", 4, 60_000, gpus=2)

    def between(done: int, total: int) -> None:
        if done in (1, 3):  # after the first request and after the third
            gpus = "2" if done == 1 else "100"
            argv = ["--db", path, "quota", "set", "--tenant", "acme", "--gpus", gpus]
            done_ = subprocess.run([*ENTRY, *argv], capture_output=True, text=True)
            assert done_.returncode == 0, done_.stderr

    ctx = Ctx(db, T0, who=Principal(ME, admin=True))
    report = simulate.simulate(ctx, str(workload), "jsonl", Fraction(1), progress=between)
    # 1: placed; 2 and 3: over the quota of 2 GPUs that the first holds; 4: placed.
    assert (report.placed_at_once, report.never_placed) == (2, 2)
    db.close()


def _story(db: Ledger, fleet: Fleet | None) -> list[tuple[object, ...]]:
    """Blockers on both nodes, a request that waits behind them (regular, so each retry also
    looks for spot work to preempt), a spot one that waits too, then ticks every 30 s for four
    hours."""

    def reserve(at: int, gpus: int, hours: float, spot: bool = False) -> None:
        args = ReserveArgs("acme", None, gpus, int(hours * HOUR), spot=spot)
        booking.reserve(Ctx(db, at, fleet=fleet), args)

    reserve(T0, 8, 1)  # n1 for an hour
    reserve(T0, 2, 1.5)  # n2
    reserve(T0, 4, 3, spot=True)  # n2, spot
    reserve(T0, 8, 2)  # waits: even preempting the spot work leaves 6 of n2's 8 GPUs
    reserve(T0, 6, 1, spot=True)  # waits too (spot work never preempts)
    for k in range(1, 481):
        now = T0 + k * 30_000
        if k == 100:
            reserve(now, 2, 0.5)  # changes n1's or n2's refusal in the middle of the retries
        ticking.tick(Ctx(db, now, fleet=fleet))
    rows = repo.events(db.conn, tenant=None, reservation=None, since=None)
    return [(e.type, e.at, e.reservation_id, e.data) for e in rows]


def test_retries_from_memory_write_what_retries_from_sql_write(
    two_nodes: Ledger, db_dir: Path
) -> None:
    """The same story on two ledgers built alike (so their ids are alike too), with and without
    the fleet: the same events, word for word (no-fit reasons included), while most retries
    plan nothing again."""
    plain = _two_nodes(pgtest.ledger(str(db_dir / "copy.db")))
    try:
        expected = _story(plain, None)
    finally:
        plain.close()
    planned: list[str] = []
    real = fleet_engine.plan_node

    def counting(request: Any, snap: Any, **kw: Any) -> Any:
        planned.append(snap.node.name)
        return real(request, snap, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fleet_engine, "plan_node", counting)
        assert _story(two_nodes, Fleet()) == expected
    assert [e for e in expected if e[0] == "reservation.pending"]  # there were retries
    retries = 2 * 480  # two requests waiting, a tick every 30 s
    assert len(planned) < retries  # each retry would plan both nodes without the memo


def test_a_replay_places_from_memory_not_from_sql(db_dir: Path) -> None:
    """Placement's SQL readers (candidates, snapshots, the name-order scan for perfect fits)
    are never called while simulate has its fleet: each would cost a query per request."""
    path = pgtest.ledger(str(db_dir / "mem.db"))
    db = setup.init(path, T0, force=True, manual=True, admin=ME, group=None)[0]
    doc = {"pools": [{"name": "p", "nodes": [_node(f"n{i}") for i in range(4)]}]}
    setup.inventory_import(Ctx(db, T0), parse_inventory(doc))
    workload = db_dir / "w.jsonl"
    workload.write_text(
        "".join(
            json.dumps(
                {"at": T0 + k * 60_000, "tenant": "acme", "gpus": 1 + k % 8, "duration": "1h"}
            )
            + "\n"
            for k in range(40)
        )
    )
    called: list[str] = []

    def refused(name: str) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            called.append(name)
            raise AssertionError(f"{name} read SQL during a replay")

        return call

    ctx = Ctx(db, T0, who=Principal(ME, admin=True))
    with pytest.MonkeyPatch.context() as mp:
        for name in ("snapshots", "fit_candidates", "node_capacity"):
            mp.setattr(repo, name, refused(f"repo.{name}"))
        mp.setattr(placing, "name_order_scan", refused("placing.name_order_scan"))
        report = simulate.simulate(ctx, str(workload), "jsonl", Fraction(1))
    assert called == []
    assert report.placed_at_once + report.placed_after_waiting == 40
    db.close()


def _book_in_another_process(path: str) -> str:
    """A real second process books 1 GPU at T0 + 30 min for 10 minutes; its reservation id."""
    other = ["--db", path, "reserve", "--tenant", "acme", "--gpus", "1"]
    other += ["--start", "2026-09-28T08:30:00Z", "--for", "10m", "--json"]
    done = subprocess.run([*ENTRY, *other], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["id"])


def test_simulate_ticks_what_another_process_made_due_between_requests(db_dir: Path) -> None:
    """The replay takes again the due instant its previous request's transaction ended on only
    when nothing was committed since. A real second process books a window between two
    requests; the replay must tick at its start and its end, not at the next arrival."""
    path, db, workload = _two_nodes_and_requests(db_dir, "due.db", 2, 3_600_000, gpus=1)
    minute = 60_000

    def between(done: int, total: int) -> None:
        if done == 1:
            made.append(_book_in_another_process(path))

    made: list[str] = []
    ctx = Ctx(db, T0, who=Principal(ME, admin=True))
    simulate.simulate(ctx, str(workload), "jsonl", Fraction(1), progress=between)
    (other,) = made
    seen = {e.type: e.at for e in repo.events(db.conn, tenant=None, reservation=other, since=0)}
    assert seen["reservation.active"] == T0 + 30 * minute
    assert seen["reservation.released"] == T0 + 40 * minute
    db.close()


@pytest.mark.sqlite_only(reason="hooks the SQLite ledger's commit to act between transactions")
def test_simulate_ticks_what_another_process_made_due_after_the_last_arrival(
    db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ticks after the last arrival share transactions; the first starts from the due
    instant the last request's transaction ended on when nothing was committed since. A real
    second process books a window right after that request's commit: the replay must tick at
    its start and its end, not jump to the request's expiring notice."""
    path, db, workload = _two_nodes_and_requests(db_dir, "trail.db", 1, 3_600_000, gpus=1)
    minute = 60_000
    made: list[str] = []
    real_commit = db._commit  # type: ignore[attr-defined]

    def commit() -> None:
        real_commit()
        if made:
            return
        with db.read() as conn:
            if not repo.reservations_in(conn, State.ACTIVE):
                return  # the request (active from the tick at its arrival) has not committed
        made.append(_book_in_another_process(path))

    monkeypatch.setattr(db, "_commit", commit)
    ctx = Ctx(db, T0, who=Principal(ME, admin=True))
    simulate.simulate(ctx, str(workload), "jsonl", Fraction(1))
    (other,) = made
    seen = {e.type: e.at for e in repo.events(db.conn, tenant=None, reservation=other, since=0)}
    assert seen["reservation.active"] == T0 + 30 * minute
    assert seen["reservation.released"] == T0 + 40 * minute
    db.close()


def _contended(seed: int, count: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Eight 8-GPU nodes in two racks, and `count` requests arriving every few minutes for up
    to three hours each: spot work, two-node gangs on one rack, calendar starts, more than fits
    (waits, cut-backs and requeues)."""
    rng = random.Random(seed)
    doc = {"pools": [{"name": "p", "nodes": [
        {**_node(f"n{i}"), "labels": {"rack": f"r{i // 4}"}} for i in range(8)
    ]}]}  # fmt: skip
    lines, at = [], T0
    for _ in range(count):
        at += rng.randint(0, 10) * 60_000
        line: dict[str, Any] = {
            "at": at,
            "tenant": rng.choice(["a", "b", "c"]),
            "gpus": rng.choice([1, 1, 2, 4, 8]),
            "duration": rng.randint(10, 180) * 60_000,
        }
        kind = rng.random()
        if kind < 0.3:
            line["spot"] = True
        elif kind < 0.4:
            line.update(gang=2, gpus=8, topologyKey="rack")
        if rng.random() < 0.25:
            line["start"] = at + rng.randint(1, 48) * HOUR
        lines.append(line)
    return doc, lines


@pytest.mark.parametrize("seed", [1, 2])
def test_the_fleet_a_replay_keeps_is_the_ledger_at_every_use(db_dir: Path, seed: int) -> None:
    """Each time a contended replay consults its fleet, the pool index it is handed holds what
    one built afresh from the ledger at that instant holds: the same bookings by node and by
    reservation, and every node filed alike. The catch-up after this process's own commits
    (reading bookings back, or taking what placing.commit wrote, or dropping a release's) is
    what keeps it so."""
    path = pgtest.ledger(str(db_dir / f"contended{seed}.db"))
    db = setup.init(path, T0, force=True, manual=True, admin=ME, group=None)[0]
    doc, lines = _contended(seed, 60)
    setup.inventory_import(Ctx(db, T0), parse_inventory(doc))
    workload = db_dir / f"w{seed}.jsonl"
    workload.write_text("".join(json.dumps(line) + "\n" for line in lines))
    real = Fleet.index
    checked = [0]

    def index(self: Fleet, conn: Any, pool_id: str, now: int, **kw: Any) -> Any:
        pool = real(self, conn, pool_id, now, **kw)
        fresh = fleet_engine.PoolIndex.build(
            now,
            repo.load_nodes(conn, pool_id),
            store.pool_maintenance_after(conn, pool_id, now),
            (fleet_engine.BookingRow(*r) for r in store.pool_bookings_after(conn, pool_id, now)),
        )
        assert _held(pool) == _held(fresh), now
        assert (pool.bucket_of, pool.odd) == (fresh.bucket_of, fresh.odd), now
        checked[0] += 1
        return pool

    ctx = Ctx(db, T0, who=Principal(ME, admin=True))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Fleet, "index", index)
        report = simulate.simulate(ctx, str(workload), "jsonl", Fraction(1))
    db.close()
    assert checked[0] > len(lines)  # every request, and the retries of those that waited
    assert report.placed_after_waiting > 0 and report.cut_back > 0, report


def _held(pool: fleet_engine.PoolIndex) -> tuple[object, ...]:
    by_node = {n: sorted(b) for n, b in pool.booked.items() if b}
    by_rsv = {r: sorted(h) for r, h in pool.by_rsv.items() if h}
    return by_node, by_rsv


_ROWS = st.lists(
    st.builds(
        fleet_engine.BookingRow,
        st.sampled_from(["rsv_a", "rsv_b", "rsv_c", "rsv_d", "rsv_e"]),
        st.sampled_from(["n1", "n2", "n3", "gone"]),
        st.integers(0, 7),
        st.integers(0, 5 * fleet_engine.SLOT),
        st.integers(1, 3 * fleet_engine.SLOT),
        st.booleans(),
        st.booleans(),
    ).map(lambda r: r._replace(end=r.start + r.end)),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_ROWS, st.integers(0, 4 * fleet_engine.SLOT))
def test_building_holds_every_booking_as_one_by_one_would(
    rows: list[fleet_engine.BookingRow], horizon: int
) -> None:
    """PoolIndex.build holds all the bookings at once (_hold_all): the same lists, heaps,
    longest booking and generations as holding each reservation's in turn (_hold)."""
    from better_compute.model import Atom, Node

    fleet = [Node(n, "p", tuple(Atom(i, "h100") for i in range(8))) for n in ("n1", "n2", "n3")]
    built = fleet_engine.PoolIndex.build(horizon, fleet, (), rows)
    one_by_one = fleet_engine.PoolIndex.build(horizon, fleet, (), ())
    grouped: dict[str, list[fleet_engine.BookingRow]] = {}
    for row in rows:
        grouped.setdefault(row.reservation_id, []).append(row)
    for rsv_id, held in grouped.items():
        one_by_one._hold(rsv_id, held)
    for name in ("booked", "slots", "by_rsv", "longest", "generation", "node_gen"):
        assert getattr(built, name) == getattr(one_by_one, name), name
    assert sorted(built.ends) == sorted(one_by_one.ends)
    assert sorted(built.starts) == sorted(one_by_one.starts)
