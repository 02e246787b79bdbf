"""What a tick at time T must do, decided from values alone (PRODUCT.md §5.4).

Each function answers one numbered step; the service applies the answers in order inside one
transaction. All of them are idempotent at a fixed T: once applied, the same T selects nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from better_compute.model import (
    LIVE_STATES,
    Maintenance,
    Node,
    ReleaseReason,
    Reservation,
    State,
    Window,
)


class RepairPoint(StrEnum):
    LEAD = "lead"  # repair.leadMs before the start
    START = "start"  # at the start, just before binding


def retry_window(rsv: Reservation, now: int) -> Window:
    """The same window while its start is ahead; once passed, from now for the full duration."""
    if rsv.start is not None and rsv.start > now:
        return Window(rsv.start, rsv.start + rsv.duration_ms)
    return Window(now, now + rsv.duration_ms)


def due_release(rsv: Reservation, now: int) -> ReleaseReason | None:
    """Step 1: a live reservation whose preemption deadline or end has come."""
    return release_due(rsv.state, rsv.during, rsv.preempt_deadline, now)


def release_due(
    state: State, during: Window | None, deadline: int | None, now: int
) -> ReleaseReason | None:
    """due_release from the three values it reads: the tick decides a release from a narrow
    row (storage/tickwork.Ending), without building the reservation and its allocations."""
    if state not in LIVE_STATES or during is None:
        return None
    if deadline is not None and deadline <= now:
        return ReleaseReason.PREEMPTED
    if during.end <= now:
        return ReleaseReason.EXPIRED
    return None


def ended_at(during: Window | None, deadline: int | None, now: int) -> int | None:
    """The instant a reservation's end or preemption deadline came, the earlier of the two, if
    either has by `now`; None when neither has. Until a tick releases it, such a reservation
    still looks live, but its GPUs are no longer its own: nothing may start on them."""
    ends = (deadline, None if during is None else during.end)
    came = [t for t in ends if t is not None and t <= now]
    return min(came) if came else None


def kept_window(during: Window | None, at: int) -> Window | None:
    """The window a reservation released at `at` keeps, as booking.finish writes it: none when
    it had not begun (it held no time at all), else cut back to `at`. Released at the instant
    it began, it keeps that instant (`{start: T, end: T}`): it may have been made active then,
    with a bound allocation and a usage window of that instant (PRODUCT.md §7: a released
    reservation keeps the time it really held; a review found `during: null` beside them)."""
    if during is None or during.start > at:
        return None
    return Window(during.start, at) if during.end > at else during


def timed_out(rsv: Reservation, waiting_since: int, now: int, max_wait_ms: int) -> bool:
    """Step 1 too: a pending reservation that has waited pending.maxWaitMs since it began to wait
    is released as `timeout`, so a request that never fits does not hold its quota forever."""
    return rsv.state == State.PENDING and now - waiting_since >= max_wait_ms


def due_retries(pending: Sequence[Reservation], now: int) -> list[Reservation]:
    """Step 2: pending reservations whose next attempt is due, oldest first."""
    due = [
        r
        for r in pending
        if r.state == State.PENDING and r.next_attempt_at is not None and r.next_attempt_at <= now
    ]
    return sorted(due, key=lambda r: r.seq)


def due_repair(rsv: Reservation, now: int, lead_ms: int) -> RepairPoint | None:
    """Step 3: once at start - leadMs, and again at the start."""
    if rsv.state != State.PLACED or rsv.during is None:
        return None
    start = rsv.during.start
    if start <= now and not rsv.start_checked:
        return RepairPoint.START
    if start - lead_ms <= now < start and not rsv.lead_checked:
        return RepairPoint.LEAD
    return None


def due_binding(rsv: Reservation, now: int) -> bool:
    """Step 4: a placed reservation whose start has come."""
    return rsv.state == State.PLACED and rsv.during is not None and rsv.during.start <= now


@dataclass(frozen=True)
class NodeHealth:
    """All BookingRepair asks of a node: may it take work, and which of its GPUs are unhealthy."""

    schedulable: bool
    reachable: bool
    sick: frozenset[int]


def bad_nodes(
    rsv: Reservation,
    nodes: Mapping[str, NodeHealth],
    maintenance: Sequence[Maintenance],
    now: int,
) -> list[str]:
    """BookingRepair's check: the nodes of a placed reservation that can no longer serve it.

    A node lease is judged only before its window begins, and by whether the node is still
    leasable (schedulable, reachable, not in maintenance, every GPU healthy).
    """
    if rsv.during is None:
        return []
    if rsv.node_lease and rsv.during.start <= now:
        return []
    blocked = {m.node_id for m in maintenance if m.window.overlaps(rsv.during)}
    bad = []
    for alloc in rsv.allocations:
        node = nodes.get(alloc.node_id)
        if node is None or not node.schedulable or not node.reachable or alloc.node_id in blocked:
            bad.append(alloc.node_id)
            continue
        # A node lease watches every GPU of the node; a device booking only its own.
        if node.sick if rsv.node_lease else node.sick.intersection(alloc.atoms):
            bad.append(alloc.node_id)
    return sorted(set(bad))


def can_bind(reachable: bool, auto_bind: bool) -> bool:
    """Step 5: with autoBind, tick binds reachable nodes itself; otherwise agents report."""
    return auto_bind and reachable


def other_groups(rsv: Reservation, nodes: dict[str, Node]) -> frozenset[str]:
    """For a gang under repair: the nodes outside its current topology value, so the first attempt
    keeps it on the same value (another value is tried only if that fails)."""
    if not rsv.gang_size or not rsv.topology_key:
        return frozenset()
    values = {
        nodes[a.node_id].label(rsv.topology_key) for a in rsv.allocations if a.node_id in nodes
    }
    if len(values) != 1:
        return frozenset()
    value = next(iter(values))
    return frozenset(n.name for n in nodes.values() if n.label(rsv.topology_key) != value)
