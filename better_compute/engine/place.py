"""Single-node placement over candidate nodes, and the dispatch to gangs (PRODUCT.md §5.1).

The shared planning (plan_node, plan_nodes, seeded_pick) lives in fit.py, below gang.py and this
module, so this module can import gang.py at the top without a cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from better_compute.engine.atoms import victims_of
from better_compute.engine.fit import Fit, plan_nodes, seeded_pick
from better_compute.engine.gang import place_gang
from better_compute.model import NodeSnapshot, NoFit, Plan, Request


def single_plan(fit: Fit) -> Plan:
    snap, member = fit
    return Plan(members=(member,), score=member.score, victims=victims_of(snap, member.atoms))


def rank_single(fits: Iterable[Fit]) -> list[Plan]:
    """Single-node plans, best first: score descending, then node name."""
    plans = [single_plan(fit) for fit in fits]
    return sorted(plans, key=lambda p: (-p.score, p.members[0].node_id))


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
        return place_gang(request, snapshots, seed=seed, top_n=top_n, exclude=exclude)
    fits, refused = plan_nodes(request, snapshots, exclude=exclude)
    if not fits:
        return no_node_fits(len(snapshots), refused)
    return pick_single(fits, seed=seed, top_n=top_n)


def pick_single(fits: Sequence[Fit], *, seed: int, top_n: int) -> Plan:
    """One of the best topN single-node plans among `fits` (at least one)."""
    return seeded_pick(rank_single(fits), seed=seed, top_n=top_n)
