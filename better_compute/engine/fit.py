"""One node's share for a request, every node planned, and the seeded pick (PRODUCT.md §5.1).

Single-node placement (place.py) and gang placement (gang.py) both build on these; keeping them
here, below both, is what lets place.py dispatch to gang.py without an import cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from better_compute.engine.atoms import pick_atoms
from better_compute.engine.filters import refusal
from better_compute.engine.scorers import score
from better_compute.model import NodePlan, NodeSnapshot, Request

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


def seeded_pick(ranked: Sequence[T], *, seed: int, top_n: int) -> T:
    """`ranked[seed % min(top_n, len(ranked))]`: one of the best topN, reproducible by seed."""
    if not ranked:
        raise ValueError("nothing to pick from")
    return ranked[seed % min(max(1, top_n), len(ranked))]
