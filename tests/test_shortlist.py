"""Issue 8: placement plans only the nodes SQL shortlists, and must answer exactly as the full
planner does (every node of the pool loaded and planned), on random fleets and bookings.

Each example writes a fleet and its bookings into a real ledger inside a transaction, asks both
paths, and rolls back: the shortlist is SQL, so only a real database tests it.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from better_compute.engine import shortlist
from better_compute.engine.fit import plan_nodes
from better_compute.engine.gang import group_fits, rank_gangs
from better_compute.engine.place import rank_single
from better_compute.engine.preempt import MAX_PLANS, plan_preemption
from better_compute.model import (
    Atom,
    Binding,
    Plan,
    Reservation,
    Settings,
    State,
    Window,
)
from better_compute.service import placing, setup
from better_compute.service.context import Ctx
from better_compute.service.fleet import Fleet
from better_compute.storage import repo
from better_compute.storage.db import Database

H = 3_600_000
T0 = 1_790_582_400_000
WINDOW = Window(T0 + 100 * H, T0 + 130 * H)

_DB: dict[str, tuple[Database, str]] = {}


def ledger() -> tuple[Database, str]:
    """One ledger for the whole module (each example rolls its rows back): (db, pool id).

    test_fitting, test_fitlevels and test_fleet_memory use it too, where this module's fixture
    below does not run: their copy goes when the test process ends."""
    if "db" not in _DB:
        folder = tempfile.mkdtemp(prefix="bc-shortlist-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = Path(folder) / "ledger.db"
        db = setup.init(str(path), T0, force=True, manual=True, admin="admin", group=None)[0]
        with db.write() as conn:
            pool_id = repo.insert_pool(conn, "p", ())
            repo.insert_tenant(conn, "t")
        _DB["db"] = (db, pool_id)
    return _DB["db"]


@pytest.fixture(scope="module", autouse=True)
def _ledger_removed_after() -> Iterator[None]:
    """The module's ledger goes when its tests are done."""
    yield
    if "db" in _DB:
        db, _ = _DB.pop("db")
        db.close()
        shutil.rmtree(db.path.parent, ignore_errors=True)


@contextmanager
def rolled_back(db: Database) -> Iterator[None]:
    db.conn.execute("BEGIN")
    try:
        yield
    finally:
        db.conn.execute("ROLLBACK")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    atoms: tuple[Atom, ...]
    rack: str | None
    schedulable: bool
    reachable: bool
    maintenance: tuple[int, int] | None  # hours from T0


@dataclass(frozen=True)
class BookingSpec:
    node: int  # index into the fleet
    atoms: tuple[int, ...]
    start: int  # hours from T0
    hours: int
    spot: bool
    state: State
    subject: bool  # held by the reservation being planned (placement ignores its own bookings)


@st.composite
def nodes(
    draw: st.DrawFn, i: int, racks: tuple[str | None, ...] = (None, "r1", "r2"), cliques: int = 2
) -> NodeSpec:
    gpus = draw(st.sampled_from([0, 1, 2, 4, 8, 8, 8]))
    groups = draw(st.integers(1, 4))
    model = draw(st.sampled_from(["h100", "h100", "a100"]))
    mixed = draw(st.integers(0, 5)) == 0
    clique = draw(st.integers(1, cliques))
    atoms = tuple(
        Atom(
            index=j,
            model="a100" if mixed and j % 2 else model,
            nvlink_group=j * groups // gpus,
            fabric_cluster="c1",
            fabric_clique=clique,
            healthy=draw(st.integers(0, 7)) > 0,
        )
        for j in range(gpus)
    )
    maintenance = None
    if draw(st.integers(0, 7)) == 0:
        start = draw(st.integers(60, 160))
        maintenance = (start, start + draw(st.integers(1, 40)))
    return NodeSpec(
        f"n{i:02d}",
        atoms,
        draw(st.sampled_from(racks)),
        schedulable=draw(st.integers(0, 7)) > 0,
        reachable=draw(st.integers(0, 7)) > 0,
        maintenance=maintenance,
    )


