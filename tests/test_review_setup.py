"""Setting up, as a hostile reviewer tried it (2026-12-02): input that no output could carry,
a flag dropped silently, a policy nothing can satisfy, two label rules, a backup SQLite deletes,
and maintenance in the past. Each test fails on the code before its fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pgtest
import pytest
from conftest import NOW, NOW_MS, Cli, invoke

INVALID = 2
ENTRY = [sys.executable, "-c", "from better_compute.cli import main; main()"]


def _import(run: Cli, tmp_path: Path, doc: str) -> dict[str, str]:
    path = tmp_path / "inv.json"
    path.write_text(doc)
    return run.fails(INVALID, "inventory", "import", path)


def test_text_that_is_not_utf8_is_refused_and_nothing_is_written(run: Cli, tmp_path: Path) -> None:
    before = run.ok("node", "list")
    node = (
        '{"name": "west-09", "labels": {"owner": "\\ud800"}, "gpus": {"count": 8, "model": "h100"}}'
    )
    err = _import(run, tmp_path, '{"pools": [{"name": "west", "nodes": [' + node + "]}]}")
    assert "not UTF-8" in err["message"] and '"owner"' in err["message"]
    assert run.ok("node", "list") == before  # the listings still work, nothing was imported
    # bytes that are not UTF-8 on the command line reach Python as lone surrogates
    db = pgtest.ledger(str(run.db))
    for change in ([b"node", b"cordon", b"west-02", b"--reason", b"\xffbad"],
                   [b"node", b"label", b"west-01", b"k=\xff"]):  # fmt: skip
        done = subprocess.run(
            [*ENTRY, "--db", db, "--now", NOW, *change], capture_output=True, check=False
        )
        assert done.returncode == INVALID, done.stderr
        assert done.stderr.startswith(b"error: INVALID_INPUT: argument ")
        assert done.stderr.count(b"\n") == 1
    assert run.ok("node", "list") == before


def test_labels_follow_one_rule_in_files_and_on_the_command_line(run: Cli, tmp_path: Path) -> None:
    for labels in ('{"a=b": "x"}', '{"e": ""}'):
        doc = '{"pools": [{"name": "west", "labels": ' + labels + ', "nodes": []}]}'
        assert "key=value" in _import(run, tmp_path, doc)["message"]
    run.fails(INVALID, "node", "label", "west-01", "e=")


def test_demo_refuses_the_global_json_flag() -> None:
    result = invoke(["--json", "demo"])
    assert result.exit_code == INVALID and result.stdout == ""
    assert json.loads(result.stderr)["error"]["code"] == "INVALID_INPUT"


def test_a_calendar_policy_that_leaves_no_window_is_refused(run: Cli) -> None:
    err = run.fails(
        INVALID, "pool", "policy", "set", "west", "--min-lead", "1h", "--max-horizon", "30m"
    )
    assert "--max-horizon 30m" in err["message"]
    run.fails(
        INVALID, "pool", "policy", "set", "west", "--min-lead", "1h", "--min-duration", "2h",
        "--max-horizon", "2h",
    )  # fmt: skip
    run.ok(
        "pool", "policy", "set", "west", "--min-lead", "1h", "--min-duration", "1h",
        "--max-horizon", "2h",
    )  # fmt: skip
    run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--start", "+1h")


def test_a_maintenance_window_that_has_passed_is_refused(run: Cli) -> None:
    err = run.fails(
        INVALID, "node", "cordon", "west-02", "--from", "2025-01-01T00:00:00Z",
        "--until", "2025-01-02T00:00:00Z",
    )  # fmt: skip
    assert "has passed" in err["message"]
    assert run.ok("node", "show", "west-02")["maintenance"] == []


@pytest.mark.sqlite_only(reason="backup copies an SQLite file")
def test_a_backup_is_never_written_over_the_ledgers_own_files(run: Cli) -> None:
    for suffix in ("-wal", "-shm", "-journal"):
        err = run.fails(INVALID, "backup", f"{run.db}{suffix}", "--force")
        assert "the name SQLite gives the" in err["message"]


def _exported(run: Cli) -> tuple[dict[str, object], dict[str, dict[str, object]]]:
    pool = run.ok("inventory", "export")["pools"][0]
    return pool, {n["name"]: n for n in pool["nodes"]}


def test_a_partial_file_keeps_what_it_leaves_out(run: Cli, tmp_path: Path) -> None:
    """Review finding: importing one node without its labels and fabric, in a pool given
    without labels, wiped them all (fabric.domain, which gangs use, included). An absent key
    keeps what the ledger has; null or {} says none, as in a JSON merge patch."""
    pool, nodes = _exported(run)
    path = tmp_path / "part.json"
    bare = {"name": "west-01", "gpus": {"count": 8, "model": "h100"}}
    path.write_text(json.dumps({"pools": [{"name": "west", "nodes": [bare]}]}))
    run.ok("inventory", "import", path)
    assert _exported(run) == (pool, nodes)  # nothing changed
    cleared = {**bare, "labels": {}, "gpus": {**bare["gpus"], "fabric": None}}
    path.write_text(json.dumps({"pools": [{"name": "west", "labels": None, "nodes": [cleared]}]}))
    run.ok("inventory", "import", path)
    after, now = _exported(run)
    assert after["labels"] == {}
    assert now["west-01"]["labels"] == {} and "fabric" not in now["west-01"]["gpus"]
    assert now["west-01"]["gpus"]["nvlinkGroups"] == nodes["west-01"]["gpus"]["nvlinkGroups"]
    assert {k: v for k, v in now.items() if k != "west-01"} == {
        k: v for k, v in nodes.items() if k != "west-01"
    }


def test_a_tenants_creation_is_its_own_event(run: Cli) -> None:
    """tenant.created names the tenant, like quota.set and policy.set, so `events --tenant T`
    starts with it."""
    run.ok("tenant", "create", "t9")
    [created] = run.ok("events", "--tenant", "t9")
    assert created["type"] == "tenant.created" and created["tenantId"] == "t9"


def test_tables_name_the_year_so_windows_a_year_apart_differ(run: Cli) -> None:
    """§2: human output shows UTC times; a table's short `10-01 09:00` must not make two
    reservations a year apart read the same."""
    wide = {"COLUMNS": "200"}
    run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "2h", "--start",
           "2026-10-01T09:00:00Z", "--key", "x1")  # fmt: skip
    code, one_year, _ = run("list", json=False, env=wide)
    assert code == 0 and "window (UTC 2026)" in one_year and "10-01 09:00–11:00" in one_year
    run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "2h", "--start",
           "2027-10-01T09:00:00Z", "--key", "x2")  # fmt: skip
    code, two_years, _ = run("list", json=False, env=wide)
    assert code == 0 and "window (UTC)" in two_years
    assert "2026-10-01 09:00–11:00" in two_years and "2027-10-01 09:00–11:00" in two_years


def test_a_node_is_not_told_to_run_a_reservation_whose_end_has_come(run: Cli) -> None:
    """Its GPUs are free once the end has come (pool show, preview), though no tick has released
    it yet: the node's desired state leaves it out."""
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--key", "r")
    run.ok("tick")
    node = rsv["allocations"][0]["nodeId"]
    during = run.ok("node", "show", node, now="2026-09-28T08:30:00Z")["desiredState"]
    assert [a["reservationId"] for a in during] == [rsv["id"]]
    assert run.ok("node", "show", node, now="2026-09-28T09:30:00Z")["desiredState"] == []
    assert run.ok("node", "show", node, now="2026-09-28T07:30:00Z")["desiredState"] == []


