"""Setting up through the CLI: init, inventory, pools, nodes, tenants, quotas, settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import HOUR, NOW, NOW_MS, Cli, at, init_db


def write(path: Path, doc: object) -> Path:
    path.write_text(json.dumps(doc))
    return path


# ---------------------------------------------------------------- init


@pytest.mark.sqlite_only(reason="inspects the new SQLite file")
def test_init_creates_an_empty_database(db_dir: Path) -> None:
    cli = Cli(db_dir / "new.db")
    doc = cli.ok("init")
    assert doc["demo"] is False
    assert (db_dir / "new.db").exists()
    assert cli.ok("pool", "list") == []
    assert cli.ok("tenant", "list") == []
    assert cli.ok("list") == []


def test_init_demo_loads_the_demo_inventory(run: Cli) -> None:
    pools = run.ok("pool", "list")
    assert [p["name"] for p in pools] == ["west"]
    assert pools[0]["allocatable"] == 56
    nodes = run.ok("node", "list")
    assert len(nodes) == 7
    assert {n["labels"]["fabric.domain"] for n in nodes} == {"c1.1", "c1.2"}
    assert [t["id"] for t in run.ok("tenant", "list")] == ["acme", "globex"]


def test_init_again_is_a_conflict_and_force_replaces(run: Cli) -> None:
    run.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--key", "k")
    err = run.fails(4, "init")
    assert err["code"] == "CONFLICT"
    assert "--force" in err["message"]
    assert len(run.ok("list")) == 1  # untouched
    run.ok("init", "--force")
    assert run.ok("list") == []
    assert run.ok("pool", "list") == []


@pytest.mark.sqlite_only(reason="a foreign file at the ledger's path")
def test_a_file_that_is_not_a_database_is_refused_untouched(db_dir: Path) -> None:
    path = db_dir / "notes.txt"
    path.write_text("these are my notes, not a database\n" * 10)
    before = path.read_bytes()
    cli = Cli(path)
    for args in (("list",), ("init",), ("init", "--force"), ("pool", "list")):
        err = cli.fails(2, *args)
        assert err["code"] == "INVALID_INPUT"
        assert "not a better-compute database" in err["message"]
    assert path.read_bytes() == before
    assert sorted(p.name for p in db_dir.iterdir()) == ["notes.txt"]


def test_a_missing_database_is_unavailable_with_a_hint(db_dir: Path) -> None:
    cli = Cli(db_dir / "missing.db")
    err = cli.fails(7, "list")
    assert err["code"] == "UNAVAILABLE"
    assert "init" in err["message"]
    code, out, stderr = cli("pool", "list", json=False)
    assert code == 7
    assert out == ""
    assert stderr.startswith("error: UNAVAILABLE: ") and "init" in stderr
    assert not (db_dir / "missing.db").exists()


# ---------------------------------------------------------------- inventory


GOOD = {
    "pools": [
        {
            "name": "east",
            "labels": {"region": "us-east"},
            "nodes": [
                {
                    "name": "east-01",
                    "labels": {"rack": "e1"},
                    "gpus": {
                        "count": 4,
                        "model": "a100",
                        "nvlinkGroups": 2,
                        "fabric": {"cluster": "c9", "clique": 1},
                    },
                }
            ],
        }
    ],
    "tenants": [{"id": "initech", "quota": {"gpus": 16}}],
}


def test_inventory_import_of_a_good_file(run: Cli, db_dir: Path) -> None:
    doc = run.ok("inventory", "import", write(db_dir / "inv.json", GOOD))
    assert doc == {"pools": 1, "nodes": 1, "tenants": 1}
    east = run.ok("pool", "show", "east")
    assert (east["name"], east["allocatable"], east["free"]) == ("east", 4, 4)
    assert east["labels"] == {"region": "us-east"}
    node = run.ok("node", "show", "east-01")
    assert node["pool"] == "east"
    assert node["labels"] == {"fabric.domain": "c9.1", "rack": "e1"}
    assert [g["nvlinkGroup"] for g in node["gpus"]] == [0, 0, 1, 1]
    assert {g["model"] for g in node["gpus"]} == {"a100"}
    quota = run.ok("quota", "show", "--tenant", "initech")
    assert quota["quotas"] == [
        {"poolId": None, "pool": None, "gpus": 16, "held": 0, "remaining": 16}
    ]


def test_inventory_import_from_stdin(run: Cli) -> None:
    doc = run.ok("inventory", "import", "-", input=json.dumps(GOOD))
    assert doc["nodes"] == 1
    assert run.ok("node", "show", "east-01")["name"] == "east-01"


def _bad_variants() -> list[tuple[str, dict[str, object], str]]:
    unknown = json.loads(json.dumps(GOOD))
    unknown["pools"][0]["nodes"][0]["gpus"]["colour"] = "green"
    wrong_type = json.loads(json.dumps(GOOD))
    wrong_type["pools"][0]["nodes"][0]["gpus"]["count"] = "4"
    duplicate = json.loads(json.dumps(GOOD))
    duplicate["pools"][0]["nodes"].append(duplicate["pools"][0]["nodes"][0])
    clash = json.loads(json.dumps(GOOD))  # a node name already taken in the demo file
    clash["pools"][0]["nodes"].append({"name": "east-01", "gpus": {"count": 8, "model": "h100"}})
    return [
        ("unknown key", unknown, "pools[0].nodes[0].gpus.colour"),
        ("wrong type", wrong_type, "pools[0].nodes[0].gpus.count"),
        ("duplicate node", duplicate, "pools[0].nodes[1].name"),
        ("duplicate node, other shape", clash, "pools[0].nodes[1].name"),
    ]


def test_a_bad_inventory_names_the_path_and_applies_nothing(run: Cli, db_dir: Path) -> None:
    before = run.ok("inventory", "export")
    events_before = run.ok("events")
    for what, doc, path in _bad_variants():
        err = run.fails(2, "inventory", "import", write(db_dir / "bad.json", doc))
        assert err["code"] == "INVALID_INPUT", what
        assert path in err["message"], (what, err["message"])
        assert run.ok("inventory", "export") == before, what
    assert run.ok("events") == events_before
    code, out, stderr = run("inventory", "import", db_dir / "bad.json", json=False)
    assert code == 2 and out == ""
    assert stderr.startswith("error: INVALID_INPUT: pools[0].nodes[1].name")


def test_inventory_import_not_json_or_missing_file_is_invalid(run: Cli, db_dir: Path) -> None:
    bad = db_dir / "bad.json"
    bad.write_text('{"pools": [')
    assert "line 1" in run.fails(2, "inventory", "import", bad)["message"]
    assert run.fails(2, "inventory", "import", db_dir / "nope.json")["code"] == "INVALID_INPUT"


def test_an_import_refused_by_the_database_applies_nothing(run: Cli, db_dir: Path) -> None:
    """A file that parses but moves a node with live bookings: the new pool is not created."""
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "2h", "--key", "k")
    node = rsv["allocations"][0]["nodeId"]
    before = run.ok("inventory", "export")
    doc = {
        "pools": [
            {"name": "aaa-new", "nodes": []},
            {"name": "east", "nodes": [{"name": node, "gpus": {"count": 8, "model": "h100"}}]},
        ],
        "tenants": [{"id": "newcorp"}],
    }
    err = run.fails(2, "inventory", "import", write(db_dir / "move.json", doc))
    assert err["message"].startswith("pools[1].nodes[0].name"), err["message"]
    assert run.ok("inventory", "export") == before
    assert run.fails(3, "pool", "show", "aaa-new")["code"] == "NOT_FOUND"


def test_export_import_round_trip(run: Cli, db_dir: Path) -> None:
    run.ok("inventory", "import", write(db_dir / "inv.json", GOOD))
    exported = run.ok("inventory", "export")
    assert [p["name"] for p in exported["pools"]] == ["east", "west"]
    fresh = Cli(init_db(db_dir / "fresh.db"))
    fresh.ok("inventory", "import", write(db_dir / "export.json", exported))
    assert fresh.ok("inventory", "export") == exported
    # importing the export into the source again changes nothing
    run.ok("inventory", "import", db_dir / "export.json")
    assert run.ok("inventory", "export") == exported
    # without --json, export prints the same document (indented)
    code, text, _ = run("inventory", "export", json=False)
    assert code == 0 and json.loads(text) == exported


# ---------------------------------------------------------------- pools


def test_pool_create_list_show(run: Cli) -> None:
    created = run.ok("pool", "create", "east", "--label", "region=us-east", "--label", "tier=a")
    assert created["id"].startswith("pool_")
    assert created["name"] == "east"
    assert created["labels"] == {"region": "us-east", "tier": "a"}
    assert (created["allocatable"], created["inUse"], created["reserved"], created["free"]) == (
        0,
        0,
        0,
        0,
    )
    assert [p["name"] for p in run.ok("pool", "list")] == ["east", "west"]
    by_id = run.ok("pool", "show", created["id"])
    assert by_id == run.ok("pool", "show", "east")
    assert run.fails(4, "pool", "create", "east")["code"] == "CONFLICT"
    assert run.fails(2, "pool", "create", "bad name!")["code"] == "INVALID_INPUT"
    assert run.fails(2, "pool", "create", "p2", "--label", "novalue")["code"] == "INVALID_INPUT"
    assert run.fails(3, "pool", "show", "nowhere")["code"] == "NOT_FOUND"


def rollup(cli: Cli, now: str = NOW) -> tuple[int, int, int, int]:
    p = cli.ok("pool", "show", "west", now=now)
    assert p["free"] == p["allocatable"] - p["inUse"]
    return p["allocatable"], p["inUse"], p["reserved"], p["free"]


def test_pool_rollup_counts_now_and_later(run: Cli) -> None:
    assert rollup(run) == (56, 0, 0, 56)
    first = run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "2h", "--key", "now")
    assert rollup(run) == (56, 4, 0, 52)
    later = run.ok(
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "8",
        "--for",
        "2h",
        "--start",
        "+1d",
        "--key",
        "later",
    )
    assert later["state"] == "placed"
    # reserved: GPUs whose next booking begins later and that no booking covers now
    busy_now = {(a["nodeId"], i) for a in first["allocations"] for i in a["atoms"]}
    booked_later = {(a["nodeId"], i) for a in later["allocations"] for i in a["atoms"]}
    assert len(booked_later) == 8
    assert rollup(run) == (56, 4, len(booked_later - busy_now), 52)
    # an hour into tomorrow's window it is in use and the first one has ended
    assert rollup(run, now=at(24 * HOUR + HOUR)) == (56, 8, 0, 48)
    # after every window, nothing
    assert rollup(run, now=at(3 * 24 * HOUR)) == (56, 0, 0, 56)
    # a cancelled calendar reservation no longer counts as reserved
    run.ok("cancel", later["id"])
    assert rollup(run) == (56, 4, 0, 52)
    later = run.ok(
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "8",
        "--for",
        "2h",
        "--start",
        "+1d",
        "--pool",
        "west",
        "--key",
        "later-2",
    )
    booked_later = {(a["nodeId"], i) for a in later["allocations"] for i in a["atoms"]}
    assert rollup(run)[2] == len(booked_later - busy_now)
    run.ok("cancel", later["id"])
    listed = {p["name"]: p for p in run.ok("pool", "list")}
    assert (listed["west"]["inUse"], listed["west"]["reserved"]) == (4, 0)


def test_pool_allocatable_drops_with_a_quarantined_gpu_or_a_cordoned_node(solo: Cli) -> None:
    assert solo.ok("pool", "show", "solo")["allocatable"] == 8
    solo.ok("device", "quarantine", "n1:3", "--reason", "xid-79")
    shown = solo.ok("pool", "show", "solo")
    assert (shown["allocatable"], shown["free"]) == (7, 7)
    solo.ok("device", "restore", "n1:3")
    assert solo.ok("pool", "show", "solo")["allocatable"] == 8
    solo.ok("node", "cordon", "n1", "--reason", "bios")
    assert solo.ok("pool", "show", "solo")["allocatable"] == 0
    solo.ok("node", "uncordon", "n1")
    assert solo.ok("pool", "show", "solo")["allocatable"] == 8


def test_free_counts_the_allocatable_gpus_no_booking_holds(solo: Cli) -> None:
    """`pool show` and `timeline` answer what reserve will place: a booked GPU quarantined since
    takes no allocatable GPU from `free`, and an unreachable node's GPUs are not allocatable,
    since placement refuses them (a review: free read one short of what reserve then placed,
    and offered an unreachable node's GPUs that preview refused)."""

    def rollup() -> tuple[int, int, int]:
        shown = solo.ok("pool", "show", "solo")
        return shown["allocatable"], shown["inUse"], shown["free"]

    def first_bucket() -> tuple[int, int]:
        bucket = solo.ok("timeline", "--pool", "solo", "--step", "60")["buckets"][0]
        return bucket["booked"], bucket["free"]

    job = solo.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "2h")
    solo.ok("tick")
    assert rollup() == (8, 2, 6) and first_bucket() == (2, 6)
    held = job["allocations"][0]["atoms"][0]
    solo.ok("device", "quarantine", f"n1:{held}", "--reason", "xid-79")
    assert rollup() == (7, 2, 6) and first_bucket() == (2, 6)
    solo.ok("node", "mark-unreachable", "n1")
    assert rollup() == (0, 2, 0) and first_bucket() == (2, 0)
    assert solo.ok("preview", "--tenant", "acme", "--gpus", "1", "--for", "1h")["fits"] is False
    solo.ok("node", "mark-reachable", "n1")
    assert rollup() == (7, 2, 6)
    assert solo.ok("reserve", "--tenant", "acme", "--gpus", "6", "--for", "1h")["state"] == "placed"
    assert rollup() == (7, 8, 0) and first_bucket() == (8, 0)


