"""`tick`: the five ordered lifecycle steps at one instant, BookingRepair, and agents' reports."""

from __future__ import annotations

from collections.abc import Callable

from better_compute.errors import Conflict, InvalidInput, NotFound, QuotaExceeded
from better_compute.lifecycle import states
from better_compute.lifecycle.tick import (
    NodeHealth,
    RepairPoint,
    bad_nodes,
    can_bind,
    due_binding,
    due_repair,
    due_retries,
    ended_at,
    kept_window,
    other_groups,
    release_due,
    timed_out,
)
from better_compute.model import Event, JsonValue, ReleaseReason, Reservation, State, Window, evolve
from better_compute.service import authz, booking, metering, notices, placing
from better_compute.service.admission import check_quota
from better_compute.service.authz import require_admin
from better_compute.service.context import NO_NOW_ON_REAL_CLOCK, Ctx
from better_compute.service.fleet import Looked
from better_compute.storage import due, fitlevels, ledger, repo, tickwork, webhooks
from better_compute.storage.repo import Conn
from better_compute.timeparse import iso


def tick(ctx: Ctx, *, shown: bool = True, admin_only: str | None = None) -> list[Event]:
    """One tick, in one transaction; returns the events it wrote (what changed), unless `shown`
    is False: then nothing.

    Anyone may tick (cron): it only does what is due. Its events' actor is `system`. A step of
    `tick --until` on a real clock is an admin's, though: with `admin_only` (what the command
    has written so far), the principal must still be an admin once the lock is held.
    """
    ctx.system = True
    with ctx.write():
        if admin_only is not None:
            ctx.require_still_admin(ctx.db.conn, admin_only)
        first = _last_seq(ctx) if shown else 0
        looked = _steps(ctx)
        if ctx.fleet is None:  # a replay plans from memory (simulate refreshes at its end)
            fitlevels.refresh_pools(ctx.db.conn, ctx.now)
        changes = _shown(ctx, first) if shown else []
    if ctx.fleet is not None:
        ctx.fleet.looked = looked  # committed: the next tick of this replay may rely on it
    return changes


def sweep(ctx: Ctx) -> None:
    """Cron's `tick` is the ledger's janitor too: the temp copy a killed `init --force` or
    `restore` left beside the ledger goes at the next tick, not at the next replace (a review
    found them kept through every other command)."""
    ctx.db.sweep_temps()


def tick_in(ctx: Ctx) -> None:
    """One tick inside the caller's write transaction (a replay's request, service/simulate.py),
    acting at ctx's instant, exactly as tick would in a transaction of its own. It takes no
    savepoint: whatever fails in it rolls back the caller's whole transaction, which a replay
    does not survive, so a savepoint would undo nothing that mattered. Its look for expiring
    notices is kept for the fleet's next tick at once: it commits with the caller's transaction,
    or nothing of this replay does."""
    ctx.system = True
    ctx.act()
    looked = _steps(ctx)
    if ctx.fleet is not None:
        ctx.fleet.looked = looked


def _steps(ctx: Ctx) -> Looked | None:
    """A tick's steps inside its write transaction, at ctx.now; returns what the notices step
    looked at (service/notices.give_due)."""
    settings = ctx.settings
    due = tickwork.due_first(
        ctx.db.conn,
        ctx.now,
        ctx.now - settings.pending_max_wait_ms,
        ctx.now + settings.repair_lead_ms,
    )
    if due.ending:
        _release_due(ctx)
    if due.waited:
        _time_out_pending(ctx)
    if due.retrying:  # step 1 never makes a retry due: it only releases
        _retry_pending(ctx)
        if settings.spot_notice_ms == 0:  # a retry that preempted made its victims due now:
            _release_due(ctx)  # released before the preemptor binds, not by the next tick
    # Steps 1 and 2 add no binding row, and only a retry places one: what due_first saw
    # empty before them is empty still (a release only takes rows away).
    reach: dict[str, bool] = {}  # nodes step 3 found reachable or not, for step 5
    placed = _repair_due(ctx, reach) if due.starting or due.retrying else []
    binding = _start_binding(ctx, placed)
    active = _bind(ctx, binding, reach, others=due.binding) if due.binding or binding else {}
    return notices.give_due(ctx, [r for r in placed if r.id not in binding], active)


