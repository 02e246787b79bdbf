"""Plan a reservation with the pure engine, then commit the plan: the shared core of reserve,
pending retries, BookingRepair and preemption."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from better_compute.engine import shortlist
from better_compute.engine.fit import Fit, plan_nodes
from better_compute.engine.fleet import PoolIndex
from better_compute.engine.gang import gang_size, pick_gang
from better_compute.engine.place import pick_single, place
from better_compute.engine.preempt import enough_in_name_order
from better_compute.model import (
    Condition,
    NodeSnapshot,
    NoFit,
    Plan,
    Request,
    Reservation,
    State,
    Window,
    evolve,
)
from better_compute.service.context import Ctx
from better_compute.storage import fitlevels, fitting, locks, repo, simulation


class LostRace(Exception):
    """A planned atom turned out to be booked already; the node is excluded and planning repeats."""

    def __init__(self, node_id: str) -> None:
        super().__init__(node_id)
        self.node_id = node_id


def plan(
    ctx: Ctx, rsv: Reservation, window: Window, exclude: frozenset[str] = frozenset()
) -> Plan | NoFit:
    """What full_plan answers, planning only the shortlisted nodes (engine/shortlist.py says why
    that is the same answer). A single-node request that fits nowhere asks full_plan, whose
    no-fit reason counts every node's refusal."""
    request = rsv.request(window)
    if request.gang_size is not None:
        return gang_plan(ctx, rsv, window, exclude)[0]
    seed, top_n = ctx.seed(rsv.id, window.start), ctx.settings.top_n
    fits = shortlisted_fits(ctx, rsv.pool_id, request, rsv.id, exclude, enough=max(1, top_n))
    if fits:
        return pick_single(fits, seed=seed, top_n=top_n)
    return full_plan(ctx, rsv, window, exclude)


def gang_plan(
    ctx: Ctx, rsv: Reservation, window: Window, exclude: frozenset[str] = frozenset()
) -> tuple[Plan | NoFit, list[Fit]]:
    """plan() of a gang, with the fits it chose from: enough for the best topN gangs, so the
    best one (engine/gang.rank_gangs) too, which preview shows without planning again."""
    request = rsv.request(window)
    top_n = ctx.settings.top_n
    fits = gang_fits(ctx, rsv.pool_id, request, rsv.id, exclude, top_n=max(1, top_n))
    return pick_gang(request, fits, seed=ctx.seed(rsv.id, window.start), top_n=top_n), fits


def full_plan(
    ctx: Ctx, rsv: Reservation, window: Window, exclude: frozenset[str] = frozenset()
) -> Plan | NoFit:
    """Every node of the pool planned: the reference the shortlist must agree with."""
    pool = fleet_pool(ctx, rsv.pool_id, window)
    if pool is not None:
        request = rsv.request(window)
        if request.gang_size is None:  # a pending request's retries: what changed is planned
            no_fit = pool.no_fit(request, rsv.id, exclude)
            if no_fit is not None:
                return no_fit
        snaps = pool.snapshots(window, rsv.id)
    else:
        snaps = repo.snapshots(ctx.db.conn, rsv.pool_id, window, ignore_reservation=rsv.id)
    return place(
        rsv.request(window),
        snaps,
        seed=ctx.seed(rsv.id, window.start),
        top_n=ctx.settings.top_n,
        exclude=exclude,
    )


def fleet_pool(ctx: Ctx, pool_id: str, window: Window) -> PoolIndex | None:
    """The pool from the fleet this command keeps in memory, when it has one that can answer
    for the window (service/fleet.py); None: read it from SQL."""
    if ctx.fleet is None:
        return None
    version = simulation.data_version_of(ctx.db)
    pool = ctx.fleet.index(ctx.db.conn, pool_id, ctx.now, version=version)
    return pool if pool.covers(window) else None


#: Nodes loaded and planned in the first round of shortlisted_fits; each round doubles it.
FIRST_ROUND = 8


