"""A pool's calendar policy, judged from values (PRODUCT.md §5.6, the calendar-mode seed's limits).

A calendar request (one with a start: `--start`, `--start-range` or `--every`) is judged whole:
its duration, how far ahead it starts (lead), how far ahead it ends (horizon) and its size. Each
refusal names the limit and what is allowed, so a person can fix the request in one go.
"""

from __future__ import annotations

from better_compute.model import CalendarPolicy, Window
from better_compute.timeparse import human_duration, iso


def allowed_durations(policy: CalendarPolicy) -> str:
    lo = human_duration(policy.min_duration_ms) if policy.min_duration_ms is not None else None
    hi = human_duration(policy.max_duration_ms) if policy.max_duration_ms is not None else None
    if lo and hi:
        return f"from {lo} to {hi}"
    if lo or hi:
        return f"at least {lo}" if lo else f"at most {hi}"
    return "any"


def size_refusal(policy: CalendarPolicy, total_gpus: int) -> str | None:
    """Why `total_gpus` (per-node GPUs times the gang size) is not an allowed size, if it is not."""
    if policy.sizes and total_gpus not in policy.sizes:
        allowed = ", ".join(str(s) for s in policy.sizes)
        return f"size {total_gpus} GPUs is not allowed (allowed sizes: {allowed})"
    return None


def duration_refusal(policy: CalendarPolicy, duration_ms: int) -> str | None:
    lo, hi = policy.min_duration_ms, policy.max_duration_ms
    if (lo is not None and duration_ms < lo) or (hi is not None and duration_ms > hi):
        return (
            f"duration {human_duration(duration_ms)} is outside the allowed durations"
            f" ({allowed_durations(policy)})"
        )
    return None


def earliest_start(policy: CalendarPolicy, now: int) -> int:
    """The earliest start the minimum lead time allows."""
    return now + (policy.min_lead_ms or 0)


def latest_end(policy: CalendarPolicy, now: int) -> int | None:
    """The latest end the maximum horizon allows (None: no horizon)."""
    return None if policy.max_horizon_ms is None else now + policy.max_horizon_ms


def refusal(policy: CalendarPolicy, window: Window, total_gpus: int, now: int) -> str | None:
    """The first limit the calendar request breaks, worded with what is allowed; None if none."""
    size = size_refusal(policy, total_gpus)
    if size is not None:
        return size
    duration = duration_refusal(policy, window.duration)
    if duration is not None:
        return duration
    first = earliest_start(policy, now)
    # Without a lead time a start already past is no refusal: it books from now, as it does
    # where a pool has no policy (a series' first occurrence, asked with a --now the ledger's
    # time has passed, crashed here).
    if policy.min_lead_ms and window.start < first:
        return (
            f"start {iso(window.start)} is sooner than the minimum lead time"
            f" {human_duration(policy.min_lead_ms)} (start at {iso(first)} or later)"
        )
    return horizon_refusal(policy, max(window.start, now) + window.duration, now)  # as booked


def reshape_refusal(
    policy: CalendarPolicy, window: Window, total_gpus: int, now: int
) -> str | None:
    """refusal() of a booking's new shape at the start it keeps (`update` without --start): its
    size, duration and end are judged, its lead not again. The start was judged when it was
    admitted; one that has since come inside the lead may still be made smaller, shorter or
    longer, as `extend` may make it longer."""
    return (
        size_refusal(policy, total_gpus)
        or duration_refusal(policy, window.duration)
        or horizon_refusal(policy, max(window.start, now) + window.duration, now)
    )


def horizon_refusal(policy: CalendarPolicy, end: int, now: int) -> str | None:
    """Why a booking may not end at `end`, judged at `now`, if it may not."""
    last = latest_end(policy, now)
    if last is not None and end > last:
        assert policy.max_horizon_ms is not None
        return (
            f"end {iso(end)} is beyond the maximum horizon"
            f" {human_duration(policy.max_horizon_ms)} (end at {iso(last)} or sooner)"
        )
    return None


def extension_refusal(policy: CalendarPolicy, window: Window, now: int) -> str | None:
    """Why a calendar booking may not grow to `window` (its new end, same start), if it may
    not: the longer duration and the later end are judged; its start and size were judged
    when it was admitted, and the lead is not asked again of a booking that may have begun."""
    return duration_refusal(policy, window.duration) or horizon_refusal(policy, window.end, now)


def describe(policy: CalendarPolicy) -> list[tuple[str, str]]:
    """The policy as (limit, value) pairs for people; `none` where there is no limit."""

    def d(ms: int | None) -> str:
        return "none" if ms is None else human_duration(ms)

    return [
        ("minDuration", d(policy.min_duration_ms)),
        ("maxDuration", d(policy.max_duration_ms)),
        ("minLead", d(policy.min_lead_ms)),
        ("maxHorizon", d(policy.max_horizon_ms)),
        ("sizes", ",".join(map(str, policy.sizes)) or "any"),
        ("commit", "yes" if policy.commit else "no"),
    ]
