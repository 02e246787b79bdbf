"""Properties of the engine over random pools: plans are sound, whole and reproducible."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from better_compute.engine.atoms import spot_held
from better_compute.engine.explain import explain
from better_compute.engine.fit import plan_node
from better_compute.engine.gang import gang_candidates
from better_compute.engine.place import place
from better_compute.engine.preempt import enough_in_name_order, plan_preemption
from better_compute.model import Atom, Node, NodeSnapshot, NoFit, Plan, Request, Window

FABRICS = [("c1", 1), ("c1", 1), ("c1", 2), ("c2", 1), (None, None)]
SPOT_IDS = ["rsv_a", "rsv_b", "rsv_c", "rsv_d"]


@st.composite
def snapshots(draw: st.DrawFn, name: str) -> NodeSnapshot:
    gpus = draw(st.sampled_from([0, 2, 4, 8, 8, 8]))
    groups = draw(st.integers(1, 4))
    fabric = draw(st.sampled_from(FABRICS))
    mixed = draw(st.booleans()) and gpus > 1  # GPUs that disagree: no fabric.domain
    model = draw(st.sampled_from(["h100", "h100", "a100"]))
    atoms = tuple(
        Atom(
            index=i,
            model=model,
            nvlink_group=i * groups // gpus,
            fabric_cluster=fabric[0],
            fabric_clique=(fabric[1] or 0) + (i % 2 if mixed else 0) if fabric[0] else None,
            healthy=draw(st.integers(0, 9)) > 0,
        )
        for i in range(gpus)
    )
    labels = (("rack", draw(st.sampled_from(["r1", "r2"]))),) if draw(st.booleans()) else ()
    node = Node(
        name,
        "pool_1",
        atoms,
        labels,
        schedulable=draw(st.integers(0, 9)) > 0,
        reachable=draw(st.integers(0, 9)) > 0,
    )
    busy = (
        draw(st.frozensets(st.integers(0, max(0, gpus - 1)), max_size=gpus))
        if gpus
        else frozenset()
    )
    spot = []
    for i in sorted(busy):
        if draw(st.booleans()):
            ids = draw(st.lists(st.sampled_from(SPOT_IDS), min_size=1, max_size=2, unique=True))
            spot.append((i, tuple(sorted(ids))))
    blocked = "maintenance" if draw(st.integers(0, 9)) == 0 else None
    return NodeSnapshot(node, busy, tuple(spot), blocked)


@st.composite
def pools(draw: st.DrawFn) -> list[NodeSnapshot]:
    count = draw(st.integers(0, 8))
    return [draw(snapshots(f"node-{i:02d}")) for i in range(count)]


@st.composite
def requests(draw: st.DrawFn) -> Request:
    lease = draw(st.integers(0, 5)) == 0
    return Request(
        window=Window(0, 1000),
        gpus=draw(st.none() if lease else st.nothing())
        if lease and draw(st.booleans())
        else draw(st.integers(1, 8)),
        models=draw(st.sampled_from([(), ("h100",), ("a100", "h100")])),
        topology=draw(st.sampled_from([None, None, "nvlink-all"])),
        gang_size=draw(st.sampled_from([None, None, 2, 3])),
        topology_key=draw(st.sampled_from([None, "fabric.domain", "rack"])),
        node_lease=lease,
    )


def by_name(snaps: list[NodeSnapshot]) -> dict[str, NodeSnapshot]:
    return {s.node.name: s for s in snaps}


def check_members(
    request: Request, snaps: list[NodeSnapshot], plan: Plan, *, free_spot: bool
) -> None:
    nodes = by_name(snaps)
    for member in plan.members:
        snap = nodes[member.node_id]
        healthy = {a.index for a in snap.node.atoms if a.healthy}
        freeable = set(spot_held(snap)) if free_spot else set()
        assert set(member.atoms) <= healthy
        assert all(i not in snap.busy or i in freeable for i in member.atoms)
        assert list(member.atoms) == sorted(set(member.atoms))
        wanted = len(snap.node.atoms) if request.node_lease else request.gpus
        assert len(member.atoms) == wanted


SEEDS = st.integers(-(2**40), 2**40)


@settings(max_examples=400, deadline=None)
@given(pools(), requests(), SEEDS, st.integers(-1, 5))
def test_plans_are_sound_whole_and_reproducible(
    snaps: list[NodeSnapshot], request: Request, seed: int, top_n: int
) -> None:
    result = place(request, snaps, seed=seed, top_n=top_n)
    assert result == place(request, snaps[::-1], seed=seed, top_n=top_n)
    assert explain(request, snaps) == explain(request, snaps[::-1])
    if isinstance(result, NoFit):
        if request.gang_size is not None:
            assert result.reason.startswith(f"no gang of {request.gang_size} nodes fits in ")
            assert gang_candidates(request, snaps) == []
        else:
            assert result.reason.startswith(f"no node fits ({len(snaps)} nodes): ")
            counted = re.findall(r"(?:: |, )(\d+) × ", result.reason) if snaps else []
            assert sum(int(count) for count in counted) == len(snaps)
        return
    assert result.victims == ()
    check_members(request, snaps, result, free_spot=False)
    if request.gang_size is None:
        assert len(result.members) == 1 and result.group is None
        return
    names = [m.node_id for m in result.members]
    assert len(names) == request.gang_size == len(set(names))
    assert names == sorted(names)
    assert result.score == sum(m.score for m in result.members)
    if request.topology_key is None:
        assert result.group is None
    else:
        values = {by_name(snaps)[n].node.label(request.topology_key) for n in names}
        assert values == {result.group}
    ranked = gang_candidates(request, snaps)
    assert result in ranked[: max(1, top_n)]


@settings(max_examples=200, deadline=None)
@given(pools(), requests(), SEEDS, st.integers(1, 4))
def test_single_node_pick_is_among_the_best_top_n(
    snaps: list[NodeSnapshot], request: Request, seed: int, top_n: int
) -> None:
    single = Request(request.window, request.gpus or 1, request.models, request.topology)
    result = place(single, snaps, seed=seed, top_n=top_n)
    plans = [p for s in snaps if not isinstance(p := plan_node(single, s), str)]
    if not plans:
        assert isinstance(result, NoFit)
        return
    assert isinstance(result, Plan)
    ranked = sorted(plans, key=lambda p: (-p.score, p.node_id))
    assert result.members[0] in ranked[:top_n]
    assert result.members[0] == ranked[seed % min(top_n, len(ranked))]


@settings(max_examples=300, deadline=None)
@given(pools(), requests(), SEEDS, st.integers(1, 4))
def test_preemption_frees_only_spot_work_and_names_its_victims(
    snaps: list[NodeSnapshot], request: Request, seed: int, top_n: int
) -> None:
    result = plan_preemption(request, snaps)
    assert result == plan_preemption(request, snaps[::-1])
    if request.node_lease:
        assert result == NoFit("spot and node-lease requests never preempt")
        return
    normal = place(request, snaps, seed=seed, top_n=top_n)
    if isinstance(result, NoFit):
        assert result == normal
        return
    check_members(request, snaps, result, free_spot=True)
    nodes = by_name(snaps)
    victims = {
        rid
        for m in result.members
        for i in m.atoms
        for rid in spot_held(nodes[m.node_id]).get(i, ())
    }
    assert result.victims == tuple(sorted(victims))
    if isinstance(normal, Plan):
        assert result.victims == ()


@settings(max_examples=400, deadline=None)
@given(
    st.integers(0, 14).flatmap(
        lambda n: st.tuples(*(snapshots(f"node-{i:02d}") for i in range(n)))
    ),
    requests(),
    st.integers(1, 5),
    st.integers(1, 4),
)
def test_preemption_plans_the_same_from_enough_snapshots_in_name_order(
    snaps: tuple[NodeSnapshot, ...], request: Request, batch: int, max_plans: int
) -> None:
    """enough_in_name_order keeps the batches (in node-name order) up to the one where
    `max_plans` nodes fit a single-node request: preemption's plan from them is its plan from
    every snapshot (the first `max_plans` fitting nodes by name are all it compares)."""
    ordered = sorted(snaps, key=lambda s: s.node.name)
    batches = [ordered[i : i + batch] for i in range(0, len(ordered), batch)]
    some = enough_in_name_order(request, batches, max_plans)
    assert some == ordered[: len(some)]
    full = plan_preemption(request, ordered, max_plans=max_plans)
    short = plan_preemption(request, some, max_plans=max_plans)
    assert isinstance(short, Plan) == isinstance(full, Plan)
    if isinstance(full, Plan):
        assert short == full
