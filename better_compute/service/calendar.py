"""Calendar requests (PRODUCT.md §5.6): pool calendar policies, `reserve --start-range`, and the
`--commit` rule that a placed calendar reservation is final.

A calendar request is one with a start (`--start`, `--start-range`, `--every`). booking.reserve
calls `admit` on the new reservation before it is saved (in the same write transaction, so the
window a start range finds is the window booked) and `require_changeable` before a cancel,
extend or release.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from better_compute.engine import calendar as rules
from better_compute.engine import search
from better_compute.errors import Conflict, InvalidInput
from better_compute.model import LIVE_STATES, CalendarPolicy, Reservation, Window
from better_compute.service import windows
from better_compute.service.authz import require_admin
from better_compute.service.context import Ctx
from better_compute.storage import calendar as cal
from better_compute.storage import repo
from better_compute.timeparse import human_duration, iso

# ---------------------------------------------------------------- pool policy set|show|clear


class PolicyRefusal(InvalidInput):
    """A request outside its pool's calendar policy (INVALID_INPUT, PRODUCT.md §5.6): a series
    names the occurrence it refuses (service/series.py)."""


def _validated(p: CalendarPolicy) -> CalendarPolicy:
    for flag, value in (
        ("--min-duration", p.min_duration_ms),
        ("--max-duration", p.max_duration_ms),
        ("--min-lead", p.min_lead_ms),
        ("--max-horizon", p.max_horizon_ms),
    ):
        if value is not None and value <= 0:
            raise InvalidInput(f"{flag} must be a positive duration such as 1d, got {value} ms")
    lo, hi = p.min_duration_ms, p.max_duration_ms
    if lo is not None and hi is not None and lo > hi:
        raise InvalidInput(
            f"--min-duration {human_duration(lo)} is longer than --max-duration"
            f" {human_duration(hi)}"
        )
    lead, horizon = p.min_lead_ms, p.max_horizon_ms
    if horizon is not None and (lead or 0) + (lo or 1) > horizon:
        asks = [f"--min-lead {human_duration(lead)}"] if lead else []
        asks += [f"--min-duration {human_duration(lo)}"] if lo else []
        raise InvalidInput(
            f"{' plus '.join(asks)} would leave no window that ends within --max-horizon"
            f" {human_duration(horizon)}; allow a longer horizon, or a shorter lead or duration"
        )
    if any(not 1 <= s <= 64 * 64 for s in p.sizes):
        raise InvalidInput("--sizes must list GPU counts from 1 to 4096, such as 1,4,8,16")
    return replace(p, sizes=tuple(sorted(set(p.sizes))))


def policy_set(ctx: Ctx, pool_ref: str, policy: CalendarPolicy) -> tuple[CalendarPolicy, str]:
    """Replace the pool's calendar policy (limits not given are no limits). Admin-only, an event."""
    require_admin(ctx.who, "change pool settings")
    with ctx.write() as conn:
        pool = repo.find_pool(conn, pool_ref)
        p = _validated(replace(policy, pool_id=str(pool["id"])))
        if cal.policy(conn, p.pool_id) == p:
            return p, str(pool["name"])  # already so: nothing is written, no event (README)
        cal.set_policy(conn, p)
        ctx.event(
            "pool.policy.set", None, None, {"poolId": p.pool_id, **p.limits(), "by": ctx.principal}
        )
        return p, str(pool["name"])


def policy_show(ctx: Ctx, pool_ref: str) -> tuple[CalendarPolicy | None, str]:
    with ctx.db.read() as conn:
        pool = repo.find_pool(conn, pool_ref)
        return cal.policy(conn, str(pool["id"])), str(pool["name"])


def policy_clear(ctx: Ctx, pool_ref: str) -> tuple[bool, str]:
    """Remove the pool's calendar policy; reservations committed under it stay committed."""
    require_admin(ctx.who, "change pool settings")
    with ctx.write() as conn:
        pool = repo.find_pool(conn, pool_ref)
        cleared = cal.clear_policy(conn, str(pool["id"]))
        if cleared:
            ctx.event(
                "pool.policy.cleared", None, None, {"poolId": pool["id"], "by": ctx.principal}
            )
        return cleared, str(pool["name"])


# ---------------------------------------------------------------- admission of calendar requests


@dataclass(frozen=True)
class Settled:
    """A calendar request with its window settled: for a start range, the ask searched and
    whether a window was found (if not, `rsv` keeps the range's first start and shortest length,
    the window it asked for first)."""

    rsv: Reservation
    searched: search.Ask | None = None
    found: bool = True

    def no_window(self, pool_name: str) -> str:
        assert self.searched is not None
        return (
            f"no window fits in pool {pool_name} with a start from {iso(self.searched.first)} to"
            f" {iso(self.searched.last)}"
        )


