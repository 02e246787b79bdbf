"""Single-node placement: filters, atom pick, scores, counted reasons, the seeded topN pick."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest

from better_compute.engine.atoms import pick_atoms
from better_compute.engine.explain import atom_ranges, explain
from better_compute.engine.fit import plan_node
from better_compute.engine.place import place
from better_compute.model import Atom, Node, NodeSnapshot, NoFit, Plan, Request, Window


def node(
    name: str,
    gpus: int = 8,
    *,
    groups: int = 1,
    model: str = "h100",
    fabric: str | None = "c1.1",
    labels: tuple[tuple[str, str], ...] = (),
    schedulable: bool = True,
    reachable: bool = True,
    sick: Iterable[int] = (),
) -> Node:
    cluster, clique = fabric.split(".") if fabric else (None, None)
    atoms = tuple(
        Atom(
            index=i,
            model=model,
            nvlink_group=i * groups // gpus,
            fabric_cluster=cluster,
            fabric_clique=int(clique) if clique else None,
            healthy=i not in set(sick),
            health_reason="xid-79" if i in set(sick) else None,
        )
        for i in range(gpus)
    )
    return Node(name, "pool_1", atoms, labels, schedulable, reachable)


def snap(
    n: Node,
    busy: Iterable[int] = (),
    spot: Mapping[int, tuple[str, ...]] | None = None,
    blocked: str | None = None,
) -> NodeSnapshot:
    spot = spot or {}
    return NodeSnapshot(n, frozenset(busy) | frozenset(spot), tuple(sorted(spot.items())), blocked)


def req(gpus: int | None = 4, **kw: object) -> Request:
    return Request(Window(0, 3_600_000), gpus, **kw)  # type: ignore[arg-type]


def only(result: Plan | NoFit) -> tuple[str, tuple[int, ...], int]:
    assert isinstance(result, Plan), result
    (member,) = result.members
    return member.node_id, member.atoms, member.score


FILTER_CASES = [
    ("maintenance", req(), snap(node("n"), blocked="firmware"), "in maintenance"),
    (
        "maintenance before cordon",
        req(),
        snap(node("n", schedulable=False), blocked="x"),
        "in maintenance",
    ),
    ("cordoned", req(), snap(node("n", schedulable=False)), "cordoned"),
    (
        "cordoned before unreachable",
        req(),
        snap(node("n", schedulable=False, reachable=False)),
        "cordoned",
    ),
    ("unreachable", req(), snap(node("n", reachable=False)), "unreachable"),
    ("model", req(models=("a100",)), snap(node("n")), "model h100 not accepted"),
    (
        "model before fit",
        req(models=("a100",)),
        snap(node("n"), busy=range(8)),
        "model h100 not accepted",
    ),
    ("model ok", req(models=("a100", "h100")), snap(node("n")), None),
    ("no fit", req(), snap(node("n"), busy=range(8)), "fits: 0 of 4 gpu free"),
    ("partial fit", req(), snap(node("n"), busy=range(5)), "fits: 3 of 4 gpu free"),
    (
        "quarantined never free",
        req(),
        snap(node("n", sick=(0, 1)), busy=(2, 3, 4)),
        "fits: 3 of 4 gpu free",
    ),
    ("full fit", req(8), snap(node("n")), None),
    (
        "nvlink-all",
        req(8, topology="nvlink-all"),
        snap(node("n", groups=2)),
        "nvlink-all: at most 4 of 8 gpu free in one NVLink group",
    ),
    (
        "nvlink-all partial",
        req(4, topology="nvlink-all"),
        snap(node("n", groups=2), busy=(0, 5)),
        "nvlink-all: at most 3 of 4 gpu free in one NVLink group",
    ),
    ("nvlink-all fits", req(4, topology="nvlink-all"), snap(node("n", groups=2), busy=(0,)), None),
    ("lease too small", req(8, node_lease=True), snap(node("n", 4)), "has 4 gpu, needs 8"),
    (
        "lease busy",
        req(None, node_lease=True),
        snap(node("n"), busy=(0, 7)),
        "node lease: 6 of 8 gpu free",
    ),
    (
        "lease sick",
        req(8, node_lease=True),
        snap(node("n", sick=(3,))),
        "node lease: 7 of 8 gpu free",
    ),
    ("lease ok", req(4, node_lease=True), snap(node("n")), None),
    ("lease cordoned", req(None, node_lease=True), snap(node("n", schedulable=False)), "cordoned"),
]


@pytest.mark.parametrize(("case", "request_", "snapshot", "expected"), FILTER_CASES)
def test_filters(
    case: str, request_: Request, snapshot: NodeSnapshot, expected: str | None
) -> None:
    result = plan_node(request_, snapshot)
    if expected is None:
        assert not isinstance(result, str), (case, result)
    else:
        assert result == expected, case


def test_mixed_model_node_names_every_refused_model() -> None:
    atoms = node("n", 4).atoms[:2] + tuple(
        Atom(index=i, model="a100", fabric_cluster="c1", fabric_clique=1) for i in (2, 3)
    )
    mixed = NodeSnapshot(Node("n", "pool_1", atoms))
    assert plan_node(req(2, models=("h100",)), mixed) == "model a100 not accepted"
    assert plan_node(req(2, models=("l4",)), mixed) == "model a100,h100 not accepted"
    assert not isinstance(plan_node(req(2, models=("a100", "h100")), mixed), str)


PICK_CASES = [
    ("best-fit group that fits", req(4), node("n", groups=2), (0,), (4, 5, 6, 7)),
    ("fewest free that still fit", req(2), node("n", groups=2), (0,), (1, 2)),
    ("tie lowest group", req(3), node("n", groups=2), (0, 4), (1, 2, 3)),
    ("fullest groups first", req(5), node("n", groups=2), (0, 1, 4), (2, 3, 5, 6, 7)),
    ("tie lowest group when filling", req(5), node("n", groups=4), (0, 2), (1, 4, 5, 6, 7)),
    ("lowest indices in a group", req(2), node("n", 8), (1,), (0, 2)),
    ("skips quarantined", req(3), node("n", 4, sick=(0,)), (), (1, 2, 3)),
    ("nvlink-all best fit", req(2, topology="nvlink-all"), node("n", groups=2), (0, 1), (2, 3)),
    (
        "nvlink-all larger group",
        req(3, topology="nvlink-all"),
        node("n", groups=2),
        (0, 1),
        (4, 5, 6),
    ),
    ("node lease takes all", req(2, node_lease=True), node("n", 4, groups=2), (), (0, 1, 2, 3)),
]


@pytest.mark.parametrize(("case", "request_", "n", "busy", "expected"), PICK_CASES)
def test_atom_pick(
    case: str, request_: Request, n: Node, busy: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    assert pick_atoms(request_, snap(n, busy)) == expected, case
    result = plan_node(request_, snap(n, busy))
    assert not isinstance(result, str)
    assert result.atoms == expected


SCORE_CASES = [
    ("empty node, one group", req(2), node("n"), (), 10 * (2 * 1000 // 8) + 9),
    ("partly booked", req(2), node("n"), (0, 1), 10 * (4 * 1000 // 8) + 9),
    ("spans two groups", req(6), node("n", groups=2), (0,), 10 * (7 * 1000 // 8) + 8),
    ("spans four groups", req(4), node("n", groups=4), (0, 2, 4, 6), 10 * 1000 + 6),
    ("busy counts though quarantine not", req(1), node("n", 3, sick=(0,)), (1,), 10 * 666 + 9),
    ("node lease", req(None, node_lease=True), node("n", groups=2), (), 10_000 + 8),
]


@pytest.mark.parametrize(("case", "request_", "n", "busy", "expected"), SCORE_CASES)
def test_score(case: str, request_: Request, n: Node, busy: tuple[int, ...], expected: int) -> None:
    result = plan_node(request_, snap(n, busy))
    assert not isinstance(result, str)
    assert result.score == expected, case


def test_bin_packing_prefers_partly_booked_node() -> None:
    snaps = [snap(node("a")), snap(node("b"), busy=(0, 1, 2)), snap(node("c"), busy=(7,))]
    assert only(place(req(4), snaps, seed=0, top_n=1)) == ("b", (3, 4, 5, 6), 8759)


def test_ties_break_by_node_name_whatever_the_input_order() -> None:
    snaps = [snap(node(name)) for name in ("d", "b", "a", "c")]
    assert only(place(req(2), snaps, seed=0, top_n=1))[0] == "a"
    assert only(place(req(2), snaps[::-1], seed=0, top_n=1))[0] == "a"


NOFIT_CASES = [
    ([], req(), "no node fits (0 nodes): the pool has no nodes"),
    (
        [snap(node("a"), busy=range(8)), snap(node("b"), busy=range(8))],
        req(),
        "no node fits (2 nodes): 2 × fits: 0 of 4 gpu free",
    ),
    (
        [
            snap(node("a"), busy=range(8)),
            snap(node("b", schedulable=False)),
            snap(node("c"), busy=range(8)),
        ],
        req(),
        "no node fits (3 nodes): 2 × fits: 0 of 4 gpu free, 1 × cordoned",
    ),
    (
        [
            snap(node("a", reachable=False)),
            snap(node("b", schedulable=False)),
            snap(node("c"), busy=range(6)),
            snap(node("d"), blocked="bios"),
        ],
        req(),
        "no node fits (4 nodes): 1 × cordoned, 1 × fits: 2 of 4 gpu free, "
        "1 × in maintenance, 1 × unreachable",
    ),
    (
        [snap(node("a", groups=2)), snap(node("b", groups=2))],
        req(8, topology="nvlink-all"),
        "no node fits (2 nodes): 2 × nvlink-all: at most 4 of 8 gpu free in one NVLink group",
    ),
]


@pytest.mark.parametrize(("snaps", "request_", "reason"), NOFIT_CASES)
def test_no_fit_reason_counts(snaps: list[NodeSnapshot], request_: Request, reason: str) -> None:
    assert place(request_, snaps, seed=7, top_n=3) == NoFit(reason)


def test_excluded_nodes_are_refused_and_counted() -> None:
    snaps = [snap(node("a")), snap(node("b"), busy=range(8))]
    assert only(place(req(), snaps, seed=0, top_n=3))[0] == "a"
    assert place(req(), snaps, seed=0, top_n=3, exclude=frozenset({"a"})) == NoFit(
        "no node fits (2 nodes): 1 × excluded, 1 × fits: 0 of 4 gpu free"
    )
    cordoned = [snap(node("a", schedulable=False))]
    assert place(req(), cordoned, seed=0, top_n=1, exclude=frozenset({"a"})) == NoFit(
        "no node fits (1 nodes): 1 × excluded"
    )


def test_seeded_pick_stays_within_top_n_and_is_deterministic() -> None:
    # Scores: e > d > c > b > a (more busy atoms); so the ranking is e, d, c, b, a.
    snaps = [snap(node(name), busy=range(i)) for i, name in enumerate("abcde")]
    for top_n, allowed in [(1, "e"), (3, "edc"), (10, "edcba"), (0, "e"), (-2, "e")]:
        picks = [only(place(req(2), snaps, seed=s, top_n=top_n))[0] for s in range(20)]
        assert set(picks) == set(allowed), top_n
        assert picks == [allowed[s % len(allowed)] for s in range(20)]
        again = [only(place(req(2), snaps[::-1], seed=s, top_n=top_n))[0] for s in range(20)]
        assert again == picks


def test_place_dispatches_to_gang() -> None:
    snaps = [snap(node(name, fabric="c1.2")) for name in ("a", "b")]
    result = place(req(8, gang_size=2, topology_key="fabric.domain"), snaps, seed=0, top_n=1)
    assert isinstance(result, Plan)
    assert [m.node_id for m in result.members] == ["a", "b"]
    assert result.group == "c1.2"


def test_explain_single_node_lines() -> None:
    snaps = [
        snap(node("node-03"), busy=(0,)),
        snap(node("node-02", schedulable=False)),
        snap(node("node-01"), busy=(0, 1, 2, 3)),
        snap(node("node-04")),
    ]
    assert explain(req(4), snaps) == [
        ("node-01", "taken: atoms 4-7, score 10009"),
        ("node-02", "refused: cordoned"),
        ("node-03", "candidate #2, score 6259, atoms 1-4"),
        ("node-04", "candidate #3, score 5009, atoms 0-3"),
    ]
    picked = explain(req(4), snaps, seed=1, top_n=3)
    assert picked[0] == ("node-01", "candidate #1, score 10009, atoms 4-7")
    assert picked[2] == ("node-03", "taken: atoms 1-4, score 6259")
    assert explain(req(4), snaps) == explain(req(4), snaps[::-1])
    assert explain(req(4), []) == []


def test_explain_names_the_plan_place_picks() -> None:
    snaps = [snap(node(name), busy=range(i % 3)) for i, name in enumerate("abcdef")]
    for seed in range(6):
        node_id = only(place(req(2), snaps, seed=seed, top_n=4))[0]
        lines = dict(explain(req(2), snaps, seed=seed, top_n=4))
        assert lines[node_id].startswith("taken: ")
        assert sum(v.startswith("taken") for v in lines.values()) == 1


@pytest.mark.parametrize(
    ("indices", "text"),
    [((), "none"), ((3,), "3"), ((0, 1, 2, 3), "0-3"), ((0, 1, 4, 6, 7), "0-1,4,6-7")],
)
def test_atom_ranges(indices: tuple[int, ...], text: str) -> None:
    assert atom_ranges(indices) == text