def test_a_node_lease_never_grows_past_what_it_was_admitted_for(run: Cli) -> None:
    """Admitted (quota, policy) at the pool's largest node then, a waiting lease is not placed on
    a larger node added since: it would hold 16 GPUs of an 8-GPU quota."""
    run.ok("quota", "set", "--tenant", "acme", "--gpus", "8")
    for n in range(1, 8):
        run.ok("node", "cordon", f"west-0{n}")
    lease = run.ok("reserve", "--tenant", "acme", "--node-lease", "--for", "2h", "--key", "l")
    assert lease["state"] == "pending" and lease["quotaCharge"] == 8
    run.ok("node", "add", "big-1", "--pool", "west", "--gpus", "16", "--model", "h100")
    run.ok("tick", now="2026-09-28T08:01:00Z")
    still = run.ok("get", lease["id"])
    assert still["state"] == "pending" and still["quotaCharge"] == 8
    assert "1 × has 16 gpu, lease admitted for 8" in still["conditions"][0]["message"]
    run.ok("node", "uncordon", "west-01")
    run.ok("tick", now="2026-09-28T08:02:00Z")
    placed = run.ok("get", lease["id"])
    assert [a["nodeId"] for a in placed["allocations"]] == ["west-01"]
    assert placed["quotaCharge"] == 8


