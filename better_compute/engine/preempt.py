"""Plan as if live spot bookings were free; fewest victims, then best score (PRODUCT.md §5.5).

The caller passes snapshots for the window that starts at the deadline. Plans needing no victim are
kept (with `victims == ()`) so the caller can tell that normal placement would have done.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from better_compute.engine.filters import refusal
from better_compute.engine.fit import plan_nodes
from better_compute.engine.gang import no_gang_fits, rank_gangs
from better_compute.engine.place import no_node_fits, single_plan
from better_compute.model import NodeSnapshot, NoFit, Plan, Request

NEVER_PREEMPTS = "spot and node-lease requests never preempt"


def _name(plan: Plan, *, gang: bool) -> str:
    """The tie-break: a gang's group, a single-node plan's node."""
    return (plan.group or "") if gang else plan.members[0].node_id


#: The plans preemption compares at most (plan_preemption).
MAX_PLANS = 64


def plan_preemption(
    request: Request,
    snapshots: Sequence[NodeSnapshot],
    *,
    max_plans: int = MAX_PLANS,
) -> Plan | NoFit:
    """The plan preempting the fewest spot reservations, then the best score, then the name.

    At most `max_plans` plans are compared: the first ones in node-name order (gangs: group-name
    order), taken before ranking so the cost stays bounded on large pools. There is no random
    topN pick here: taking a worse plan would preempt more than needed or waste a node.
    """
    if request.spot or request.node_lease:
        return NoFit(NEVER_PREEMPTS)
    fits, _ = plan_nodes(request, snapshots, free_spot=True)
    gang = request.gang_size is not None
    if gang:
        plans = sorted(rank_gangs(request, fits), key=lambda p: _name(p, gang=True))
    else:
        plans = [single_plan(fit) for fit in fits]  # already in node-name order
    compared = plans[: max(1, max_plans)]
    if not compared:
        return _normal_no_fit(request, snapshots)
    return min(compared, key=lambda p: (len(p.victims), -p.score, _name(p, gang=gang)))


def _normal_no_fit(request: Request, snapshots: Sequence[NodeSnapshot]) -> NoFit:
    """The reason normal placement gives: freeing spot work only ever adds free atoms."""
    fits, refused = plan_nodes(request, snapshots)
    if request.gang_size is not None:
        return no_gang_fits(request, fits)
    return no_node_fits(len(snapshots), refused)


def enough_in_name_order(
    request: Request, batches: Iterable[Sequence[NodeSnapshot]], max_plans: int = MAX_PLANS
) -> list[NodeSnapshot]:
    """The snapshots plan_preemption needs of `batches` (every node's snapshot, batch after
    batch, in node-name order) for the same answer as from all of them: a single-node request
    compares only the plans of its first `max_plans` fitting nodes by name, so the batches up
    to the one where that many fit are enough; a gang ranks every group, so it takes them all.
    A caller that builds the snapshots batch by batch builds no more than that: a regular
    request that waits on a pool full of spot work is tried again every 30 s."""
    taken: list[NodeSnapshot] = []
    fitting = 0
    for batch in batches:
        taken.extend(batch)
        if request.gang_size is None:
            fitting += sum(1 for snap in batch if refusal(request, snap, free_spot=True) is None)
            if fitting >= max(1, max_plans):
                break
    return taken