# ---------------------------------------------------------------- nodes


def test_node_add_list_show_label(run: Cli) -> None:
    run.ok("pool", "create", "east")
    added = run.ok(
        "node",
        "add",
        "east-01",
        "--pool",
        "east",
        "--gpus",
        "8",
        "--model",
        "a100",
        "--label",
        "rack=e1",
        "--nvlink-groups",
        "4",
        "--fabric",
        "c2.7",
    )
    assert added["name"] == "east-01"
    assert added["labels"] == {"fabric.domain": "c2.7", "rack": "e1"}
    assert [g["nvlinkGroup"] for g in added["gpus"]] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(g["fabric"] == {"cluster": "c2", "clique": 7} for g in added["gpus"])
    assert all(g["health"] == "healthy" for g in added["gpus"])
    assert added["schedulable"] is True and added["reachable"] is True
    assert [n["name"] for n in run.ok("node", "list", "--pool", "east")] == ["east-01"]
    assert len(run.ok("node", "list")) == 8
    assert len(run.ok("node", "list", "--pool", "west")) == 7
    shown = run.ok("node", "show", "east-01")
    assert shown["pool"] == "east" and shown["desiredState"] == [] and shown["maintenance"] == []
    assert run.ok("pool", "show", "east")["allocatable"] == 8

    labelled = run.ok("node", "label", "east-01", "zone=a", "rack=e2")
    assert labelled["labels"] == {"fabric.domain": "c2.7", "rack": "e2", "zone": "a"}
    unlabelled = run.ok("node", "label", "east-01", "zone-")
    assert unlabelled["labels"] == {"fabric.domain": "c2.7", "rack": "e2"}
    assert run.ok("node", "show", "east-01")["labels"] == unlabelled["labels"]

    assert (
        run.fails(4, "node", "add", "east-01", "--pool", "east", "--gpus", "8", "--model", "a100")[
            "code"
        ]
        == "CONFLICT"
    )
    assert (
        run.fails(3, "node", "add", "x-01", "--pool", "nowhere", "--gpus", "8", "--model", "a100")[
            "code"
        ]
        == "NOT_FOUND"
    )
    assert (
        run.fails(2, "node", "add", "x-01", "--pool", "east", "--gpus", "0", "--model", "a100")[
            "code"
        ]
        == "INVALID_INPUT"
    )
    assert (
        run.fails(
            2,
            "node",
            "add",
            "x-01",
            "--pool",
            "east",
            "--gpus",
            "8",
            "--model",
            "a100",
            "--nvlink-groups",
            "3",
        )["code"]
        == "INVALID_INPUT"
    )
    assert (
        run.fails(
            2,
            "node",
            "add",
            "x-01",
            "--pool",
            "east",
            "--gpus",
            "8",
            "--model",
            "a100",
            "--fabric",
            "nodot",
        )["code"]
        == "INVALID_INPUT"
    )
    assert run.fails(2, "node", "label", "east-01", "fabric.domain=x")["code"] == "INVALID_INPUT"
    assert run.fails(3, "node", "show", "ghost")["code"] == "NOT_FOUND"
    assert run.fails(3, "node", "label", "ghost", "a=b")["code"] == "NOT_FOUND"
    assert run.fails(3, "node", "list", "--pool", "nowhere")["code"] == "NOT_FOUND"