@st.composite
def bookings(draw: st.DrawFn, fleet: list[NodeSpec]) -> list[BookingSpec]:
    out = []
    sized = [i for i, n in enumerate(fleet) if n.atoms]
    if not sized:
        return []
    for _ in range(draw(st.integers(0, 3 * len(sized)))):
        node = draw(st.sampled_from(sized))
        count = len(fleet[node].atoms)
        atoms = draw(st.frozensets(st.integers(0, count - 1), min_size=1, max_size=count))
        # Around the window [100, 130): before, across, inside, after, touching its edges, and
        # some long ones that start long before it (the longest-booking bound must hold them).
        start = draw(st.sampled_from([0, 40, 70, 90, 99, 100, 110, 129, 130, 150]))
        hours = draw(st.sampled_from([1, 10, 30, 31, 60, 120]))
        out.append(
            BookingSpec(
                node,
                tuple(sorted(atoms)),
                start + draw(st.integers(0, 3)),
                hours,
                spot=draw(st.booleans()),
                state=draw(st.sampled_from([State.PLACED, State.ACTIVE, State.RELEASED])),
                subject=draw(st.integers(0, 9)) == 0,
            )
        )
    return out


@dataclass(frozen=True)
class Ask:
    gpus: int | None
    lease: bool
    models: tuple[str, ...]
    topology: str | None
    gang: int | None
    key: str | None
    exclude: frozenset[str]
    top_n: int


@st.composite
def asks(draw: st.DrawFn, fleet: list[NodeSpec]) -> Ask:
    lease = draw(st.integers(0, 5)) == 0
    gang = draw(st.sampled_from([None, None, None, 2, 3]))
    names = [n.name for n in fleet]
    return Ask(
        gpus=draw(st.sampled_from([None, 1, 4, 8])) if lease else draw(st.integers(1, 8)),
        lease=lease,
        models=draw(st.sampled_from([(), ("h100",), ("H100",), ("a100", "h100")])),
        topology=draw(st.sampled_from([None, None, "nvlink-all"])),
        gang=gang,
        key=draw(st.sampled_from([None, "fabric.domain", "rack"])) if gang else None,
        exclude=frozenset(draw(st.lists(st.sampled_from(names), max_size=3)))
        if names
        else frozenset(),
        top_n=draw(st.integers(1, 4)),
    )


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[NodeSpec], list[BookingSpec], Ask]:
    fleet = [draw(nodes(i)) for i in range(draw(st.integers(0, 12)))]
    return fleet, draw(bookings(fleet)), draw(asks(fleet))


def reservation(rsv_id: str, seq: int, pool_id: str, **kw: object) -> Reservation:
    base: dict[str, object] = {
        "id": rsv_id,
        "seq": seq,
        "tenant_id": "t",
        "pool_id": pool_id,
        "state": State.PENDING,
        "gpus": 1,
        "models": (),
        "topology": None,
        "gang_size": None,
        "topology_key": None,
        "spot": False,
        "binding": Binding.DEVICE,
        "duration_ms": WINDOW.duration,
        "start": WINDOW.start,
        "during": None,
        "conditions": (),
        "quota_charge": 1,
        "idempotency_key": None,
        "release_reason": None,
        "created_at": T0,
        "next_attempt_at": None,
    }
    base.update(kw)
    return Reservation(**base)  # type: ignore[arg-type]


