"""Budgets in GPU-hours over a rolling period (issue 12), beside the GPUs-at-once quota (§6).

A quota counts GPUs held at once, so two bookings that never overlap still fill it; a budget
counts GPU-time, as Slurm's GrpTRESMins does. A reservation is admitted only while the tenant's
booked GPU-hours in every rolling period its window reaches into, its own included, stay within
the budget. Booked means the bookings table (released reservations' past included: what
was held is spent) plus pending reservations' wanted windows (admitted, so already promised).
"""

from __future__ import annotations

from dataclasses import dataclass

from better_compute.errors import InvalidInput, QuotaExceeded
from better_compute.lifecycle.tick import retry_window
from better_compute.model import Reservation, Window
from better_compute.service import authz
from better_compute.service.context import Ctx
from better_compute.storage import budgets as store
from better_compute.storage import repo
from better_compute.storage.repo import Conn
from better_compute.timeparse import MAX_MS, human_duration, iso

HOUR_MS = 3_600_000
MAX_GPU_HOURS = 10**9
MIN_PERIOD_MS, MAX_PERIOD_MS = HOUR_MS, 366 * 24 * HOUR_MS


def hours(gpu_ms: int) -> float:
    """GPU-milliseconds as GPU-hours, to six places as usage gives them: to the hundredth, a
    budget of 0.125 read 0.12 in JSON and in its `quota.set` event, and 0.004 read 0.0, while the
    stored GPU-milliseconds were enforced (a review). Six places hold 0.0036 s of one GPU."""
    return round(gpu_ms / HOUR_MS, 6)


def validate(gpu_hours: float, period_ms: int) -> int:
    """The budget in GPU-milliseconds."""
    if not 0 <= gpu_hours <= MAX_GPU_HOURS or gpu_hours != gpu_hours:
        raise InvalidInput(f"--gpu-hours must be from 0 to {MAX_GPU_HOURS}, got {gpu_hours}")
    if not MIN_PERIOD_MS <= period_ms <= MAX_PERIOD_MS:
        raise InvalidInput(f"--period must be from 1h to 366d, got {human_duration(period_ms)}")
    return round(gpu_hours * HOUR_MS)


def used(
    conn: Conn, tenant: str, pool_id: str, period: Window, now: int, ignore: str | None
) -> int:
    """GPU-milliseconds booked or promised (pending) by the tenant inside `period`."""
    promised = _promised(conn, tenant, pool_id, now, ignore)
    return store.booked_gpu_ms(conn, tenant, pool_id, period, ignore) + _inside(promised, period)


def _promised(
    conn: Conn, tenant: str, pool_id: str, now: int, ignore: str | None
) -> list[tuple[int, int, int]]:
    """(start, end, GPUs) the tenant's pending reservations would book if placed now or at
    their start: admitted, so they count against the budget."""
    spans = []
    for start, duration, charge in store.pending_wants(conn, tenant, pool_id, ignore):
        s = start if start is not None and start > now else now
        spans.append((s, s + duration, charge))
    return spans


def _overlap(a: Window, b: Window) -> int:
    return max(0, min(a.end, b.end) - max(a.start, b.start))


def _inside(spans: list[tuple[int, int, int]], period: Window) -> int:
    """GPU-milliseconds of these (start, end, GPUs) spans inside `period`."""
    return sum(n * _overlap(Window(s, e), period) for s, e, n in spans)