def test_node_add_without_pool_uses_the_only_pool(db_dir: Path) -> None:
    cli = Cli(init_db(db_dir / "one.db"))
    cli.ok("pool", "create", "only")
    added = cli.ok("node", "add", "n1", "--gpus", "2", "--model", "h100")
    assert added["poolId"] == cli.ok("pool", "show", "only")["id"]
    cli.ok("pool", "create", "second")
    code, out, err = cli("node", "add", "n2", "--gpus", "2", "--model", "h100")
    assert code != 0 and out == ""
    assert "--pool" in json.loads(err)["error"]["message"]
    assert [n["name"] for n in cli.ok("node", "list")] == ["n1"]


def test_node_show_lists_its_desired_state(run: Cli) -> None:
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "2h", "--key", "k")
    node = rsv["allocations"][0]["nodeId"]
    assert run.ok("node", "show", node)["desiredState"] == []  # placed, not yet binding
    run.ok("tick")
    desired = run.ok("node", "show", node)["desiredState"]
    assert len(desired) == 1
    assert desired[0]["reservationId"] == rsv["id"]


# ---------------------------------------------------------------- tenants, quotas


def test_tenant_create_and_list(run: Cli) -> None:
    assert run.ok("tenant", "create", "initech") == {"id": "initech"}
    assert run.ok("tenant", "list") == [{"id": "acme"}, {"id": "globex"}, {"id": "initech"}]
    assert run.fails(4, "tenant", "create", "acme")["code"] == "CONFLICT"
    assert run.fails(2, "tenant", "create", "_bad")["code"] == "INVALID_INPUT"
    assert run.fails(2, "tenant", "create", "--", "-bad")["code"] == "INVALID_INPUT"
    assert [t["id"] for t in run.ok("tenant", "list")] == ["acme", "globex", "initech"]