def shortlisted_fits(
    ctx: Ctx,
    pool_id: str,
    request: Request,
    ignore: str | None,
    exclude: frozenset[str] = frozenset(),
    *,
    enough: int | None,
) -> list[Fit]:
    """Fitting nodes, planned most promising first (engine/shortlist.py), until the best `enough`
    single-node plans are known (None: every candidate, as gangs need), by node name."""
    pool = fleet_pool(ctx, pool_id, request.window)
    # Nodes the name-order reading planned already: their plans count, and are not made twice.
    fits: list[Fit] = []
    planned: set[str] = set()
    if enough is not None and pool is None:  # from memory, candidates come best first at once
        scan = name_order_scan(ctx, pool_id, request, ignore, exclude, enough)
        if scan.answered:
            return scan.fits
        fits, planned = scan.fits, scan.planned
    order: Iterator[tuple[tuple[int, str], str]]
    if pool is not None:
        order = pool.candidates(request, ignore)
    else:
        rows = candidates(ctx, pool_id, request, ignore, None if enough is None else FIRST_FETCH)
        order = ((shortlist.best_key(request, shortlist.Candidate(*r)), r[0]) for r in rows)
    fits = _planned_in_order(
        ctx, pool, pool_id, request, ignore, exclude, order, enough, fits, planned
    )
    return sorted(fits, key=lambda fit: fit[1].node_id)


def _planned_in_order(
    ctx: Ctx,
    pool: PoolIndex | None,
    pool_id: str,
    request: Request,
    ignore: str | None,
    exclude: frozenset[str],
    order: Iterator[tuple[tuple[int, str], str]],
    enough: int | None,
    fits: list[Fit] | None = None,
    planned: frozenset[str] | set[str] = frozenset(),
) -> list[Fit]:
    """`fits` and the fits of the candidates of `order` (best key, name), planned in rounds in
    that order until the best `enough` are known (shortlist.settled; None: all of them).
    Candidates `planned` already (with `fits` their fits) are not planned again."""
    fits = list(fits or [])
    # A round from memory costs no query: start with just enough (a bucket of equal nodes
    # settles at once); from SQL, rounds are fewer and larger.
    size = max(1, enough or 0) if pool is not None else max(FIRST_ROUND, 2 * (enough or 0))
    head = next(order, None)
    while head is not None:
        names: list[str] = []
        while head is not None and len(names) < size:
            if head[1] not in planned:
                names.append(head[1])
            head = next(order, None)
        size *= 2
        if pool is not None:
            snaps = pool.snapshots(request.window, ignore, names)
        elif names:
            snaps = repo.snapshots(
                ctx.db.conn, pool_id, request.window, ignore_reservation=ignore, names=names
            )
        else:
            snaps = []
        fits.extend(plan_nodes(request, snaps, exclude=exclude)[0])
        # A planned node's bound is at most the next unplanned one's: a safe bound to stop at.
        following = None if head is None else head[0]
        if enough is not None and shortlist.settled([p for _, p in fits], enough, following):
            break
    return fits


def gang_fits(
    ctx: Ctx,
    pool_id: str,
    request: Request,
    ignore: str | None,
    exclude: frozenset[str],
    *,
    top_n: int,
) -> list[Fit]:
    """Fitting nodes enough for pick_gang to answer as it would on every fitting node of the
    pool, the same plan or the same reason (engine/shortlist.py says why): a gang of 4 on the
    big benchmark pool planned every one of its 2,800 nodes with room."""
    if fleet_pool(ctx, pool_id, request.window) is not None:  # from memory: cheap already
        return shortlisted_fits(ctx, pool_id, request, ignore, exclude, enough=None)
    size = gang_size(request)
    rows = _fit_rows(ctx, pool_id, request, ignore)  # best first: each group's order too
    groups = _groups(ctx, pool_id, request.topology_key, rows)
    fits: list[Fit] = []
    found: list[tuple[int, str]] = []  # rank_gangs' keys of the groups' best gangs
    planned: dict[str, int] = {}  # group: its nodes that fit, once planned in full
    for bound, value in shortlist.gang_bounds(request, groups, size):
        if shortlist.keys_settled(found, top_n, bound):
            break
        order = _in_order(request, groups[value])
        mine = _planned_in_order(ctx, None, pool_id, request, ignore, exclude, order, size)
        fits.extend(mine)
        key = shortlist.gang_key([p for _, p in mine], size, value)
        if key is not None:
            found.append(key)
        else:  # too few fit: every candidate of the group was planned
            planned[value] = len(mine)
    if found:
        return fits
    # No gang: the reason names the most nodes any group fits. A group fits at most its
    # candidates, so the largest are planned until none left could fit more.
    most = max(planned.values(), default=0)
    for value in sorted(groups, key=lambda v: (-len(groups[v]), v)):
        if len(groups[value]) <= most:
            break
        if value not in planned:
            order = _in_order(request, groups[value])
            mine = _planned_in_order(ctx, None, pool_id, request, ignore, exclude, order, None)
            fits.extend(mine)
            most = max(most, len(mine))
    return fits


