"""Candidate gangs per topology value, all or nothing (PRODUCT.md §5.3).

Every node is planned for the per-node request; fitting nodes are grouped by the topology key's
value; each group with at least `size` fitting nodes offers its `size` best nodes as one candidate.
"""

from __future__ import annotations

from collections.abc import Sequence

from better_compute.engine.atoms import victims_of
from better_compute.engine.fit import Fit, plan_nodes, seeded_pick
from better_compute.model import NodeSnapshot, NoFit, Plan, Request


def gang_size(request: Request) -> int:
    if request.gang_size is None:
        raise ValueError("not a gang request")
    return request.gang_size


def group_fits(request: Request, fits: Sequence[Fit]) -> tuple[dict[str, list[Fit]], list[Fit]]:
    """Fitting nodes by topology value ("" without a key), and fitting nodes lacking the label."""
    key = request.topology_key
    groups: dict[str, list[Fit]] = {}
    unlabeled: list[Fit] = []
    for fit in fits:
        value = "" if key is None else fit[0].node.label(key)
        if value is None:
            unlabeled.append(fit)  # nodes without the label never join a gang
        else:
            groups.setdefault(value, []).append(fit)
    return groups, unlabeled


def _member_rank(fit: Fit) -> tuple[int, int, str]:
    # Victims only exist when planning with spot freed; otherwise this is score, then name.
    snap, plan = fit
    return (len(victims_of(snap, plan.atoms)), -plan.score, plan.node_id)


def gang_plan(value: str, members: Sequence[Fit]) -> Plan:
    victims = sorted({rid for snap, plan in members for rid in victims_of(snap, plan.atoms)})
    return Plan(
        members=tuple(sorted((plan for _, plan in members), key=lambda p: p.node_id)),
        score=sum(plan.score for _, plan in members),
        group=value or None,
        victims=tuple(victims),
    )


def rank_gangs(request: Request, fits: Sequence[Fit]) -> list[Plan]:
    """One candidate per large enough group; fewest victims, summed score descending, group name."""
    size = gang_size(request)
    groups, _ = group_fits(request, fits)
    candidates = [
        gang_plan(value, sorted(groups[value], key=_member_rank)[:size])
        for value in sorted(groups)
        if len(groups[value]) >= size
    ]
    return sorted(candidates, key=lambda p: (len(p.victims), -p.score, p.group or ""))


def gang_candidates(
    request: Request,
    snapshots: Sequence[NodeSnapshot],
    *,
    exclude: frozenset[str] = frozenset(),
    free_spot: bool = False,
) -> list[Plan]:
    """Candidate gangs ranked best first (see rank_gangs)."""
    fits, _ = plan_nodes(request, snapshots, exclude=exclude, free_spot=free_spot)
    return rank_gangs(request, fits)


def no_gang_fits(request: Request, fits: Sequence[Fit]) -> NoFit:
    size = gang_size(request)
    groups, _ = group_fits(request, fits)
    most = max((len(members) for members in groups.values()), default=0)
    key = request.topology_key
    if key is None:
        return NoFit(f"no gang of {size} nodes fits in the pool (at most {most} nodes fit)")
    return NoFit(f"no gang of {size} nodes fits in one {key} (at most {most} nodes fit together)")


def place_gang(
    request: Request,
    snapshots: Sequence[NodeSnapshot],
    *,
    seed: int,
    top_n: int,
    exclude: frozenset[str] = frozenset(),
) -> Plan | NoFit:
    fits, _ = plan_nodes(request, snapshots, exclude=exclude)
    return pick_gang(request, fits, seed=seed, top_n=top_n)


def pick_gang(request: Request, fits: Sequence[Fit], *, seed: int, top_n: int) -> Plan | NoFit:
    """One of the best topN gangs made of `fits`; the outcome depends on the fitting nodes only."""
    ranked = rank_gangs(request, fits)
    if not ranked:
        return no_gang_fits(request, fits)
    return seeded_pick(ranked, seed=seed, top_n=top_n)
