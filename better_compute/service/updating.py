"""`update RSV [--start] [--for] [--gpus]`: change a reservation before its window begins
(issue 12), the way Slurm's `scontrol update reservation` and a calendar-mode cloud do.

Everything happens in one write transaction: the new shape is admitted as a fresh draft would be
(policy, quota on the difference, GPU-hour budgets), then re-planned keeping the nodes and atoms
it holds where they still fit (engine/sticky.py), or else planned afresh as a whole. If nothing
fits, CONFLICT says why and the old booking is as it was. A pending reservation takes the new
shape and is retried at once, like a new request.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from better_compute.engine.sticky import keep
from better_compute.errors import Conflict, InvalidInput
from better_compute.lifecycle.tick import retry_window
from better_compute.model import JsonValue, Plan, Reservation, State, Window
from better_compute.service import booking, budgets, calendar, placing, reading, windows
from better_compute.service.admission import check_policy, check_quota, draft_of
from better_compute.service.context import Ctx
from better_compute.storage import repo, webhooks
from better_compute.storage import updating as store
from better_compute.timeparse import MAX_MS, check_time, human_duration, iso, parse_time

CHANGEABLE = frozenset({State.PENDING, State.PLACED})


@dataclass(frozen=True)
class Change:
    """What `update` was asked; None keeps the current value. `start` is TIME text, read against
    the ledger's instant once the write lock is held."""

    start: str | None = None
    duration_ms: int | None = None
    gpus: int | None = None


def validate(change: Change) -> None:
    if change.start is None and change.duration_ms is None and change.gpus is None:
        raise InvalidInput("nothing to change: give --start, --for or --gpus")
    if change.gpus is not None and not 1 <= change.gpus <= booking.MAX_GANG:
        raise InvalidInput(f"--gpus must be from 1 to {booking.MAX_GANG}, got {change.gpus}")
    if change.duration_ms is not None and change.duration_ms <= 0:
        raise InvalidInput("--for must be a positive duration such as 90m or 3d")
    if change.start is not None:
        check_time(change.start)  # its form, before any state is read: bad input is bad input


def may_change(ctx: Ctx, rsv: Reservation) -> None:
    """The one place that decides whether a reservation may still be changed: `pending`, or
    `placed` before its window begins, not being preempted, and not made final by a pool calendar
    policy with `--commit` (service/calendar.py, which refuses cancel and extend alike)."""
    if rsv.state not in CHANGEABLE:
        hint = "use extend to move its end, or release" if rsv.state != State.RELEASED else ""
        raise Conflict(
            f"cannot update {rsv.id}: it is {rsv.state} (allowed: pending, placed before its"
            f" start){'; ' + hint if hint else ''}"
        )
    if rsv.state == State.PLACED and rsv.during is not None and rsv.during.start <= ctx.now:
        raise Conflict(
            f"cannot update {rsv.id}: its window began at {iso(rsv.during.start)}; use extend to"
            " move its end, or release"
        )
    if rsv.preempt_deadline is not None:
        raise Conflict(f"cannot update {rsv.id}: it is being preempted")
    calendar.require_changeable(ctx, rsv, "update")
    # What is left to be overdue is a pending request's time-out (a placed one whose window
    # began, or under a deadline, is refused above): the tick's to release, as extend leaves
    # an ended window.
    if booking.overdue(ctx, rsv) is not None:
        raise Conflict(
            f"cannot update {rsv.id}: it has waited longer than pending.maxWaitMs"
            f" ({human_duration(ctx.settings.pending_max_wait_ms)}); the next tick releases it"
            " as timed out"
        )


