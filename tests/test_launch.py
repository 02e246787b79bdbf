"""`launch RSV`: what a job launcher needs, checked against `get` (issue 12)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from conftest import HOUR, Cli, at
from test_trust import be


def reserve(cli: Cli, *flags: object, tenant: str = "acme") -> Any:
    return cli.ok("reserve", "--tenant", tenant, "--for", "2h", *flags)


def expected(rsv: dict[str, Any]) -> dict[str, Any]:
    """What launch --format json must say, derived from `get` alone."""
    allocs = sorted(rsv["allocations"], key=lambda a: a["nodeId"])
    return {
        "reservationId": rsv["id"],
        "nodes": [
            {"nodeId": a["nodeId"], "rank": i, "gpus": sorted(a["atoms"])}
            for i, a in enumerate(allocs)
        ],
        "masterAddr": allocs[0]["nodeId"],
    }


@pytest.mark.parametrize(
    "flags",
    [
        ("--gpus", "8", "--gang", "3"),
        ("--gpus", "4", "--gang", "2", "--topology-key", "fabric.domain"),
        (
            "--gpus",
            "3",
        ),
        ("--node-lease",),
        ("--node-lease", "--gang", "2"),
    ],
    ids=["gang", "gang-keyed", "single", "lease", "lease-gang"],
)
def test_launch_json_agrees_with_get(run: Cli, flags: tuple[str, ...]) -> None:
    rsv = reserve(run, *flags)
    run.ok("tick")  # binding, then active (autoBind)
    got = run.ok("get", rsv["id"])
    assert got["state"] == "active"
    doc = run.ok("launch", rsv["id"], "--format", "json")
    assert doc == expected(got)
    assert run.ok("launch", rsv["id"]) == doc  # --json alone gives the same document
    text = run.ok("launch", rsv["id"], "--format", "json", json=False)
    assert json.loads(text) == doc


def test_hostfile_env_and_torchrun(run: Cli) -> None:
    rsv = reserve(run, "--gpus", "8", "--gang", "2")
    run.ok("tick")
    members = expected(run.ok("get", rsv["id"]))["nodes"]
    names = [m["nodeId"] for m in members]
    code, text, err = run("launch", rsv["id"], "--format", "hostfile", json=False)
    assert (code, err) == (0, "")
    assert text == "".join(f"{n} slots=8\n" for n in names)
    code, text, err = run("launch", rsv["id"], "--format", "env", json=False)
    assert (code, err) == (0, "")
    env = shell_env(text)
    assert env["BC_RESERVATION"] == rsv["id"]
    assert env["BC_NODES"] == ",".join(names)
    assert (env["NNODES"], env["NPROC_PER_NODE"]) == ("2", "8")
    assert env["MASTER_ADDR"] == names[0] == min(names)
    assert "NODE_RANK" not in env and "CUDA_VISIBLE_DEVICES" not in env
    env = shell_env(run("launch", rsv["id"], "--node", names[1], json=False)[1])
    assert env["NODE_RANK"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, members[1]["gpus"]))
    _, text, _ = run("launch", rsv["id"], "--format", "torchrun", json=False)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        assert f"--nnodes=2 --nproc-per-node=8 --node-rank={rank}" in line
        assert f"--master-addr={names[0]}" in line and line.startswith("env CUDA_VISIBLE_DEVICES=")
    _, text, _ = run("launch", rsv["id"], "--format", "torchrun", "--node", names[0], json=False)
    assert text.splitlines() == [lines[0]]


def shell_env(text: str) -> dict[str, str]:
    """Run the `export` lines through bash, as `eval "$(better-compute launch …)"` would."""
    names = (
        "BC_RESERVATION",
        "BC_NODES",
        "NNODES",
        "NPROC_PER_NODE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NODE_RANK",
        "CUDA_VISIBLE_DEVICES",
    )
    script = text + "".join(f'[ -n "${{{n}+x}}" ] && echo "{n}=${n}"\n' for n in names)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={})
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


def test_one_node_gets_its_rank_and_devices_without_node(solo: Cli) -> None:
    reserve(solo, "--gpus", "2")  # takes two atoms first
    rsv = reserve(solo, "--gpus", "3")
    solo.ok("tick")
    atoms = solo.ok("get", rsv["id"])["allocations"][0]["atoms"]
    env = shell_env(solo("launch", rsv["id"], json=False)[1])
    assert env["NODE_RANK"] == "0" and env["NPROC_PER_NODE"] == "3"
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, sorted(atoms)))


def test_placed_launches_with_a_warning(run: Cli) -> None:
    rsv = reserve(run, "--gpus", "8", "--gang", "2", "--start", "+1d")
    code, text, err = run("launch", rsv["id"], "--format", "json", json=False)
    assert code == 0 and err.startswith("warning: ") and "has not started" in err
    assert "2026-09-29T08:00:00Z" in err
    assert json.loads(text) == expected(rsv)  # stdout stays one document


def test_a_placed_reservation_begun_with_no_tick_says_so(run: Cli) -> None:
    """Not "has not started" for a window that has begun (a review)."""
    rsv = reserve(run, "--gpus", "1", "--for", "2h", "--start", "+3m")
    code, _, err = run("launch", rsv["id"], json=False, now=at(10 * 60_000))
    assert code == 0 and "has not started" not in err
    assert f"{rsv['id']} began at 2026-09-28T08:03:00Z but no tick has bound it yet" in err


@pytest.mark.sqlite_only(
    reason=(
        "acts as another OS user (test_trust.be); on PostgreSQL the principal is the"
        " server's role, tested with real roles in test_postgres.py"
    )
)
def test_pending_released_and_strangers_are_refused(run: Cli, monkeypatch: Any) -> None:
    big = reserve(run, "--gpus", "8", "--gang", "7")
    pending = reserve(run, "--gpus", "1")
    assert pending["state"] == "pending"
    assert "pending" in run.fails(4, "launch", pending["id"])["message"]
    run.ok("cancel", big["id"])
    assert "released (cancelled)" in run.fails(4, "launch", big["id"])["message"]
    assert run.fails(3, "launch", "rsv_nope")["code"] == "NOT_FOUND"
    live = reserve(run, "--gpus", "1", tenant="acme")
    run.ok("policy", "set", "--tenant", "acme", "--principal", "alice")
    be(monkeypatch, "mallory")
    assert run.fails(3, "launch", live["id"], now=at(HOUR))["code"] == "NOT_FOUND"


def test_bad_format_and_node(run: Cli) -> None:
    rsv = reserve(run, "--gpus", "8", "--gang", "2")
    err = run.fails(2, "launch", rsv["id"], "--format", "yaml")
    assert "env, hostfile, torchrun, json" in err["message"]
    assert run.fails(3, "launch", rsv["id"], "--node", "ghost")["code"] == "NOT_FOUND"
    names = {a["nodeId"] for a in rsv["allocations"]}
    other = next(f"west-0{i}" for i in range(1, 8) if f"west-0{i}" not in names)
    err = run.fails(2, "launch", rsv["id"], "--node", other)
    assert "not a member" in err["message"]


def test_a_spot_reservation_being_preempted_warns_with_its_deadline(solo: Cli) -> None:
    spot = solo.ok("reserve", "--tenant", "globex", "--gpus", "8", "--for", "1d", "--spot")
    solo.ok("tick")
    solo.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h")
    assert solo.ok("get", spot["id"])["state"] == "active"
    code, text, err = solo("launch", spot["id"], json=False)
    assert code == 0 and "is being preempted: it ends at 2026-09-28T08:02:00Z" in err
    assert "NODE_RANK=0" in text


def test_a_spot_booking_preempted_before_it_starts_warns_of_both(solo: Cli) -> None:
    """A placed spot victim said only that it had not started, not that it ends at its
    deadline (a hostile review); and the tick gave it `reservation.starting` after its
    `reservation.preempting`, for a window cut to a minute."""
    spot = solo.ok(
        "reserve", "--tenant", "globex", "--gpus", "8", "--for", "4h", "--spot", "--start", "+1m"
    )
    solo.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h")
    victim = solo.ok("get", spot["id"])
    assert victim["state"] == "placed" and victim["conditions"]
    code, _, err = solo("launch", spot["id"], json=False)
    assert code == 0 and err.count("\n") == 1
    assert "has not started" in err and "is being preempted: it ends at" in err
    solo.ok("tick", now=at(30_000))
    types = [e["type"] for e in solo.ok("events", "--reservation", spot["id"])]
    assert "reservation.preempting" in types and "reservation.starting" not in types


def test_launch_warns_of_hardware_that_went_bad_under_a_running_reservation(run: Cli) -> None:
    """Nothing moves a running reservation, and launch handed out a quarantined GPU and a rank
    on an unreachable node without a word (a hostile review)."""
    gang = reserve(run, "--gpus", "8", "--gang", "2", "--for", "4h")
    run.ok("tick")
    first, second = sorted(a["nodeId"] for a in gang["allocations"])
    code, _, err = run("launch", gang["id"], json=False)
    assert code == 0 and err == ""
    run.ok("device", "quarantine", f"{first}:2", "--reason", "xid-79")
    run.ok("node", "mark-unreachable", second)
    code, text, err = run("launch", gang["id"], json=False)
    assert code == 0 and err.count("\n") == 1
    assert f"GPU 2 of {first} not healthy" in err and f"node {second} is unreachable" in err
    assert "MASTER_ADDR=" in text  # stdout as before: the launcher decides


def test_a_reservation_whose_end_has_come_does_not_launch(run: Cli) -> None:
    """Until a tick releases it, a reservation past its end still reads as active or placed,
    but its GPUs may be booked by someone else from that end on (a hostile review: launch
    printed them with no warning, or said a placed one "has not started")."""
    active = reserve(run, "--gpus", "8", "--gang", "7", "--for", "1h")
    run.ok("tick")
    assert run.ok("launch", active["id"], "--format", "json", now=at(HOUR - 1))
    later = reserve(run, "--gpus", "8", "--for", "1h", "--start", "+3h")
    other = run.ok(
        "reserve", "--tenant", "globex", "--gpus", "8", "--for", "1h", "--gang", "4", now=at(HOUR)
    )
    assert other["state"] == "placed"  # on GPUs the ended gang still reads as holding
    assert run.ok("get", active["id"])["state"] == "active"
    err = run.fails(4, "launch", active["id"], now=at(HOUR))
    assert err["message"] == (
        f"cannot launch on {active['id']}: its end or preemption deadline came at"
        " 2026-09-28T09:00:00Z; a tick releases it"
    )
    err = run.fails(4, "launch", later["id"], now=at(5 * HOUR))
    assert "came at 2026-09-28T12:00:00Z" in err["message"]
    # Judged at the ledger's time (here HOUR, where globex's reserve acted), never at an earlier
    # --now: a stale --now printed the ended gang's hostfile (a review).
    for now in (at(HOUR - 1), None):
        err = run.fails(4, "launch", active["id"], now=now)
        assert "came at 2026-09-28T09:00:00Z" in err["message"]
