"""`launch` output: the four forms launchers read (issue 12). Plain text, never rich: these lines
are fed to `eval`, written to hostfiles and pasted into shells, so nothing may wrap or be styled.
Every value is shell-quoted where a shell reads it."""

from __future__ import annotations

from shlex import quote
from typing import TYPE_CHECKING

from better_compute.model import JsonValue

if TYPE_CHECKING:
    from better_compute.service.launching import Launch, Member


def as_json(launch: Launch) -> dict[str, JsonValue]:
    return {
        "reservationId": launch.reservation_id,
        "nodes": [
            {"nodeId": m.node_id, "rank": m.rank, "gpus": list(m.gpus)} for m in launch.members
        ],
        "masterAddr": launch.master_addr,
    }


def hostfile(launch: Launch) -> str:
    """One `NODE slots=N` line per member, rank order (DeepSpeed and Open MPI hostfiles)."""
    return "".join(f"{m.node_id} slots={len(m.gpus)}\n" for m in launch.members)


def env(launch: Launch, master_port: int) -> str:
    """`export` lines for `eval`; NODE_RANK and CUDA_VISIBLE_DEVICES only for one node (--node,
    or a reservation on a single node), since they differ from node to node."""
    pairs: list[tuple[str, str]] = [
        ("BC_RESERVATION", launch.reservation_id),
        ("BC_NODES", ",".join(m.node_id for m in launch.members)),
        ("NNODES", str(len(launch.members))),
        ("NPROC_PER_NODE", str(launch.nproc_per_node)),
        ("MASTER_ADDR", launch.master_addr),
        ("MASTER_PORT", str(master_port)),
    ]
    if launch.node is not None:
        pairs += [
            ("NODE_RANK", str(launch.node.rank)),
            ("CUDA_VISIBLE_DEVICES", _devices(launch.node)),
        ]
    return "".join(f"export {k}={quote(v)}\n" for k, v in pairs)


def torchrun(launch: Launch, master_port: int) -> str:
    """The command line for each node (only the asked one with --node), without the training
    script: append it. `env VAR=… torchrun …` keeps the line usable from `$(…)` as well."""
    members = (launch.node,) if launch.node is not None else launch.members
    lines = []
    for m in members:
        line = (
            f"env CUDA_VISIBLE_DEVICES={_devices(m)} torchrun --nnodes={len(launch.members)}"
            f" --nproc-per-node={len(m.gpus)} --node-rank={m.rank}"
            f" --master-addr={quote(launch.master_addr)} --master-port={master_port}"
        )
        lines.append(line if launch.node is not None else f"# {m.node_id}\n{line}")
    return "".join(f"{line}\n" for line in lines)


def _devices(m: Member) -> str:
    return ",".join(str(i) for i in m.gpus)
