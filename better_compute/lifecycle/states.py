"""The reservation states and the moves between them."""

from __future__ import annotations

from better_compute.errors import Conflict
from better_compute.model import ReleaseReason, Reservation, State, evolve

ALLOWED: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.PLACED, State.RELEASED}),
    # placed -> pending: BookingRepair failed, or a spot victim was requeued.
    State.PLACED: frozenset({State.BINDING, State.PENDING, State.RELEASED}),
    State.BINDING: frozenset({State.ACTIVE, State.RELEASED}),
    State.ACTIVE: frozenset({State.RELEASED}),
    State.RELEASED: frozenset(),
}

#: Which user verbs each state accepts.
CANCELLABLE = frozenset({State.PENDING, State.PLACED})
RELEASABLE = frozenset({State.PLACED, State.BINDING, State.ACTIVE})
EXTENDABLE = frozenset({State.PLACED, State.BINDING, State.ACTIVE})


def move(rsv: Reservation, to: State) -> Reservation:
    if to not in ALLOWED[rsv.state]:
        raise Conflict(f"reservation {rsv.id} is {rsv.state}; it cannot become {to}")
    return evolve(rsv, state=to)


def released(rsv: Reservation, reason: ReleaseReason) -> Reservation:
    return evolve(move(rsv, State.RELEASED), release_reason=reason, next_attempt_at=None)


def require(rsv: Reservation, allowed: frozenset[State], verb: str, hint: str = "") -> None:
    if rsv.state not in allowed:
        names = ", ".join(sorted(s.value for s in allowed))
        extra = f"; {hint}" if hint else ""
        raise Conflict(f"cannot {verb} {rsv.id}: it is {rsv.state} (allowed: {names}){extra}")