def test_quota_set_and_show(run: Cli) -> None:
    doc = run.ok("quota", "set", "--tenant", "globex", "--gpus", "16")
    assert doc["tenantId"] == "globex"
    assert doc["quotas"] == [{"poolId": None, "pool": None, "gpus": 16, "held": 0, "remaining": 16}]
    pool_id = run.ok("pool", "show", "west")["id"]
    run.ok("quota", "set", "--tenant", "globex", "--pool", "west", "--gpus", "8")
    run.ok("reserve", "--tenant", "globex", "--gpus", "4", "--for", "1h", "--key", "k")
    shown = run.ok("quota", "show", "--tenant", "globex")
    assert sorted(shown["quotas"], key=lambda q: q["gpus"]) == [
        {"poolId": pool_id, "pool": "west", "gpus": 8, "held": 4, "remaining": 4},
        {"poolId": None, "pool": None, "gpus": 16, "held": 4, "remaining": 12},
    ]
    code, text, _ = run("quota", "show", "--tenant", "globex", json=False)
    assert code == 0 and "4 of 8" in text and "4 of 16" in text
    assert run.fails(3, "quota", "show", "--tenant", "ghost")["code"] == "NOT_FOUND"
    assert run.fails(3, "quota", "set", "--tenant", "ghost", "--gpus", "1")["code"] == "NOT_FOUND"
    assert (
        run.fails(3, "quota", "set", "--tenant", "acme", "--pool", "nowhere", "--gpus", "1")["code"]
        == "NOT_FOUND"
    )
    assert run.fails(2, "quota", "set", "--tenant", "acme", "--gpus", "-1")["code"] == (
        "INVALID_INPUT"
    )
    assert run.ok("quota", "show", "--tenant", "acme")["quotas"][0]["gpus"] == 64


