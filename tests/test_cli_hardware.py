"""The CLI of hardware state, repair, preview --explain, meters and usage, with their error paths.

All on the demo database (pool west: west-01..04 in fabric c1.1, west-05..07 in c1.2, 8 × h100
each; tenants acme and globex), with placement.topN = 1 so picks are by score, then name.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import DAY, HOUR, ME, MIN, NOW_MS, Cli, at


@pytest.fixture
def cli(run: Cli) -> Cli:
    """Operators `ops` and `billing` are admins: fleet changes and meters are admin-only."""
    run.ok("config", "set", "placement.topN", "1")
    run.ok("admin", "add", "ops")
    run.ok("admin", "add", "billing")
    return run


def last_event(cli: Cli, type_: str) -> dict[str, Any]:
    events = [e for e in cli.ok("events") if e["type"] == type_]
    assert events, f"no {type_} event"
    return events[-1]  # type: ignore[no-any-return]


def allocatable(cli: Cli) -> int:
    return int(cli.ok("pool", "show", "west")["allocatable"])


# ---------------------------------------------------------------- cordon and maintenance


def test_cordon_with_reason_records_who_and_why(cli: Cli) -> None:
    before = allocatable(cli)
    doc = cli.ok("--as", "ops", "node", "cordon", "west-01", "--reason", "PSU swap")
    assert doc["name"] == "west-01"
    assert doc["schedulable"] is False and doc["cordonReason"] == "PSU swap"
    assert allocatable(cli) == before - 8
    ev = last_event(cli, "node.cordoned")
    assert ev["data"] == {"nodeId": "west-01", "by": "ops", "reason": "PSU swap"}
    assert ev["tenantId"] is None and ev["reservationId"] is None
    # nothing is placed on it any more
    rsv = cli.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--key", "k")
    assert rsv["allocations"][0]["nodeId"] == "west-02"

    doc = cli.ok("node", "uncordon", "west-01")
    assert doc["schedulable"] is True and doc["cordonReason"] is None
    ev = last_event(cli, "node.uncordoned")
    assert ev["data"]["by"] == ME and ev["data"]["nodeId"] == "west-01"
    assert allocatable(cli) == before


def test_cordon_without_reason_and_human_output(cli: Cli) -> None:
    code, text, _ = cli("node", "cordon", "west-02", json=False)
    assert code == 0 and "west-02 cordoned" in text
    assert last_event(cli, "node.cordoned")["data"] == {"nodeId": "west-02", "by": ME}
    code, text, _ = cli("node", "uncordon", "west-02", json=False)
    assert code == 0 and "uncordoned" in text


def test_maintenance_window_blocks_placement_only_inside_it(cli: Cli) -> None:
    start, until = at(DAY), at(DAY + 6 * HOUR)
    doc = cli.ok(
        "--as", "ops", "node", "cordon", "west-01", "--from", start, "--until", until,
        "--reason", "firmware",
    )  # fmt: skip
    assert doc == {
        "nodeId": "west-01",
        "maintenance": {
            "from": NOW_MS + DAY,
            "until": NOW_MS + DAY + 6 * HOUR,
            "reason": "firmware",
        },
        "moved": [],
        "waiting": [],
        "kept": [],
        "running": [],
    }
    ev = last_event(cli, "node.maintenance")
    assert ev["data"] == {
        "nodeId": "west-01",
        "from": NOW_MS + DAY,
        "until": NOW_MS + DAY + 6 * HOUR,
        "by": "ops",
        "reason": "firmware",
    }
    shown = cli.ok("node", "show", "west-01")
    assert "west-01" in str(shown) and str(NOW_MS + DAY) in str(shown)
    # still schedulable outside the window
    now_rsv = cli.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--key", "a")
    assert now_rsv["allocations"][0]["nodeId"] == "west-01"
    inside = cli.ok(
        "reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--start", at(DAY + HOUR),
        "--key", "b",
    )  # fmt: skip
    assert inside["allocations"][0]["nodeId"] != "west-01"
    # uncordon lifts every window, and says so
    code, text, _ = cli("node", "uncordon", "west-01", json=False)
    assert code == 0 and text.strip() == "west-01 uncordoned; 1 maintenance window(s) lifted"
    assert last_event(cli, "node.uncordoned")["data"]["maintenanceRemoved"] == 1
    again = cli.ok(
        "reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--start", at(DAY + HOUR),
        "--key", "c",
    )  # fmt: skip
    assert again["allocations"][0]["nodeId"] == "west-01"


def test_maintenance_window_moves_an_overlapping_booking(cli: Cli) -> None:
    rsv = cli.ok(
        "reserve", "--tenant", "acme", "--gpus", "8", "--for", "2h", "--start", at(DAY),
        "--key", "w",
    )  # fmt: skip
    assert rsv["allocations"][0]["nodeId"] == "west-01"
    cli.ok("node", "cordon", "west-01", "--from", at(DAY + HOUR), "--until", at(DAY + 2 * HOUR))
    moved = cli.ok("get", rsv["id"])
    assert moved["state"] == "placed" and moved["allocations"][0]["nodeId"] == "west-02"
    assert moved["during"] == rsv["during"]
    ev = last_event(cli, "reservation.repaired")
    assert ev["data"]["from"] == ["west-01"] and ev["data"]["nodeIds"] == ["west-02"]


@pytest.mark.parametrize(
    "args",
    [
        ["--from", at(HOUR)],
        ["--until", at(HOUR)],
        ["--from", at(2 * HOUR), "--until", at(HOUR)],
        ["--from", at(HOUR), "--until", at(HOUR)],
        ["--from", "yesterday-ish", "--until", at(HOUR)],
    ],
)
def test_cordon_window_errors_are_invalid_input(cli: Cli, args: list[str]) -> None:
    err = cli.fails(2, "node", "cordon", "west-01", *args)
    assert err["code"] == "INVALID_INPUT"
    assert cli.ok("node", "show", "west-01") is not None
    assert not [e for e in cli.ok("events") if e["type"] == "node.maintenance"]


@pytest.mark.parametrize(
    "command",
    [
        ["node", "cordon", "nope"],
        ["node", "cordon", "nope", "--from", at(HOUR), "--until", at(2 * HOUR)],
        ["node", "uncordon", "nope"],
        ["node", "mark-unreachable", "nope"],
        ["node", "mark-reachable", "nope"],
        ["device", "quarantine", "nope:1", "--reason", "xid-79"],
        ["device", "restore", "nope:1"],
    ],
)
def test_unknown_node_is_not_found(cli: Cli, command: list[str]) -> None:
    assert cli.fails(3, *command)["code"] == "NOT_FOUND"


# ---------------------------------------------------------------- reachability


def test_mark_unreachable_and_reachable(cli: Cli) -> None:
    doc = cli.ok("--as", "ops", "node", "mark-unreachable", "west-01", "--reason", "no heartbeat")
    assert doc["reachable"] is False and doc["schedulable"] is True
    ev = last_event(cli, "node.unreachable")
    assert ev["data"] == {"nodeId": "west-01", "by": "ops", "reason": "no heartbeat"}
    rsv = cli.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--key", "k")
    assert rsv["allocations"][0]["nodeId"] == "west-02"  # never placed on an unreachable node
    doc = cli.ok("node", "mark-reachable", "west-01")
    assert doc["reachable"] is True
    assert last_event(cli, "node.reachable")["data"] == {"nodeId": "west-01", "by": ME}


def test_a_reservation_starting_now_is_checked_at_its_start_before_it_binds(cli: Cli) -> None:
    rsv = cli.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--key", "k")
    assert rsv["allocations"][0]["nodeId"] == "west-01"
    cli.ok("node", "mark-unreachable", "west-01")
    cli.ok("tick", now=at(MIN))
    got = cli.ok("get", rsv["id"], now=at(MIN))
    assert got["state"] == "active"
    assert got["allocations"][0]["nodeId"] == "west-02"


def test_a_late_tick_repairs_only_what_is_to_come(cli: Cli) -> None:
    """A tick after the start planned the repair for the whole window, the past part too: a
    booking made of that part since (here, ended at 08:20) made it fail, BookingRepairFailed
    with "no node fits" in a free pool, or kept a window begun before the repair (a review)."""
    fill = ("--tenant", "acme", "--gpus", "8", "--gang", "6", "--for", "20m", "--key", "fill")
    cli.ok("reserve", *fill)  # west-01..06 until 08:20
    cal = cli.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--start", "+10m")
    assert [a["nodeId"] for a in cal["allocations"]] == ["west-07"]
    cli.ok("node", "cordon", "west-07", now=at(5 * MIN))
    cli.ok("tick", now=at(25 * MIN))  # late: the fill ends (08:20), then the repair, at 08:25
    got = cli.ok("get", cal["id"], now=at(25 * MIN))
    assert got["state"] == "active" and got["allocations"][0]["nodeId"] != "west-07", got
    assert got["during"] == {"start": NOW_MS + 25 * MIN, "end": NOW_MS + 70 * MIN}
    assert last_event(cli, "reservation.repaired")["data"]["start"] == NOW_MS + 25 * MIN


# ---------------------------------------------------------------- devices


def test_device_quarantine_and_restore(cli: Cli) -> None:
    before = allocatable(cli)
    doc = cli.ok("--as", "ops", "device", "quarantine", "west-01:3", "--reason", "xid-79")
    gpu = doc["gpus"][3]
    assert gpu["health"] == "quarantined" and gpu["healthReason"] == "xid-79"
    assert all(g["health"] == "healthy" for i, g in enumerate(doc["gpus"]) if i != 3)
    assert allocatable(cli) == before - 1
    ev = last_event(cli, "device.quarantined")
    assert ev["data"] == {"nodeId": "west-01", "index": 3, "by": "ops", "reason": "xid-79"}
    # a quarantined GPU is never booked
    rsv = cli.ok("reserve", "--tenant", "acme", "--gpus", "7", "--for", "1h", "--key", "k")
    assert rsv["allocations"][0]["nodeId"] == "west-01"
    assert 3 not in rsv["allocations"][0]["atoms"]

    doc = cli.ok("device", "restore", "west-01:3")
    assert doc["gpus"][3]["health"] == "healthy" and doc["gpus"][3]["healthReason"] is None
    assert last_event(cli, "device.restored")["data"] == {
        "nodeId": "west-01",
        "index": 3,
        "by": ME,
    }
    assert allocatable(cli) == before


@pytest.mark.parametrize(
    ("ref", "code"),
    [
        ("west-01", 2),
        ("west-01:", 2),
        ("west-01:x", 2),
        ("west-01:-1", 2),
        (":3", 3),
        ("west-01:8", 3),
        ("west-01:99", 3),
    ],
)
def test_device_reference_errors(cli: Cli, ref: str, code: int) -> None:
    err = cli.fails(code, "device", "quarantine", ref, "--reason", "xid-79")
    assert err["code"] == {2: "INVALID_INPUT", 3: "NOT_FOUND"}[code]
    cli.fails(code, "device", "restore", ref)


def test_device_quarantine_needs_a_reason(cli: Cli) -> None:
    code, out, _ = cli("device", "quarantine", "west-01:3")
    assert code == 2 and out == ""


# ---------------------------------------------------------------- repair


def test_repair_one_and_every_reservation(cli: Cli) -> None:
    later = cli.ok(
        "reserve", "--tenant", "acme", "--gpus", "4", "--for", "2h", "--start", at(DAY),
        "--key", "later",
    )  # fmt: skip
    assert later["allocations"][0] == {**later["allocations"][0], "nodeId": "west-01"}
    booked = later["allocations"][0]["atoms"]
    cli.ok("device", "quarantine", f"west-01:{booked[0]}", "--reason", "xid-79")
    out = cli.ok("repair", later["id"])
    [change] = out["changes"]
    assert change["type"] == "reservation.repaired" and change["reservationId"] == later["id"]
    assert change["data"]["from"] == ["west-01"]
    assert (
        change["data"]["start"] == NOW_MS + DAY and change["data"]["end"] == NOW_MS + DAY + 2 * HOUR
    )
    got = cli.ok("get", later["id"])
    assert got["state"] == "placed" and got["during"] == later["during"]
    assert got["allocations"][0]["nodeId"] == change["data"]["nodeIds"][0] != "west-01"
    assert got["quotaCharge"] == 4
    assert cli.ok("repair") == {"changes": []}
    code, text, _ = cli("repair", json=False)
    assert code == 0 and "still good" in text


def test_repair_and_tick_by_an_outsider_do_not_say_nothing_happened(cli: Cli) -> None:
    """Anyone may repair and tick, and is shown only its tenants' changes. A principal that may
    act for no tenant moved acme's booking and was told "every booking checked is still good"
    (tick: "nothing to do"); it is now told what is true without naming other tenants."""
    cli.ok("policy", "set", "--tenant", "acme", "--principal", "alice")
    later = cli.ok(
        "reserve", "--tenant", "acme", "--gpus", "4", "--for", "2h", "--start", at(DAY),
        "--key", "later",
    )  # fmt: skip
    cli.ok(
        "device", "quarantine", f"west-01:{later['allocations'][0]['atoms'][0]}", "--reason", "x"
    )
    code, text, _ = cli("--as", "mallory", "repair", json=False)
    assert code == 0 and text.strip() == "no change to reservations you may see"
    assert last_event(cli, "reservation.repaired")["reservationId"] == later["id"]
    assert cli.ok("--as", "mallory", "repair") == {"changes": []}
    code, text, _ = cli("--as", "mallory", "tick", json=False)
    assert code == 0 and text.strip() == "no change to reservations you may see"
    # One reservation the principal may see, checked: said as it is.
    code, text, _ = cli("--as", "alice", "repair", later["id"], json=False)
    assert code == 0 and text.strip() == "every booking checked is still good"


def test_repair_errors(cli: Cli) -> None:
    assert cli.fails(3, "repair", "rsv_doesnotexist")["code"] == "NOT_FOUND"
    active = cli.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--key", "a")
    cli.ok("tick")
    err = cli.fails(4, "repair", active["id"])
    assert err["code"] == "CONFLICT" and "active" in err["message"]
    cli.ok("node", "cordon", "west-01")  # c1.1 keeps three of its four nodes
    pending = cli.ok(
        "reserve", "--tenant", "acme", "--gpus", "8", "--gang", "4", "--topology-key",
        "fabric.domain", "--for", "1h", "--key", "p",
    )  # fmt: skip
    assert pending["state"] == "pending"
    assert cli.fails(4, "repair", pending["id"])["code"] == "CONFLICT"


# ---------------------------------------------------------------- preview --explain


def test_preview_explain_has_a_line_per_node(cli: Cli) -> None:
    cli.ok("node", "cordon", "west-03")
    doc = cli.ok("preview", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--explain")
    assert doc["fits"] is True
    lines = {line["subject"]: line["verdict"] for line in doc["explain"]}
    assert sorted(lines) == [f"west-0{i}" for i in range(1, 8)]
    assert lines["west-01"].startswith("best")
    assert lines["west-03"].startswith("refused")
    assert cli.ok("list") == []  # books nothing

    code, text, _ = cli(
        "preview", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--explain", json=False
    )
    assert code == 0
    for i in range(1, 8):
        assert f"west-0{i}:" in text


def test_preview_explain_for_a_gang_walks_groups_and_nodes(cli: Cli) -> None:
    doc = cli.ok(
        "preview", "--tenant", "acme", "--gpus", "8", "--gang", "4", "--topology-key",
        "fabric.domain", "--for", "1h", "--explain",
    )  # fmt: skip
    subjects = [line["subject"] for line in doc["explain"]]
    assert "fabric.domain=c1.1" in subjects and "fabric.domain=c1.2" in subjects
    verdicts = {line["subject"]: line["verdict"] for line in doc["explain"]}
    assert verdicts["fabric.domain=c1.1"].startswith("4 nodes fit: best")
    assert verdicts["fabric.domain=c1.2"] == "only 3 of 4 nodes fit"
    assert sorted(c["node"] for c in doc["candidates"]) == [f"west-0{i}" for i in range(1, 5)]


# ---------------------------------------------------------------- meters and usage


def test_meter_create_and_list(cli: Cli) -> None:
    assert cli.ok("meter", "list") == []
    assert cli.ok("--as", "billing", "meter", "create", "gpu.h100.hours") == {
        "name": "gpu.h100.hours"
    }
    cli.ok("meter", "create", "gpu.h100.spot.hours")
    assert cli.ok("meter", "list") == [{"name": "gpu.h100.hours"}, {"name": "gpu.h100.spot.hours"}]
    assert last_event(cli, "meter.created")["data"]["by"] == ME
    assert cli.fails(4, "meter", "create", "gpu.h100.hours")["code"] == "CONFLICT"
    # a meter's name is taken in lower case, as a model's is: the same meter
    assert cli.fails(4, "meter", "create", "GPU.H100.hours")["code"] == "CONFLICT"
    for bad in ("gpu h100", "", ".hours", "gpu/h100", "GPU/H100", "gpu.\u212a80.hours"):
        assert cli.fails(2, "meter", "create", bad)["code"] == "INVALID_INPUT"
    assert len(cli.ok("meter", "list")) == 2
    code, text, _ = cli("meter", "list", json=False)
    assert code == 0 and "gpu.h100.spot.hours" in text


def test_a_meter_named_in_upper_case_bills_the_model_it_names(cli: Cli) -> None:
    """openb writes models in upper case (V100M16) and the inventory keeps them lowercased, so
    usage bills gpu.v100m16.hours: `meter create gpu.V100M16.hours` creates that meter, which
    used to be refused as not lowercase."""
    assert cli.ok("meter", "create", "gpu.H100.Hours") == {"name": "gpu.h100.hours"}
    assert cli.ok("meter", "list") == [{"name": "gpu.h100.hours"}]
    cli.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--key", "m")
    cli.ok("tick")
    [row] = cli.ok("usage", now=at(30 * MIN))
    assert row["meter"] == "gpu.h100.hours"
    assert cli.ok("usage", "--dead-letter", now=at(30 * MIN)) == []


def test_usage_json_rows_have_the_stable_shape(cli: Cli) -> None:
    cli.ok("meter", "create", "gpu.h100.hours")
    rsv = cli.ok(
        "reserve", "--tenant", "acme", "--gpus", "8", "--gang", "2", "--for", "1h", "--key", "g"
    )
    spot = cli.ok(
        "reserve", "--tenant", "globex", "--gpus", "2", "--for", "1h", "--spot", "--key", "s"
    )
    cli.ok("tick")
    rows = cli.ok("usage", now=at(30 * MIN))
    assert isinstance(rows, list) and len(rows) == 2  # one per allocation of the gang
    for row in rows:
        assert list(row) == [
            "meter",
            "tenantId",
            "reservationId",
            "allocationId",
            "start",
            "end",
            "quantity",
        ]
        assert row["meter"] == "gpu.h100.hours" and row["reservationId"] == rsv["id"]
        assert row["start"] == NOW_MS and row["end"] is None and row["quantity"] == 4.0
    assert {r["allocationId"] for r in rows} == {a["id"] for a in rsv["allocations"]}
    dead = cli.ok("usage", "--dead-letter", now=at(30 * MIN))
    assert [(r["meter"], r["reservationId"]) for r in dead] == [("gpu.h100.spot.hours", spot["id"])]
    assert cli.ok("usage", "--tenant", "globex", now=at(30 * MIN)) == []
    assert cli.fails(3, "usage", "--tenant", "nobody")["code"] == "NOT_FOUND"
    assert cli.fails(2, "usage", "--from", "not-a-time")["code"] == "INVALID_INPUT"
    code, text, _ = cli("usage", json=False, now=at(30 * MIN))
    assert code == 0 and "gpu.h100.hours" in text


def test_policy_commands_smoke(cli: Cli) -> None:
    cli.ok("policy", "set", "--tenant", "acme", "--principal", "bob", "--max-gpus", "8")
    assert [p["principal"] for p in cli.ok("policy", "list")] == ["bob"]
    err = cli.fails(
        6, "--as", "bob", "reserve", "--tenant", "acme", "--gpus", "8", "--gang", "2",
        "--for", "1h", "--key", "g",
    )  # fmt: skip
    assert "max-gpus 8" in err["message"]
    cli.ok("policy", "delete", "--tenant", "acme", "--principal", "bob")
    assert cli.fails(3, "policy", "delete", "--tenant", "acme", "--principal", "bob")