def test_an_import_that_changes_a_quota_logs_it(run: Cli, tmp_path: Path) -> None:
    """Every change to a tenant's rules is an event with its actor (§8), whichever command
    makes it; an import that leaves the cap as it was logs nothing."""
    path = tmp_path / "quota.json"
    path.write_text('{"pools": [], "tenants": [{"id": "acme", "quota": {"gpus": 2}}]}')
    run.ok("inventory", "import", path)
    run.ok("inventory", "import", path)
    changes = [e for e in run.ok("events", "--tenant", "acme") if e["type"] == "quota.set"]
    assert [e["data"]["gpus"] for e in changes][-2:] == [64, 2]  # init --demo's cap, then 2


def test_a_lease_given_a_new_window_is_charged_what_it_holds(run: Cli) -> None:
    """Only its time changes: it is judged at the 4 GPUs it holds (it moves to no larger node),
    not at the pool's largest node, which the tenant's quota no longer has room for."""
    run.ok("quota", "set", "--tenant", "acme", "--gpus", "8")
    run.ok("node", "add", "small-1", "--pool", "west", "--gpus", "4", "--model", "h100")
    for n in range(1, 8):
        run.ok("node", "cordon", f"west-0{n}")
    lease = run.ok(
        "reserve", "--tenant", "acme", "--node-lease", "--start", "+1h", "--for", "2h",
        "--key", "l",
    )  # fmt: skip
    assert lease["quotaCharge"] == 4
    for n in range(1, 8):
        run.ok("node", "uncordon", f"west-0{n}")
    run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "4h", "--key", "other")
    longer = run.ok("update", lease["id"], "--for", "3h")
    assert longer["quotaCharge"] == 4 and longer["durationMs"] == 3 * 3_600_000
    assert [a["nodeId"] for a in longer["allocations"]] == ["small-1"]


def test_a_series_over_quota_says_which_occurrence_and_why(run: Cli) -> None:
    """Nothing was booked: the figures count the occurrences before the one refused."""
    run.ok("quota", "set", "--tenant", "acme", "--gpus", "8")
    err = run.fails(
        5, "reserve", "--tenant", "acme", "--gpus", "4", "--for", "2h", "--start", "+1h",
        "--every", "1d", "--count", "3", "--key", "s",
    )  # fmt: skip
    assert err["message"].startswith("occurrence 3 (2026-09-30T09:00:00Z): tenant 'acme' holds 8")
    assert "counting the 2 occurrences before it" in err["message"]
    assert err["message"].endswith("nothing of the series was booked")
    assert run.ok("list") == []