def write_world(
    db: Database, pool_id: str, fleet: list[NodeSpec], held: list[BookingSpec], ask: Ask
) -> Reservation:
    conn = db.conn
    for spec in fleet:
        labels = (("rack", spec.rack),) if spec.rack else ()
        repo.insert_node(conn, spec.name, pool_id, labels, spec.atoms)
        repo.update_node(
            conn, spec.name, schedulable=int(spec.schedulable), reachable=int(spec.reachable)
        )
        for atom in spec.atoms:
            if not atom.healthy:
                repo.set_atom_health(conn, spec.name, atom.index, False, "xid-79")
        if spec.maintenance is not None:
            window = Window(T0 + spec.maintenance[0] * H, T0 + spec.maintenance[1] * H)
            repo.insert_maintenance(conn, spec.name, window, "bios")
    subject = reservation(
        "rsv_subject",
        1,
        pool_id,
        gpus=ask.gpus,
        models=ask.models,
        topology=ask.topology,
        gang_size=ask.gang,
        topology_key=ask.key,
        binding=Binding.NODE if ask.lease else Binding.DEVICE,
        # a lease is charged at admission the pool's largest node per member, as reserve does
        # (placing.beyond_charge keeps it off larger ones)
        quota_charge=max((len(f.atoms) for f in fleet), default=0) * (ask.gang or 1)
        if ask.lease
        else 1,
    )
    repo.insert_reservation(conn, subject, "{}")
    for k, b in enumerate(held):
        window = Window(T0 + b.start * H, T0 + (b.start + b.hours) * H)
        if b.subject:
            rsv = subject
        else:
            rsv = reservation(f"rsv_{k:04d}", k + 2, pool_id, spot=b.spot, state=b.state)
            repo.insert_reservation(conn, rsv, "{}")
        repo.insert_allocation(conn, rsv, fleet[b.node].name, b.atoms, window)
    return subject


def context(db: Database, top_n: int) -> Ctx:
    ctx = Ctx(db, T0)
    ctx.__dict__["settings"] = Settings(top_n=top_n)
    return ctx


@contextmanager
def written(
    world: tuple[list[NodeSpec], list[BookingSpec], Ask],
) -> Iterator[tuple[Database, str, Reservation, Ctx]]:
    """The world in the module's ledger, rolled back after: (db, pool id, subject, context)."""
    fleet, held, ask = world
    db, pool_id = ledger()
    with rolled_back(db):
        subject = write_world(db, pool_id, fleet, held, ask)
        yield db, pool_id, subject, context(db, ask.top_n)


