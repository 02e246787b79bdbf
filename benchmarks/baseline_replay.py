"""The floor for `simulate` (issue 8, "Replay"): a bare in-memory best-fit replay in plain Python.

The same tasks `simulate` replays (parsed by better_compute.workload, so the two agree on what a
task is), on the same nodes, with none of the product: no database, no transactions, no events,
no gangs, no preemption, no calendar. Each arrival first frees what ended by then, then retries
what waits (oldest first), then takes the node with the fewest free GPUs of an accepted model
that still fits (best fit, ties by name); what fits nowhere waits for the next release.

    python benchmarks/baseline_replay.py [--compress 100] [--tasks FILE] [--nodes FILE] [--json]

prints the wall seconds of the replay alone (parsing excluded) and what it placed; with --json,
one document with its CPU seconds too (benchmarks/run.py runs it so, a fresh process a round).
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

from better_compute.errors import InvalidInput
from better_compute.inventory import parse_openb_nodes
from better_compute.workload import Request, parse_compress, parse_openb

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "openb"
T0 = 1_790_582_400_000


@dataclass
class Node:
    name: str
    model: str
    free: int


@dataclass(frozen=True)
class Outcome:
    seconds: float
    placed_at_once: int
    placed_after_waiting: int
    never_placed: int


def _fits(node: Node, task: Request) -> bool:
    return node.free >= task.gpus and (not task.models or node.model in task.models)


def _best_fit(nodes: list[Node], task: Request) -> Node | None:
    best: Node | None = None
    for node in nodes:  # sorted by name: the first of equal free counts wins
        if _fits(node, task) and (best is None or node.free < best.free):
            best = node
    return best


def replay(nodes: list[Node], tasks: list[Request]) -> Outcome:
    """Best-fit replay of `tasks` (in arrival order) on `nodes`; returns its own wall time."""
    started = time.perf_counter()
    ends: list[tuple[int, int, str, int]] = []  # (end, seq, node, gpus)
    by_name = {n.name: n for n in nodes}
    waiting: list[tuple[int, Request]] = []
    at_once = after_wait = seq = 0

    def place(task: Request, now: int) -> bool:
        nonlocal seq
        node = _best_fit(nodes, task)
        if node is None:
            return False
        node.free -= task.gpus
        seq += 1
        heapq.heappush(ends, (now + task.duration_ms, seq, node.name, task.gpus))
        return True

    def release_until(now: int) -> None:
        nonlocal after_wait
        while ends and ends[0][0] <= now:
            end, _, name, gpus = heapq.heappop(ends)
            by_name[name].free += gpus
            still = []
            for arrived, task in waiting:
                if place(task, end):
                    after_wait += 1
                else:
                    still.append((arrived, task))
            waiting[:] = still

    for task in tasks:
        release_until(task.at)
        if place(task, task.at):
            at_once += 1
        else:
            waiting.append((task.at, task))
    release_until(2**62)
    return Outcome(time.perf_counter() - started, at_once, after_wait, len(waiting))


def load(
    tasks_file: Path, nodes_file: Path, compress: Fraction
) -> tuple[list[Node], list[Request]]:
    inventory = parse_openb_nodes(nodes_file.read_text())
    nodes = sorted(
        (Node(n.name, n.model, n.gpus) for n in inventory.inventory.pools[0].nodes),
        key=lambda n: n.name,
    )
    workload = parse_openb(tasks_file.read_text(), T0, compress)
    return nodes, list(workload.requests)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--compress",
        default="100",
        help="arrivals K times faster, as simulate's --compress (K >= 1)",
    )
    parser.add_argument(
        "--tasks", type=Path, default=DATA / "openb_pod_list_default.csv", help="openb task list"
    )
    parser.add_argument(
        "--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv", help="openb node list"
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    try:  # simulate's own checks: the floor replays only what simulate would
        compress = parse_compress(args.compress)
        nodes, tasks = load(args.tasks, args.nodes, compress)
    except InvalidInput as exc:
        parser.error(exc.message)
    except OSError as exc:  # the data is beside the repository by default: say where it looked
        parser.error(f"cannot read {exc.filename}: {exc.strerror}; give --tasks and --nodes")
    cpu = time.process_time()
    out = replay(nodes, tasks)
    cpu = time.process_time() - cpu
    if args.json:  # the Outcome's fields, and the CPU time
        print(json.dumps({**asdict(out), "cpu_seconds": cpu}))
        return
    print(
        f"{len(tasks)} tasks on {len(nodes)} nodes in {out.seconds:.3f} s:"
        f" {out.placed_at_once} at once, {out.placed_after_waiting} after waiting,"
        f" {out.never_placed} never"
    )


if __name__ == "__main__":
    main()