def test_a_gang_lease_on_nodes_of_two_sizes_keeps_them_when_moved(run: Cli) -> None:
    """A placed lease may move to nodes no larger than the largest it holds: a gang on an 8- and
    a 4-GPU node keeps both when its window moves, and BookingRepair can still use the 8."""
    for name, gpus in (("big-01", "8"), ("small-01", "4"), ("small-02", "4")):
        run.ok("node", "add", name, "--pool", "west", "--gpus", gpus, "--model", "h100",
               "--fabric", "c1.3")  # fmt: skip
    for n in range(1, 8):
        run.ok("node", "cordon", f"west-0{n}")
    run.ok("node", "cordon", "small-02")
    lease = run.ok(
        "reserve", "--tenant", "acme", "--node-lease", "--gang", "2", "--topology-key",
        "fabric.domain", "--start", "+3h", "--for", "2h", "--key", "g",
    )  # fmt: skip
    assert sorted(a["nodeId"] for a in lease["allocations"]) == ["big-01", "small-01"]
    assert lease["quotaCharge"] == 12
    moved = run.ok("update", lease["id"], "--start", "+4h")
    assert sorted(a["nodeId"] for a in moved["allocations"]) == ["big-01", "small-01"]
    run.ok("node", "uncordon", "small-02")
    run.ok("device", "quarantine", "small-01:0", "--reason", "xid-79")
    run.ok("repair")
    repaired = run.ok("get", lease["id"])
    assert repaired["state"] == "placed", repaired["conditions"]
    assert sorted(a["nodeId"] for a in repaired["allocations"]) == ["big-01", "small-02"]
    assert repaired["quotaCharge"] == 12


def test_a_budget_refusal_at_the_end_of_time_names_its_period(run: Cli) -> None:
    """The fullest period may end past 9999: it is named by its start, not a crash."""
    run.ok("quota", "set", "--tenant", "acme", "--gpu-hours", "1", "--period", "30d")
    err = run.fails(
        5, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "2h", "--start",
        "9999-12-31T20:00:00Z", "--key", "late",
    )  # fmt: skip
    assert err["code"] == "QUOTA_EXCEEDED" and "over the 30d from 9999-12-" in err["message"]


def test_a_requeued_spot_victim_forgets_its_earlier_deadline(run: Cli) -> None:
    """Cut back by one notice, then requeued by another: placed again, it is ordinary spot work,
    repaired, extended and ended like any other, not killed at the old deadline."""
    run.ok("config", "set", "placement.topN", "1")
    gang2 = ("--gpus", "8", "--gang", "2", "--topology-key", "fabric.domain")
    run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--gang", "4", "--topology-key",
           "fabric.domain", "--for", "12h", "--key", "blk")  # fmt: skip
    spot = run.ok("reserve", "--tenant", "globex", *gang2, "--spot", "--start",
                  "2026-09-28T10:00:00Z", "--for", "4h", "--key", "S")  # fmt: skip
    run.ok("reserve", "--tenant", "acme", *gang2, "--start", "2026-09-28T11:00:00Z", "--for",
           "1h", "--key", "R1")  # fmt: skip
    run.ok("reserve", "--tenant", "acme", *gang2, "--start", "2026-09-28T09:00:00Z", "--for",
           "90m", "--key", "R2")  # fmt: skip
    assert run.ok("get", spot["id"])["state"] == "pending"
    run.ok("release", run.ok("list", "--key", "blk")[0]["id"])
    run.ok("tick", now="2026-09-28T08:01:00Z")
    again = run.ok("get", spot["id"])
    assert again["state"] == "placed" and again["during"]["end"] == NOW_MS + 6 * 3_600_000
    run.ok("extend", spot["id"], "--by", "30m", now="2026-09-28T08:01:00Z")
    node = again["allocations"][0]["nodeId"]
    run.ok("device", "quarantine", f"{node}:0", "--reason", "xid-79", now="2026-09-28T08:01:00Z")
    run.ok("repair", spot["id"], now="2026-09-28T08:01:00Z")
    moved = run.ok("get", spot["id"])
    assert node not in [a["nodeId"] for a in moved["allocations"]] or moved["state"] == "pending"


