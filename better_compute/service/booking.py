"""Reserving: reserve, preview, get, list, cancel, extend, release."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from better_compute.engine.explain import explain as explain_plan
from better_compute.engine.gang import rank_gangs
from better_compute.engine.preempt import plan_preemption
from better_compute.engine.search import Ask
from better_compute.errors import Conflict, InvalidInput
from better_compute.inventory import MAX_LABEL_KEY, MODEL_RE, normal_model
from better_compute.lifecycle import states
from better_compute.lifecycle.tick import kept_window, release_due, retry_window, timed_out
from better_compute.model import (
    NVLINK_ALL,
    SERIES_MARK,
    Binding,
    Condition,
    JsonValue,
    NodePlan,
    NoFit,
    Plan,
    ReleaseReason,
    Reservation,
    State,
    Window,
    evolve,
)
from better_compute.service import (
    authz,
    budgets,
    calendar,
    finding,
    listing,
    metering,
    placing,
    reading,
    windows,
)
from better_compute.service.admission import Draft, check_policy, check_quota, draft_of
from better_compute.service.context import Ctx
from better_compute.service.preemption import may_preempt, preemption_window, try_preempt
from better_compute.storage import finding as finding_store
from better_compute.storage import fleet, repo, simulation
from better_compute.storage.conn import Conn, Row
from better_compute.timeparse import MAX_MS, iso, parse_time

MAX_GANG = 64


@dataclass(frozen=True)
class ReserveArgs:
    tenant: str
    pool: str | None
    gpus: int | None
    duration_ms: int
    models: tuple[str, ...] = ()
    topology: str | None = None
    gang: int | None = None
    topology_key: str | None = None
    start: int | None = None
    spot: bool = False
    node_lease: bool = False
    key: str | None = None
    #: How --start was written when it was relative to now (`+2h`): a retry of the same command
    #: line later is the same request, so the key compares this text rather than the instant.
    #: Without a `start`, the write reads it at the instant it acts at (at_acting_instant).
    start_text: str | None = None
    #: `--start-range FROM..TO` (and `--duration-range MIN..MAX`): book the earliest window that
    #: fits (service/calendar.py). Compared as written on a key's reuse.
    start_range: str | None = None
    duration_range: str | None = None
    #: What people find it by (service/finding.py); not part of placement.
    name: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    #: `--every` as given (service/series.Repeat.written) when this is a series: compared on a
    #: key's reuse with the rest, so another --every, --count or --until is another request.
    series: tuple[tuple[str, object], ...] | None = None

    def __post_init__(self) -> None:
        # Model names compare without regard to case: stored and compared lowercased, sorted.
        object.__setattr__(self, "models", tuple(sorted({normal_model(m) for m in self.models})))


def validate(args: ReserveArgs) -> None:
    """Flag combinations that no database state could make valid."""
    if args.gpus is None and not args.node_lease:
        raise InvalidInput("--gpus is required (a number of GPUs per node, 1 or more)")
    if args.gpus is not None and not 1 <= args.gpus <= 64:
        raise InvalidInput(f"--gpus must be from 1 to 64, got {args.gpus}")
    if args.gang is not None and not 2 <= args.gang <= MAX_GANG:
        raise InvalidInput(f"--gang must be from 2 to {MAX_GANG} nodes, got {args.gang}")
    key = args.topology_key
    if key is not None and (
        not key.strip() or "=" in key or len(key) > MAX_LABEL_KEY or not key.isprintable()
    ):
        raise InvalidInput(
            f"--topology-key {key[:40]!r} must name a label key (no '=', at most"
            f" {MAX_LABEL_KEY} printable characters), such as fabric.domain or rack"
        )
    for model in args.models:
        if not MODEL_RE.fullmatch(model):
            raise InvalidInput(f"--model {model[:40]!r} is not a model name (like h100)")
    if args.topology_key is not None and args.gang is None:
        raise InvalidInput("--topology-key applies only to a gang; add --gang SIZE")
    if args.topology not in (None, NVLINK_ALL):
        raise InvalidInput(f"--topology must be {NVLINK_ALL}, got {args.topology!r}")
    if args.spot and args.node_lease:
        raise InvalidInput("--spot and --node-lease cannot be combined: node leases are never spot")
    if args.duration_ms <= 0:
        raise InvalidInput("--for must be a positive duration such as 90m or 3d")
    finding.check_name(args.key, "--key", finding.MAX_KEY, finding.MAX_KEY_BYTES)  # tables, events
    if args.start_range is not None and (args.start is not None or args.start_text is not None):
        raise InvalidInput("give --start or --start-range, not both")
    if args.duration_range is not None and args.start_range is None:
        raise InvalidInput("--duration-range needs --start-range FROM..TO")

    finding.check_name(args.name)


def _params(args: ReserveArgs, pool_id: str) -> str:
    """The canonical request that an idempotency key is compared on (a name, labels and ranges
    only when given, so requests from before they existed still compare equal)."""
    tags: dict[str, object] = {"name": args.name} if args.name is not None else {}
    if args.labels:
        tags["labels"] = dict(args.labels)
    if args.start_range is not None:
        tags["startRange"] = args.start_range
    if args.duration_range is not None:
        tags["durationRange"] = args.duration_range
    if args.series is not None:
        tags["series"] = dict(args.series)
    return json.dumps(
        {
            **tags,
            "pool": pool_id,
            "gpus": args.gpus,
            "models": list(args.models),
            "topology": args.topology,
            "gang": args.gang,
            "topologyKey": args.topology_key,
            "spot": args.spot,
            "binding": "node" if args.node_lease else "device",
            "durationMs": args.duration_ms,
            "start": args.start,
            "startText": args.start_text,
        },
        sort_keys=True,
    )


def _same_request(old: str, new: str) -> bool:
    """Equal parameters; the start matches as an instant, or as the same relative text (`+2h`),
    so both a retried command line and the same instant written another way are the same request;
    `--start now` also matches no --start. A series' --until matches the same way. A series
    occurrence booked before series were compared whole has no `series`: it is compared without."""
    before, after = json.loads(old), json.loads(new)
    if (_is_now(before) and after.get("start") is None) or (
        _is_now(after) and before.get("start") is None
    ):
        before["start"] = after["start"] = before["startText"] = after["startText"] = None
    if not _same_time(before, after, "start", "startText"):
        return False
    if "series" not in before:
        after.pop("series", None)
    if "series" in before and "series" in after:
        old_series, new_series = before.pop("series"), after.pop("series")
        if not _same_time(old_series, new_series, "until", "untilText"):
            return False
        if old_series != new_series:
            return False
    return bool(before == after)


def _is_now(params: dict[str, Any]) -> bool:
    return str(params.get("startText") or "").strip().lower() == "now"


def _same_time(before: dict[str, Any], after: dict[str, Any], at: str, text: str) -> bool:
    """Whether `at` is the same instant, or was written as the same relative `text`; both are
    taken out of the two, which then compare on the rest."""
    old_text, new_text = before.pop(text, None), after.pop(text, None)
    old_at, new_at = before.pop(at, None), after.pop(at, None)
    return bool(old_at == new_at or (old_text is not None and old_text == new_text))


def _charge(ctx: Ctx, args: ReserveArgs, pool_id: str) -> int:
    """GPUs times the gang size. A node lease holds whole machines whatever --gpus says (that is
    only a minimum node size): until placed it is charged the pool's largest node per member, then
    exactly the GPUs it leased."""
    size = args.gang or 1
    if not args.node_lease:
        assert args.gpus is not None  # validate() guarantees it
        return args.gpus * size
    return lease_charge(ctx.db.conn, pool_id, args.gpus, size)


def lease_charge(conn: Conn, pool_id: str, gpus: int | None, size: int) -> int:
    """A node lease not placed (yet, or again): the pool's largest node (at least --gpus) per
    member; Request.lease_most keeps it off any larger node."""
    return max(repo.largest_node_size(conn, pool_id), gpus or 0) * size


def start_kept(start: int | None, now: int, *, in_series: bool) -> int | None:
    """The start a request keeps. One at or before now (`--start now`, or a time already past)
    asks for now, and is booked from now: the same request as no --start (README), so it is not
    a calendar request and a pool's calendar policy does not judge it. A series' occurrences
    keep their starts: `--every` makes every one a calendar request. reserve, preview and
    update all take a start through here."""
    return None if start is not None and start <= now and not in_series else start


def for_now(ctx: Ctx, args: ReserveArgs) -> ReserveArgs:
    """`args` with the start it keeps (start_kept); the key still compares it as written."""
    start = start_kept(args.start, ctx.now, in_series=args.series is not None)
    return args if start == args.start else replace(args, start=start)


def _draft(args: ReserveArgs, pool_id: str, charge: int) -> Draft:
    return Draft(
        tenant_id=args.tenant,
        pool_id=pool_id,
        gpu_count=charge,
        gang_size=args.gang or 1,
        spot=args.spot,
        duration_ms=args.duration_ms,
        start=args.start,
    )


def _new_reservation(
    ctx: Ctx, args: ReserveArgs, pool_id: str, charge: int, rsv_id: str, seq: int
) -> Reservation:
    return Reservation(
        id=rsv_id,
        seq=seq,
        tenant_id=args.tenant,
        pool_id=pool_id,
        state=State.PENDING,
        gpus=args.gpus,
        models=args.models,
        topology=args.topology,
        gang_size=args.gang,
        topology_key=args.topology_key,
        spot=args.spot,
        binding=Binding.NODE if args.node_lease else Binding.DEVICE,
        duration_ms=args.duration_ms,
        start=args.start,
        during=None,
        conditions=(),
        quota_charge=charge,
        idempotency_key=args.key,
        release_reason=None,
        created_at=ctx.now,
        next_attempt_at=None,
        principal=ctx.principal,
        name=args.name,
        labels=args.labels,
    )


def placed_data(rsv: Reservation) -> dict[str, JsonValue]:
    assert rsv.during is not None
    return {
        "nodeIds": [a.node_id for a in rsv.allocations],
        "start": rsv.during.start,
        "end": rsv.during.end,
    }


def place_or_pend(ctx: Ctx, rsv: Reservation, reason_kind: str = "NoCapacity") -> Reservation:
    """Try to place now; a regular request that does not fit may preempt spot work; else pending.
    Pending too, `BudgetExceeded`, while the window would take its tenant over a GPU-hour
    budget (budgets.over_budget)."""
    window = retry_window(rsv, ctx.now)
    if window.end > MAX_MS:  # admitted while it fitted before the end of time: now it cannot
        why = f"placed from {iso(window.start)} it would end after {iso(MAX_MS)}, the last instant"
        return placing.unschedulable(rsv, reason_kind, why, ctx.now, ctx.settings.retry_ms)
    over = budgets.over_budget(ctx.db.conn, rsv, window, ctx.now)
    if over is not None:
        return placing.unschedulable(rsv, "BudgetExceeded", over, ctx.now, ctx.settings.retry_ms)
    outcome = placing.place_now(ctx, rsv, window)
    if isinstance(outcome, Reservation):
        return outcome
    return _pend_or_preempt(ctx, rsv, outcome.reason, reason_kind)


def _pend_or_preempt(
    ctx: Ctx, rsv: Reservation, reason: str, reason_kind: str = "NoCapacity"
) -> Reservation:
    """What a request that fits nowhere now becomes: placed by preempting spot work (regular
    requests only), or pending with why."""
    preempted = try_preempt(ctx, rsv)  # None at once for work that may not preempt
    if isinstance(preempted, Reservation):
        return preempted
    if preempted is not None:  # a preemption would place it where its budget does not hold
        return placing.unschedulable(
            rsv, "BudgetExceeded", preempted, ctx.now, ctx.settings.retry_ms
        )
    return placing.unschedulable(rsv, reason_kind, reason, ctx.now, ctx.settings.retry_ms)


def record_outcome(
    ctx: Ctx, rsv: Reservation, previous: Reservation | None = None, *, saved: bool = False
) -> None:
    """Save a reservation after a placement attempt (unless its row is `saved` as it stands)
    and log what changed. A retry that left it pending wrote nothing of it yet, so `previous`
    is the row as stored: only what the retry changed is written (its next attempt)."""
    if not saved:
        stored = previous if rsv.state == State.PENDING else None
        repo.save_reservation(ctx.db.conn, rsv, stored=stored)
    if rsv.state == State.PLACED:
        ctx.event("reservation.placed", rsv.tenant_id, rsv.id, placed_data(rsv))
    elif previous is None or _news(previous.conditions, rsv.conditions):
        message = rsv.conditions[0].message if rsv.conditions else ""
        reason = rsv.conditions[0].reason if rsv.conditions else ""
        ctx.event(
            "reservation.pending",
            rsv.tenant_id,
            rsv.id,
            {"reason": reason, "message": message, "nextAttemptAt": rsv.next_attempt_at},
        )


def _news(before: tuple[Condition, ...], after: tuple[Condition, ...]) -> bool:
    """Whether a retry's condition is worth an event. A budget's message moves with time (how
    much more the request needs, the period's end) while nothing changes for the reservation:
    it waits `BudgetExceeded` until its reason changes (a review counted an event every 30 s).
    `get` shows the latest message all the same."""
    if before and after and before[0].reason == after[0].reason == "BudgetExceeded":
        return before[0].type != after[0].type  # only a budget says BudgetExceeded (ticking)
    return before != after


def check_horizon(ctx: Ctx, args: ReserveArgs) -> None:
    """Every instant must be printable: the window asked for ends in year 9999."""
    check_horizon_at(ctx.now, args)


def check_horizon_at(now: int, args: ReserveArgs, fix: str = "an earlier --start or --for") -> None:
    """check_horizon for a request acting at `now` (simulate checks each line before writing;
    `fix` says what to change, in the words of where the request came from). The window a
    preemption would give a regular request, after the spot notice, is judged where it is made
    (preemption_window: none past the end of time); adding the notice here refused a `--start`
    window that `advice` and `--start-range` book (a review)."""
    latest_end = max(args.start or now, now) + args.duration_ms
    if latest_end > MAX_MS:
        raise InvalidInput(f"that window would end after {iso(MAX_MS)}; use {fix}")


def _admit(ctx: Ctx, args: ReserveArgs) -> tuple[Row, int]:
    """What reserve and preview both check first: the pool, the tenant, the policy; the charge."""
    conn = ctx.db.conn
    pool = repo.find_pool(conn, args.pool)
    repo.require_tenant(conn, args.tenant)
    charge = _charge(ctx, args, pool["id"])
    check_policy(conn, ctx.who, _draft(args, pool["id"], charge))
    return pool, charge


def _require_possible(ctx: Ctx, args: ReserveArgs, pool: Row) -> None:
    """Refuse what no node of the pool could ever hold, whatever its state (cordoned, unhealthy
    or booked nodes count): waiting could never place it, and it would hold quota meanwhile.
    Checked after policy (which may refuse the principal outright) and before quota: a request
    no pool could ever hold is wrong whatever the tenant holds."""
    share, enough = args.gpus or 1, args.gang or 1
    index = None
    if ctx.fleet is not None:  # a long-running command's fleet in memory (service/fleet.py)
        version = simulation.data_version_of(ctx.db)
        index = ctx.fleet.index(ctx.db.conn, pool["id"], ctx.now, version=version)
        largest, fitting_nodes = index.capacity(args.models, share)
    elif fleet.nodes_holding(ctx.db.conn, pool["id"], args.models, share, enough) >= enough:
        largest, fitting_nodes = share, enough  # enough to pass: from the first nodes that do
    else:
        largest, fitting_nodes = repo.node_capacity(ctx.db.conn, pool["id"], args.models, share)
    gpus = windows.gpus_of(args.models)
    if share > largest:
        raise InvalidInput(
            f"--gpus {share} per node: the largest node of pool {pool['name']} has {largest} {gpus}"
        )
    if args.gang is not None and args.gang > fitting_nodes:
        raise InvalidInput(
            f"--gang {args.gang}: pool {pool['name']} has {fitting_nodes} nodes with {share} or"
            f" more {gpus}, so a gang is at most {fitting_nodes} nodes"
        )
    shape = (args.topology, args.topology_key, args.gang)
    windows.require_topology(ctx, (pool["id"], pool["name"]), args.models, share, shape, index)


def replayed(ctx: Ctx, args: ReserveArgs) -> Reservation | None:
    """A key already used by the tenant: the same request returns its reservation as it is (even
    if a policy's limits or the pools changed since), other parameters are a CONFLICT (PRODUCT.md
    §7). Only to a principal that acts for the tenant: to anyone else a key is no way to learn
    whether it was used (admission refuses them as if it was not). A key another principal used
    is this principal's request too, judged by its own policy (§6): a spot-only principal is
    not told that the regular reservation it asked for is booked. A retry of one's own request
    is not judged again, so a limit lowered since does not turn a success into a refusal."""
    if args.key is None:
        return None
    conn = ctx.db.conn
    repo.require_tenant(conn, args.tenant)
    if not authz.may_act_for(conn, ctx.who, args.tenant):
        return None
    existing = repo.reservation_by_key(conn, args.tenant, args.key)
    if existing is None:
        if args.series is None:
            _require_single_key(conn, args.tenant, args.key)
        return None
    rsv, old_params = existing
    pool_id = repo.find_pool(conn, args.pool)["id"] if args.pool is not None else rsv.pool_id
    if not _same_request(old_params, _params(args, pool_id)):
        raise Conflict(
            f"key {args.key!r} was used by {rsv.id} with other parameters;"
            " use a new --key for a new request"
        )
    if rsv.principal != ctx.principal:
        check_policy(conn, ctx.who, _draft(args, pool_id, _charge(ctx, args, pool_id)))
    return rsv


def reserve(ctx: Ctx, args: ReserveArgs, *, read_back: bool = True) -> Reservation:
    validate(args)
    read_at(ctx, args)  # as the command opened the ledger: bad input is refused before the lock
    if args.start_range is not None:  # malformed, inverted or wholly past then: so under the lock
        calendar.read_ranges(ctx, args.start_range, args.duration_range, args.duration_ms)
    with ctx.write():
        return reserve_in(ctx, read_at(ctx, args), read_back=read_back)


def read_at(ctx: Ctx, args: ReserveArgs) -> ReserveArgs:
    """`args` at ctx's instant (at_acting_instant), its window checked against the end of time.
    Before the write, at the instant the command opened the ledger, so that a window past the
    end of time is INVALID_INPUT at once, not after a wait for the lock (or UNAVAILABLE when the
    lock never came: a review); then again in the write, at the instant it acts at."""
    args = at_acting_instant(ctx, args)
    check_horizon(ctx, args)
    return args


def at_acting_instant(ctx: Ctx, args: ReserveArgs) -> ReserveArgs:
    """`args` with a relative --start (`+1h`, `now`) read against the instant the write acts at,
    with its lock held (PRODUCT.md §2): reserve's command line leaves such a start unread (a
    `start_text` without a `start`). Read when the command opened the ledger, a wait for the
    lock shortened a `+1h` lead, and a manual clock moved meanwhile (a replay, another admin's
    tick) made it a start for now (a review). A start already read stays as it is."""
    if args.start is not None or args.start_text is None:
        return args
    return replace(args, start=parse_time(args.start_text, ctx.now))


def _require_single_key(conn: Conn, tenant: str, key: str) -> None:
    """A new key for one reservation: without the mark that numbers a series' occurrences
    (a ledger's older keys may have it, and still replay), and not the key of a series."""
    if SERIES_MARK in key:
        raise InvalidInput(
            f"--key must not contain {SERIES_MARK!r}: it numbers the occurrences of a series"
            f" (KEY{SERIES_MARK}1, KEY{SERIES_MARK}2, …)"
        )
    first = repo.reservation_by_key(conn, tenant, occurrence_key(key, 1))
    if first is not None and first[0].series_id is not None:
        raise Conflict(
            f"key {key!r} names a series (reserve --every); use a new --key for a new request"
        )


def occurrence_key(key: str, i: int) -> str:
    """The key of occurrence i (from 1) of a series booked with `key`."""
    return f"{key}{SERIES_MARK}{i}"


def reserve_in(
    ctx: Ctx, args: ReserveArgs, *, read_back: bool = True, same_as: ReserveArgs | None = None
) -> Reservation:
    """reserve inside the caller's write transaction (a recurring series books several).

    The answer is read back as stored (allocations in their stored order), unless `read_back`
    is False (simulate, which needs only its id and seq): then it is the value just written.
    `same_as`: the request a key's reuse is compared with, when not `args` itself (a series'
    occurrence is compared as the whole series' command)."""
    conn = ctx.db.conn
    replay = replayed(ctx, args)
    if replay is not None:
        return replay
    written, args = args, for_now(ctx, args)
    pool, charge = _admit(ctx, args)
    params = _params(same_as or written, pool["id"])
    _require_possible(ctx, args, pool)
    check_quota(conn, args.tenant, pool["id"], pool["name"], charge)
    rsv_id, seq = repo.next_id(conn, "rsv"), repo.next_seq(conn, "reservations")
    rsv = _new_reservation(ctx, args, pool["id"], charge, rsv_id, seq)
    rsv = calendar.admit(ctx, rsv, pool["name"], args.start_range, args.duration_range)
    budgets.check_reservation(conn, rsv, ctx.now)

    def create(row: Reservation) -> None:
        """The reservation's row, its calendar record, its tags and `reservation.created`."""
        repo.insert_reservation(conn, row, params)
        calendar.record(ctx, row)
        if args.name is not None or args.labels:
            finding_store.set_tags(conn, row.id, args.name, args.labels)
        ctx.event(
            "reservation.created",
            row.tenant_id,
            row.id,
            {
                "gpuCount": charge,
                "spot": row.spot,
                "binding": row.binding.value,
                "name": args.name,
                "labels": dict(args.labels),
            },
        )

    rsv, saved = _place_new(ctx, rsv, create)
    record_outcome(ctx, rsv, saved=saved)
    return repo.get_reservation(conn, rsv.id) if read_back else rsv


def _place_new(
    ctx: Ctx, rsv: Reservation, create: Callable[[Reservation], None]
) -> tuple[Reservation, bool]:
    """place_or_pend for a request not yet written, which `create` writes. Its row is written
    once, as it ends up, where the outcome is known before anything else is written: placed at
    once (create runs once the atoms are checked free, before they are booked) or left pending
    without a preemption to try. A preemption writes its victims' notices before booking, and
    those come after `reservation.created`: that row is written pending first, then saved.
    Returns the outcome and whether its row is written as it stands."""
    window = retry_window(rsv, ctx.now)
    outcome = placing.place_now(ctx, rsv, window, before_booking=create)
    if isinstance(outcome, Reservation):
        return outcome, True
    if may_preempt(rsv):
        create(rsv)
        return _pend_or_preempt(ctx, rsv, outcome.reason), False
    pending = _pend_or_preempt(ctx, rsv, outcome.reason)  # pending: it cannot preempt
    create(pending)
    return pending, True


# ---------------------------------------------------------------- preview


@dataclass(frozen=True)
class Preview:
    fits: bool
    candidates: tuple[NodePlan, ...]
    reason: str | None
    preemptible: tuple[int, int] | None  # (reservations, startsAt)
    window: Window
    #: With --start-range: the ranges searched (after now and the pool's policy); `window` is
    #: the earliest window found, or, when none fits, the first one asked for.
    searched: Ask | None = None


def preview(ctx: Ctx, args: ReserveArgs) -> Preview:
    validate(args)
    check_horizon(ctx, args)
    with ctx.db.read() as conn:
        args = for_now(ctx, args)
        pool, charge = _admit(ctx, args)
        _require_possible(ctx, args, pool)
        check_quota(conn, args.tenant, pool["id"], pool["name"], charge)
        # Preview takes no id: a draft named "preview" plans exactly as the real request would.
        draft = _new_reservation(ctx, args, pool["id"], charge, "preview", 0)
        # A start range settles the window as reserve would; a calendar policy judges it too.
        settled = calendar.settle(ctx, draft, pool["name"], args.start_range, args.duration_range)
        draft, searched = settled.rsv, settled.searched
        window = retry_window(draft, ctx.now)
        if not settled.found:  # reserve refuses (CONFLICT): it never waits or preempts for one
            return Preview(False, (), settled.no_window(pool["name"]), None, window, searched)
        budgets.check_reservation(conn, draft, ctx.now)
        request = draft.request(window)
        outcome: Plan | NoFit
        if request.gang_size is None:
            # One shortlist answers both: a node fits (the plan reserve would make exists) and
            # the best topN. None fits: the full planner words why (placing.plan does the same).
            top = max(1, ctx.settings.top_n)
            fits = placing.shortlisted_fits(ctx, draft.pool_id, request, None, enough=top)
            if fits:
                plans = sorted((plan for _, plan in fits), key=lambda p: (-p.score, p.node_id))
                return Preview(True, tuple(plans[:top]), None, None, window, searched)
            outcome = placing.full_plan(ctx, draft, window)
            best = outcome.members if isinstance(outcome, Plan) else ()
        else:  # a gang: the members of the best gang, from the fits its plan chose from
            outcome, fits = placing.gang_plan(ctx, draft, window)
            gangs = rank_gangs(request, fits) if isinstance(outcome, Plan) else []
            best = gangs[0].members if gangs else ()
        if isinstance(outcome, Plan):
            return Preview(True, best, None, None, window, searched)
        preemptible = None
        late = preemption_window(ctx, draft) if may_preempt(draft) else None
        if late is not None:  # what reserve's try_preempt would do, without doing it
            snaps = placing.preemption_snapshots(ctx, pool["id"], draft.request(late), None)
            option = plan_preemption(draft.request(late), snaps)
            if (
                isinstance(option, Plan)
                and option.victims
                and budgets.over_budget(conn, draft, late, ctx.now) is None
            ):
                preemptible = (len(option.victims), late.start)
        return Preview(False, (), outcome.reason, preemptible, window, searched)


def previewed(args: ReserveArgs, p: Preview) -> ReserveArgs:
    """The request for the window a preview answered (a start range's window found)."""
    if args.start_range is None:
        return args
    return replace(
        args,
        start=p.window.start,
        duration_ms=p.window.duration,
        start_range=None,
        duration_range=None,
    )


# ---------------------------------------------------------------- reading


# get and mine live in service/reading.py (no placement code to load); kept here by name.
get = reading.get
mine = reading.mine


# list lives in service/listing.py (no placement code to load); kept here by name.
list_reservations = listing.reservations


# ---------------------------------------------------------------- changing


def finish(ctx: Ctx, rsv: Reservation, reason: ReleaseReason, at: int) -> Reservation:
    """Release a reservation at `at`: bookings from then on go back, usage closes, quota refunds."""
    conn = ctx.db.conn
    repo.end_bookings(conn, rsv.id, at)
    metering.close_windows(conn, rsv.id, at)
    done = states.released(rsv, reason)
    done = evolve(done, during=kept_window(done.during, at))
    repo.save_reservation(conn, done)
    data: dict[str, JsonValue] = {"reason": reason.value}
    by = rsv.preempted_by if reason == ReleaseReason.PREEMPTED else None
    if by is not None and repo.tenant_of(conn, by) == rsv.tenant_id:
        data["by"] = by  # never name another tenant's reservation
    ctx.event("reservation.released", rsv.tenant_id, rsv.id, data)
    return done


def _end_now(ctx: Ctx, rsv_id: str, reason: ReleaseReason, hint: str) -> Reservation:
    allowed = states.CANCELLABLE if reason == ReleaseReason.CANCELLED else states.RELEASABLE
    verb = "cancel" if reason == ReleaseReason.CANCELLED else "release"
    with ctx.write() as conn:
        rsv = mine(ctx, rsv_id)
        states.require(rsv, allowed, verb, "" if rsv.state == State.RELEASED else hint)
        late = overdue(ctx, rsv)
        if late is not None:  # a tick at this instant would release it: released as it would
            finish(ctx, rsv, *late)
        else:
            calendar.require_changeable(ctx, rsv, verb)
            finish(ctx, rsv, reason, ctx.now)
        return repo.get_reservation(conn, rsv_id)


def overdue(ctx: Ctx, rsv: Reservation) -> tuple[ReleaseReason, int] | None:
    """How a tick at ctx.now would release this reservation, if it would: its end or preemption
    deadline has come (released at that end or deadline), or it has waited pending for
    pending.maxWaitMs (timed out now). A user's late release or cancel, or a late extend, meets
    a reservation no tick has yet released: it is the tick's to release, not the user's."""
    due = release_due(rsv.state, rsv.during, rsv.preempt_deadline, ctx.now)
    if due is not None and rsv.during is not None:
        return due, min(rsv.during.end, ctx.now)
    limit = ctx.settings.pending_max_wait_ms
    # As the tick does (repo.pending_created_by): only one created that long ago can have
    # waited that long, so the event log is read for few of them.
    old_enough = rsv.state == State.PENDING and rsv.created_at <= ctx.now - limit
    if old_enough and timed_out(rsv, repo.pending_since(ctx.db.conn, rsv), ctx.now, limit):
        return ReleaseReason.TIMEOUT, ctx.now
    return None


def cancel(ctx: Ctx, rsv_id: str) -> Reservation:
    """Withdraw a pending or placed reservation; its quota is refunded."""
    return _end_now(ctx, rsv_id, ReleaseReason.CANCELLED, "use `release` once it has started")


def release(ctx: Ctx, rsv_id: str) -> Reservation:
    """Give the GPUs back now."""
    return _end_now(ctx, rsv_id, ReleaseReason.RELEASED, "use `cancel` while it is pending")


def extend(ctx: Ctx, rsv_id: str, by_ms: int) -> Reservation:
    """Move every member's end, or none: any collision on any member is a CONFLICT."""
    if by_ms <= 0:
        raise InvalidInput("--by must be a positive duration such as 30m or 2h")
    with ctx.write() as conn:
        rsv = mine(ctx, rsv_id)
        states.require(rsv, states.EXTENDABLE, "extend")
        calendar.require_changeable(ctx, rsv, "extend")
        if rsv.preempt_deadline is not None:
            raise Conflict(
                f"cannot extend {rsv.id}: it is being preempted and ends at its deadline"
            )
        assert rsv.during is not None
        old_end, new_end = rsv.during.end, rsv.during.end + by_ms
        if new_end > MAX_MS:
            raise InvalidInput(f"that would end after {iso(MAX_MS)}; extend by less")
        if old_end <= ctx.now:  # the next tick releases it: more time would rewrite its end
            raise Conflict(
                f"cannot extend {rsv.id}: its window ended at {iso(old_end)}; the next tick"
                " releases it"
            )
        extra = Window(old_end, new_end)
        longer = Window(rsv.during.start, new_end)
        check_policy(conn, ctx.who, draft_of(replace(rsv, duration_ms=longer.duration)))
        calendar.require_extendable(ctx, rsv, longer)
        for alloc in rsv.allocations:
            clash = repo.first_clash(conn, alloc.node_id, alloc.atoms, extra, rsv.id)
            if clash is not None:
                raise Conflict(
                    f"cannot extend {rsv.id} by that much: GPU {alloc.node_id}:{clash}"
                    " is booked by another reservation in the extra time; nothing was changed"
                )
            maintenance = [
                m
                for m in repo.maintenance_for_node(conn, alloc.node_id, old_end)
                if m.window.overlaps(extra)
            ]
            if maintenance:
                raise Conflict(
                    f"cannot extend {rsv.id}: node {alloc.node_id} has maintenance in the extra"
                    " time; nothing was changed"
                )
            # More time is new capacity: a drained node or a failed GPU does not grant it.
            node = repo.get_node(conn, alloc.node_id)
            sick = [a.index for a in node.atoms if a.index in alloc.atoms and not a.healthy]
            if not node.schedulable or not node.reachable or sick:
                why = "is cordoned" if not node.schedulable else "is unreachable"
                if node.schedulable and node.reachable:
                    why = f"has quarantined GPUs {sick}"
                raise Conflict(
                    f"cannot extend {rsv.id}: node {alloc.node_id} {why}; nothing was changed"
                )
        budgets.check(conn, rsv.tenant_id, rsv.pool_id, rsv.quota_charge, extra, ctx.now)
        repo.move_bookings_end(conn, rsv.id, old_end, new_end)
        repo.save_reservation(conn, replace(rsv, during=longer, duration_ms=longer.duration))
        ctx.event("reservation.extended", rsv.tenant_id, rsv.id, {"from": old_end, "to": new_end})
        return repo.get_reservation(conn, rsv_id)


def explain(ctx: Ctx, args: ReserveArgs) -> list[tuple[str, str]]:
    """`preview --explain`: node by node (or group by group), why each was taken or refused."""
    with ctx.db.read() as conn:
        pool = repo.find_pool(conn, args.pool)
        draft = _new_reservation(
            ctx, args, pool["id"], _charge(ctx, args, pool["id"]), "preview", 0
        )
        window = retry_window(draft, ctx.now)
        # reserve picks among the best placement.topN with a seed from its id, unknown here.
        return explain_plan(
            draft.request(window), repo.snapshots(conn, pool["id"], window), picked_label="best"
        )
