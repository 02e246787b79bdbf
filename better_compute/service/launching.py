"""`launch`: what a job launcher needs to run on a reservation (issue 12).

A booking is worth something only when a job runs on it. Launchers (torchrun, DeepSpeed, Open MPI)
want the same few facts: the member nodes in a fixed order, which GPUs each one holds, and one
node that every rank can find first. This module derives them from the reservation alone, so the
answer is as deterministic as the ledger: members are ranked by node name, and rank 0 (the first
name) is the master. Nothing is written; launching is a read.
"""

from __future__ import annotations

from dataclasses import dataclass

from better_compute.errors import Conflict, InvalidInput
from better_compute.lifecycle.tick import ended_at
from better_compute.model import Reservation, State
from better_compute.service import reading
from better_compute.service.context import Ctx
from better_compute.storage import repo, tickwork
from better_compute.storage.conn import Conn
from better_compute.timeparse import iso

FORMATS = ("env", "hostfile", "torchrun", "json")

#: torch.distributed's default rendezvous port; printed so `env` alone is enough for env:// init.
MASTER_PORT = 29500


@dataclass(frozen=True)
class Member:
    node_id: str
    rank: int
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Launch:
    """One reservation as a launcher sees it. `node` is the member asked for with --node (or the
    only member); `warning` says why the GPUs may not be usable yet."""

    reservation_id: str
    members: tuple[Member, ...]
    node: Member | None
    warning: str | None

    @property
    def master_addr(self) -> str:
        return self.members[0].node_id

    @property
    def nproc_per_node(self) -> int:
        """GPUs per node: the same on every member except a node-lease gang of mixed machines,
        where it is the asked node's count, or the smallest member's (what every node can run)."""
        if self.node is not None:
            return len(self.node.gpus)
        return min(len(m.gpus) for m in self.members)


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise InvalidInput(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def launch(ctx: Ctx, rsv_id: str, node: str | None = None) -> Launch:
    """Binding or active reservations launch; a placed one too, with a warning that its window
    has not begun (a job can be staged before the GPUs are handed over)."""
    with ctx.db.read() as conn:
        rsv = reading.mine(ctx, rsv_id)
        members = _members(rsv)
        # At the ledger's time, not an earlier --now: its GPUs may be another's from the end.
        came = ended_at(rsv.during, rsv.preempt_deadline, ctx.latest(conn))
        if came is not None:  # not yet released by a tick, but its GPUs may be another's now
            raise Conflict(
                f"cannot launch on {rsv.id}: its end or preemption deadline came at {iso(came)};"
                " a tick releases it"
            )
        chosen = None
        if node is not None:
            chosen = next((m for m in members if m.node_id == node), None)
            if chosen is None:
                repo.get_node(conn, node)  # an unknown node is NOT_FOUND
                names = ", ".join(m.node_id for m in members)
                raise InvalidInput(f"node {node} is not a member of {rsv.id}; its nodes: {names}")
        elif len(members) == 1:
            chosen = members[0]
        said = _warnings(rsv, ctx.latest(conn)) + _hardware(conn, members)
        return Launch(rsv.id, members, chosen, "; ".join(said) or None)


def _members(rsv: Reservation) -> tuple[Member, ...]:
    if rsv.state == State.PENDING:
        raise Conflict(
            f"cannot launch on {rsv.id}: it is pending and holds no GPUs yet; launch once it is"
            " placed (`get` shows why it waits)"
        )
    if rsv.state == State.RELEASED:
        reason = rsv.release_reason.value if rsv.release_reason else "released"
        raise Conflict(f"cannot launch on {rsv.id}: it was released ({reason})")
    ordered = sorted(rsv.allocations, key=lambda a: a.node_id)
    return tuple(Member(a.node_id, i, tuple(sorted(a.atoms))) for i, a in enumerate(ordered))


def _hardware(conn: Conn, members: tuple[Member, ...]) -> list[str]:
    """What went wrong with the members' hardware since they were booked: nothing moves a
    running reservation, so its job would start on a GPU quarantined or a node unreachable."""
    health = tickwork.node_health(conn, [m.node_id for m in members])
    said = []
    for m in members:
        _, reachable, sick = health.get(m.node_id, (True, True, frozenset()))
        if not reachable:
            said.append(f"node {m.node_id} is unreachable")
        bad = sorted(sick.intersection(m.gpus))
        if bad:
            said.append(f"GPU {', '.join(map(str, bad))} of {m.node_id} not healthy")
    return said


def _warnings(rsv: Reservation, now: int) -> list[str]:
    """What a launcher should know of a placed or preempted reservation, at `now` (the ledger's
    time, as the end check reads it)."""
    assert rsv.during is not None  # every live reservation has its window
    said = []
    if rsv.state == State.PLACED and rsv.during.start > now:
        said.append(
            f"{rsv.id} has not started: its GPUs are handed over from {iso(rsv.during.start)}"
            " (tick moves it to binding)"
        )
    elif rsv.state == State.PLACED:  # begun, with no tick since (a review: "has not started")
        said.append(
            f"{rsv.id} began at {iso(rsv.during.start)} but no tick has bound it yet: its"
            " GPUs are handed over at the next tick"
        )
    if rsv.preempt_deadline is not None:  # a spot victim, started or not yet
        said.append(f"{rsv.id} is being preempted: it ends at {iso(rsv.preempt_deadline)}")
    return said