def _groups(
    ctx: Ctx, pool_id: str, key: str | None, rows: list[tuple[str, int, int]]
) -> dict[str, list[shortlist.Candidate]]:
    """The candidates by their value of the topology key, each group in the rows' order; nodes
    without the value never join a gang (engine/gang.group_fits)."""
    if key is None:
        return {"": [shortlist.Candidate(*row) for row in rows]} if rows else {}
    values = fitting.topology_values(ctx.db.conn, pool_id, key)
    groups: dict[str, list[shortlist.Candidate]] = {}
    for row in rows:
        value = values.get(row[0])
        if value is not None:
            groups.setdefault(value, []).append(shortlist.Candidate(*row))
    return groups


def _in_order(
    request: Request, members: list[shortlist.Candidate]
) -> Iterator[tuple[tuple[int, str], str]]:
    return iter([(shortlist.best_key(request, c), c.name) for c in members])


#: Candidates the first bound-order query returns; planning past them asks again for them all.
FIRST_FETCH = 64


def candidates(
    ctx: Ctx, pool_id: str, request: Request, ignore: str | None, first: int | None
) -> Iterator[tuple[str, int, int]]:
    """storage's fit candidates (node, GPUs booked, GPUs), best first: the best `first` (None:
    all) at once, the rest only if planning gets that far. Both reads see one snapshot: the
    command's transaction."""

    rows = _fit_rows(ctx, pool_id, request, ignore, limit=first)
    yield from rows
    if first is not None and len(rows) == first:
        yield from _fit_rows(ctx, pool_id, request, ignore)[first:]


def _fit_rows(
    ctx: Ctx,
    pool_id: str,
    request: Request,
    ignore: str | None,
    *,
    limit: int | None = None,
    free_spot: bool = False,
) -> list[tuple[str, int, int]]:
    """fitting.fit_candidates for one node's share of `request`."""
    return fitting.fit_candidates(
        ctx.db.conn,
        pool_id,
        request.window,
        ignore_reservation=ignore,
        need=request.gpus or 0,
        whole_node=request.node_lease,
        limit=limit,
        free_spot=free_spot,
    )


#: Nodes whose snapshots preemption's planning reads at a time (preemption_snapshots).
PREEMPTION_BATCH = 64


def preemption_snapshots(
    ctx: Ctx,
    pool_id: str,
    request: Request,
    ignore: str | None,
    pool: PoolIndex | None = None,
) -> list[NodeSnapshot]:
    """The snapshots preemption's planning (engine/preempt.py) needs for the answer it would give
    from the whole pool, by name; from `pool` when the command keeps one in memory (fleet_pool),
    else from SQL.

    Only the nodes that could take a share were every spot booking in the window freed: the
    others it would refuse whatever it frees (a no-fit's reason is not used). A gang's members
    come only from topology groups with at least `size` such nodes: no other group can offer a
    gang. A single-node request compares the plans of its first fitting nodes by name only
    (engine/preempt.enough_in_name_order), so those are read PREEMPTION_BATCH at a time until
    that many fit. A pool of 4,000 nodes is not built for a request that finds nothing to
    preempt (a pending gang, at every retry), nor for a regular request waiting on a pool full
    of spot work, whose first 64 fitting nodes are all it needs."""
    window = request.window
    if pool is not None:
        names = pool.preemption_candidates(request, ignore)

        def read(chunk: list[str]) -> list[NodeSnapshot]:
            return pool.snapshots(window, ignore, chunk)

    else:
        rows = _fit_rows(ctx, pool_id, request, ignore, free_spot=True)
        if request.gang_size is None:
            names = sorted(name for name, _, _ in rows)
        else:
            groups = _groups(ctx, pool_id, request.topology_key, rows).values()
            size = request.gang_size
            names = sorted(c.name for members in groups if len(members) >= size for c in members)

        def read(chunk: list[str]) -> list[NodeSnapshot]:
            return repo.snapshots(
                ctx.db.conn, pool_id, window, ignore_reservation=ignore, names=chunk
            )

    if request.gang_size is not None:
        return read(names) if names else []
    batches = (
        read(names[i : i + PREEMPTION_BATCH]) for i in range(0, len(names), PREEMPTION_BATCH)
    )
    return enough_in_name_order(request, batches)


#: At most this many nodes, in name order, are read looking for perfect fits (shortlist.perfect)
#: before the bound-ordered candidate query takes over.
PERFECT_SCAN = 120


@dataclass
class NameScan:
    """What the name-order reading found: `answered` when `fits` are enough to answer (topN
    perfect plans); else the nodes it `planned` and their fits, which the bound order reuses."""

    fits: list[Fit]
    planned: set[str]
    answered: bool