def _shown(ctx: Ctx, first: int) -> list[Event]:
    """What changed since event `first`, as far as this principal may see: its tenants' events
    and the fleet's. Anyone may run tick and repair; they learn nothing of other tenants."""
    conn = ctx.db.conn
    seen = authz.visible_tenants(conn, ctx.who)
    return repo.events(conn, tenant=None, reservation=None, since=first, tenants=seen)


def tick_until(
    ctx: Ctx,
    until: int | Callable[[int], int],
    step_ms: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[Event]:
    """The same as running tick at every step from now to `until` (both included).

    `until` is an instant, or how to find it from the instant the ticks start at: a relative
    `--until +10m` without `--now` counts from the instant the first tick acts at, which is read
    with the write lock held (PRODUCT.md §2), not from the instant the command opened the ledger
    at. Another writer may move the ledger on in between (two admins advancing time at once).
    An instant stays put: if the ledger passed it meanwhile, the first tick acts at the ledger's
    time and the rest add nothing, as a tick with an older --now does.

    On a real-clock ledger this moves the ledger's time ahead of the clock for good, so it is
    an admin's decision; on a manual clock it is how time passes.
    """
    with ctx.db.read() as conn:
        state = ledger.clock_state(conn)
    if state.mode == ledger.REAL:
        if ctx.asked_by_flag:
            raise InvalidInput(NO_NOW_ON_REAL_CLOCK)
        require_admin(ctx.who, "tick ahead of the real clock (tick --until)")
    # An older --now would act at the ledger's time anyway (§2): the steps start there.
    first = max(ctx.now, state.last_at)
    instants = _instants(first, until(first) if callable(until) else until, step_ms)
    changes: list[Event] = []
    ctx.db.let_writers_in(first=True)
    real = state.mode == ledger.REAL
    done = 0
    while done < len(instants):
        step = ctx.at(instants[done])
        changes.extend(tick(step, admin_only=_written(instants, done + 1) if real else None))
        ctx.now = step.now  # where the ledger acted last: what the command reports as now
        done += 1
        if done == 1 and callable(until) and step.now != instants[0]:
            # the same count of steps from where it acted (`now` or `+10m`: never before it)
            instants = _instants(step.now, max(until(step.now), step.now), step_ms)
        ctx.db.let_writers_in()  # ticks come back to back: a writer that waits goes first
        if progress is not None:
            progress(done, len(instants))
    return changes


def _instants(first: int, until: int, step_ms: int) -> list[int]:
    """`first`, every step after it, and `until`; refused when `until` is before `first`."""
    if until < first:
        raise InvalidInput(
            f"--until {iso(until)} is before the ledger's time {iso(first)}: time only moves"
            " forward"
        )
    if (until - first) // step_ms > 1_000_000:
        raise InvalidInput("--until/--step make more than a million ticks; use a longer --step")
    instants = list(range(first, until + 1, step_ms))
    if instants[-1] != until:
        instants.append(until)
    return instants


def _written(instants: list[int], done: int) -> str:
    """What `tick --until` has written before step `done` (from 1): a refusal says so."""
    if done == 1:
        return "nothing was written"
    return f"the ticks up to {iso(instants[done - 2])} were written, none after"


def _last_seq(ctx: Ctx) -> int:
    return repo.last_event_seq(ctx.db.conn)


def _release_due(ctx: Ctx) -> None:
    """Step 1: preemption deadlines and ends that have come. What booking.finish does, from
    the few columns a release reads (tickwork.Ending) instead of whole reservations with their
    allocations, and writing only the columns the release changes: the same rows."""
    conn = ctx.db.conn
    for end in tickwork.endings_due(conn, ctx.now):
        reason = release_due(end.state, end.during, end.preempt_deadline, ctx.now)
        if reason is None or end.during is None:
            continue
        at = min(end.during.end, ctx.now)
        repo.end_bookings(conn, end.id, at)
        metering.close_windows(conn, end.id, at)
        tickwork.mark_released(conn, end.id, reason, kept_window(end.during, at))
        data: dict[str, JsonValue] = {"reason": reason.value}
        by = end.preempted_by if reason == ReleaseReason.PREEMPTED else None
        if by is not None and repo.tenant_of(conn, by) == end.tenant_id:
            data["by"] = by  # never name another tenant's reservation
        ctx.event("reservation.released", end.tenant_id, end.id, data)


def _time_out_pending(ctx: Ctx) -> None:
    """Step 1 too: release, oldest first, pending reservations that waited pending.maxWaitMs;
    only those created that long ago can have, so the event log is read for few of them."""
    limit = ctx.settings.pending_max_wait_ms
    for rsv in repo.pending_created_by(ctx.db.conn, ctx.now - limit):
        if timed_out(rsv, repo.pending_since(ctx.db.conn, rsv), ctx.now, limit):
            booking.finish(ctx, rsv, ReleaseReason.TIMEOUT, ctx.now)


def _retry_pending(ctx: Ctx) -> None:
    """Step 2: pending reservations whose next attempt is due, oldest first."""
    pending = repo.pending_due(ctx.db.conn, ctx.now)
    for rsv in due_retries(pending, ctx.now):
        after = booking.place_or_pend(ctx, rsv, _pending_reason(rsv))
        booking.record_outcome(ctx, after, previous=rsv)


def _pending_reason(rsv: Reservation) -> str:
    """A retry that finds no room keeps saying why it first waited (BookingRepairFailed,
    SpotPreempted, NoCapacity). Not BudgetExceeded, which a retry says itself whenever its
    budget holds it back: one past its budget that finds no room waits for capacity, and its
    condition says so (a review found it labelled BudgetExceeded with a capacity message)."""
    reason = rsv.conditions[0].reason if rsv.conditions else "NoCapacity"
    return "NoCapacity" if reason == "BudgetExceeded" else reason


def _repair_due(ctx: Ctx, reach: dict[str, bool]) -> list[Reservation]:
    """Step 3: BookingRepair at start - leadMs (once) and again at the start. Returns the placed
    reservations that start by now + leadMs as this step leaves them (oldest first), which is
    all that steps 4 and 6 read: nothing after this step places a reservation. Fills `reach`
    with whether each node it checked is reachable (a tick changes no node)."""
    lead = ctx.settings.repair_lead_ms
    placed = repo.placed_starting_by(ctx.db.conn, ctx.now + lead)
    after: list[Reservation] = []
    for rsv in placed:
        point = due_repair(rsv, ctx.now, lead)
        if point is None:
            after.append(rsv)
            continue
        marked = evolve(
            rsv,
            lead_checked=True,
            start_checked=rsv.start_checked or point == RepairPoint.START,
        )
        tickwork.mark_checked(ctx.db.conn, rsv.id, marked.lead_checked, marked.start_checked)
        checked = repair_one(ctx, marked, reach)
        if checked is not marked:  # placed again or waiting: read back as stored
            checked = repo.get_reservation(ctx.db.conn, rsv.id)
        if checked.state == State.PLACED:
            after.append(checked)
    return after


def _recharged(conn: Conn, lease: Reservation) -> Reservation:
    """A lease back to pending after a failed repair: charged as a lease not placed (the pool's
    largest node per member), so its size cap (Request.lease_most) admits the nodes it held,
    when the tenant's caps hold the difference; else it keeps what it was charged, and a cap no
    larger. A repair never takes a tenant over its quota."""
    size = lease.gang_size or 1
    charge = booking.lease_charge(conn, lease.pool_id, lease.gpus, size)
    extra = charge - lease.quota_charge
    if extra > 0:
        try:
            check_quota(conn, lease.tenant_id, lease.pool_id, "", extra)
        except QuotaExceeded:
            return lease
    return evolve(lease, quota_charge=charge)


def repair_one(ctx: Ctx, rsv: Reservation, reach: dict[str, bool] | None = None) -> Reservation:
    """Check one placed reservation; if a node went bad, place it again for the same window.
    `reach`, when given, learns whether each node read is reachable."""
    conn = ctx.db.conn
    if rsv.state != State.PLACED or rsv.during is None or rsv.preempt_deadline is not None:
        return rsv  # a spot reservation under notice ends at its deadline: nothing to repair
    # The check needs only the reservation's own nodes; the whole pool only when one went bad.
    names = sorted({a.node_id for a in rsv.allocations})
    maintenance = due.maintenance_on(conn, names, rsv.during)
    health = {n: NodeHealth(*h) for n, h in tickwork.node_health(conn, names).items()}
    if reach is not None:
        reach.update((n, h.reachable) for n, h in health.items())
    bad = bad_nodes(rsv, health, maintenance, ctx.now)
    if not bad:
        return rsv
    # A gang stays on its topology value if it can, else moves whole to another one. Only such
    # a gang needs the pool's nodes (their labels): building them costs about 0.5 s on 4,000
    # nodes, once per reservation a cordon moves.
    others = frozenset[str]()
    if rsv.gang_size and rsv.topology_key:
        others = other_groups(rsv, {n.name: n for n in repo.load_nodes(conn, rsv.pool_id)})
    left: list[JsonValue] = [a.node_id for a in rsv.allocations]
    window = rsv.during
    if window.start < ctx.now < window.end:
        # A tick after the start (cron late, or the ledger's time moved on): only what is to
        # come is placed again. Planning the past part too failed on bookings made of it since,
        # though the pool was free now, or kept a window begun before the repair (a review).
        window = Window(ctx.now, window.end)
    with ctx.db.savepoint("repair"):
        # Every booking goes, as before: a live reservation's bookings are its allocations
        # over its window (it never ran on the ones it leaves).
        repo.drop_allocations(conn, rsv.id, rsv.during.start)
        fresh = evolve(rsv, allocations=(), during=None, lease_cap=rsv.lease_most())
        outcome = placing.place_now(ctx, fresh, window, frozenset(bad) | others)
        if not isinstance(outcome, Reservation) and others:
            outcome = placing.place_now(ctx, fresh, window, exclude=frozenset(bad))
        if isinstance(outcome, Reservation):
            repo.save_reservation(conn, outcome)
            webhooks.forget_start_notice(conn, rsv.id)  # on other nodes, it is noticed again
            ctx.event(
                "reservation.repaired",
                rsv.tenant_id,
                rsv.id,
                {
                    "from": [n for n in left if n not in kept(outcome)],
                    "nodeIds": [a.node_id for a in outcome.allocations],
                    "start": window.start,
                    "end": window.end,
                },
            )
            return outcome
        waiting = placing.unschedulable(
            states.move(fresh, State.PENDING),
            "BookingRepairFailed",
            f"booking repair failed: nodes {', '.join(bad)} can no longer serve it; "
            + outcome.reason,
            ctx.now,
            ctx.settings.retry_ms,
        )
        waiting = evolve(waiting, lead_checked=False, start_checked=False, lease_cap=None)
        if waiting.node_lease:
            waiting = _recharged(conn, waiting)
        repo.save_reservation(conn, waiting)
        webhooks.forget_start_notice(conn, rsv.id)  # placed again, it is noticed again
        ctx.event(
            "reservation.pending",
            rsv.tenant_id,
            rsv.id,
            {
                "reason": "BookingRepairFailed",
                "message": waiting.conditions[0].message,
                "from": left,
                "nextAttemptAt": waiting.next_attempt_at,
            },
        )
        return waiting


def kept(rsv: Reservation) -> set[JsonValue]:
    return {a.node_id for a in rsv.allocations}


def repair(ctx: Ctx, rsv_id: str | None) -> list[Event]:
    """`repair [RSV]`: check one or every placed reservation now, whatever their start.

    Open to anyone, like tick: its events' actor is `system`. One reservation must be visible.
    """
    ctx.system = True
    with ctx.write() as conn:
        first = _last_seq(ctx)
        if rsv_id is not None:
            rsv = booking.mine(ctx, rsv_id)
            states.require(rsv, frozenset({State.PLACED}), "repair")
            targets = [rsv]
        else:  # the others are fine as they are: repair_one would return each unchanged
            targets = tickwork.placed_on_suspect_nodes(conn)
        for rsv in targets:
            repair_one(ctx, rsv)
        return _shown(ctx, first)


def _start_binding(ctx: Ctx, placed: list[Reservation]) -> dict[str, Reservation]:
    """Step 4: placed reservations whose start has come; nodes' desired state lists them.
    `placed` is what step 3 left (a superset, oldest first). Returns those moved, as they now
    are. Their rows still say placed: step 5, which follows in the same transaction and makes
    most of them active at once, writes each row's state once, binding or active (a replay
    starts thousands; each write of the state moves the row in every index on it)."""
    moved = {}
    for rsv in placed:
        if due_binding(rsv, ctx.now):
            moved[rsv.id] = states.move(rsv, State.BINDING)
            ctx.event(
                "reservation.binding",
                rsv.tenant_id,
                rsv.id,
                {"nodeIds": [a.node_id for a in rsv.allocations]},
            )
    return moved


def _save_move(ctx: Ctx, rsv: Reservation) -> None:
    """Save a reservation read as stored that states.move has moved: the state is all that
    changed (repo.save_reservation would write the same row, every column encoded again)."""
    tickwork.set_state(ctx.db.conn, rsv.id, rsv.state)


def _auto_bind(ctx: Ctx, pool_id: str) -> bool:
    own = repo.pool_auto_bind(ctx.db.conn, pool_id)
    return ctx.settings.auto_bind if own is None else own


def _bind(
    ctx: Ctx, moved: dict[str, Reservation], known: dict[str, bool], *, others: bool = True
) -> dict[str, Reservation]:
    """Step 5: autoBind reachable nodes; a reservation with every allocation bound is active.
    `moved`: those step 4 has just moved to binding, their rows not yet written (this step
    writes each one's state: active, or binding when it must wait); the others binding are
    read, unless `others` says there are none (due_first saw no binding row, and steps 1 to 4
    write none: a replay's tick that starts what was just placed asks nothing more).
    `known`: nodes whose reachability this tick has read (only the others are read). Returns
    those it made active, as stored."""
    conn = ctx.db.conn
    binding = tickwork.ids_in_state(conn, State.BINDING.value) if others else []
    waiting = tickwork.reservations_named(conn, binding)
    auto: dict[str, bool] = {}
    active: dict[str, Reservation] = {}
    for rsv in sorted([*waiting, *moved.values()], key=lambda r: r.seq):
        if rsv.pool_id not in auto:
            auto[rsv.pool_id] = _auto_bind(ctx, rsv.pool_id)
        names = {a.node_id for a in rsv.allocations}
        reach = {n: known[n] for n in names if n in known}
        reach.update(tickwork.reachable(conn, sorted(names - reach.keys())))
        allocations = []
        for alloc in rsv.allocations:
            if not alloc.bound and can_bind(reach[alloc.node_id], auto[rsv.pool_id]):
                repo.set_bound(conn, alloc.id)
                alloc = evolve(alloc, bound=True)
            allocations.append(alloc)
        done = _activate(ctx, evolve(rsv, allocations=tuple(allocations)))
        if done is not None:
            active[rsv.id] = done
        elif rsv.id in moved:
            _save_move(ctx, rsv)  # binding, until its nodes are reachable or report bound
    return active


def activate_if_bound(ctx: Ctx, rsv_id: str) -> None:
    _activate(ctx, repo.get_reservation(ctx.db.conn, rsv_id))


def _activate(ctx: Ctx, rsv: Reservation) -> Reservation | None:
    """A binding reservation (as stored) whose every allocation is bound becomes active: the
    active reservation as stored, or None when it stays as it is."""
    if not (rsv.state == State.BINDING and all(a.bound for a in rsv.allocations)):
        return None
    active = states.move(rsv, State.ACTIVE)
    _save_move(ctx, active)
    metering.open_windows(ctx.db.conn, active, ctx.now)
    ctx.event(
        "reservation.active",
        rsv.tenant_id,
        rsv.id,
        {"nodeIds": [a.node_id for a in rsv.allocations]},
    )
    return active


def report_bound(ctx: Ctx, node: str, rsv_id: str) -> Reservation:
    """What a node agent calls once it has bound its devices for a reservation. The agent acts
    for the reservation's tenant (in practice, an admin account): the answer prints it."""
    with ctx.write() as conn:
        repo.get_node(conn, node)
        rsv = booking.mine(ctx, rsv_id)
        if rsv.state not in (State.BINDING, State.ACTIVE):
            raise Conflict(
                f"cannot report {rsv_id} bound on {node}: it is {rsv.state}; nodes bind once"
                " `tick` has moved it to binding"
            )
        alloc = next((a for a in rsv.allocations if a.node_id == node), None)
        if alloc is None:
            raise NotFound(f"reservation {rsv_id} has no allocation on node {node}")
        came = ended_at(rsv.during, rsv.preempt_deadline, ctx.now)
        if rsv.state == State.BINDING and came is not None:
            # A manual clock's next tick may still be earlier than that instant: say which.
            raise Conflict(
                f"cannot report {rsv_id} bound on {node}: its end or preemption deadline came at"
                f" {iso(came)}; a tick at or after that instant releases it"
            )
        repo.set_bound(conn, alloc.id)
        activate_if_bound(ctx, rsv_id)
        return repo.get_reservation(conn, rsv_id)
