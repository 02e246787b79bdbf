"""`preview --explain`: why each candidate was taken or refused, as (subject, verdict) lines.

It runs the very planning code placement runs (plan_node via plan_nodes), so it cannot drift.
"""

from __future__ import annotations

from collections.abc import Sequence

from better_compute.engine.fit import plan_nodes, seeded_pick
from better_compute.engine.gang import gang_size, group_fits, rank_gangs
from better_compute.engine.place import rank_single
from better_compute.model import NodeSnapshot, Plan, Request


def atom_ranges(indices: Sequence[int]) -> str:
    """`0-3,6` for atoms 0, 1, 2, 3 and 6."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs) or "none"


def explain(
    request: Request,
    snapshots: Sequence[NodeSnapshot],
    *,
    seed: int = 0,
    top_n: int = 1,
    picked_label: str = "taken",
) -> list[tuple[str, str]]:
    """Node by node (group by group for a gang), why each candidate was taken or refused.

    Pass the seed and topN placement uses so `picked_label` names the plan placement picks; the
    defaults mark the best-ranked plan (a preview, which has no seed yet, calls it "best").
    """
    if request.gang_size is not None:
        return _explain_gang(request, snapshots, seed=seed, top_n=top_n, label=picked_label)
    fits, refused = plan_nodes(request, snapshots)
    ranked = rank_single(fits)
    picked = seeded_pick(ranked, seed=seed, top_n=top_n) if ranked else None
    lines = [(name, f"refused: {reason}") for name, reason in refused]
    for rank, plan in enumerate(ranked, start=1):
        member = plan.members[0]
        atoms = atom_ranges(member.atoms)
        if plan == picked:
            verdict = f"{picked_label}: atoms {atoms}, score {member.score}"
        else:
            verdict = f"candidate #{rank}, score {member.score}, atoms {atoms}"
        lines.append((member.node_id, verdict))
    return sorted(lines)


def _explain_gang(
    request: Request, snapshots: Sequence[NodeSnapshot], *, seed: int, top_n: int, label: str
) -> list[tuple[str, str]]:
    size = gang_size(request)
    key = request.topology_key
    fits, refused = plan_nodes(request, snapshots)
    groups, unlabeled = group_fits(request, fits)
    ranked = rank_gangs(request, fits)
    picked = seeded_pick(ranked, seed=seed, top_n=top_n) if ranked else None
    by_group = {plan.group or "": (rank, plan) for rank, plan in enumerate(ranked, start=1)}
    # Groups whose every node was refused are listed too, as "only 0 of N nodes fit".
    values = {""} if key is None else {v for s in snapshots if (v := s.node.label(key)) is not None}
    lines: list[tuple[str, str]] = []
    for value in sorted(values | set(groups)):
        subject = "pool" if key is None else f"{key}={value}"
        count = len(groups.get(value, ()))
        if value not in by_group:
            lines.append((subject, f"only {count} of {size} nodes fit"))
            continue
        rank, plan = by_group[value]
        verdict = _gang_verdict(rank, plan, picked, label)
        lines.append((subject, f"{count} nodes fit: {verdict}"))
    nodes = [(name, f"refused: {reason}") for name, reason in refused]
    nodes += [(snap.node.name, f"refused: no {key} label") for snap, _ in unlabeled]
    return lines + sorted(nodes)


def _gang_verdict(rank: int, plan: Plan, picked: Plan | None, label: str) -> str:
    members = ", ".join(m.node_id for m in plan.members)
    status = label if plan == picked else f"candidate #{rank}"
    return f"{status}, summed score {plan.score}, members {members}"
