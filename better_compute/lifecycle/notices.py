"""Notices people act on (issue 11), decided from values alone: each is given once per reservation.

`reservation.starting` comes at repair.leadMs before a calendar start, once BookingRepair's check
at that point has passed (the booking it announces is one that will really start).
`reservation.expiring` comes notice.expiringMs before the end of a running reservation, as the
big clouds warn before a capacity block ends. A spot reservation under a preemption notice gets
neither: it already has `reservation.preempting`. A setting of 0 turns it off.
"""

from __future__ import annotations

from better_compute.model import Reservation, State

STARTING = "reservation.starting"
EXPIRING = "reservation.expiring"
RUNNING = (State.BINDING, State.ACTIVE)


def due_starting(rsv: Reservation, now: int, lead_ms: int) -> bool:
    """A calendar reservation inside its lead window whose lead check has passed, unless it is
    a spot reservation under a preemption notice: that start is not the one to prepare for."""
    if rsv.state != State.PLACED or rsv.during is None or rsv.start is None:
        return False
    if rsv.preempt_deadline is not None:
        return False
    return rsv.lead_checked and rsv.during.start - lead_ms <= now < rsv.during.start


def due_expiring(rsv: Reservation, now: int, notice_ms: int) -> bool:
    """A running reservation within notice.expiringMs of its end."""
    if rsv.state not in RUNNING or rsv.during is None or rsv.preempt_deadline is not None:
        return False
    return rsv.during.end - notice_ms <= now < rsv.during.end