@contextmanager
def _perfect_scan(nodes: int) -> Iterator[None]:
    kept = placing.PERFECT_SCAN
    placing.PERFECT_SCAN = nodes
    try:
        yield
    finally:
        placing.PERFECT_SCAN = kept


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(worlds(), st.sampled_from([0, 1, 3, placing.PERFECT_SCAN]))
def test_the_shortlist_answers_as_the_full_planner(
    world: tuple[list[NodeSpec], list[BookingSpec], Ask], scan: int
) -> None:
    """`scan` nodes are read in name order looking for perfect fits before the bound order takes
    over (placing.PERFECT_SCAN): none, a few, or every node of these small fleets."""
    fleet, held, ask = world
    db, pool_id = ledger()
    with rolled_back(db), _perfect_scan(scan):
        subject = write_world(db, pool_id, fleet, held, ask)
        ctx = context(db, ask.top_n)
        request = subject.request(WINDOW)

        # The outcome: the same plan (members, atoms, score, group), or the same no-fit reason.
        short = placing.plan(ctx, subject, WINDOW, ask.exclude)
        full = placing.full_plan(ctx, subject, WINDOW, ask.exclude)
        assert short == full
        kind = "gang" if ask.gang else "lease" if ask.lease else "single"
        event(f"{kind}: {'plan' if isinstance(full, Plan) else 'no fit'}")

        # No node the full planner finds fitting is missing from the shortlist's candidates.
        snaps = repo.snapshots(db.conn, pool_id, WINDOW, ignore_reservation=subject.id)
        all_fits, _ = plan_nodes(request, snaps, exclude=ask.exclude)
        rows = repo.fit_candidates(
            db.conn,
            pool_id,
            WINDOW,
            ignore_reservation=subject.id,
            need=request.gpus or 0,
            whole_node=request.node_lease,
        )
        candidates = {name for name, _, _ in rows}
        assert {plan.node_id for _, plan in all_fits} <= candidates
        # SQLite sorts them exactly as the engine defines "most promising first".
        defined = shortlist.ordered(request, [shortlist.Candidate(*row) for row in rows])
        assert [name for name, _, _ in rows] == [name for _, name in defined]

        # The ranking among the best topN is the full planner's, plan by plan.
        enough = max(1, ask.top_n)
        fits = placing.shortlisted_fits(
            ctx, pool_id, request, subject.id, ask.exclude, enough=None if ask.gang else enough
        )
        if ask.gang:
            assert rank_gangs(request, fits) == rank_gangs(request, all_fits)
        else:
            assert rank_single(fits)[:enough] == rank_single(all_fits)[:enough]
            if isinstance(full, Plan):
                assert full.members[0].node_id in {plan.node_id for _, plan in fits}
            # The name-order reading, when it answers, answers the same.
            read = placing.name_order_scan(ctx, pool_id, request, subject.id, ask.exclude, enough)
            found = read.fits if read.answered else None
            if found is not None:
                assert rank_single(found)[:enough] == rank_single(all_fits)[:enough]
            # What it planned is planned exactly: the same plans the full planner makes there.
            planned = sorted((p for _, p in all_fits if p.node_id in read.planned), key=str)
            assert sorted((p for _, p in read.fits), key=str) == planned
            perfect = sum(1 for _, p in all_fits if p.score >= shortlist.MAX_SCORE)
            event(f"scan {scan}: {'answered' if found is not None else 'passed'}, {perfect=}")


