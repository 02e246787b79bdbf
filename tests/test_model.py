"""model.evolve: dataclasses.replace without __init__, for the frozen values a replay copies."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from better_compute.model import (
    Allocation,
    Binding,
    ReleaseReason,
    Reservation,
    State,
    Window,
    evolve,
)


def _reservation() -> Reservation:
    return Reservation(
        id="rsv_a",
        seq=7,
        tenant_id="t",
        pool_id="p",
        state=State.PENDING,
        gpus=2,
        models=("H100",),
        topology=None,
        gang_size=None,
        topology_key=None,
        spot=False,
        binding=Binding.DEVICE,
        duration_ms=3_600_000,
        start=None,
        during=None,
        conditions=(),
        quota_charge=2,
        idempotency_key=None,
        release_reason=None,
        created_at=0,
        next_attempt_at=None,
        allocations=(Allocation("alc_a", "rsv_a", "n1", (0, 1)),),
    )


CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "state": st.sampled_from(list(State)),
        "during": st.none() | st.builds(Window, st.integers(0, 10), st.integers(11, 20)),
        "release_reason": st.none() | st.sampled_from(list(ReleaseReason)),
        "lead_checked": st.booleans(),
        "next_attempt_at": st.none() | st.integers(0, 10**12),
        "allocations": st.just(()),
    },
)


@given(CHANGES)
def test_evolve_is_replace(changes: dict[str, object]) -> None:
    rsv = _reservation()
    copy = evolve(rsv, **changes)
    assert copy == dataclasses.replace(rsv, **changes)  # type: ignore[arg-type]
    assert rsv == _reservation()  # the original is untouched
    assert type(copy) is Reservation


def test_evolve_keeps_values_frozen() -> None:
    copy = evolve(_reservation(), state=State.PLACED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.state = State.ACTIVE  # type: ignore[misc]
    alloc = evolve(copy.allocations[0], bound=True)
    assert alloc == dataclasses.replace(copy.allocations[0], bound=True)


def test_evolve_refuses_what_replace_refuses() -> None:
    with pytest.raises(TypeError, match="no field colour"):
        evolve(_reservation(), colour="red")


def test_evolve_refuses_classes_whose_init_does_more() -> None:
    @dataclasses.dataclass(frozen=True)
    class Checked:
        n: int

        def __post_init__(self) -> None:
            if self.n < 0:
                raise ValueError("negative")

    with pytest.raises(TypeError, match=r"use dataclasses\.replace"):
        evolve(Checked(1), n=-1)