def name_order_scan(
    ctx: Ctx,
    pool_id: str,
    request: Request,
    ignore: str | None,
    exclude: frozenset[str],
    enough: int,
) -> NameScan:
    """Read the pool's usable nodes in name order until `enough` plans score
    shortlist.MAX_SCORE (their best `enough` are then the pool's), every usable node is read,
    or PERFECT_SCAN nodes are. Each node comes with its GPUs booked in the window, so only a node
    a share would leave exactly full (shortlist.could_be_perfect) is planned: a pool packed full
    costs a count per node, not a snapshot. Nodes not schedulable or not reachable fit nowhere."""
    conn = ctx.db.conn
    fits: list[Fit] = []
    planned: set[str] = set()
    after, size, read = "", FIRST_ROUND, 0
    while read < PERFECT_SCAN:
        rows = fitting.usable_after(
            conn,
            pool_id,
            request.window,
            ignore_reservation=ignore,
            after=after,
            limit=min(size, PERFECT_SCAN - read),
        )
        if not rows:
            break  # every usable node is read
        read, after, size = read + len(rows), rows[-1][0], 2 * size
        names = [n for n, g, h, b in rows if shortlist.could_be_perfect(request, g, h, b)]
        if not names:
            continue
        planned.update(names)
        snaps = repo.snapshots(
            conn, pool_id, request.window, ignore_reservation=ignore, names=names
        )
        fits.extend(plan_nodes(request, snaps, exclude=exclude)[0])
        if shortlist.perfect([p for _, p in fits], enough):
            return NameScan(fits, planned, answered=True)
    return NameScan(fits, planned, answered=False)


def commit(
    ctx: Ctx,
    rsv: Reservation,
    chosen: Plan,
    window: Window,
    before_booking: Callable[[Reservation], None] | None = None,
) -> Reservation:
    """Book every member inside one savepoint: the whole gang or nothing. Every member's atoms
    are checked free first (LostRace: none is booked); then `before_booking`, when given, has
    the reservation as it is about to stand, placed, without its allocations (reserve writes
    its row then, once, in its final state); then the members are booked."""
    conn = ctx.db.conn
    charge = rsv.quota_charge
    if rsv.node_lease:  # whole machines: charged exactly what was leased
        charge = sum(len(m.atoms) for m in chosen.members)
    placed = evolve(
        rsv,
        state=State.PLACED,
        during=window,
        allocations=(),
        conditions=(),
        next_attempt_at=None,
        quota_charge=charge,
    )
    with ctx.db.savepoint("place"):
        for member in chosen.members:  # a gang's members are distinct nodes: none books another's
            if repo.atoms_booked(conn, member.node_id, member.atoms, window):
                raise LostRace(member.node_id)
        if before_booking is not None:
            before_booking(placed)
        allocations = tuple(
            repo.insert_allocation(conn, rsv, member.node_id, member.atoms, window)
            for member in chosen.members
        )
    placed = evolve(placed, allocations=allocations)
    if ctx.fleet is not None:
        ctx.fleet.booked(placed)
    return placed


def place_now(
    ctx: Ctx,
    rsv: Reservation,
    window: Window,
    exclude: frozenset[str] = frozenset(),
    before_booking: Callable[[Reservation], None] | None = None,
) -> Reservation | NoFit:
    """Plan and commit, excluding a node that lost a race, up to placement.maxAttempts times.
    `before_booking`: see commit (called once, for the plan that is booked)."""
    locks.lock_pool(ctx.db, rsv.pool_id)  # the lock order: clock row, pool row, victims
    if ctx.fleet is None:  # SQL plans this placement: its candidates come from fresh levels
        fitlevels.refresh(ctx.db.conn, rsv.pool_id, ctx.now)
    excluded = set(exclude)
    outcome: Plan | NoFit = NoFit("no attempt made")
    for _ in range(max(1, ctx.settings.max_attempts)):
        outcome = plan(ctx, rsv, window, frozenset(excluded))
        if isinstance(outcome, NoFit):
            return outcome
        try:
            return commit(ctx, rsv, outcome, window, before_booking)
        except LostRace as lost:
            excluded.add(lost.node_id)
    return outcome if isinstance(outcome, NoFit) else NoFit("placement lost every attempt")


def unschedulable(
    rsv: Reservation, reason: str, message: str, now: int, retry_ms: int
) -> Reservation:
    return evolve(
        rsv,
        state=State.PENDING,
        during=None,
        allocations=(),
        conditions=(Condition("Unschedulable", reason, message),),
        next_attempt_at=now + retry_ms,
    )