def test_a_mixed_gang_lease_waiting_after_a_failed_repair_is_placed_again(run: Cli) -> None:
    """Back to pending, it is charged as a lease not placed (the pool's largest node per
    member), so its cap admits its 8-GPU nodes again: 28 // 4 = 7 kept it waiting for a week."""
    run.ok("config", "set", "placement.topN", "1")
    run.ok("node", "add", "west-08", "--pool", "west", "--gpus", "4", "--model", "h100",
           "--fabric", "c1.2")  # fmt: skip
    run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--gang", "4", "--topology-key",
           "fabric.domain", "--for", "12h", "--key", "blk")  # fmt: skip
    lease = run.ok("reserve", "--tenant", "globex", "--node-lease", "--gang", "4",
                   "--topology-key", "fabric.domain", "--for", "4h", "--start", "+1h",
                   "--key", "nl")  # fmt: skip
    assert lease["quotaCharge"] == 28
    victim = lease["allocations"][1]["nodeId"]
    run.ok("node", "mark-unreachable", victim)
    run.ok("repair")
    waiting = run.ok("get", lease["id"])
    assert waiting["state"] == "pending" and waiting["quotaCharge"] == 32
    run.ok("node", "mark-reachable", victim)
    run.ok("tick", now="2026-09-28T08:30:00Z")
    again = run.ok("get", lease["id"])
    assert again["state"] == "placed" and again["quotaCharge"] == 28


def test_a_node_leased_whole_keeps_its_gpu_count(run: Cli, tmp_path: Path) -> None:
    """A lease holds every GPU of its node: GPUs added by an import would be booked by others
    beside it, so the import is refused, naming the lease, and nothing is written."""
    lease = run.ok("reserve", "--tenant", "acme", "--node-lease", "--for", "4h", "--key", "nl")
    node = lease["allocations"][0]["nodeId"]
    doc = run.ok("inventory", "export")
    for n in doc["pools"][0]["nodes"]:
        if n["name"] == node:
            n["gpus"].update(count=16, nvlinkGroups=4)
    path = tmp_path / "grown.json"
    path.write_text(json.dumps(doc))
    err = run.fails(2, "inventory", "import", path)
    assert lease["id"] in err["message"] and "gpus.count" in err["message"]
    assert len(run.ok("node", "show", node)["gpus"]) == 8


def test_a_node_cannot_report_bound_once_the_window_has_ended(run: Cli) -> None:
    """The tick releases it at its end: a late agent does not make it active afterwards."""
    run.ok("config", "set", "binding.autoBind", "false")
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--key", "b")
    run.ok("tick")
    node = rsv["allocations"][0]["nodeId"]
    err = run.fails(4, "node", "report-bound", node, rsv["id"], now="2026-09-28T09:30:00Z")
    assert err["message"].endswith(
        "its end or preemption deadline came at 2026-09-28T09:00:00Z; a tick at or after that"
        " instant releases it"
    )
    assert run.ok("get", rsv["id"])["state"] == "binding"
    run.ok("node", "report-bound", node, rsv["id"], now="2026-09-28T08:30:00Z")


def test_an_update_keeps_a_start_placed_from_a_preemption_deadline(run: Cli) -> None:
    """Placed from the deadline (08:03), a longer --for keeps that start and its nodes instead
    of planning from now, where the victims still run until the deadline."""
    run.ok("config", "set", "placement.topN", "1")
    gang = ("--topology-key", "fabric.domain", "--gpus", "8")
    run.ok("reserve", "--tenant", "acme", *gang, "--gang", "4", "--for", "12h", "--key", "reg4")
    run.ok("reserve", "--tenant", "globex", *gang, "--gang", "3", "--for", "12h", "--spot",
           "--key", "sp3")  # fmt: skip
    run.ok("tick", now="2026-09-28T08:01:00Z")
    r2 = run.ok("reserve", "--tenant", "acme", *gang, "--gang", "2", "--for", "1h", "--key", "r2",
                now="2026-09-28T08:01:00Z")  # fmt: skip
    deadline = NOW_MS + 3 * 60_000
    assert r2["during"]["start"] == deadline
    longer = run.ok("update", r2["id"], "--for", "2h", now="2026-09-28T08:01:00Z")
    assert longer["during"] == {"start": deadline, "end": deadline + 2 * 3_600_000}
    assert sorted(a["nodeId"] for a in longer["allocations"]) == sorted(
        a["nodeId"] for a in r2["allocations"]
    )


