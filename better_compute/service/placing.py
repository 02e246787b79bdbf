"""Plan a reservation with the pure engine, then commit the plan: the shared core of reserve,
pending retries, BookingRepair and preemption."""

from __future__ import annotations

from dataclasses import replace

from better_compute.engine.place import place
from better_compute.model import (
    Condition,
    NoFit,
    Plan,
    Reservation,
    State,
    Window,
)
from better_compute.service.context import Ctx
from better_compute.storage import repo


class LostRace(Exception):
    """A planned atom turned out to be booked already; the node is excluded and planning repeats."""

    def __init__(self, node_id: str) -> None:
        super().__init__(node_id)
        self.node_id = node_id


def plan(
    ctx: Ctx, rsv: Reservation, window: Window, exclude: frozenset[str] = frozenset()
) -> Plan | NoFit:
    snaps = repo.snapshots(ctx.db.conn, rsv.pool_id, window, ignore_reservation=rsv.id)
    return place(
        rsv.request(window),
        snaps,
        seed=ctx.seed(rsv.id, window.start),
        top_n=ctx.settings.top_n,
        exclude=exclude,
    )


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
