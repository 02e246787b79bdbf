"""Preemption of spot work for a regular request that would otherwise wait (PRODUCT.md §5.5).

The victims are computed first by the pure engine, then applied with the placement inside one
savepoint: if any step fails, no spot reservation is touched.
"""

from __future__ import annotations

from dataclasses import replace

from better_compute.engine.preempt import plan_preemption
from better_compute.errors import BetterComputeError
from better_compute.lifecycle import states
from better_compute.model import (
    LIVE_STATES,
    Condition,
    JsonValue,
    Plan,
    Reservation,
    State,
    Window,
)
from better_compute.service import budgets, placing
from better_compute.service.context import Ctx
from better_compute.storage import locks, repo, webhooks
from better_compute.timeparse import MAX_MS

OTHER_TENANT = "preempted by a non-spot reservation"


def notice(victim: Reservation, by: Reservation) -> tuple[str, dict[str, JsonValue]]:
    """What the victim's tenant may read: the preempting id only when it is their own."""
    if victim.tenant_id == by.tenant_id:
        return f"preempted by {by.id}", {"by": by.id}
    return OTHER_TENANT, {}


class _Abort(Exception):
    """A victim no longer qualifies or the placement failed: roll the whole savepoint back."""


def may_preempt(rsv: Reservation) -> bool:
    """Only regular requests preempt: spot work never does, nor a lease of whole machines."""
    return not rsv.spot and not rsv.node_lease


def preemption_window(ctx: Ctx, rsv: Reservation) -> Window | None:
    """The window preempting spot work gives `rsv`: from the notice's deadline (or its own later
    start) for its duration; None when that would end after the end of time. `preview` asks
    the same of its draft."""
    deadline = max(rsv.start or ctx.now, ctx.now + ctx.settings.spot_notice_ms)
    window = Window(deadline, deadline + rsv.duration_ms)
    return None if window.end > MAX_MS else window


def try_preempt(ctx: Ctx, rsv: Reservation) -> Reservation | str | None:
    """Place `rsv` from the deadline by preempting spot reservations; or leave it untouched:
    None when nothing could be preempted, or (str) why its GPU-hour budget holds it back from
    the window a preemption would give it (admitted for a window from now, from the deadline
    it may not fit): it waits `BudgetExceeded`, as preview then promises no preemption."""
    if not may_preempt(rsv):
        return None
    conn = ctx.db.conn
    locks.lock_pool(ctx.db, rsv.pool_id)
    window = preemption_window(ctx, rsv)
    if window is None:
        return None
    pool = placing.fleet_pool(ctx, rsv.pool_id, window)  # a long-running command's memory
    key = (rsv.id, rsv.request(Window(0, rsv.duration_ms)))
    if pool is not None and pool.nothing_to_preempt(key, window):
        return None  # nothing changed since a retry found nothing
    snaps = placing.preemption_snapshots(ctx, rsv.pool_id, rsv.request(window), rsv.id, pool)
    option = plan_preemption(
        rsv.request(window),
        snaps,
    )
    if not isinstance(option, Plan) or not option.victims:
        if pool is not None:
            pool.found_nothing_to_preempt(key, window)
        return None
    over = budgets.over_budget(conn, rsv, window, ctx.now)
    if over is not None:
        return over
    try:
        with ctx.db.savepoint("preempt"):
            if not locks.lock_victims(conn, option.victims):
                raise _Abort("a victim is locked by another transaction")
            for victim_id in option.victims:
                _give_notice(ctx, repo.get_reservation(conn, victim_id), rsv, window.start)
            return placing.commit(ctx, rsv, option, window)
    except (_Abort, placing.LostRace, BetterComputeError):
        return None


def _give_notice(ctx: Ctx, victim: Reservation, by: Reservation, deadline: int) -> None:
    conn = ctx.db.conn
    if not victim.spot or victim.state not in LIVE_STATES or victim.during is None:
        raise _Abort(victim.id)
    message, by_data = notice(victim, by)
    other_tenant = victim.tenant_id != by.tenant_id  # the notice names neither it nor its actor
    if victim.state != State.PLACED or victim.during.start < deadline:
        # Started, or starts before the deadline: cut back to end at it, released then by tick.
        # Never sooner than a deadline it was told already. Planning frees no such booking
        # (model.frees, storage/repo.PREEMPTIBLE): this is the last word if they ever disagree.
        if victim.preempt_deadline is not None and deadline < victim.preempt_deadline:
            raise _Abort(victim.id)
        repo.end_bookings(conn, victim.id, deadline)
        cut = replace(
            victim,
            during=Window(victim.during.start, deadline),
            preempt_deadline=deadline,
            preempted_by=by.id,
            conditions=(Condition("Preempted", "SpotPreempted", message),),
        )
        repo.save_reservation(conn, cut)
        ctx.event(
            "reservation.preempting",
            victim.tenant_id,
            victim.id,
            {"at": deadline, **by_data},
            system=other_tenant,
        )
        return
    # Not started by the deadline: it loses its bookings and waits again, keeping its quota.
    repo.drop_allocations(conn, victim.id, victim.during.start)
    requeued = replace(
        states.move(victim, State.PENDING),
        during=None,
        allocations=(),
        preempted_by=by.id,
        preempt_deadline=None,  # an earlier notice's deadline went with the bookings it cut
        conditions=(Condition("Unschedulable", "SpotPreempted", message),),
        next_attempt_at=ctx.now + ctx.settings.retry_ms,
        lead_checked=False,
        start_checked=False,
    )
    repo.save_reservation(conn, requeued)
    webhooks.forget_start_notice(conn, victim.id)  # placed again, it is noticed again
    ctx.event(
        "reservation.preempted",
        victim.tenant_id,
        victim.id,
        {"requeued": True, **by_data},
        system=other_tenant,
    )