def update(ctx: Ctx, rsv_id: str, change: Change) -> Reservation:
    validate(change)
    if change.start is not None:  # past as the command opens the ledger is past under the lock
        _start_ahead(change.start, ctx)
    with ctx.write() as conn:
        old = reading.mine(ctx, rsv_id)
        may_change(ctx, old)
        new = _reshaped(ctx, old, change)
        if (new.start, new.duration_ms, new.gpus) == (old.start, old.duration_ms, old.gpus):
            return old  # nothing changes: no event, no re-plan
        window = _window(ctx, old, new, change)
        new = replace(new, quota_charge=_charge(ctx, old, new))
        _admit(ctx, old, new, window)
        if old.state == State.PENDING:
            store.set_shape(conn, new)
            repo.save_reservation(conn, new)
            _event(ctx, old, new, window=None)
            placed = booking.place_or_pend(ctx, new)
            booking.record_outcome(ctx, placed, previous=new)
        else:
            _replan(ctx, old, new, window)
        if new.start is not None:  # a --commit policy makes the changed booking final
            calendar.record(ctx, new)
        elif old.start is not None:  # moved to now: no --commit makes it final any more
            calendar.forget(ctx, new)
        return repo.get_reservation(conn, rsv_id)


def _reshaped(ctx: Ctx, old: Reservation, change: Change) -> Reservation:
    start = old.start
    if change.start is not None:
        start = _start_ahead(change.start, ctx)
        start = booking.start_kept(start, ctx.now, in_series=old.series_id is not None)
    gpus = change.gpus if change.gpus is not None else old.gpus
    duration = change.duration_ms if change.duration_ms is not None else old.duration_ms
    if max(start or ctx.now, ctx.now) + duration > MAX_MS:
        raise InvalidInput(
            f"that window would end after {iso(MAX_MS)}; use an earlier --start or --for"
        )
    return replace(old, start=start, gpus=gpus, duration_ms=duration)


def _start_ahead(text: str, ctx: Ctx) -> int:
    """--start read at ctx's instant (a relative one from --now, when given), not in the past.
    Checked as the command opens the ledger and again under the lock: time only moves on, and a
    relative start moves with it, so one refused then would be refused under the lock too."""
    start = parse_time(text, ctx.relative_base)
    if start < ctx.now:
        raise InvalidInput(f"--start {iso(start)} is in the past (the ledger is at {iso(ctx.now)})")
    return start


def _window(ctx: Ctx, old: Reservation, new: Reservation, change: Change) -> Window:
    """Where the new shape is planned: as a retry would (retry_window), except that a request
    for now placed from a preemption deadline (its window starts later than now) keeps that
    start when --start is not given: from now it would meet the victims' last minutes."""
    kept = old.during
    placed_later = old.state == State.PLACED and kept is not None and kept.start > ctx.now
    if change.start is None and new.start is None and placed_later and kept is not None:
        return Window(kept.start, kept.start + new.duration_ms)
    return retry_window(new, ctx.now)


def _charge(ctx: Ctx, old: Reservation, rsv: Reservation) -> int:
    """GPUs times the gang size; a node lease until placed: the pool's largest node per member,
    unless only its time changes: then what it holds (it moves to no larger node, Request's
    lease_most), so a new window is not refused for GPUs it would never hold."""
    size = rsv.gang_size or 1
    if rsv.node_lease and rsv.gpus == old.gpus and old.quota_charge > 0:
        return old.quota_charge
    if rsv.node_lease:
        return booking.lease_charge(ctx.db.conn, rsv.pool_id, rsv.gpus, size)
    assert rsv.gpus is not None
    return rsv.gpus * size


def _admit(ctx: Ctx, old: Reservation, new: Reservation, window: Window) -> None:
    """The new shape judged as a new draft would be; quota counts only the difference."""
    conn = ctx.db.conn
    check_policy(conn, ctx.who, draft_of(new))
    name = repo.pool_name(conn, new.pool_id)
    if new.start is not None and new.start == old.start:  # its start was judged at admission
        calendar.admit_reshape(ctx, new, name)
    else:
        calendar.admit(ctx, new, name)  # the pool's calendar policy
    share = new.gpus or 1
    largest, fitting = repo.node_capacity(conn, new.pool_id, new.models, share)
    if share > largest:
        raise InvalidInput(
            f"--gpus {share} per node: the largest node of pool {name} has {largest}"
        )
    if new.gang_size is not None and new.gang_size > fitting:
        raise InvalidInput(
            f"--gpus {share}: pool {name} has {fitting} nodes with {share} or more GPUs, fewer"
            f" than the gang's {new.gang_size}"
        )
    shape = (new.topology, new.topology_key, new.gang_size)
    windows.require_topology(ctx, (new.pool_id, name), new.models, share, shape)
    extra = new.quota_charge - old.quota_charge
    if extra > 0:
        check_quota(conn, new.tenant_id, new.pool_id, name, extra)
    budgets.check(conn, new.tenant_id, new.pool_id, new.quota_charge, window, ctx.now, old.id)


