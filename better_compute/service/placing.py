"""Plan a reservation with the pure engine, then commit the plan: the shared core of reserve,
pending retries, BookingRepair and preemption."""

from __future__ import annotations

from dataclasses import replace

from better_compute.engine import shortlist
from better_compute.engine.fit import Fit, plan_nodes
from better_compute.engine.gang import pick_gang
from better_compute.engine.place import pick_single, place
from better_compute.model import (
    Condition,
    NoFit,
    Plan,
    Request,
    Reservation,
    State,
    Window,
)
from better_compute.service.context import Ctx
from better_compute.storage import locks, repo


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
    seed, top_n = ctx.seed(rsv.id, window.start), ctx.settings.top_n
    if request.gang_size is not None:
        fits = shortlisted_fits(ctx, rsv.pool_id, request, rsv.id, exclude, enough=None)
        return pick_gang(request, fits, seed=seed, top_n=top_n)
    fits = shortlisted_fits(ctx, rsv.pool_id, request, rsv.id, exclude, enough=max(1, top_n))
    if fits:
        return pick_single(fits, seed=seed, top_n=top_n)
    return full_plan(ctx, rsv, window, exclude)


def full_plan(
    ctx: Ctx, rsv: Reservation, window: Window, exclude: frozenset[str] = frozenset()
) -> Plan | NoFit:
    """Every node of the pool planned: the reference the shortlist must agree with."""
    snaps = repo.snapshots(ctx.db.conn, rsv.pool_id, window, ignore_reservation=rsv.id)
    return place(
        rsv.request(window),
        snaps,
        seed=ctx.seed(rsv.id, window.start),
        top_n=ctx.settings.top_n,
        exclude=exclude,
    )


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
    conn = ctx.db.conn
    order = repo.fit_candidates(  # already in shortlist.best_key order
        conn,
        pool_id,
        request.window,
        ignore_reservation=ignore,
        need=request.gpus or 0,
        whole_node=request.node_lease,
    )
    fits: list[Fit] = []
    done, size = 0, max(FIRST_ROUND, 2 * (enough or 0))
    while done < len(order):
        names = [name for name, _, _ in order[done : done + size]]
        done, size = done + len(names), 2 * size
        snaps = repo.snapshots(
            conn, pool_id, request.window, ignore_reservation=ignore, names=names
        )
        fits.extend(plan_nodes(request, snaps, exclude=exclude)[0])
        following = None
        if done < len(order):
            following = shortlist.best_key(request, shortlist.Candidate(*order[done]))
        if enough is not None and shortlist.settled([p for _, p in fits], enough, following):
            break
    return sorted(fits, key=lambda fit: fit[1].node_id)


def commit(ctx: Ctx, rsv: Reservation, chosen: Plan, window: Window) -> Reservation:
    """Book every member inside one savepoint: the whole gang or nothing."""
    conn = ctx.db.conn
    with ctx.db.savepoint("place"):
        allocations = []
        for member in chosen.members:
            if repo.atoms_booked(conn, member.node_id, member.atoms, window):
                raise LostRace(member.node_id)
            allocations.append(
                repo.insert_allocation(conn, rsv, member.node_id, member.atoms, window)
            )
    charge = rsv.quota_charge
    if rsv.node_lease:  # whole machines: charged exactly what was leased
        charge = sum(len(m.atoms) for m in chosen.members)
    return replace(
        rsv,
        state=State.PLACED,
        during=window,
        allocations=tuple(allocations),
        conditions=(),
        next_attempt_at=None,
        quota_charge=charge,
    )


def place_now(
    ctx: Ctx, rsv: Reservation, window: Window, exclude: frozenset[str] = frozenset()
) -> Reservation | NoFit:
    """Plan and commit, excluding a node that lost a race, up to placement.maxAttempts times."""
    locks.lock_pool(ctx.db.conn, rsv.pool_id)  # the lock order: clock row, pool row, victims
    excluded = set(exclude)
    outcome: Plan | NoFit = NoFit("no attempt made")
    for _ in range(max(1, ctx.settings.max_attempts)):
        outcome = plan(ctx, rsv, window, frozenset(excluded))
        if isinstance(outcome, NoFit):
            return outcome
        try:
            return commit(ctx, rsv, outcome, window)
        except LostRace as lost:
            excluded.add(lost.node_id)
    return outcome if isinstance(outcome, NoFit) else NoFit("placement lost every attempt")


def unschedulable(
    rsv: Reservation, reason: str, message: str, now: int, retry_ms: int
) -> Reservation:
    return replace(
        rsv,
        state=State.PENDING,
        during=None,
        allocations=(),
        conditions=(Condition("Unschedulable", reason, message),),
        next_attempt_at=now + retry_ms,
    )
