"""One node's share over candidate nodes; the seeded pick among the best topN (PRODUCT.md §5.1)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from better_compute.engine.atoms import pick_atoms, victims_of
from better_compute.engine.filters import refusal
from better_compute.engine.scorers import score
from better_compute.model import NodePlan, NodeSnapshot, NoFit, Plan, Request

T = TypeVar("T")

#: A fitting node: its snapshot and its plan.
Fit = tuple[NodeSnapshot, NodePlan]


def plan_node(request: Request, snap: NodeSnapshot, *, free_spot: bool = False) -> NodePlan | str:
    """Plan one node's share for request.window; a str is the refusal reason.

    With free_spot, atoms listed in snap.spot_holders count as free.
    """
    reason = refusal(request, snap, free_spot=free_spot)
    if reason is not None:
        return reason
    taken = pick_atoms(request, snap, free_spot=free_spot)
    return NodePlan(
        node_id=snap.node.name, atoms=taken, score=score(snap, taken, free_spot=free_spot)
    )


def plan_nodes(
    request: Request,
    snapshots: Sequence[NodeSnapshot],
    *,
    exclude: frozenset[str] = frozenset(),
    free_spot: bool = False,
) -> tuple[list[Fit], list[tuple[str, str]]]:
    """Every node planned, in node-name order: (fitting nodes, (node name, refusal) pairs)."""
    fits: list[Fit] = []
    refused: list[tuple[str, str]] = []
    for snap in sorted(snapshots, key=lambda s: s.node.name):
        name = snap.node.name
        result = "excluded" if name in exclude else plan_node(request, snap, free_spot=free_spot)
        if isinstance(result, str):
            refused.append((name, result))
        else:
            fits.append((snap, result))
    return fits, refused


def single_plan(fit: Fit) -> Plan:
    snap, member = fit
    return Plan(members=(member,), score=member.score, victims=victims_of(snap, member.atoms))


def rank_single(fits: Iterable[Fit]) -> list[Plan]:
    """Single-node plans, best first: score descending, then node name."""
    plans = [single_plan(fit) for fit in fits]
    return sorted(plans, key=lambda p: (-p.score, p.members[0].node_id))


def seeded_pick(ranked: Sequence[T], *, seed: int, top_n: int) -> T:
    """`ranked[seed % min(top_n, len(ranked))]`: one of the best topN, reproducible by seed."""
    if not ranked:
        raise ValueError("nothing to pick from")
    return ranked[seed % min(max(1, top_n), len(ranked))]


def count_reasons(reasons: Iterable[str]) -> str:
    """`2 × fits: 0 of 4 gpu free, 1 × cordoned`: by count descending, then reason text."""
    counts: dict[str, int] = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{count} × {reason}" for reason, count in ordered)


def no_node_fits(total: int, refused: Sequence[tuple[str, str]]) -> NoFit:
    if total == 0:
        return NoFit("no node fits (0 nodes): the pool has no nodes")
    return NoFit(f"no node fits ({total} nodes): {count_reasons(r for _, r in refused)}")


def place(
    request: Request,
    snapshots: Sequence[NodeSnapshot],
    *,
    seed: int,
    top_n: int,
    exclude: frozenset[str] = frozenset(),
) -> Plan | NoFit:
    """Dispatches to gang placement when request.gang_size is set.

    Nodes named in `exclude` are refused with reason 'excluded'.
    """
    if request.gang_size is not None:
        # Imported here: gang placement is built on plan_node, so gang.py imports this module.
        from better_compute.engine.gang import place_gang

        return place_gang(request, snapshots, seed=seed, top_n=top_n, exclude=exclude)
    fits, refused = plan_nodes(request, snapshots, exclude=exclude)
    if not fits:
        return no_node_fits(len(snapshots), refused)
    return seeded_pick(rank_single(fits), seed=seed, top_n=top_n)