# ---------------------------------------------------------------- settings


def test_config_get_and_set(run: Cli) -> None:
    values = run.ok("config", "get")
    assert values["placement.topN"] == 3
    assert values["pending.retryMs"] == 30000
    assert values["binding.autoBind"] is True
    assert values["capacity.spotNoticeMs"] == 120000
    assert values["timeline.maxBuckets"] == 336
    assert run.ok("config", "get", "placement.topN") == {"placement.topN": 3}
    assert run.ok("config", "set", "placement.topN", "5") == {"placement.topN": 5}
    assert run.ok("config", "get", "placement.topN") == {"placement.topN": 5}
    assert run.ok("config", "set", "binding.autoBind", "false") == {"binding.autoBind": False}
    assert run.ok("config", "get")["binding.autoBind"] is False


def test_config_bad_key_or_value_is_invalid_and_changes_nothing(run: Cli) -> None:
    before = run.ok("config", "get")
    for args in (
        ("nope.key", "1"),
        ("placement.topN", "many"),
        ("placement.topN", "0"),
        ("placement.topN", "-3"),
        ("binding.autoBind", "yes"),
        ("pending.retryMs", "1.5"),
    ):
        err = run.fails(2, "config", "set", "--", *args)
        assert err["code"] == "INVALID_INPUT", args
        assert args[0] in err["message"], args
    assert run.ok("config", "get") == before


def test_config_get_unknown_key_is_invalid(run: Cli) -> None:
    err = run.fails(2, "config", "get", "nope.key")
    assert err["code"] == "INVALID_INPUT"
    assert "nope.key" in err["message"] and "placement.topN" in err["message"]


def test_init_uses_the_given_now(db_dir: Path) -> None:
    cli = Cli(init_db(db_dir / "t.db", "--demo"))
    created = [e for e in cli.ok("events") if e["type"] == "inventory.imported"]
    assert created and created[0]["at"] == NOW_MS
