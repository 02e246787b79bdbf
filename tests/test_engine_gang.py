"""Gang placement: groups per topology value, summed scores, whole gangs or a counted reason."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from better_compute.engine.explain import explain
from better_compute.engine.gang import gang_candidates, place_gang
from better_compute.engine.place import place
from better_compute.model import Atom, Node, NodeSnapshot, NoFit, Plan, Request, Window

KEY = "fabric.domain"


def node(
    name: str,
    fabric: str | None = "c1.1",
    *,
    gpus: int = 8,
    labels: tuple[tuple[str, str], ...] = (),
    schedulable: bool = True,
) -> Node:
    cluster, clique = fabric.split(".") if fabric else (None, None)
    atoms = tuple(Atom(i, "h100", 0, cluster, int(clique) if clique else None) for i in range(gpus))
    return Node(name, "pool_1", atoms, labels, schedulable)


def snap(n: Node, busy: Iterable[int] = ()) -> NodeSnapshot:
    return NodeSnapshot(n, frozenset(busy))


def gang(size: int, key: str | None = KEY, gpus: int | None = 8, **kw: object) -> Request:
    return Request(Window(0, 1000), gpus, gang_size=size, topology_key=key, **kw)  # type: ignore[arg-type]


def disagreeing(name: str) -> Node:
    """A node whose GPUs sit on two fabric cliques: it has no fabric.domain."""
    atoms = tuple(Atom(i, "h100", 0, "c1", 1 if i < 4 else 2) for i in range(8))
    return Node(name, "pool_1", atoms)


def members(result: Plan | NoFit) -> list[str]:
    assert isinstance(result, Plan), result
    return [m.node_id for m in result.members]


def test_disagreeing_gpus_have_no_fabric_domain() -> None:
    assert disagreeing("x").label(KEY) is None
    assert node("y", "c2.7").label(KEY) == "c2.7"


def test_only_the_large_enough_fabric_forms_a_gang() -> None:
    snaps = [snap(node(f"a{i}", "c1.1")) for i in range(3)]
    snaps += [snap(node(f"b{i}", "c1.2")) for i in (3, 1, 2, 0)]
    result = place_gang(gang(4), snaps, seed=5, top_n=3)
    assert isinstance(result, Plan)
    assert members(result) == ["b0", "b1", "b2", "b3"]
    assert result.group == "c1.2"
    assert result.score == 4 * 10009
    assert all(m.atoms == tuple(range(8)) for m in result.members)
    assert result.victims == ()


def test_candidates_ranked_by_summed_score_then_group_name() -> None:
    snaps = [snap(node(f"a{i}", "c1.1"), busy=(0,)) for i in range(2)]  # 1 gpu busy each
    snaps += [snap(node(f"b{i}", "c1.2"), busy=(0,)) for i in range(2)]  # same score as c1.1
    snaps += [snap(node(f"c{i}", "c1.3"), busy=(0, 1)) for i in range(2)]  # fuller: best
    snaps += [snap(node(f"d{i}", "c1.4")) for i in range(2)]  # empty: worst
    ranked = gang_candidates(gang(2, gpus=4), snaps)
    assert [p.group for p in ranked] == ["c1.3", "c1.1", "c1.2", "c1.4"]
    assert [p.score for p in ranked] == [2 * 7509, 2 * 6259, 2 * 6259, 2 * 5009]
    picks = [place_gang(gang(2, gpus=4), snaps, seed=s, top_n=2) for s in range(4)]
    assert [p.group for p in picks if isinstance(p, Plan)] == ["c1.3", "c1.1", "c1.3", "c1.1"]
    assert place_gang(gang(2, gpus=4), snaps[::-1], seed=1, top_n=2) == picks[1]


def test_group_contributes_its_best_nodes() -> None:
    snaps = [
        snap(node("n1"), busy=()),
        snap(node("n2"), busy=(0, 1)),
        snap(node("n3"), busy=(0,)),
        snap(node("n4"), busy=(0, 1)),
        snap(node("n5"), busy=range(7)),  # too full for 4
    ]
    result = place_gang(gang(3, gpus=4), snaps, seed=0, top_n=1)
    assert members(result) == ["n2", "n3", "n4"]
    assert isinstance(result, Plan) and result.score == 7509 + 6259 + 7509


NOFIT_CASES = [
    (
        "unlabeled nodes never join",
        [snap(node(f"a{i}")) for i in range(3)] + [snap(disagreeing("x")), snap(node("y", None))],
        gang(4),
        "no gang of 4 nodes fits in one fabric.domain (at most 3 nodes fit together)",
    ),
    (
        "split across fabrics",
        [snap(node("a", "c1.1")), snap(node("b", "c1.2")), snap(node("c", "c2.1"))],
        gang(2),
        "no gang of 2 nodes fits in one fabric.domain (at most 1 nodes fit together)",
    ),
    (
        "busy and cordoned nodes do not count",
        [snap(node("a")), snap(node("b"), busy=(0,)), snap(node("c", schedulable=False))],
        gang(2),
        "no gang of 2 nodes fits in one fabric.domain (at most 1 nodes fit together)",
    ),
    (
        "nothing fits",
        [snap(node("a"), busy=(0,))],
        gang(2),
        "no gang of 2 nodes fits in one fabric.domain (at most 0 nodes fit together)",
    ),
    (
        "empty pool",
        [],
        gang(2),
        "no gang of 2 nodes fits in one fabric.domain (at most 0 nodes fit together)",
    ),
    (
        "no key",
        [snap(node("a", None)), snap(disagreeing("b")), snap(node("c"), busy=(1,))],
        gang(3, key=None),
        "no gang of 3 nodes fits in the pool (at most 2 nodes fit)",
    ),
    (
        "no key, empty pool",
        [],
        gang(2, key=None),
        "no gang of 2 nodes fits in the pool (at most 0 nodes fit)",
    ),
    (
        "operator label",
        [
            snap(node("a", labels=(("rack", "r1"),))),
            snap(node("b", labels=(("rack", "r2"),))),
            snap(node("c")),
        ],
        gang(2, key="rack"),
        "no gang of 2 nodes fits in one rack (at most 1 nodes fit together)",
    ),
]


@pytest.mark.parametrize(("case", "snaps", "request_", "reason"), NOFIT_CASES)
def test_no_gang_reason(
    case: str, snaps: list[NodeSnapshot], request_: Request, reason: str
) -> None:
    assert place_gang(request_, snaps, seed=0, top_n=3) == NoFit(reason), case
    assert place(request_, snaps, seed=0, top_n=3) == NoFit(reason), case


def test_no_key_any_nodes_form_a_gang() -> None:
    snaps = [snap(node("a", None)), snap(disagreeing("b")), snap(node("c", "c9.9"))]
    result = place_gang(gang(3, key=None), snaps, seed=0, top_n=1)
    assert members(result) == ["a", "b", "c"]
    assert isinstance(result, Plan) and result.group is None


def test_operator_label_groups() -> None:
    r1, r2 = (("rack", "r1"),), (("rack", "r2"),)
    snaps = [snap(node(n, labels=lab)) for n, lab in [("a", r1), ("b", r2), ("c", r2), ("d", ())]]
    result = place_gang(gang(2, key="rack"), snaps, seed=0, top_n=3)
    assert members(result) == ["b", "c"]
    assert isinstance(result, Plan) and result.group == "r2"


def test_excluded_node_breaks_the_gang_and_another_group_takes_over() -> None:
    snaps = [snap(node(n, "c1.1"), busy=(0,)) for n in ("a", "b")]
    snaps += [snap(node(n, "c1.2")) for n in ("c", "d")]
    assert members(place_gang(gang(2, gpus=4), snaps, seed=0, top_n=1)) == ["a", "b"]
    again = place_gang(gang(2, gpus=4), snaps, seed=0, top_n=1, exclude=frozenset({"a"}))
    assert members(again) == ["c", "d"]


def test_gang_of_node_leases() -> None:
    snaps = [snap(node("a", gpus=8)), snap(node("b", gpus=4)), snap(node("c", gpus=8), busy=(2,))]
    result = place_gang(gang(2, gpus=None, node_lease=True), snaps, seed=0, top_n=1)
    assert members(result) == ["a", "b"]
    assert isinstance(result, Plan)
    assert [m.atoms for m in result.members] == [tuple(range(8)), tuple(range(4))]
    assert place_gang(gang(2, gpus=8, node_lease=True), snaps, seed=0, top_n=1) == NoFit(
        "no gang of 2 nodes fits in one fabric.domain (at most 1 nodes fit together)"
    )


def test_explain_gang_lines() -> None:
    snaps = [snap(node(f"a{i}", "c1.1")) for i in range(2)]
    snaps += [snap(node(f"b{i}", "c1.2"), busy=(0,)) for i in range(3)]
    snaps += [snap(node("c0", "c1.3"), busy=(0,)), snap(node("c1", "c1.3", schedulable=False))]
    snaps += [snap(disagreeing("x"))]
    assert explain(gang(2, gpus=4), snaps) == [
        ("fabric.domain=c1.1", "2 nodes fit: candidate #2, summed score 10018, members a0, a1"),
        ("fabric.domain=c1.2", "3 nodes fit: taken, summed score 12518, members b0, b1"),
        ("fabric.domain=c1.3", "only 1 of 2 nodes fit"),
        ("c1", "refused: cordoned"),
        ("x", "refused: no fabric.domain label"),
    ]
    lines = explain(gang(2, gpus=4), snaps, seed=1, top_n=2)
    assert lines[0] == (
        "fabric.domain=c1.1",
        "2 nodes fit: taken, summed score 10018, members a0, a1",
    )
    assert explain(gang(3, key=None, gpus=8), snaps) == [
        ("pool", "3 nodes fit: taken, summed score 30027, members a0, a1, x"),
        ("b0", "refused: fits: 7 of 8 gpu free"),
        ("b1", "refused: fits: 7 of 8 gpu free"),
        ("b2", "refused: fits: 7 of 8 gpu free"),
        ("c0", "refused: fits: 7 of 8 gpu free"),
        ("c1", "refused: cordoned"),
    ]