def settle(
    ctx: Ctx,
    rsv: Reservation,
    pool_name: str,
    start_range: str | None = None,
    duration_range: str | None = None,
) -> Settled:
    """The request with its window settled and judged: a start range becomes the earliest window
    that fits now (the longest at that start for a duration range); a calendar request outside
    the pool's policy is INVALID_INPUT naming the limit and what is allowed. What reserve and
    preview share (preview answers "no window" where reserve refuses)."""
    policy = cal.policy(ctx.db.conn, rsv.pool_id)
    if start_range is not None:
        ask = _range_ask(ctx, rsv, pool_name, policy, start_range, duration_range)
        found = windows.find(ctx, rsv, ask, 1)
        if not found:
            return Settled(replace(rsv, start=ask.first, duration_ms=ask.min_ms), ask, False)
        rsv = replace(rsv, start=found[0].start, duration_ms=found[0].duration)
        settled = Settled(rsv, ask)
    else:
        settled = Settled(rsv)
    _judge(ctx, rsv, pool_name, policy, rules.refusal)
    return settled


def _judge(
    ctx: Ctx,
    rsv: Reservation,
    pool_name: str,
    policy: CalendarPolicy | None,
    rule: Callable[[CalendarPolicy, Window, int, int], str | None],
) -> None:
    """A calendar request's window judged by `rule` of the pool's policy: INVALID_INPUT naming
    the limit it breaks. A request for now (no start) is never judged."""
    if rsv.start is None or policy is None:
        return
    window = Window(rsv.start, rsv.start + rsv.duration_ms)
    refused = rule(policy, window, rsv.quota_charge, ctx.now)
    if refused is not None:
        raise PolicyRefusal(f"pool {pool_name}'s calendar policy: {refused}")


def admit_reshape(ctx: Ctx, rsv: Reservation, pool_name: str) -> None:
    """`update`'s judgement of a new shape at the start the booking keeps: its size, duration
    and end, not its lead again (rules.reshape_refusal)."""
    _judge(ctx, rsv, pool_name, cal.policy(ctx.db.conn, rsv.pool_id), rules.reshape_refusal)


def admit(
    ctx: Ctx,
    rsv: Reservation,
    pool_name: str,
    start_range: str | None = None,
    duration_range: str | None = None,
) -> Reservation:
    """`settle` for reserve: no window in the range is a CONFLICT, and nothing is written (a
    pending reservation with no start would have nothing to retry)."""
    settled = settle(ctx, rsv, pool_name, start_range, duration_range)
    if not settled.found:
        raise Conflict(
            f"{settled.no_window(pool_name)}; nothing was booked (`advice` shows near misses)"
        )
    return settled.rsv


def record(ctx: Ctx, rsv: Reservation) -> None:
    """Once saved: a calendar reservation admitted under a `--commit` policy is final once placed
    (recorded now, so a policy changed later neither binds nor frees what was booked before)."""
    if rsv.start is None:
        return
    policy = cal.policy(ctx.db.conn, rsv.pool_id)
    if policy is not None and policy.commit:
        cal.commit_reservation(ctx.db.conn, rsv.id, rsv.pool_id)


def forget(ctx: Ctx, rsv: Reservation) -> None:
    """A booking changed into a request for now (`update --start now` while pending) is no
    calendar request: a `--commit` taken at its admission no longer makes it final."""
    cal.uncommit_reservation(ctx.db.conn, rsv.id)


def read_ranges(
    ctx: Ctx, start_range: str, duration_range: str | None, duration_ms: int
) -> search.Ask:
    """--start-range (and --duration-range) read at ctx's instant, relative TIMEs from --now
    when given. reserve reads them once as the command opens the ledger too: a range malformed,
    inverted or wholly past then is so under the lock as well, and is refused without waiting
    for it."""
    return windows.wanted(
        ctx.now,
        start_range,
        duration_ms=None if duration_range is not None else duration_ms,
        duration_range=duration_range,
        relative_to=ctx.relative_base,
    )


def _range_ask(
    ctx: Ctx,
    rsv: Reservation,
    pool_name: str,
    policy: CalendarPolicy | None,
    start_range: str,
    duration_range: str | None,
) -> search.Ask:
    """The ranges read and narrowed to the pool's policy (INVALID_INPUT if it allows none)."""
    want = read_ranges(ctx, start_range, duration_range, rsv.duration_ms)
    ask = windows.bounded(want, policy, ctx.now, rsv.quota_charge)
    if isinstance(ask, str):
        raise InvalidInput(f"pool {pool_name}'s calendar policy: {ask}")
    return ask


def require_extendable(ctx: Ctx, rsv: Reservation, longer: Window) -> None:
    """`extend` of a calendar reservation stays within its pool's policy (maximum duration and
    horizon), as `update` to the same window would: INVALID_INPUT naming the limit. A request
    for now was never judged by the policy, and its extension is not either."""
    if rsv.start is None:
        return
    policy = cal.policy(ctx.db.conn, rsv.pool_id)
    refused = None if policy is None else rules.extension_refusal(policy, longer, ctx.now)
    if refused is not None:
        pool = repo.find_pool(ctx.db.conn, rsv.pool_id)
        raise InvalidInput(f"pool {pool['name']}'s calendar policy: {refused}; nothing was changed")


def require_changeable(ctx: Ctx, rsv: Reservation, verb: str) -> None:
    """CONFLICT when a `--commit` calendar policy made this placed reservation final."""
    if rsv.state in LIVE_STATES and cal.is_committed(ctx.db.conn, rsv.id):
        raise Conflict(
            f"cannot {verb} {rsv.id}: it was booked under a calendar policy with --commit, so"
            " once placed it cannot be cancelled, extended, shortened or released early"
        )