@st.composite
def half_full_worlds(draw: st.DrawFn) -> tuple[list[NodeSpec], list[BookingSpec], Ask]:
    """Fleets of 8-GPU nodes in two NVLink groups where many nodes have one group booked, so a
    4-GPU ask often finds perfect fits (full after booking, one group) in name order."""
    fleet = [
        NodeSpec(
            f"n{i:02d}",
            tuple(
                Atom(j, "h100", j // 4, "c1", 1, healthy=draw(st.integers(0, 15)) > 0)
                for j in range(8)
            ),
            None,
            schedulable=draw(st.integers(0, 9)) > 0,
            reachable=True,
            maintenance=None,
        )
        for i in range(draw(st.integers(1, 30)))
    ]
    patterns = [(), (0, 1, 2, 3), (4, 5, 6, 7), (1, 2, 5, 6), (0, 1), (2, 3, 4), (0, 1, 2, 3, 4, 5)]
    held = [
        BookingSpec(
            node,
            atoms,
            draw(st.sampled_from([90, 100, 110])),
            30,
            spot=draw(st.integers(0, 5)) == 0,
            state=draw(st.sampled_from([State.PLACED, State.ACTIVE])),
            subject=False,
        )
        for node in range(len(fleet))
        if (atoms := draw(st.sampled_from(patterns)))
    ]
    ask = Ask(4, False, (), None, None, None, frozenset(), draw(st.integers(1, 4)))
    return fleet, held, ask


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(half_full_worlds(), st.integers(1, 12))
def test_perfect_fits_in_name_order_are_the_full_planners_best(
    world: tuple[list[NodeSpec], list[BookingSpec], Ask], scan: int
) -> None:
    fleet, held, ask = world
    db, pool_id = ledger()
    with rolled_back(db), _perfect_scan(scan):
        subject = write_world(db, pool_id, fleet, held, ask)
        ctx = context(db, ask.top_n)
        request = subject.request(WINDOW)
        enough = max(1, ask.top_n)
        snaps = repo.snapshots(db.conn, pool_id, WINDOW, ignore_reservation=subject.id)
        all_fits, _ = plan_nodes(request, snaps)
        read = placing.name_order_scan(ctx, pool_id, request, subject.id, frozenset(), enough)
        found = read.fits if read.answered else None
        if found is not None:
            assert rank_single(found)[:enough] == rank_single(all_fits)[:enough]
        assert placing.plan(ctx, subject, WINDOW) == placing.full_plan(ctx, subject, WINDOW)
        whole = len(found or ()) == len(all_fits) and len(fleet) <= scan
        event("whole pool" if whole else "answered" if found is not None else "passed")


@st.composite
def gang_worlds(draw: st.DrawFn) -> tuple[list[NodeSpec], list[BookingSpec], Ask]:
    """Gangs over many topology groups: racks and fabric cliques of one to a dozen nodes."""
    racks = (None, "r1", "r2", "r3", "r4", "r5")
    fleet = [draw(nodes(i, racks=racks, cliques=4)) for i in range(draw(st.integers(4, 24)))]
    # Most nodes whole and healthy, so that several groups can make a gang and rank.
    fleet = [
        replace(
            n,
            atoms=tuple(replace(a, healthy=True, model="h100") for a in n.atoms),
            schedulable=True,
            reachable=True,
            maintenance=None,
        )
        if draw(st.integers(0, 3))
        else n
        for n in fleet
    ]
    ask = draw(asks(fleet))
    clean = draw(st.booleans())  # a plain ask: any model, GPUs of one node's share
    ask = replace(
        ask,
        gang=draw(st.integers(2, 4)),
        key=draw(st.sampled_from([None, "fabric.domain", "rack", "rack"])),
        topology=None,
        models=() if clean else ask.models,
        lease=False if clean else ask.lease,
        gpus=draw(st.integers(1, 4)) if clean else ask.gpus,
    )
    held = draw(bookings(fleet))
    return fleet, held[: draw(st.integers(0, len(held)))], ask


def _eight(clique: int = 1) -> tuple[Atom, ...]:
    return tuple(Atom(j, "h100", j // 4, "c1", clique) for j in range(8))


#: Two racks wholly held by spot work, r1 with exactly a gang's two nodes: preemption's best gang
#: (fewest victims, best score, then the group's name) is r1's.
_TWO_RACKS_OF_SPOT = (
    [NodeSpec(f"n{i:02d}", _eight(), "r1" if i < 2 else "r2", True, True, None) for i in range(5)],
    [BookingSpec(i, tuple(range(8)), 99, 40, True, State.ACTIVE, False) for i in range(5)],
    Ask(8, False, (), None, 2, "rack", frozenset(), 1),
)


@st.composite
def spot_gang_worlds(draw: st.DrawFn) -> tuple[list[NodeSpec], list[BookingSpec], Ask]:
    """gang_worlds with every node's GPUs held through the window, mostly by spot work: only
    preemption can place the gang, in whichever groups have enough spot-held nodes."""
    fleet, _, ask = draw(gang_worlds())
    held = [
        BookingSpec(
            i,
            tuple(range(len(n.atoms))),
            start=draw(st.sampled_from([90, 99, 100])),
            hours=draw(st.sampled_from([31, 40, 60])),
            spot=draw(st.integers(0, 4)) > 0,
            state=draw(st.sampled_from([State.PLACED, State.ACTIVE])),
            subject=False,
        )
        for i, n in enumerate(fleet)
        if n.atoms
    ]
    return fleet, held, ask


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.one_of(worlds(), gang_worlds(), spot_gang_worlds()), st.sampled_from([1, 2, 64]))
@example(_TWO_RACKS_OF_SPOT, 64)
def test_preemption_plans_the_same_on_the_nodes_it_could_use(
    world: tuple[list[NodeSpec], list[BookingSpec], Ask], batch: int
) -> None:
    """placing.preemption_snapshots reads only the nodes that could take a share were every
    spot booking freed (a gang's: only in groups with enough of them; a single-node request's:
    only until enough fit), from SQL and from a replay's fleet; preemption's plan on them is its
    plan on the whole pool."""
    ask = world[2]
    # Read `batch` nodes at a time (64 outside tests): the batches join up in name order.
    with (
        written(world) as (db, pool_id, subject, ctx),
        patch.object(placing, "PREEMPTION_BATCH", batch),
    ):
        request = subject.request(WINDOW)
        everything = repo.snapshots(db.conn, pool_id, WINDOW, ignore_reservation=subject.id)
        some = placing.preemption_snapshots(ctx, pool_id, request, subject.id)
        full = plan_preemption(request, everything)
        short = plan_preemption(request, some)
        assert isinstance(short, Plan) == isinstance(full, Plan)
        if isinstance(full, Plan):
            assert short == full
        fits, _ = plan_nodes(request, everything, free_spot=True)
        if ask.gang:  # the fits of every group that could offer a gang
            groups = group_fits(request, fits)[0].values()
            fits = [fit for members in groups if len(members) >= ask.gang for fit in members]
        else:  # the first fitting nodes by name: all a single-node request compares
            fits = fits[:MAX_PLANS]
        assert {p.node_id for _, p in fits} <= {s.node.name for s in some}
        # The same from the fleet a replay keeps in memory (engine/fleet.PoolIndex), whose
        # candidates skip no group: every node that could take a share.
        pool = Fleet().index(db.conn, pool_id, WINDOW.start)
        kept = plan_preemption(
            request, placing.preemption_snapshots(ctx, pool_id, request, subject.id, pool)
        )
        assert isinstance(kept, Plan) == isinstance(full, Plan)
        if isinstance(full, Plan):
            assert kept == full
        named = pool.preemption_candidates(request, subject.id)
        free_spot_fits, _ = plan_nodes(request, everything, free_spot=True)
        assert {p.node_id for _, p in free_spot_fits} <= set(named)
        victims = bool(full.victims) if isinstance(full, Plan) else False
        event(f"{'plan' if isinstance(full, Plan) else 'no fit'}, {victims=}")


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(gang_worlds())
def test_a_gang_plans_only_its_best_groups_and_answers_as_the_full_planner(
    world: tuple[list[NodeSpec], list[BookingSpec], Ask],
) -> None:
    """placing.gang_fits plans groups in order of their best possible gang, each only until its
    best members are known, and stops once topN gangs rank before the next group's bound; with
    no gang anywhere it plans enough to name the most nodes any group fits. The outcome and the
    ranking of the best topN must be the full planner's."""
    ask = world[2]
    with written(world) as (db, pool_id, subject, ctx):
        request = subject.request(WINDOW)
        assert placing.plan(ctx, subject, WINDOW, ask.exclude) == placing.full_plan(
            ctx, subject, WINDOW, ask.exclude
        )
        snaps = repo.snapshots(db.conn, pool_id, WINDOW, ignore_reservation=subject.id)
        all_fits, _ = plan_nodes(request, snaps, exclude=ask.exclude)
        top_n = max(1, ask.top_n)
        fits = placing.gang_fits(ctx, pool_id, request, subject.id, ask.exclude, top_n=top_n)
        best = rank_gangs(request, all_fits)[:top_n]
        assert rank_gangs(request, fits)[:top_n] == best
        # preview shows the best gang from the fits its plan chose from (placing.gang_plan)
        outcome, chosen = placing.gang_plan(ctx, subject, WINDOW, ask.exclude)
        assert outcome == placing.full_plan(ctx, subject, WINDOW, ask.exclude)
        assert rank_gangs(request, chosen)[:1] == best[:1]
        planned = {plan.node_id for _, plan in fits}
        event(f"gang {'found' if best else 'none'}: planned {len(planned)} of {len(all_fits)} fits")
