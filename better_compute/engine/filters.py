"""Why a node cannot take one node's share (PRODUCT.md §5.1 step 1).

Reasons are short and carry no ids or free text, so identical situations give identical strings
and a no-fit message can count them. The first failing filter wins, in the order below.
"""

from __future__ import annotations

from better_compute.engine.atoms import by_group, free_atoms, needed
from better_compute.model import NVLINK_ALL, NodeSnapshot, Request


def refusal(
    request: Request, snap: NodeSnapshot, *, excluded: bool = False, free_spot: bool = False
) -> str | None:
    """The reason this node cannot take the request's per-node share, or None when it can."""
    node = snap.node
    if excluded:
        return "excluded"
    if snap.blocked is not None:
        return "in maintenance"
    if not node.schedulable:
        return "cordoned"
    if not node.reachable:
        return "unreachable"
    if request.models:
        accepted = {m.casefold() for m in request.models}
        refused = sorted({a.model for a in node.atoms if a.model.casefold() not in accepted})
        if refused:
            return f"model {','.join(refused)} not accepted"
    free = free_atoms(snap, free_spot=free_spot)
    total = len(node.atoms)
    if request.node_lease:
        if request.gpus is not None and total < request.gpus:
            return f"has {total} gpu, needs {request.gpus}"
        if total == 0:
            return "has no gpu"
        if request.lease_most is not None and total > request.lease_most:
            return f"has {total} gpu, lease admitted for {request.lease_most}"
        if len(free) < total:
            return f"node lease: {len(free)} of {total} gpu free"
    n = needed(request, node)
    if len(free) < n:
        return f"fits: {len(free)} of {n} gpu free"
    if request.topology == NVLINK_ALL:
        best = max((len(ids) for ids in by_group(free).values()), default=0)
        if best < n:
            return f"nvlink-all: at most {best} of {n} gpu free in one NVLink group"
    return None
