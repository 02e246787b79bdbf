"""`advice`: when and where a request would fit, without booking it (PRODUCT.md §5.6).

Every pool asked about (`--pool`, or every pool) is searched with service/windows.py; the windows
are merged earliest first (then by pool name) and each says how the other pools stand in that same
window. When nothing fits, up to two near misses say what almost does (docs/advice.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from better_compute.engine import calendar as policy_rules
from better_compute.engine import search
from better_compute.errors import InvalidInput
from better_compute.inventory import MODEL_RE, normal_model
from better_compute.model import NVLINK_ALL, Binding, Plan, Reservation, State, Window
from better_compute.service import placing, windows
from better_compute.service.context import Ctx
from better_compute.storage import calendar as cal
from better_compute.storage import repo
from better_compute.timeparse import human_duration

AVAILABLE, NO_CAPACITY, NOT_SUPPORTED = "AVAILABLE", "NO_CAPACITY", "NOT_SUPPORTED"
#: Near-miss kinds, in the order they are offered.
LATER, SHORTER, FEWER_GPUS = "later", "shorter", "fewer-gpus"
DEFAULT_LIMIT = 5


@dataclass(frozen=True)
class AdviceArgs:
    gpus: int
    start_range: str
    pool: str | None = None
    models: tuple[str, ...] = ()
    topology: str | None = None
    gang: int | None = None
    topology_key: str | None = None
    duration_ms: int | None = None
    duration_range: str | None = None
    end_range: str | None = None
    limit: int = DEFAULT_LIMIT


@dataclass(frozen=True)
class Other:
    """How another pool stands for the same window."""

    pool: str
    status: str
    details: str


@dataclass(frozen=True)
class Recommendation:
    window: Window
    pool_id: str
    pool: str
    gpus: int
    others: tuple[Other, ...]
    near_miss: str | None = None
    details: str | None = None


@dataclass(frozen=True)
class Advice:
    recommendations: tuple[Recommendation, ...]
    #: The start range as searched (after now): what the picture spans with the windows.
    searched: Window


@dataclass(frozen=True)
class Target:
    """One pool and the request as `reserve` would make it there."""

    pool_id: str
    name: str
    draft: Reservation


def validate(args: AdviceArgs) -> None:
    if not 1 <= args.gpus <= 64:
        raise InvalidInput(f"--gpus must be from 1 to 64, got {args.gpus}")
    if args.gang is not None and not 2 <= args.gang <= 64:
        raise InvalidInput(f"--gang must be from 2 to 64 nodes, got {args.gang}")
    if args.topology_key is not None and args.gang is None:
        raise InvalidInput("--topology-key applies only to a gang; add --gang SIZE")
    if args.topology_key is not None and not args.topology_key.strip():
        raise InvalidInput("--topology-key must name a label, such as fabric.domain or rack")
    if args.topology not in (None, NVLINK_ALL):
        raise InvalidInput(f"--topology must be {NVLINK_ALL}, got {args.topology!r}")
    for model in args.models:
        if not MODEL_RE.fullmatch(model):
            raise InvalidInput(f"--model {model[:40]!r} is not a model name (like h100)")
    if not 1 <= args.limit <= windows.MAX_LIMIT:
        raise InvalidInput(f"--limit must be from 1 to {windows.MAX_LIMIT}, got {args.limit}")


def draft(pool_id: str, args: AdviceArgs, gpus: int, now: int) -> Reservation:
    """The request as an unsaved reservation: what the planner is asked to place."""
    return Reservation(
        id="advice",
        seq=0,
        tenant_id="advice",
        pool_id=pool_id,
        state=State.PENDING,
        gpus=gpus,
        models=tuple(sorted({normal_model(m) for m in args.models})),
        topology=args.topology,
        gang_size=args.gang,
        topology_key=args.topology_key,
        spot=False,
        binding=Binding.DEVICE,
        duration_ms=1,
        start=None,
        during=None,
        conditions=(),
        quota_charge=0,
        idempotency_key=None,
        release_reason=None,
        created_at=now,
        next_attempt_at=None,
    )


def advise(ctx: Ctx, args: AdviceArgs) -> Advice:
    validate(args)
    with ctx.db.read() as conn:
        want = windows.wanted(
            ctx.now,
            args.start_range,
            duration_ms=args.duration_ms,
            duration_range=args.duration_range,
            end_range=args.end_range,
        )
        pools = cal.pool_ids(conn)
        if args.pool is not None or not pools:  # no pool at all: find_pool says so
            row = repo.find_pool(conn, args.pool)
            chosen = [(str(row["id"]), str(row["name"]))]
        else:
            chosen = pools
        searchable: list[tuple[Target, search.Ask]] = []
        refusals: list[str] = []
        for pool_id, name in chosen:
            target = Target(pool_id, name, draft(pool_id, args, args.gpus, ctx.now))
            ask = _ask(ctx, target, want, args.gpus)
            if isinstance(ask, str):
                refusals.append(ask)
            else:
                searchable.append((target, ask))
        if refusals and not searchable:  # no pool could ever answer: the request is at fault
            raise InvalidInput("; ".join(refusals))
        found = sorted(
            (
                (window.start, target.name, window, target)
                for target, ask in searchable
                for window in windows.find(ctx, target.draft, ask, args.limit)
            ),
            key=lambda t: (t[0], t[1]),
        )[: args.limit]
        recs = [
            _recommend(ctx, target, window, args, args.gpus, pools)
            for _, _, window, target in found
        ]
        if not recs:
            recs = _near_misses(ctx, searchable, args, pools)
        return Advice(tuple(recs), Window(want.first, max(want.last, want.first + 1)))


def _ask(ctx: Ctx, target: Target, ask: search.Ask, gpus: int) -> search.Ask | str:
    """The ask this pool allows, or why the pool cannot take the request at all."""
    why = windows.unsupported(ctx, target.draft, target.name)
    if why is not None:
        return why
    total = gpus * (target.draft.gang_size or 1)
    bounded = windows.bounded(ask, windows.policy_of(ctx, target.pool_id), ctx.now, total)
    if isinstance(bounded, str):
        return f"pool {target.name}'s calendar policy: {bounded}"
    return bounded


def _recommend(
    ctx: Ctx,
    target: Target,
    window: Window,
    args: AdviceArgs,
    gpus: int,
    pools: list[tuple[str, str]],
    near_miss: str | None = None,
    details: str | None = None,
) -> Recommendation:
    others = tuple(
        _status(ctx, Target(pid, name, draft(pid, args, gpus, ctx.now)), window, gpus)
        for pid, name in pools
        if pid != target.pool_id
    )
    return Recommendation(window, target.pool_id, target.name, gpus, others, near_miss, details)


def _status(ctx: Ctx, target: Target, window: Window, gpus: int) -> Other:
    """Another pool for the same window: AVAILABLE, NO_CAPACITY (with the planner's reason) or
    NOT_SUPPORTED (the pool can never hold it, or its calendar policy refuses the window)."""
    why = windows.unsupported(ctx, target.draft, target.name)
    if why is not None:
        return Other(target.name, NOT_SUPPORTED, why)
    policy = windows.policy_of(ctx, target.pool_id)
    if policy is not None:
        total = gpus * (target.draft.gang_size or 1)
        refused = policy_rules.refusal(policy, window, total, ctx.now)
        if refused is not None:
            return Other(target.name, NOT_SUPPORTED, f"calendar policy: {refused}")
    outcome = placing.plan(ctx, target.draft, window)
    if isinstance(outcome, Plan):
        return Other(target.name, AVAILABLE, "fits in this window")
    return Other(target.name, NO_CAPACITY, outcome.reason)


def _near_misses(
    ctx: Ctx,
    searchable: list[tuple[Target, search.Ask]],
    args: AdviceArgs,
    pools: list[tuple[str, str]],
) -> list[Recommendation]:
    """Up to two windows that almost fit: a later start just past the range, then a shorter
    window in range (the earliest start where at least half the length fits, as long as fits
    there), then fewer GPUs per node in range; one of each kind at most."""
    misses: list[Recommendation] = []
    for kind in (LATER, SHORTER, FEWER_GPUS):
        best: tuple[tuple[int, int, str], Recommendation] | None = None
        for target, ask in searchable:
            rec = _near_miss(ctx, kind, target, ask, args, pools)
            if rec is None:
                continue
            rank = (rec.window.start, -rec.window.duration, target.name)
            if kind == FEWER_GPUS:
                rank = (-rec.gpus, rec.window.start, target.name)
            if best is None or rank < best[0]:
                best = (rank, rec)
        if best is not None:
            misses.append(best[1])
        if len(misses) == 2:
            break
    return misses


def _near_miss(
    ctx: Ctx,
    kind: str,
    target: Target,
    ask: search.Ask,
    args: AdviceArgs,
    pools: list[tuple[str, str]],
) -> Recommendation | None:
    if kind == LATER:
        # Past the range by as much again as the range spans (at least a day, or one window).
        reach = max(ask.last - ask.first, ask.max_ms, 86_400_000)
        later = replace(ask, first=ask.last + 1, last=ask.last + reach)
        found = windows.find(ctx, target.draft, later, 1)
        if not found:
            return None
        details = "a later start"
        return _recommend(ctx, target, found[0], args, args.gpus, pools, LATER, details)
    if kind == SHORTER:
        # At least half the asked length: a few minutes is no answer to "three days".
        policy = windows.policy_of(ctx, target.pool_id)
        floor = max(1, ask.min_ms // 2, policy.min_duration_ms or 1 if policy else 1)
        if ask.min_ms <= floor:
            return None
        shorter = replace(ask, min_ms=floor, max_ms=ask.min_ms - 1, end_from=None)
        found = windows.find(ctx, target.draft, shorter, 1)
        if not found:
            return None
        window = found[0]
        details = f"shorter: {human_duration(window.duration)} of {human_duration(ask.min_ms)}"
        return _recommend(ctx, target, window, args, args.gpus, pools, SHORTER, details)
    return _fewer_gpus(ctx, target, ask, args, pools)


def _fewer_gpus(
    ctx: Ctx, target: Target, ask: search.Ask, args: AdviceArgs, pools: list[tuple[str, str]]
) -> Recommendation | None:
    """The most GPUs per node below the asked count, among the sizes the pool's policy allows,
    that fit somewhere in range: fitting is monotone in the count, so a binary search."""
    policy = windows.policy_of(ctx, target.pool_id)
    size = target.draft.gang_size or 1
    counts = [
        g
        for g in range(1, args.gpus)
        if policy is None or policy_rules.size_refusal(policy, g * size) is None
    ]
    low, high, best = 0, len(counts) - 1, None
    while low <= high:
        mid = (low + high) // 2
        found = windows.find(ctx, replace(target.draft, gpus=counts[mid]), ask, 1)
        if found:
            best, low = (counts[mid], found[0]), mid + 1
        else:
            high = mid - 1
    if best is None:
        return None
    count, window = best
    details = f"fewer GPUs: {count} of {args.gpus}"
    return _recommend(ctx, target, window, args, count, pools, FEWER_GPUS, details)
