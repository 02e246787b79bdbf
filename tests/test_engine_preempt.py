"""Preemption: plan as if spot work were free; fewest victims first, then the best score."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest

from better_compute.engine.fit import plan_node
from better_compute.engine.place import place
from better_compute.engine.preempt import plan_preemption
from better_compute.model import Atom, Node, NodeSnapshot, NoFit, Plan, Request, Window


def node(
    name: str, gpus: int = 8, *, groups: int = 1, fabric: str = "c1.1", sick: Iterable[int] = ()
) -> Node:
    cluster, clique = fabric.split(".")
    atoms = tuple(
        Atom(i, "h100", i * groups // gpus, cluster, int(clique), healthy=i not in set(sick))
        for i in range(gpus)
    )
    return Node(name, "pool_1", atoms)


def snap(
    n: Node, busy: Iterable[int] = (), spot: Mapping[int, tuple[str, ...]] | None = None
) -> NodeSnapshot:
    spot = spot or {}
    return NodeSnapshot(n, frozenset(busy) | frozenset(spot), tuple(sorted(spot.items())))


def held(rid: str, indices: Iterable[int]) -> dict[int, tuple[str, ...]]:
    return {i: (rid,) for i in indices}


def req(gpus: int | None = 4, **kw: object) -> Request:
    return Request(Window(0, 1000), gpus, **kw)  # type: ignore[arg-type]


def picked(result: Plan | NoFit) -> tuple[list[str], tuple[str, ...]]:
    assert isinstance(result, Plan), result
    return [m.node_id for m in result.members], result.victims


@pytest.mark.parametrize(
    "request_",
    [req(spot=True), req(None, node_lease=True), req(gang_size=2, spot=True)],
)
def test_spot_and_node_lease_never_preempt(request_: Request) -> None:
    snaps = [snap(node("a"), spot=held("rsv_s", range(8)))]
    assert plan_preemption(request_, snaps) == NoFit("spot and node-lease requests never preempt")


def test_fewest_victims_beats_better_score() -> None:
    snaps = [
        # Fuller node (better bin-packing) but two spot reservations in the way.
        snap(node("a"), busy=range(4), spot={**held("rsv_1", (4, 5)), **held("rsv_2", (6, 7))}),
        snap(node("b"), spot=held("rsv_3", range(8))),
    ]
    a_plan = plan_node(req(), snaps[0], free_spot=True)
    b_plan = plan_node(req(), snaps[1], free_spot=True)
    assert not isinstance(a_plan, str) and not isinstance(b_plan, str)
    assert a_plan.score > b_plan.score
    assert picked(plan_preemption(req(), snaps)) == (["b"], ("rsv_3",))


def test_fewest_victims_then_the_best_score_no_random_pick() -> None:
    snaps = [
        snap(node("a"), busy=range(6), spot={**held("rsv_1", (6,)), **held("rsv_2", (7,))}),
        snap(node("b"), spot=held("rsv_3", range(8))),
        snap(node("c"), busy=(0,), spot=held("rsv_4", range(1, 8))),
    ]
    # c (fuller) beats b on score; a needs two victims and is never picked.
    assert picked(plan_preemption(req(2), snaps)) == (["c"], ("rsv_4",))


def test_best_score_among_equal_victims() -> None:
    snaps = [
        snap(node("a"), spot=held("rsv_1", range(8))),
        snap(node("b"), busy=(0, 1), spot=held("rsv_2", range(2, 8))),
    ]
    assert picked(plan_preemption(req(4), snaps)) == (["b"], ("rsv_2",))


ATOM_CASES = [
    # (case, gpus, busy (regular), spot holders, expected atoms, expected victims)
    ("truly free first", 6, (), {**held("rsv_a", (0, 1, 2, 3))}, (0, 1, 4, 5, 6, 7), ("rsv_a",)),
    (
        "holder with most atoms first",
        7,
        (),
        {**held("rsv_b", (0,)), **held("rsv_a", (1, 2, 3))},
        (1, 2, 3, 4, 5, 6, 7),
        ("rsv_a",),
    ),
    (
        "tie by id",
        6,
        (),
        {**held("rsv_b", (0, 1)), **held("rsv_a", (2, 3))},
        (2, 3, 4, 5, 6, 7),
        ("rsv_a",),
    ),
    (
        "shared atom needs both holders",
        6,
        (),
        {0: ("rsv_a", "rsv_b"), 1: ("rsv_a",), 2: ("rsv_c",), 3: ("rsv_c",)},
        (2, 3, 4, 5, 6, 7),
        ("rsv_c",),
    ),
    ("regular bookings stay", 6, (0, 1), {**held("rsv_a", (2, 3))}, (2, 3, 4, 5, 6, 7), ("rsv_a",)),
    ("no victim needed", 4, (), {**held("rsv_a", (0, 1, 2, 3))}, (4, 5, 6, 7), ()),
]


@pytest.mark.parametrize(("case", "gpus", "busy", "spot", "atoms", "victims"), ATOM_CASES)
def test_preemption_atom_pick(
    case: str,
    gpus: int,
    busy: tuple[int, ...],
    spot: dict[int, tuple[str, ...]],
    atoms: tuple[int, ...],
    victims: tuple[str, ...],
) -> None:
    result = plan_preemption(req(gpus), [snap(node("a"), busy, spot)])
    assert isinstance(result, Plan), case
    assert result.members[0].atoms == atoms, case
    assert result.victims == victims, case


def test_quarantined_spot_atoms_are_not_freed() -> None:
    snaps = [snap(node("a", sick=(0,)), busy=range(4, 8), spot=held("rsv_a", range(4)))]
    assert isinstance(plan_preemption(req(3), snaps), Plan)
    assert plan_preemption(req(4), snaps) == NoFit(
        "no node fits (1 nodes): 1 × fits: 0 of 4 gpu free"
    )


def test_nvlink_all_prefers_the_group_with_fewest_victims() -> None:
    spot = {**held("rsv_a", (0,)), **held("rsv_b", (1,)), **held("rsv_c", (4, 5, 6))}
    snaps = [snap(node("a", groups=2), spot=spot)]
    result = plan_preemption(req(4, topology="nvlink-all"), snaps)
    assert isinstance(result, Plan)
    assert result.members[0].atoms == (4, 5, 6, 7)
    assert result.victims == ("rsv_c",)


def test_zero_victim_plans_are_returned_so_the_caller_can_tell() -> None:
    snaps = [snap(node("a"), busy=range(8)), snap(node("b"), busy=range(4))]
    result = plan_preemption(req(), snaps)
    assert picked(result) == (["b"], ())
    assert result == place(req(), snaps, seed=0, top_n=1)


def test_no_fit_reads_like_normal_placement() -> None:
    snaps = [
        snap(node("a"), busy=range(6), spot=held("rsv_1", (6,))),
        snap(node("b"), busy=range(8)),
    ]
    normal = place(req(), snaps, seed=0, top_n=3)
    assert normal == NoFit(
        "no node fits (2 nodes): 1 × fits: 0 of 4 gpu free, 1 × fits: 1 of 4 gpu free"
    )
    assert plan_preemption(req(), snaps) == normal
    gang_req = req(8, gang_size=2, topology_key="fabric.domain")
    assert plan_preemption(gang_req, snaps) == place(gang_req, snaps, seed=0, top_n=3)


def test_max_plans_bounds_the_comparison_in_node_name_order() -> None:
    snaps = [
        snap(node("a"), spot={**held("rsv_1", range(4)), **held("rsv_2", range(4, 8))}),
        snap(node("b"), spot={**held("rsv_3", range(4)), **held("rsv_4", range(4, 8))}),
        snap(node("c"), spot=held("rsv_5", range(8))),
    ]
    assert picked(plan_preemption(req(6), snaps)) == (["c"], ("rsv_5",))
    assert picked(plan_preemption(req(6), snaps, max_plans=2)) == (
        ["a"],
        ("rsv_1", "rsv_2"),
    )


def test_gang_preemption_across_several_nodes() -> None:
    key = "fabric.domain"
    snaps = [
        # c1.1: each node held by its own spot reservation -> two victims.
        snap(node("a1", fabric="c1.1"), spot=held("rsv_1", range(8))),
        snap(node("a2", fabric="c1.1"), spot=held("rsv_2", range(8))),
        # c1.2: one spot gang spans both nodes -> one victim, though a third node is free-ish.
        snap(node("b1", fabric="c1.2"), spot=held("rsv_g", range(8))),
        snap(node("b2", fabric="c1.2"), spot=held("rsv_g", range(8))),
        snap(
            node("b3", fabric="c1.2"),
            spot={**held("rsv_x", range(4)), **held("rsv_y", range(4, 8))},
        ),
    ]
    request = req(8, gang_size=2, topology_key=key)
    assert place(request, snaps, seed=0, top_n=3) == NoFit(
        "no gang of 2 nodes fits in one fabric.domain (at most 0 nodes fit together)"
    )
    result = plan_preemption(request, snaps)
    assert picked(result) == (["b1", "b2"], ("rsv_g",))
    assert isinstance(result, Plan) and result.group == "c1.2"
    three = plan_preemption(req(8, gang_size=3, topology_key=key), snaps)
    assert picked(three) == (["b1", "b2", "b3"], ("rsv_g", "rsv_x", "rsv_y"))


def test_gang_preemption_fewest_victims_across_groups() -> None:
    snaps = [
        snap(node("a1", fabric="c1.1"), busy=range(4), spot=held("rsv_1", range(4, 8))),
        snap(node("a2", fabric="c1.1"), busy=range(4), spot=held("rsv_2", range(4, 8))),
        snap(node("b1", fabric="c1.2"), spot=held("rsv_3", range(8))),
        snap(node("b2", fabric="c1.2")),
    ]
    request = req(4, gang_size=2, topology_key="fabric.domain")
    assert picked(plan_preemption(request, snaps)) == (["b1", "b2"], ("rsv_3",))
