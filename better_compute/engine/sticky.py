"""Re-plan a reservation in place (`update`, issue 12): keep its nodes and atoms where they fit.

A user who moves a booking to another day, or asks for a GPU more or less, expects to stay where
they are: the node agents, the hostfile and the people watching `node show` all know those nodes.
So the change keeps every member on its node and every atom it holds when they are all free in
the new window, and shrinks or grows by the engine's own atom choice (keep_atoms). Only when
some member cannot stay does the caller plan afresh (placing.plan): then the whole gang
moves, never a part of it.

Snapshots must be taken ignoring the reservation's own bookings (they are what it gives up).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# _pick_free is the engine's atom choice (§5.1 step 2); keeping to it is what makes a change
# and its reverse return the same atoms.
from better_compute.engine.atoms import _pick_free, by_group, free_atoms, needed
from better_compute.engine.filters import refusal
from better_compute.engine.scorers import score
from better_compute.model import NVLINK_ALL, NodePlan, NodeSnapshot, Plan, Request


def keep_atoms(request: Request, snap: NodeSnapshot, held: Sequence[int]) -> tuple[int, ...] | None:
    """This node's new share, or None when it cannot stay. The same size keeps every held atom
    (all must be free in the new window). Fewer keeps the held atoms the engine's own pick takes
    among them (one NVLink group, best fit). More keeps them all, fills the NVLink groups it holds
    first (NVLink stays local), then takes the engine's pick among the other free atoms."""
    atoms = {a.index: a for a in snap.node.atoms}
    free = {a.index for a in free_atoms(snap)}
    n = needed(request, snap.node)
    whole = request.topology == NVLINK_ALL
    mine = [atoms[i] for i in held if i in free]
    if n < len(held):
        taken = _pick_free(by_group(mine), n, whole_group=whole)
        return None if taken is None else tuple(sorted(taken))
    if len(mine) < len(held):
        return None  # someone else books a held atom in the new window
    held_in = {g: len(ids) for g, ids in by_group(mine).items()}
    others = [atoms[i] for i in sorted(free - set(held))]
    near = sorted(
        (a for a in others if a.nvlink_group in held_in),
        key=lambda a: (-held_in[a.nvlink_group], a.nvlink_group, a.index),
    )
    extra = [a.index for a in near[: n - len(held)]]
    if len(held) + len(extra) < n:
        if whole:
            return None
        far = [a for a in others if a.nvlink_group not in held_in]
        rest = _pick_free(by_group(far), n - len(held) - len(extra), whole_group=False)
        if rest is None:
            return None
        extra += rest
    return tuple(sorted([*held, *extra]))


def keep(
    request: Request, snaps: Mapping[str, NodeSnapshot], held: Mapping[str, Sequence[int]]
) -> Plan | None:
    """Every member on its node with keep_atoms' share, or None if any member cannot stay."""
    members = []
    for node_id in sorted(held):
        snap = snaps.get(node_id)
        if snap is None or refusal(request, snap) is not None:
            return None
        taken = keep_atoms(request, snap, held[node_id])
        if taken is None:
            return None
        members.append(NodePlan(node_id, taken, score(snap, taken)))
    group = None
    if request.topology_key is not None:
        values = {snaps[m.node_id].node.label(request.topology_key) for m in members}
        if len(values) != 1 or None in values:
            return None  # relabelled since: the gang no longer shares one value
        group = values.pop()
    return Plan(tuple(members), sum(m.score for m in members), group=group)
