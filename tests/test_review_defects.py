"""Defects found in review. Each test states the requirement it checks; all of them fail today."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Cli, init_db


def _nodes(rsv: dict[str, object]) -> list[tuple[str, list[int]]]:
    return [(a["nodeId"], a["atoms"]) for a in rsv["allocations"]]  # type: ignore[index,union-attr]


def test_preemption_takes_the_best_score_among_plans_with_fewest_victims(run: Cli) -> None:
    """PRODUCT.md §5.5 / issue 4: "among at most 64 fitting plans it takes the fewest victims,
    then the best score" (README: "the plan with the fewest victims, then the best score, wins").

    Every node is full; each holds exactly one spot reservation. west-01 is half regular, half
    spot: taking its 4 spot GPUs fills the node (score 10009). Every other node would be left
    half empty (score 5009). With the default placement.topN (3) the preemption is a seeded pick
    among the three best plans instead, and here it takes west-02.
    """
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "100")
    run.ok("config", "set", "placement.topN", "1")
    run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "12h", "--key", "reg")
    run.ok("reserve", "--tenant", "globex", "--gpus", "4", "--for", "12h", "--spot", "--key", "sa")
    for i in range(2, 8):
        run.ok(
            "reserve",
            "--tenant",
            "globex",
            "--gpus",
            "8",
            "--for",
            "12h",
            "--spot",
            "--key",
            f"s{i}",
        )
    run.ok("config", "set", "placement.topN", "3")  # the default

    urgent = run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "1h", "--key", "u")
    assert urgent["state"] == "placed"
    assert _nodes(urgent) == [("west-01", [4, 5, 6, 7])]


def test_node_lease_with_gpus_is_charged_the_whole_nodes_it_holds(run: Cli) -> None:
    """§6: "The charge of a reservation is its total GPUs (times the gang size)"; §4: a node
    lease takes "every atom of the node" and `--gpus` only sets a minimum node size.

    A lease without --gpus is charged 8 per 8-GPU node, but `--node-lease --gpus 2 --gang 2`
    holds two whole 8-GPU nodes (16 GPUs) and is charged 4, slipping under a 4-GPU quota.
    """
    run.ok("quota", "set", "--tenant", "acme", "--gpus", "4")
    code, out, _ = run(
        "reserve",
        "--tenant",
        "acme",
        "--node-lease",
        "--gpus",
        "2",
        "--gang",
        "2",
        "--for",
        "1h",
        "--key",
        "lease",
    )
    if code == 0 and out["state"] == "placed":
        held = sum(len(a["atoms"]) for a in out["allocations"])
        assert out["quotaCharge"] == held == 16
    else:
        assert code == 5, (code, out)  # QUOTA_EXCEEDED: the lease holds 16 GPUs


def test_node_lease_with_gpus_draft_counts_whole_nodes(run: Cli) -> None:
    """§6 / issue 4: the draft's gpuCount is the GPUs the request takes; a principal capped at
    8 GPUs "is refused a gang of two 8-GPU nodes". A whole-machine lease of two 8-GPU nodes
    written with `--gpus 1` is judged as 2 GPUs and admitted."""
    run.ok("policy", "set", "--tenant", "acme", "--principal", "ci-bot", "--max-gpus", "8")
    error = run.fails(
        6,
        "--as",
        "ci-bot",
        "reserve",
        "--tenant",
        "acme",
        "--node-lease",
        "--gpus",
        "1",
        "--gang",
        "2",
        "--for",
        "1h",
        "--key",
        "lease",
    )
    assert error["code"] == "FORBIDDEN"


@pytest.mark.sqlite_only(reason="runs subprocesses on a ledger file")
def test_error_messages_do_not_depend_on_the_process_hash_seed(db_dir: Path) -> None:
    """§2 determinism: the same commands give byte-identical output. `list --state bogus` names
    the allowed states in set order, which changes with PYTHONHASHSEED from run to run."""
    db = init_db(db_dir / "h.db", "--demo")
    texts = set()
    for seed in ("1", "2", "3", "4", "5", "6"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        env.pop("BETTER_COMPUTE_DB", None)
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "from better_compute.cli import main; main()",
                "--db",
                str(db),
                "--json",
                "list",
                "--state",
                "bogus",
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        texts.add(done.stderr)
    assert len(texts) == 1, texts


def test_open_usage_window_never_counts_past_the_reservation_end(run: Cli) -> None:
    """§8: usage meters "from the moment it is active until it is released"; §7: an open window
    "counts up to now". A reservation whose end has passed but that no tick has released yet
    still counts up to now: 2 GPUs for 1 h read as 8 GPU-hours at 12:00, then 2.0 once a tick
    closes the window at the end. At 12:00 `pool show` already says none of it is in use."""
    run.ok("meter", "create", "gpu.h100.hours")
    run.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--key", "a")
    run.ok("tick")
    noon = "2026-09-28T12:00:00Z"
    before = run.ok("usage", now=noon)
    assert run.ok("pool", "show", "west", now=noon)["inUse"] == 0
    run.ok("tick", now=noon)
    after = run.ok("usage", now=noon)
    assert after[0]["quantity"] == 2.0
    assert before[0]["quantity"] == after[0]["quantity"]


def test_a_window_ending_after_year_9999_is_invalid_input_not_a_committed_internal_error(
    run: Cli,
) -> None:
    """§3: bad input is INVALID_INPUT (exit 2), never a bug. `--start 9999-12-31T00:00:00Z
    --for 2d` is accepted, booked and committed, then printing it fails with INTERNAL (exit 1);
    from then on every `list`, even `--json list`, fails with INTERNAL, because the human view
    is rendered even when JSON is asked for."""
    code, _, err = run(
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "1",
        "--for",
        "2d",
        "--start",
        "9999-12-31T00:00:00Z",
        "--key",
        "far",
    )
    assert code == 2, err
    assert run.ok("list") == []