def test_a_failed_repair_never_takes_a_lease_over_its_tenants_quota(run: Cli) -> None:
    """Re-charged as a lease not placed only when the caps hold the difference; else it keeps
    its charge (and a cap no larger than the node it held)."""
    run.ok("node", "add", "west-08", "--pool", "west", "--gpus", "4", "--model", "h100",
           "--fabric", "c1.2")  # fmt: skip
    run.ok("quota", "set", "--tenant", "acme", "--gpus", "8")
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "100")
    run.ok("reserve", "--tenant", "globex", "--gpus", "8", "--gang", "7", "--node-lease",
           "--start", "2026-09-28T12:00:00Z", "--for", "2h", "--key", "fill")  # fmt: skip
    lease = run.ok("reserve", "--tenant", "acme", "--node-lease", "--gpus", "4", "--start",
                   "2026-09-28T12:00:00Z", "--for", "2h", "--key", "l")  # fmt: skip
    assert [a["nodeId"] for a in lease["allocations"]] == ["west-08"]
    run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--start", "2026-09-28T20:00:00Z",
           "--for", "2h", "--key", "other")  # fmt: skip
    run.ok("node", "cordon", "west-08")
    run.ok("repair")
    waiting = run.ok("get", lease["id"])
    assert waiting["state"] == "pending" and waiting["quotaCharge"] == 4
    [line] = run.ok("quota", "show", "--tenant", "acme")["quotas"]
    assert line["held"] == 8


def test_a_change_to_what_already_is_so_writes_no_event(run: Cli) -> None:
    """A second quarantine, a restore of a healthy GPU, an uncordon of a schedulable node, the
    same labels or setting again: nothing changes, so no event is logged (a webhook would tell
    receivers of a restore that never happened) and people are told it already was so."""
    changes = [
        ("device", "quarantine", "west-01:0", "--reason", "xid-79"),
        ("node", "cordon", "west-02", "--reason", "bios"),
        ("node", "mark-unreachable", "west-03"),
        ("node", "label", "west-04", "rack=r9"),
        ("config", "set", "placement.topN", "2"),
    ]
    for change in changes:
        run.ok(*change)
    seq = run.ok("events")[-1]["seq"]
    again = [
        *changes,
        ("device", "restore", "west-05:1"),
        ("node", "uncordon", "west-05"),
        ("node", "mark-reachable", "west-05"),
        ("config", "set", "placement.topN", "02"),
    ]
    for change in again:
        run.ok(*change)
    assert run.ok("events", "--since", seq) == []
    said = run("device", "restore", "west-05:1", json=False)[1]
    assert said == "west-05:1 was already healthy; nothing changed\n"
    said = run("node", "cordon", "west-02", "--reason", "bios", json=False)[1]
    assert said == "west-02 was already cordoned (bios); nothing changed\n"
    said = run("node", "mark-unreachable", "west-03", "--reason", "psu", json=False)[1]
    assert said == (
        "west-03 was already marked unreachable (the reason is not recorded); nothing changed\n"
    )
    # a new reason is a change: the GPU's reason and the log say so
    run.ok("device", "quarantine", "west-01:0", "--reason", "xid-48")
    assert [e["type"] for e in run.ok("events", "--since", seq)] == ["device.quarantined"]
    node = run.ok("node", "show", "west-01")
    assert "xid-48" in json.dumps(node)