def check(
    conn: Conn,
    tenant: str,
    pool_id: str,
    gpus: int,
    window: Window,
    now: int,
    ignore: str | None = None,
) -> None:
    """Every budget that applies must hold `gpus` over `window` on top of what the tenant has
    booked, in every rolling period the window reaches into; else QUOTA_EXCEEDED with the
    figures of the fullest such period."""
    for budget in store.budgets(conn, tenant, pool_id):
        fullest = _fullest(conn, tenant, budget, gpus, window, now, ignore)
        if fullest is None:
            continue
        period, spent, need = fullest
        if spent + need > budget.gpu_ms:
            where = (
                f"pool {repo.pool_name(conn, budget.pool_id)}" if budget.pool_id else "all pools"
            )
            booked, whole, more = _shown(spent, budget.gpu_ms, need)
            raise QuotaExceeded(
                f"tenant {tenant!r} has booked {booked} of its {whole}"
                f" GPU-hour budget in {where} over the {human_duration(budget.period_ms)}"
                f" {_named(period)}; this request needs {more} more"
            )


def _shown(spent: int, budget: int, need: int) -> tuple[str, str, str]:
    """A refusal's three figures in GPU-hours: to the hundredth, as `quota show` gives them,
    unless that rounding hides the excess (12 of 16 booked and 4 more needed reads as fitting
    exactly, which is admitted: 4.0003 does not) or the request (needs 0 more); then to as many
    places as show them (one GPU-second is 0.0003 GPU-hours, one GPU-millisecond 0.0000003)."""
    places = 2
    while places < 7:
        booked, whole, more = (round(x / HOUR_MS, places) for x in (spent, budget, need))
        if booked + more > whole and more > 0:
            break
        places += 1
    text = [
        f"{round(x / HOUR_MS, places):.{places}f}".rstrip("0").rstrip(".")
        for x in (spent, budget, need)
    ]
    return text[0], text[1], text[2]


def _named(period: Window) -> str:
    """`ending <instant>`, or `from <instant>` for a period that ends after the end of time."""
    return f"ending {iso(period.end)}" if period.end <= MAX_MS else f"from {iso(period.start)}"


def _fullest(
    conn: Conn,
    tenant: str,
    budget: store.Budget,
    gpus: int,
    window: Window,
    now: int,
    ignore: str | None,
) -> tuple[Window, int, int] | None:
    """The rolling period (of the budget's length) that meets `window` and holds the most
    GPU-time with the request's own included: (that period, what is booked in it, what the
    request adds). Checking only the period ending at the window's end let a request through
    whose GPU-time pushed a later period over (one booked further ahead) or an earlier one
    (a short request after a long one).

    None when the budget surely holds: every such period lies inside [start - period, end +
    period), so when all the tenant has booked or promised there, with the request's whole
    GPU-time, fits the budget, each period does. That one sum (a range of the bookings_tenant
    index) settles the usual request, far from its budget, without the walk over every span."""
    p = budget.period_ms
    near = Window(window.start - p, window.end + p)
    promised = _promised(conn, tenant, budget.pool_id, now, ignore)
    booked = store.booked_gpu_ms(conn, tenant, budget.pool_id, near, ignore)
    if booked + _inside(promised, near) + gpus * (window.end - window.start) <= budget.gpu_ms:
        return None
    spans = store.booked_spans(conn, tenant, budget.pool_id, near, ignore) + promised
    t, most = fullest_period([*spans, (window.start, window.end, gpus)], window, p)
    period = Window(t, t + p)
    need = gpus * _overlap(window, period)
    return period, most - need, need


def fullest_period(spans: list[tuple[int, int, int]], window: Window, p: int) -> tuple[int, int]:
    """(t, GPU-time) of the period [t, t + p) meeting `window` that holds the most GPU-time of
    these (start, end, GPUs) spans.

    A span's GPU-time inside [t, t + p) is a trapezoid in t: it rises with slope GPUs from
    s - p, levels off, and falls back to 0 at e. So the total is piecewise linear, and its
    greatest value over the periods meeting the window lies at one of those corners or at an
    end of that range: one sweep over the sorted corners finds it, whatever the count."""
    first, last = window.start - p + 1, window.end - 1  # every period that meets the window
    slopes: dict[int, int] = {}
    for s, e, n in spans:
        for corner, change in ((s - p, n), (min(s, e - p), -n), (max(s, e - p), -n), (e, n)):
            slopes[corner] = slopes.get(corner, 0) + change
    t = first
    value = sum(n * _overlap(Window(s, e), Window(t, t + p)) for s, e, n in spans)
    slope = sum(change for corner, change in slopes.items() if corner <= first)
    best_t, best = t, value
    for corner, change in sorted(slopes.items()):
        if corner <= first:
            continue
        value += slope * (min(corner, last) - t)
        t = min(corner, last)
        if value >= best:  # of equally full periods, the latest: it ends nearest the request
            best_t, best = t, value
        if corner >= last:
            break
        slope += change
    value += slope * (last - t)
    if value >= best:
        best_t, best = last, value
    return best_t, best