def _afresh(old: Reservation, new: Reservation) -> Reservation:
    """The new shape as planned from scratch. A node lease whose --gpus changed was admitted
    for the pool's largest node (_charge): it may take any node with room for it, not only
    one as large as those it holds (Reservation.lease_most), which left no lease able to grow
    onto a larger node. Otherwise it keeps what it holds as its bound (README)."""
    if new.node_lease and new.gpus != old.gpus:
        return replace(new, allocations=())
    return new


def _replan(ctx: Ctx, old: Reservation, new: Reservation, window: Window) -> None:
    """Keep the nodes and atoms where they fit, else the best fresh plan for the whole gang;
    CONFLICT (nothing written) when neither fits."""
    conn = ctx.db.conn
    request = new.request(window)
    held = {a.node_id: a.atoms for a in old.allocations}
    snaps = repo.snapshots(conn, new.pool_id, window, ignore_reservation=old.id, names=list(held))
    here = {s.node.name: s for s in snaps if s.node.pool_id == new.pool_id}  # not moved away
    chosen: Plan | None = keep(request, here, held)
    with ctx.db.savepoint("reshape"):
        if chosen is not None:
            by_node = {a.node_id: a for a in old.allocations}
            for member in chosen.members:
                alloc = by_node[member.node_id]
                store.rebook(conn, new, alloc.id, member.node_id, member.atoms, window)
            allocations = tuple(
                replace(by_node[m.node_id], atoms=m.atoms, bound=False) for m in chosen.members
            )
            placed = replace(new, during=window, allocations=allocations)
        else:
            fresh = placing.plan(ctx, _afresh(old, new), window)
            if not isinstance(fresh, Plan):
                raise Conflict(
                    f"cannot update {old.id}: the new shape does not fit ({fresh.reason});"
                    " nothing was changed"
                )
            repo.drop_allocations(conn, old.id, ctx.now)
            placed = placing.commit(ctx, new, fresh, window)
        if new.node_lease:  # whole machines: charged exactly what is leased
            placed = replace(placed, quota_charge=sum(len(a.atoms) for a in placed.allocations))
        # BookingRepair checks a new window or new nodes again; the starting notice says
        # {start, nodeIds}, so only a new start or new nodes give another one.
        elsewhere = _nodes(old) != _nodes(placed)
        moved = old.during != window or elsewhere
        if elsewhere or old.during is None or old.during.start != window.start:
            webhooks.forget_start_notice(conn, old.id)
        placed = replace(
            placed,
            lead_checked=old.lead_checked and not moved,
            start_checked=old.start_checked and not moved,
        )
        store.set_shape(conn, placed)
        repo.save_reservation(conn, placed)
        _event(ctx, old, placed, window)


def _shape(rsv: Reservation, window: Window | None) -> dict[str, JsonValue]:
    start = window.start if window is not None else rsv.start
    return {
        "start": start,
        "end": None if start is None else start + rsv.duration_ms,
        "durationMs": rsv.duration_ms,
        "gpus": rsv.gpus,
        "gpuCount": rsv.quota_charge,
    }


def _event(ctx: Ctx, old: Reservation, new: Reservation, window: Window | None) -> None:
    data: dict[str, JsonValue] = {"from": _shape(old, old.during), "to": _shape(new, window)}
    if window is not None:
        data["nodeIds"] = [a.node_id for a in new.allocations]
    ctx.event("reservation.updated", new.tenant_id, new.id, data)


def _nodes(rsv: Reservation) -> list[str]:
    return sorted(a.node_id for a in rsv.allocations)