def check_reservation(conn: Conn, rsv: Reservation, now: int, ignore: str | None = None) -> None:
    """check() for a draft reservation: its charge over the window a placement now would book."""
    check(conn, rsv.tenant_id, rsv.pool_id, rsv.quota_charge, retry_window(rsv, now), now, ignore)


def over_budget(conn: Conn, rsv: Reservation, window: Window, now: int) -> str | None:
    """Why booking `window` for a reservation already admitted would take its tenant over a
    budget, or None. Admission counted a pending reservation as placed at once (_promised);
    placed later by a retry, a requeue or a preemption's deadline, its GPU-time lands in other
    periods, which bookings made since may have filled: it is checked again there, as itself
    (its own promise left out), and waits while the budget does not hold it."""
    try:
        check(conn, rsv.tenant_id, rsv.pool_id, rsv.quota_charge, window, now, ignore=rsv.id)
    except QuotaExceeded as exc:
        return exc.message
    return None


@dataclass(frozen=True)
class BudgetLine:
    """One budget as `quota show` gives it: used in the period ending now, and booked ahead."""

    pool_id: str | None
    pool_name: str | None
    gpu_hours: float
    period_ms: int
    used: float
    remaining: float
    ahead: float


def lines(conn: Conn, tenant: str, now: int) -> list[BudgetLine]:
    out = []
    for b in store.budgets(conn, tenant):
        spent = used(conn, tenant, b.pool_id, Window(now - b.period_ms, now), now, None)
        later = used(conn, tenant, b.pool_id, Window(now, now + b.period_ms), now, None)
        name = repo.pool_name(conn, b.pool_id) if b.pool_id else None
        out.append(
            BudgetLine(
                b.pool_id or None,
                name,
                hours(b.gpu_ms),
                b.period_ms,
                hours(spent),
                hours(max(0, b.gpu_ms - spent)),
                hours(later),
            )
        )
    return out


def set_budget(
    ctx: Ctx, tenant: str, pool_ref: str | None, gpu_hours: float, period_ms: int
) -> None:
    """`quota set --gpu-hours H --period P`: admin-only, like every quota."""
    authz.require_admin(ctx.who, "set quotas")
    gpu_ms = validate(gpu_hours, period_ms)
    with ctx.write() as conn:
        repo.require_tenant(conn, tenant)
        pool_id = repo.find_pool(conn, pool_ref)["id"] if pool_ref is not None else ""
        if store.Budget(pool_id, gpu_ms, period_ms) in store.budgets(conn, tenant):
            return  # already so: nothing is written, no event (README, design notes)
        store.set_budget(conn, tenant, pool_id, gpu_ms, period_ms)
        ctx.event(
            "quota.set",
            tenant,
            None,
            {
                "poolId": pool_id or None,
                "gpuHours": hours(gpu_ms),
                "periodMs": period_ms,
                "by": ctx.principal,
            },
        )


def show(ctx: Ctx, tenant: str) -> list[BudgetLine]:
    """The tenant's budgets, for whoever may see its quota (service/setup.py quota_show)."""
    with ctx.db.read() as conn:
        repo.require_tenant(conn, tenant)
        authz.require_tenant(conn, ctx.who, tenant)
        return lines(conn, tenant, ctx.now)
