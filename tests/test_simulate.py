"""`simulate` (issue 8): a replay through the real use cases gives the same ledger as the same
commands run one by one, the same report on copies of one ledger, survives SIGKILL consistently,
and refuses bad workloads naming the line before it writes anything."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ME, MIN, NOW, NOW_MS, SEC, Cli, init_db

from better_compute.errors import InvalidInput, Terminated, Unavailable
from better_compute.service import simulate as simulate_service
from better_compute.timeparse import iso
from better_compute.workload import parse_jsonl

MACHINE_KEYS = ("wallSeconds", "requestsPerSecond")
REPORT_KEYS = [
    "requests",
    "placedAtOnce",
    "placedAfterWaiting",
    "neverPlaced",
    "skipped",
    "preemptions",
    "waitMs",
    "gpuHoursBooked",
    "gpuHoursUsed",
    "utilisation",
    "wallSeconds",
    "requestsPerSecond",
]
ENTRY = [sys.executable, "-c", "from better_compute.cli import main; main()"]


def small_fleet(path: Path) -> Cli:
    """Pool `small`: four 4-GPU h100 nodes, two per fabric domain (so 2-node gangs fit)."""
    cli = Cli(init_db(path))
    cli.ok("pool", "create", "small")
    for i in range(4):
        fabric = f"c1.{i // 2}"
        cli.ok("node", "add", f"n{i}", "--pool", "small", "--gpus", "4", "--model", "h100",
               "--nvlink-groups", "2", "--fabric", fabric)  # fmt: skip
    return cli


def generated(seed: int = 7, count: int = 40) -> list[dict[str, Any]]:
    """A contended workload on a 30-second grid (so a tick every 30 s meets every due instant):
    regular and spot requests, calendar starts, gangs; two tenants."""
    rng = random.Random(seed)
    lines: list[dict[str, Any]] = []
    for n in range(count):
        at = NOW_MS + rng.randrange(0, 40) * 30 * SEC
        line: dict[str, Any] = {
            "at": at,
            "tenant": rng.choice(["acme", "globex"]),
            "gpus": rng.choice([1, 1, 2, 2, 3, 4]),
            "duration": rng.randrange(2, 60) * 30 * SEC,
        }
        if rng.random() < 0.4:
            line["spot"] = True
        if rng.random() < 0.15:
            line["start"] = at + rng.randrange(1, 40) * 30 * SEC
        if n % 10 == 3:
            line.update(gang=2, gpus=2, topologyKey="fabric.domain", spot=False)
        if n % 7 == 0:
            line["duration"] = f"{rng.randrange(1, 20)}m"
        lines.append(line)
    return lines


def write_jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def without_machine(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k not in MACHINE_KEYS}


def outcome(cli: Cli) -> list[tuple[Any, ...]]:
    """What each reservation ended as: state, window, nodes and GPUs, release reason."""
    rows = cli.ok("list")
    return [
        (
            r["id"],
            r["tenantId"],
            r["state"],
            r["releaseReason"],
            r["during"],
            [(a["nodeId"], a["atoms"]) for a in r["allocations"]],
            [c["reason"] for c in r["conditions"]],
        )
        for r in rows
    ]


def ledger_now(cli: Cli) -> int:
    """The ledger's instant: a tick without --now on a manual clock acts at it (and does nothing
    when nothing is due)."""
    return int(cli.ok("tick", now=None)["now"])


@pytest.fixture
def fleet(db_dir: Path) -> Cli:
    return small_fleet(db_dir / "sim.db")


@pytest.mark.sqlite_only(reason="copies the ledger file")
def test_report_has_the_product_keys_and_is_the_same_on_copies(fleet: Cli, db_dir: Path) -> None:
    workload = write_jsonl(db_dir / "w.jsonl", generated())
    copy = Cli(db_dir / "copy.db")
    fleet.ok("backup", copy.db)
    first = fleet.ok("simulate", "--workload", workload, "--format", "jsonl", now=None)
    second = copy.ok("simulate", "--workload", workload, "--format", "jsonl", now=None)
    assert list(first) == REPORT_KEYS
    assert set(first["preemptions"]) == {"cutBack", "requeued"}
    assert set(first["waitMs"]) == {"mean", "p95"}
    assert without_machine(first) == without_machine(second)
    assert outcome(fleet) == outcome(copy)
    assert first["requests"] == 40 and first["skipped"] == 0
    assert first["placedAtOnce"] + first["placedAfterWaiting"] + first["neverPlaced"] == 40
    # The workload is contended: some waited, and spot work was preempted.
    assert first["placedAfterWaiting"] > 0
    assert first["preemptions"]["cutBack"] + first["preemptions"]["requeued"] > 0
    assert first["waitMs"]["p95"] >= first["waitMs"]["mean"] > 0
    assert 0 < first["gpuHoursUsed"] <= first["gpuHoursBooked"]
    for bucket in first["utilisation"]:
        assert set(bucket) == {"start", "end", "booked", "allocatable"}
        assert bucket["allocatable"] == 16 and 0 <= bucket["booked"] <= 16
    # Ticked to the end: nothing is live any more.
    assert fleet.ok("list", "--state", "pending", "--state", "placed", "--state", "active") == []


@pytest.mark.sqlite_only(reason="copies the ledger file")
def test_simulate_agrees_with_the_same_commands_run_one_by_one(fleet: Cli, db_dir: Path) -> None:
    """Reserve at each arrival with --now, `tick --until` every 30 s between them (every due
    instant lies on that grid), then tick to where simulate stopped: the same reservations end
    in the same states, windows, nodes and GPUs."""
    lines = generated(seed=11, count=30)
    workload = write_jsonl(db_dir / "w.jsonl", lines)
    by_hand = Cli(db_dir / "by-hand.db")
    fleet.ok("backup", by_hand.db)

    fleet.ok("simulate", "--workload", workload, "--format", "jsonl", now=None)
    end = ledger_now(fleet)

    for tenant in sorted({x["tenant"] for x in lines}):
        by_hand.ok("tenant", "create", tenant, now=None)
    for x in sorted(lines, key=lambda x: x["at"]):  # stable: ties keep the file's order
        by_hand.ok("tick", "--until", str(x["at"]), "--step", "30s", now=None)
        args = ["reserve", "--tenant", x["tenant"], "--gpus", x["gpus"]]
        duration = x["duration"]
        args += ["--for", duration if isinstance(duration, str) else f"{duration // SEC}s"]
        if "start" in x:
            args += ["--start", str(x["start"])]
        if x.get("spot"):
            args.append("--spot")
        if "gang" in x:
            args += ["--gang", x["gang"], "--topology-key", x["topologyKey"]]
        by_hand.ok(*args, now=str(x["at"]))
    by_hand.ok("tick", "--until", str(end), "--step", "30s", now=None)

    assert outcome(by_hand) == outcome(fleet)
    assert ledger_now(by_hand) == end
    # Expiring notices come at the same instants: one is due notice.expiringMs before the end
    # (simulate ticks then too), as a tick every 30 s gives it.
    assert expiring(by_hand) == expiring(fleet) != []
    # So do starting notices, including for reservations made inside their lead time (a start
    # less than repair.leadMs ahead): the lead check is due at once, not at the start.
    assert notices(by_hand, "reservation.starting") == notices(fleet, "reservation.starting")


@pytest.mark.sqlite_only(reason="copies the ledger file")
def test_a_spot_victim_under_notice_is_judged_alike_by_a_replay_and_by_hand(
    fleet: Cli, db_dir: Path
) -> None:
    """A replay's fleet in memory and a command's SQL free the same spot work: one under notice
    that starts as a zero-notice request arrives keeps its deadline, and the next spot job,
    not yet started, is requeued instead (a review: the replay's fleet took the started one,
    the preemption was refused, and the request waited where by hand it did not)."""
    fleet.ok("config", "set", "placement.topN", "1")
    fleet.ok("config", "set", "capacity.spotNoticeMs", str(10 * MIN))
    for tenant in ("acme", "globex"):
        fleet.ok("tenant", "create", tenant)
    for node in ("n2", "n3"):  # out of the way: regular work for hours
        fleet.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "3h", "--key", node)
    start = NOW_MS + 5 * MIN
    fleet.ok("reserve", "--tenant", "globex", "--gpus", "4", "--for", "1h", "--spot",
             "--start", str(start), "--key", "S")  # fmt: skip
    fleet.ok("reserve", "--tenant", "globex", "--gpus", "4", "--for", "1h", "--spot",
             "--start", str(start + MIN), "--key", "V")  # fmt: skip
    fleet.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "1h", "--key", "R1")
    assert _by_key(fleet, "S")["during"]["end"] == NOW_MS + 10 * MIN  # under notice
    fleet.ok("config", "set", "capacity.spotNoticeMs", "0")
    lines = [
        {"at": NOW_MS + MIN, "tenant": "acme", "gpus": 1, "duration": "1m", "key": "L"},
        {"at": start, "tenant": "acme", "gpus": 4, "duration": "5m", "key": "R2"},
    ]
    workload = write_jsonl(db_dir / "w.jsonl", lines)
    by_hand = Cli(db_dir / "by-hand.db")
    fleet.ok("backup", by_hand.db)

    report = fleet.ok("simulate", "--workload", workload, "--format", "jsonl", now=None)
    end = ledger_now(fleet)
    for x in lines:
        by_hand.ok("tick", "--until", str(x["at"]), "--step", "30s", now=None)
        by_hand.ok("reserve", "--tenant", "acme", "--gpus", str(x["gpus"]), "--for",
                   str(x["duration"]), "--key", str(x["key"]), now=str(x["at"]))  # fmt: skip
    by_hand.ok("tick", "--until", str(end), "--step", "30s", now=None)

    assert report["placedAtOnce"] == 2 and report["placedAfterWaiting"] == 0
    assert outcome(by_hand) == outcome(fleet)
    assert _by_key(fleet, "S")["during"]["end"] == NOW_MS + 10 * MIN  # its deadline stood
    v = _by_key(fleet, "V")["id"]
    requeued = [
        e for e in fleet.ok("events", "--reservation", v) if e["type"] == "reservation.preempted"
    ]
    assert [e["data"].get("requeued") for e in requeued] == [True]  # V went instead, unstarted


def test_a_replay_gives_the_expiring_notice_when_it_is_due(fleet: Cli, db_dir: Path) -> None:
    """A 3 h reservation and nothing else: the replay ticks notice.expiringMs (40 min) before
    its end, as cron would, not only at the end, when the notice is no longer due."""
    fleet.ok("tenant", "create", "acme")
    line = {"at": NOW_MS, "tenant": "acme", "gpus": 1, "duration": "3h"}
    fleet.ok("simulate", "--workload", write_jsonl(db_dir / "one.jsonl", [line]), "--format",
             "jsonl", now=None)  # fmt: skip
    assert [at for _, at in expiring(fleet)] == [NOW_MS + 3 * 60 * MIN - 40 * MIN]


def expiring(cli: Cli) -> list[tuple[str, int]]:
    """(reservation, at) of every expiring notice, by reservation."""
    return notices(cli, "reservation.expiring")


def notices(cli: Cli, type_: str) -> list[tuple[str, int]]:
    """(reservation, at) of every event of this type, by reservation."""
    return sorted((e["reservationId"], e["at"]) for e in cli.ok("events") if e["type"] == type_)


def _full_then_later(cli: Cli) -> None:
    """Pool small full until 09:00 with a fifth request waiting, acme's quota all held; nothing
    ticks after 08:00."""
    cli.ok("tenant", "create", "acme")
    cli.ok("quota", "set", "--tenant", "acme", "--gpus", "20")
    four = ("--tenant", "acme", "--pool", "small", "--gpus", "4", "--for", "1h")
    for i in range(5):
        cli.ok("reserve", *four, "--key", f"r{i}")
    cli.ok("tick")


def _by_key(cli: Cli, key: str) -> dict[str, Any]:
    return dict(cli.ok("get", cli.ok("list", "--key", key)[0]["id"]))


def test_a_replay_first_runs_what_fell_due_before_its_start(fleet: Cli, db_dir: Path) -> None:
    """Ends and retries due before the replay's instant are run by a tick at that instant, as
    `tick` then `reserve` would, before the first arrival; and a replay --until its start still
    ticks there."""
    later = "2026-09-28T10:00:00Z"
    _full_then_later(fleet)
    line = {"at": "+0m", "tenant": "acme", "gpus": 4, "duration": "1h", "pool": "small"}
    workload = write_jsonl(db_dir / "late.jsonl", [line])
    report = fleet.ok("simulate", "--workload", workload, "--format", "jsonl", now=later)
    assert report["placedAtOnce"] == 1 and report["neverPlaced"] == 0, report
    first = _by_key(fleet, "r0")
    assert first["releaseReason"] == "expired" and first["during"]["end"] == NOW_MS + 60 * MIN
    assert _by_key(fleet, "r4")["during"]["start"] == NOW_MS + 120 * MIN  # retried at 10:00
    other = small_fleet(db_dir / "until.db")
    _full_then_later(other)
    empty = write_jsonl(db_dir / "none.jsonl", [])
    other.ok("simulate", "--workload", empty, "--format", "jsonl", "--until", later, now=later)
    assert _by_key(other, "r0")["state"] == "released"
    assert _by_key(other, "r4")["during"]["start"] == NOW_MS + 120 * MIN


def test_until_leaves_work_active_and_bookings_ahead(fleet: Cli, db_dir: Path) -> None:
    lines = [
        {"at": "+0s", "tenant": "acme", "gpus": 2, "duration": "2h"},
        {"at": "+10m", "tenant": "acme", "gpus": 1, "duration": "3h", "start": "+1h"},
        {"at": "+20m", "tenant": "globex", "gpus": 4, "duration": 3_600_000, "spot": True},
        {"at": "+2h", "tenant": "latecomer", "gpus": 1, "duration": "1h"},  # after --until
    ]
    workload = write_jsonl(db_dir / "w.jsonl", lines)
    report = fleet.ok(
        "simulate", "--workload", workload, "--format", "jsonl", "--until", "+30m", now=None
    )
    assert report["requests"] == 3
    assert ledger_now(fleet) == NOW_MS + 30 * MIN
    # Only the tenants of the requests sent are created: latecomer arrives after --until.
    assert "latecomer" not in [t["id"] for t in fleet.ok("tenant", "list")]
    active = fleet.ok("list", "--state", "active")
    assert {r["tenantId"] for r in active} == {"acme", "globex"}
    placed = fleet.ok("list", "--state", "placed")
    assert [r["during"]["start"] for r in placed] == [NOW_MS + 60 * MIN]  # from the ledger
    window = ["--from", str(NOW_MS + 60 * MIN), "--to", str(NOW_MS + 120 * MIN)]
    timeline = fleet.ok("timeline", *window, "--step", "30", now=None)
    assert all(b["booked"] > 0 for b in timeline["buckets"])
    # The commands that follow carry on from there: the ledger is live at --until.
    assert fleet.ok("tick", "--until", "+3h", now=None)["changes"]


def test_a_requeued_victim_counts_by_where_it_ends(fleet: Cli, db_dir: Path) -> None:
    """A spot gang booked ahead and requeued by a regular gang that needs its nodes is waiting
    again: at --until it counts as never placed and its wait is not in the mean (it had counted
    as placed at once, wait 0). Without --until it is placed again once the regular gang ends:
    placed after waiting, its wait to that second window."""
    lines = [
        {"at": "+0m", "tenant": "sp", "gpus": 4, "duration": "3h", "spot": True, "start": "+1h",
         "gang": 4},
        {"at": "+1m", "tenant": "reg", "gpus": 4, "duration": "2h", "gang": 4},
    ]  # fmt: skip
    workload = write_jsonl(db_dir / "rq.jsonl", lines)
    copy = small_fleet(db_dir / "rq-copy.db")
    args = ("simulate", "--workload", workload, "--format", "jsonl")
    at_until = fleet.ok(*args, "--until", "+30m", now=None)
    assert at_until["preemptions"] == {"cutBack": 0, "requeued": 1}
    assert (at_until["placedAtOnce"], at_until["neverPlaced"]) == (1, 1)
    assert at_until["waitMs"] == {"mean": 2 * MIN, "p95": 2 * MIN}  # the regular gang's notice
    assert [r["tenantId"] for r in fleet.ok("list", "--state", "pending")] == ["sp"]
    whole = copy.ok(*args, now=None)
    assert (whole["placedAtOnce"], whole["placedAfterWaiting"], whole["neverPlaced"]) == (1, 1, 0)
    regular_ends = 1 * MIN + 2 * MIN + 2 * 60 * MIN  # arrival, the notice, its 2 hours
    assert whole["waitMs"]["p95"] == regular_ends - 60 * MIN  # asked for +1h


def test_utilisation_ends_with_the_replay(fleet: Cli, db_dir: Path) -> None:
    """Buckets are whole minutes (30 h 17 min / 24: 76 min each), so 24 of them would run 7 min
    past --until; the last ends at --until and averages over its own 69 minutes. The booking
    runs 3 min past --until: counted up to --until only, it is 2 GPUs in every bucket."""
    lines = [{"at": "+0s", "tenant": "acme", "gpus": 2, "duration": "30h20m"}]
    workload = write_jsonl(db_dir / "w.jsonl", lines)
    report = fleet.ok(
        "simulate", "--workload", workload, "--format", "jsonl", "--until", "+30h17m", now=None
    )
    buckets = report["utilisation"]
    assert len(buckets) == 24
    assert buckets[0]["start"] == NOW_MS and buckets[-1]["end"] == NOW_MS + (30 * 60 + 17) * MIN
    assert all(b["end"] - b["start"] == 76 * MIN for b in buckets[:-1])
    assert [b["booked"] for b in buckets] == [2.0] * 24


def test_utilisation_counts_the_pools_asked_for_when_nothing_fits(fleet: Cli, db_dir: Path) -> None:
    """Review finding: a run that booked nothing reported `allocatable: 0`, as if there were no
    GPUs, exactly when its demand found none free (here a gang of every node, one cordoned)."""
    fleet.ok("node", "cordon", "n0", now=None)
    lines = [{"at": "+0s", "tenant": "acme", "gpus": 4, "gang": 4, "duration": "1h"}]
    workload = write_jsonl(db_dir / "w.jsonl", lines)
    report = fleet.ok(
        "simulate", "--workload", workload, "--format", "jsonl", "--until", "+2h", now=None
    )
    assert report["neverPlaced"] == 1 and report["gpuHoursBooked"] == 0
    assert {b["allocatable"] for b in report["utilisation"]} == {12}  # n0 is cordoned


def test_utilisation_counts_the_pools_of_refused_requests(fleet: Cli, db_dir: Path) -> None:
    """A request refused at admission (over its tenant's quota) still asked for its pool: the
    report's allocatable counts it, and a run that made nothing still reports its buckets."""
    fleet.ok("pool", "create", "east", now=None)
    fleet.ok("node", "add", "e0", "--pool", "east", "--gpus", "2", "--model", "a100", now=None)
    fleet.ok("tenant", "create", "globex", now=None)
    fleet.ok("quota", "set", "--tenant", "globex", "--gpus", "4", now=None)
    lines = [{"at": "+0s", "tenant": "globex", "gpus": 4, "gang": 2, "duration": "1h",
              "pool": "small"}]  # fmt: skip
    workload = write_jsonl(db_dir / "w.jsonl", lines)
    report = fleet.ok(
        "simulate", "--workload", workload, "--format", "jsonl", "--until", "+2h", now=None
    )
    assert report["neverPlaced"] == 1 and report["utilisation"], report
    assert {b["allocatable"] for b in report["utilisation"]} == {16}  # small's, not east's 2
    lines.append({"at": "+3h", "tenant": "acme", "gpus": 1, "duration": "1h", "pool": "east"})
    report = fleet.ok("simulate", "--workload", write_jsonl(db_dir / "x.jsonl", lines),
                      "--format", "jsonl", now=None)  # fmt: skip
    assert {b["allocatable"] for b in report["utilisation"]} == {18}


def test_refused_requests_are_never_placed_and_the_replay_goes_on(fleet: Cli, db_dir: Path) -> None:
    fleet.ok("tenant", "create", "acme")
    fleet.ok("quota", "set", "--tenant", "acme", "--gpus", "2")
    lines = [
        {"at": "+0s", "tenant": "acme", "gpus": 2, "duration": "1h"},
        {"at": "+1m", "tenant": "acme", "gpus": 1, "duration": "1h"},  # over quota
        {"at": "+2m", "tenant": "acme", "gpus": 1, "duration": "1h", "model": "a100"},  # no a100
        {"at": "+3m", "tenant": "globex", "gpus": 1, "duration": "1h"},
    ]
    code, report, err = fleet(
        "simulate", "--workload", write_jsonl(db_dir / "w.jsonl", lines), "--format", "jsonl",
        now=None,
    )  # fmt: skip
    assert code == 0, err
    assert (report["requests"], report["placedAtOnce"], report["neverPlaced"]) == (4, 2, 2)
    # A hostile review: a typo (a model no node has) on every line read as "never placed" and
    # nothing else. The refusals are counted on stderr, with the first one's line and reason.
    assert err == (
        "warning: 2 request(s) refused while replaying, counted as never placed; the first,"
        " line 2: QUOTA_EXCEEDED: tenant 'acme' holds 2 of its 2-GPU quota in all pools; this"
        " request needs 1 more\n"
    ), err
    _code, _report, quiet = fleet(
        "simulate", "--workload", write_jsonl(db_dir / "v.jsonl", lines[3:]), "--format", "jsonl",
        now=None,
    )  # fmt: skip
    assert quiet == "", quiet  # nothing refused: no warning
    _code, _report, err = fleet(
        "simulate", "--workload", write_jsonl(db_dir / "u.jsonl", lines[2:3]), "--format", "jsonl",
        now=None,
    )  # fmt: skip
    # In the line's terms, as a bad line's error is: `gpus`, not reserve's `--gpus` (a review).
    assert "the first, line 1: INVALID_INPUT: gpus 1 per node: the largest node" in err, err


# ---------------------------------------------------------------- refusals


OK = '"at": "+1h", "tenant": "acme", "gpus": 1, "duration": "1h"'
DUR = '{{"at": "+1h", "tenant": "acme", "gpus": 1, "duration": {}}}'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{", "line 3: not a JSON object"),
        ("[1]", "line 3: must be a JSON object"),
        ("{" + OK + ', "x": 1}', 'line 3: unknown key "x"'),
        ('{"tenant": "acme", "gpus": 1, "duration": "1h"}', "line 3: at is required"),
        ('{"at": "+1h", "tenant": "acme", "duration": "1h"}', "line 3: gpus is required"),
        ('{"at": "+1h", "tenant": "acme", "gpus": 65, "duration": "1h"}', "line 3: gpus must be"),
        ('{"at": "+1h", "tenant": "acme", "gpus": 1, "duration": "soon"}', "line 3: duration"),
        ('{"at": "+1h", "tenant": "acme", "gpus": 1, "duration": 0}', "line 3: duration"),
        ('{"at": "soon", "tenant": "acme", "gpus": 1, "duration": "1h"}', "line 3: at: bad TIME"),
        ('{"at": "-1h", "tenant": "acme", "gpus": 1, "duration": "1h"}', "line 3: at "),
        ('{"at": "+1h", "tenant": "a b", "gpus": 1, "duration": "1h"}', "line 3: tenant"),
        ("{" + OK + ', "spot": 1}', "line 3: spot"),
        ("{" + OK + ', "model": "H 100"}', "line 3: model"),
        ("{" + OK + ', "topologyKey": "rack"}', "line 3: topologyKey applies only to a gang"),
        ("{" + OK + ', "pool": "nope"}', "line 3: "),
        # each key once: json.loads would keep the last of two
        ("{" + OK + ', "gpus": 2}', 'line 3: the request has the key "gpus" twice'),
        ('{"at": -1000, "tenant": "acme", "gpus": 1, "duration": "1h"}', "line 3: at must be"),
        # a window that ends after the end of time, as reserve refuses it
        (
            '{"at": "9999-12-31T23:00:00Z", "tenant": "acme", "gpus": 1, "duration": "1h"}',
            "line 3: that window would end after 9999-12-31T23:59:59.999Z",
        ),
        ("{" + OK + ', "start": "9999-12-31T23:30:00Z"}', "line 3: that window would end after"),
        # a hostile review: said "duration is required" of a number, and "not a JSON object" of
        # a number too long for Python; and a new key with a series' mark was demand refused
        # while replaying, not a bad line
        ('{"at": "+1h", "tenant": "acme", "gpus": 1, "duration": 1e300}', "line 3: duration 1"),
        (DUR.format('"0h"'), 'line 3: duration "0h": must be more than 0'),
        (DUR.format("true"), "line 3: duration must be milliseconds"),
        (DUR.format("1e17"), "line 3: duration 100000000000000000 ms: too long"),
        (DUR.format("1.5"), "line 3: duration must be whole milliseconds"),
        ('{"at": ' + "9" * 5000 + ', "tenant": "acme"}', "line 3: a number has too many digits"),
        ("{" + OK + ', "key": "x#1"}', "line 3: key must not contain '#'"),
    ],
)
def test_a_bad_line_is_refused_by_number_before_anything_is_written(
    fleet: Cli, db_dir: Path, line: str, message: str
) -> None:
    good = '{"at": "+0s", "tenant": "newco", "gpus": 1, "duration": "1h"}'
    path = db_dir / "bad.jsonl"
    path.write_text(f"{good}\n\n{line}\n{good}\n")
    events = fleet.ok("events")
    # a line naming no pool is a bad line too (INVALID_INPUT), though --pool's is NOT_FOUND
    error = fleet.fails(2, "simulate", "--workload", path, "--format", "jsonl", now=None)
    assert error["message"].startswith(message), error
    assert fleet.ok("events") == events
    assert "newco" not in [t["id"] for t in fleet.ok("tenant", "list")]


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_a_line_that_is_not_utf8_is_named_by_number(
    fleet: Cli, db_dir: Path, bom: bytes, end: bytes
) -> None:
    """Counted as the workload's own lines are (CRLF, CR or LF), the byte from the file's start
    (a BOM included)."""
    good = b'{"at": "+0s", "tenant": "newco", "gpus": 1, "duration": "1h"}' + end
    path = db_dir / "bytes.jsonl"
    data = bom + good + good + b'{"tenant": "\xff\xfe"}' + end
    path.write_bytes(data)
    error = fleet.fails(2, "simulate", "--workload", path, "--format", "jsonl", now=None)
    assert error["message"].startswith("line 3: "), error
    bad = data.index(b"\xff")
    assert f"not UTF-8 text (byte {bad})" in error["message"]
    assert "newco" not in [t["id"] for t in fleet.ok("tenant", "list")]


def test_a_bad_line_after_until_is_refused_all_the_same(fleet: Cli, db_dir: Path) -> None:
    """The same file was good with `--until` before its bad line and bad without."""
    path = db_dir / "later.jsonl"
    path.write_text(
        '{"at": "+0s", "tenant": "newco", "gpus": 1, "duration": "1h"}\n'
        '{"at": "+3h", "tenant": "newco", "gpus": 1, "duration": "1h", "topologyKey": "rack"}\n'
    )
    events = fleet.ok("events")
    for until in ([], ["--until", "+1h"]):
        args = ("simulate", "--workload", path, "--format", "jsonl", *until)
        error = fleet.fails(2, *args, now=None)
        assert error["message"].startswith("line 2: "), error
    assert fleet.ok("events") == events


def test_a_pool_only_the_flag_names_is_not_blamed_on_a_line(fleet: Cli, db_dir: Path) -> None:
    path = db_dir / "w.jsonl"
    path.write_text('{"at": "+0s", "tenant": "newco", "gpus": 1, "duration": "1h"}\n')
    args = ("simulate", "--workload", path, "--format", "jsonl", "--pool", "nope")
    error = fleet.fails(3, *args)
    assert error["message"].startswith("no pool 'nope'"), error
    # --pool is checked even when every line names its own pool
    path.write_text(
        '{"at": "+0s", "tenant": "newco", "gpus": 1, "duration": "1h", "pool": "small"}\n'
    )
    error = fleet.fails(3, *args)
    assert error["message"].startswith("no pool 'nope'"), error
    assert "newco" not in [t["id"] for t in fleet.ok("tenant", "list")]


def test_null_is_absent_for_every_optional_key(fleet: Cli, db_dir: Path) -> None:
    optional = ("start", "gang", "topologyKey", "spot", "model", "key", "pool")
    line = {"at": "+0s", "tenant": "acme", "gpus": 1, "duration": "1h"}
    path = write_jsonl(db_dir / "w.jsonl", [{**line, **dict.fromkeys(optional)}])
    report = fleet.ok("simulate", "--workload", path, "--format", "jsonl")
    assert (report["requests"], report["placedAtOnce"]) == (1, 1)
    assert fleet.ok("list", "--tenant", "acme")[0]["spot"] is False


def test_a_whole_number_written_as_a_float_is_that_integer() -> None:
    """A hostile review: `"duration": 3600000.0` (what a writer of floats emits, pandas for a
    column with a gap) was refused as "must be whole milliseconds". A whole float is the integer;
    a fraction or a boolean is still refused, and a whole float too large for exact integers
    (beyond 2**53) as too large, which it is, not as a fraction."""
    floats = {"at": float(NOW_MS + MIN), "gpus": 2.0, "duration": 3600000.0, "gang": 2.0}
    ints = {key: int(value) for key, value in floats.items()}
    got = [
        parse_jsonl(json.dumps({"tenant": "acme", **d}), NOW_MS).requests[0] for d in (floats, ints)
    ]
    assert got[0] == got[1] and (got[0].gpus, got[0].duration_ms, got[0].gang) == (2, 3_600_000, 2)
    line = {"at": "+1h", "tenant": "acme", "gpus": 1, "duration": "1h"}
    for bad, said in [
        ({"gpus": 1.5}, "gpus must be an integer from 1 to 64, got 1.5"),
        ({"gpus": True}, "gpus must be an integer from 1 to 64, got true"),
        ({"duration": 1.5}, "duration must be whole milliseconds"),
        ({"duration": 1e16}, "duration 10000000000000000 ms: too long (at most 365000d)"),
        ({"gpus": 1e300}, "gpus must be an integer from 1 to 64, got 1000000000000000052504760255"),
        ({"duration": 1e300}, "duration 100000000000000005250476025520442024870… ms: too long"),
        ({"at": 1e16}, "at: "),
    ]:
        with pytest.raises(InvalidInput) as caught:
            parse_jsonl(json.dumps({**line, **bad}), NOW_MS)
        assert caught.value.message.startswith(f"line 1: {said}"), caught.value.message


def test_simulate_refuses_a_real_clock_ledger_and_non_admins(db_dir: Path) -> None:
    real = Cli(db_dir / "real.db")
    real.ok("init", now=None)
    path = write_jsonl(db_dir / "w.jsonl", [{"at": 1, "tenant": "a", "gpus": 1, "duration": 1}])
    error = real.fails(2, "simulate", "--workload", path, "--format", "jsonl", now=None)
    assert "manual clock" in error["message"]
    manual = small_fleet(db_dir / "manual.db")
    manual.ok("admin", "remove", "admin")
    error = manual.fails(
        6, "--as", "someone", "simulate", "--workload", path, "--format", "jsonl", now=None
    )
    assert error["code"] == "FORBIDDEN"


@pytest.mark.parametrize(
    "k", ["0", "0.5", "-3", "fast", "nan", "inf", "", "1e99999999", "1e3", "3/2", "1000000001"]
)
def test_compress_must_be_a_number_of_at_least_one(fleet: Cli, db_dir: Path, k: str) -> None:
    path = write_jsonl(db_dir / "w.jsonl", [])
    error = fleet.fails(2, "simulate", "--workload", path, "--format", "jsonl", "--compress", k)
    assert error["message"] == (
        "--compress must be a decimal number from 1 to 1,000,000,000 (such as 100 or 2.5),"
        f" got {k!r}"
    )


def test_compress_divides_arrival_offsets_and_keeps_durations(fleet: Cli, db_dir: Path) -> None:
    lines = [
        {"at": "+0s", "tenant": "acme", "gpus": 1, "duration": "1h"},
        {"at": "+10h", "tenant": "acme", "gpus": 1, "duration": "1h", "start": "+11h"},
    ]
    path = write_jsonl(db_dir / "w.jsonl", lines)
    fleet.ok("simulate", "--workload", path, "--format", "jsonl", "--compress", "2.5", now=None)
    rows = fleet.ok("list")
    assert [r["createdAt"] - NOW_MS for r in rows] == [0, 4 * 3_600_000]
    # Each keeps its duration, and its lead time to the start it asked for.
    assert [(r["during"]["start"] - NOW_MS, r["durationMs"]) for r in rows] == [
        (0, 3_600_000),
        (5 * 3_600_000, 3_600_000),
    ]


# ---------------------------------------------------------------- killed part-way


def _simulate_sent(fleet: Cli, db_dir: Path, signum: int) -> tuple[int, str, str]:
    """A real simulate process of 400 generated requests sent `signum` once it has committed
    40 of them: its status, stdout and stderr."""
    workload = write_jsonl(db_dir / "w.jsonl", generated(seed=3, count=400))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    proc = subprocess.Popen(
        [*ENTRY, "--db", str(fleet.db), "--json", "simulate", "--workload", str(workload),
         "--format", "jsonl"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            with sqlite3.connect(f"file:{fleet.db}?mode=ro", uri=True, timeout=30) as conn:
                if conn.execute("SELECT COUNT(*) FROM reservations").fetchone()[0] >= 40:
                    break
            time.sleep(0.05)
        assert proc.poll() is None, "simulate finished before it could be stopped"
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.sqlite_only(reason="SQLite's busy handler against a writer committing back to back")
def test_two_replays_on_one_ledger_both_finish(fleet: Cli, db_dir: Path) -> None:
    """A review: of two replays at once, one failed UNAVAILABLE past the busy timeout, part of
    its workload in the ledger (3 runs in 3): a replay took the lock without saying it waited,
    so the other never stood aside for it. Each now says so and stands aside in turn."""
    fleet.ok("config", "set", "db.busyTimeoutMs", "200")
    lines = [{"at": f"+{m}m", "tenant": "acme", "gpus": 1, "duration": "1m"} for m in range(800)]
    workload = write_jsonl(db_dir / "w.jsonl", lines)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    run = [*ENTRY, "--db", str(fleet.db), "--json", "simulate", "--workload", str(workload),
           "--format", "jsonl"]  # fmt: skip
    first = subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and first.poll() is None:
            with sqlite3.connect(f"file:{fleet.db}?mode=ro", uri=True, timeout=30) as conn:
                if conn.execute("SELECT COUNT(*) FROM reservations").fetchone()[0] >= 50:
                    break
            time.sleep(0.05)
        assert first.poll() is None, "the first replay finished before the second began"
        second = subprocess.run(run, capture_output=True, env=env, timeout=120)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert (first.returncode, second.returncode) == (0, 0), (err, second.stderr)
    reports = [json.loads(out), json.loads(second.stdout)]
    assert [r["requests"] for r in reports] == [800, 800]
    assert len(fleet.ok("list", "--state", "released")) == 1600


@pytest.mark.sqlite_only(reason="counts the ledger file's rows while a process writes it")
def test_a_simulate_sent_sigterm_says_how_far_it_got(fleet: Cli, db_dir: Path) -> None:
    """`timeout 60 better-compute simulate …`: a real process sent SIGTERM part-way exits 143
    with one line saying how many requests are in the ledger, which is how many are there."""
    code, out, err = _simulate_sent(fleet, db_dir, signal.SIGTERM)
    assert (code, out) == (143, ""), (code, out, err)
    said = re.fullmatch(
        r"terminated: the replay stopped at request (\d+) of 400 \(line \d+, arriving at \S+\):"
        r" the (\d+) before it are in the ledger with their ticks .*\n",
        err,
    )
    assert said is not None, err
    assert int(said[1]) == int(said[2]) + 1
    assert len(fleet.ok("list")) == int(said[2]) >= 40


@pytest.mark.sqlite_only(reason="kills a process writing the ledger file")
def test_a_killed_simulate_leaves_a_consistent_ledger(fleet: Cli, db_dir: Path) -> None:
    assert _simulate_sent(fleet, db_dir, signal.SIGKILL)[0] == -signal.SIGKILL
    conn = sqlite3.connect(fleet.db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    made = conn.execute("SELECT COUNT(*) FROM reservations").fetchone()[0]
    assert 40 <= made < 400
    # No atom is booked twice for overlapping time.
    clash = conn.execute(
        "SELECT COUNT(*) FROM bookings a JOIN bookings b ON a.node_id = b.node_id"
        " AND a.atom = b.atom AND a.id < b.id AND a.start < b.end AND b.start < a.end"
    ).fetchone()[0]
    assert clash == 0
    # Every live reservation's bookings are exactly its allocations' atoms over its window.
    live = conn.execute(
        "SELECT id, during_start, during_end FROM reservations"
        " WHERE state IN ('placed', 'binding', 'active')"
    ).fetchall()
    assert live
    for rsv_id, start, end in live:
        allocated = {
            (node, atom)
            for node, atoms in conn.execute(
                "SELECT node_id, atoms FROM allocations WHERE reservation_id = ? AND released = 0",
                (rsv_id,),
            )
            for atom in json.loads(atoms)
        }
        booked = conn.execute(
            "SELECT node_id, atom, start, end FROM bookings WHERE reservation_id = ?"
            " AND end > ? ORDER BY node_id, atom",
            (rsv_id, start),
        ).fetchall()
        assert {(n, a) for n, a, _s, _e in booked} == allocated, rsv_id
        assert all((s, e) == (start, end) for _n, _a, s, e in booked), rsv_id
    # Pending reservations hold no bookings from now on.
    assert not conn.execute(
        "SELECT COUNT(*) FROM bookings b JOIN reservations r ON r.id = b.reservation_id"
        " WHERE r.state = 'pending' AND b.end > (SELECT CAST(value AS INTEGER) FROM meta"
        " WHERE key = 'last_at')"
    ).fetchone()[0]
    conn.close()
    # The ledger takes the next command.
    assert fleet.ok("tick", now=None)["now"] >= NOW_MS


def test_the_time_forms_of_a_line(fleet: Cli, db_dir: Path) -> None:
    iso = "2026-09-28T09:00:00Z"
    lines = [
        {"at": iso, "tenant": "acme", "gpus": 1, "duration": 90 * MIN},
        {"at": str(NOW_MS + 2 * 3_600_000), "tenant": "acme", "gpus": 1, "duration": "1h30m"},
        {"at": "now", "tenant": "acme", "gpus": 1, "duration": "45m"},
    ]
    path = write_jsonl(db_dir / "w.jsonl", lines)
    assert fleet.ok("simulate", "--workload", path, "--format", "jsonl", now=None)["requests"] == 3
    rows = fleet.ok("list")
    assert [(r["createdAt"], r["durationMs"]) for r in rows] == [
        (NOW_MS, 45 * MIN),
        (NOW_MS + 3_600_000, 90 * MIN),
        (NOW_MS + 2 * 3_600_000, 90 * MIN),
    ]
    assert NOW == "2026-09-28T08:00:00Z"


# ---------------------------------------------------------------- other writers meanwhile


@pytest.mark.sqlite_only(reason="processes sharing one SQLite file; PostgreSQL queues lock waiters")
def test_other_writers_get_the_lock_while_a_replay_commits_back_to_back(
    fleet: Cli, db_dir: Path
) -> None:
    """An overloaded replay (4 GPUs for 2 h every second on 16 GPUs: hundreds waiting, each
    retried by its tick) commits back to back, microseconds apart, while SQLite's busy handler
    sleeps between its tries. Each writer below must get the lock within its 3 s busy timeout:
    before, none did (UNAVAILABLE); waiting in steps without the replay standing aside
    (Database.let_writers_in), about half did."""
    lines = [
        {"at": NOW_MS + n * SEC, "tenant": "acme", "gpus": 4, "duration": "2h"} for n in range(4000)
    ]
    workload = write_jsonl(db_dir / "w.jsonl", lines)
    fleet.ok("config", "set", "db.busyTimeoutMs", "3000")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    proc = subprocess.Popen(
        [*ENTRY, "--db", str(fleet.db), "--json", "simulate", "--workload", str(workload),
         "--format", "jsonl", "--until", "+70m"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    failed = []
    try:
        time.sleep(8)  # until hundreds wait and the replay's transactions follow each other
        assert proc.poll() is None, "the replay ended before the writers came: make it longer"
        for k in range(4):
            done = subprocess.run(
                [*ENTRY, "--db", str(fleet.db), "tenant", "create", f"meanwhile{k}"],
                capture_output=True, text=True, env=env, timeout=60,
            )  # fmt: skip
            if done.returncode != 0:
                failed.append(done.stderr.strip())
        assert proc.poll() is None, "the replay ended before the writers were done: make it longer"
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert failed == []
    ids = [t["id"] for t in fleet.ok("tenant", "list")]
    assert {f"meanwhile{k}" for k in range(4)} <= set(ids)


def test_a_line_may_hold_any_character_json_allows_in_a_string() -> None:
    """U+2028 and U+0085 are allowed unescaped in a JSON string; only `\\n` ends a line, so the
    key keeps them and the next line keeps its number."""
    from better_compute.errors import InvalidInput
    from better_compute.workload import parse_jsonl

    key = "job\u2028one\u0085two"
    good = json.dumps({"at": "+0m", "tenant": "acme", "gpus": 1, "duration": "1h", "key": key})
    text = good.replace("\\u2028", "\u2028").replace("\\u0085", "\u0085") + "\r\n"
    [request] = parse_jsonl(text, NOW_MS).requests
    assert request.key == key
    with pytest.raises(InvalidInput, match=r"^line 2: "):
        parse_jsonl(text + "{}\n", NOW_MS)
    assert len(parse_jsonl(good + "\r" + good, NOW_MS).requests) == 2  # old Mac line ends


def test_a_replay_run_again_skips_its_keyed_calendar_requests(fleet: Cli, db_dir: Path) -> None:
    """A killed replay is resumed by running it again: relative times then count from a later
    instant, and a keyed request whose start is written `+2h` is still the same request (as
    `reserve --start +2h --key` run again is), so it counts as skipped, not never placed."""
    lines = [
        {"at": "+0s", "tenant": "acme", "gpus": 1, "duration": "1h", "key": "a"},
        {"at": "+0s", "tenant": "acme", "gpus": 1, "duration": "1h", "start": "+2h", "key": "b"},
    ]
    workload = write_jsonl(db_dir / "keyed.jsonl", lines)
    args = ("simulate", "--workload", workload, "--format", "jsonl")
    first = fleet.ok(*args, "--until", "+10m", now=None)
    assert (first["requests"], first["placedAtOnce"], first["skipped"]) == (2, 2, 0)
    again = fleet.ok(*args, "--until", "+20m", now=None)
    assert (again["requests"], again["neverPlaced"], again["skipped"]) == (0, 0, 2)
    assert len(fleet.ok("list")) == 2


def _waiting_then_quiet(db_dir: Path) -> Path:
    """Every GPU taken for 1 h, three requests waiting behind them (a retry every 30 s), and
    the next arrival 2 hours later: over a hundred ticks due between two arrivals."""
    lines: list[dict[str, Any]] = [
        {"at": NOW_MS, "tenant": "acme", "gpus": 4, "duration": "1h"} for _ in range(4)
    ]
    lines += [{"at": NOW_MS + SEC, "tenant": "globex", "gpus": 4, "duration": "30m"}] * 3
    lines.append({"at": NOW_MS + 2 * 60 * MIN, "tenant": "acme", "gpus": 1, "duration": "1h"})
    return write_jsonl(db_dir / "quiet.jsonl", lines)


def test_the_ticks_of_a_quiet_stretch_commit_a_share_at_a_time(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reviewer's cron `tick` failed UNAVAILABLE after the whole busy timeout: the ticks due
    between two arrivals (days of retries of waiting requests) all ran inside the next
    request's one transaction. They now commit every TRAILING_HOLD_S, as the ticks after the
    last arrival do. With a hold of 0, a transaction holds one tick, or the last one and the
    request's own; the ledger and the report are those of the default hold."""
    from better_compute.service import simulate, ticking
    from better_compute.storage.conn import Commits

    workload = _waiting_then_quiet(db_dir)
    copy = small_fleet(db_dir / "copy.db")  # the same ledger, made the same way
    args = ("simulate", "--workload", workload, "--format", "jsonl")
    expected = without_machine(copy.ok(*args))
    ticks_by_commit: dict[int, int] = {}
    real_tick_in = ticking.tick_in

    def counted(ctx: Any) -> None:
        ticks_by_commit[Commits.made] = ticks_by_commit.get(Commits.made, 0) + 1
        real_tick_in(ctx)

    monkeypatch.setattr(ticking, "tick_in", counted)
    monkeypatch.setattr(simulate, "TRAILING_HOLD_S", 0.0)
    assert without_machine(fleet.ok(*args)) == expected
    assert sum(ticks_by_commit.values()) > 100 and max(ticks_by_commit.values()) <= 2
    assert outcome(fleet) == outcome(copy)
    assert fleet.ok("events") == copy.ok("events")


def _after_the_first_request(monkeypatch: pytest.MonkeyPatch, act: Any) -> list[bool]:
    """Run `act()` once, as another writer, between the replay's first request and the next:
    where the replay lets waiting writers in. Returns a list that holds True once it ran."""
    from better_compute.service import simulate

    real, ran = simulate._reserve, list[bool]()

    def first_then(ctx: Any, line: int, args: Any, run: Any, fleet_: Any) -> bool:
        if not ran:
            original = ctx.db.let_writers_in

            def then_act(*a: Any, **k: Any) -> None:
                original(*a, **k)
                if not ran:
                    ran.append(True)
                    act()

            monkeypatch.setattr(ctx.db, "let_writers_in", then_act)
        return bool(real(ctx, line, args, run, fleet_))

    monkeypatch.setattr(simulate, "_reserve", first_then)
    return ran


def test_waits_count_from_arrival_when_another_writer_moves_the_clock(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a `tick --now +2d` during a replay made the requests after it act two days
    late, and the report called them placed at once with no wait. A wait counts from the
    request's arrival (or a later start it asked for), whenever the request could act."""
    later = iso(NOW_MS + 120 * MIN)
    ran = _after_the_first_request(monkeypatch, lambda: fleet.ok("tick", now=later))
    lines = [{"at": f"+{m}m", "tenant": "acme", "gpus": 1, "duration": "10m"} for m in range(3)]
    work = write_jsonl(db_dir / "w.jsonl", lines)
    report = fleet.ok("simulate", "--workload", work, "--format", "jsonl", now=None)
    assert ran
    assert report["waitMs"] == {"mean": (119 * MIN + 118 * MIN) // 3, "p95": 119 * MIN}


def test_a_key_another_writer_used_during_the_replay_is_not_counted_as_the_runs(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer books with a key between two of the replay's requests; the replay's
    later line with that key gets that reservation back. It is a retry (skipped), and its hours
    are not the run's: the report counted it as placed (a reviewer ran two replays at once)."""
    lines = [
        {"at": NOW_MS, "tenant": "acme", "gpus": 1, "duration": "1h"},
        {"at": NOW_MS + MIN, "tenant": "acme", "gpus": 2, "duration": "1h", "key": "k"},
    ]
    workload = write_jsonl(db_dir / "keys.jsonl", lines)
    made: list[str] = []
    _after_the_first_request(  # a user books between the first request's commit and the next
        monkeypatch,
        lambda: made.append(
            fleet.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--key", "k",
                     now="+1m")["id"]
        ),
    )  # fmt: skip
    report = fleet.ok("simulate", "--workload", workload, "--format", "jsonl", now=None)
    assert (report["requests"], report["placedAtOnce"], report["skipped"]) == (1, 1, 1)
    assert report["gpuHoursBooked"] == 1.0
    assert len(fleet.ok("list")) == 2 and made


def _filled_then_one_more() -> list[dict[str, Any]]:
    """The small fleet's 16 GPUs taken at the start, then a request that must wait."""
    full = [{"at": NOW_MS, "tenant": "acme", "gpus": 4, "duration": "2h"} for _ in range(4)]
    return [*full, {"at": NOW_MS + MIN, "tenant": "acme", "gpus": 4, "duration": "1h"}]


def test_a_setting_another_writer_changes_applies_from_then_on(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile review: `config set` during a replay was ignored for the rest of it (the
    settings were read once). The request that waits after it is retried at the new pace."""
    ran = _after_the_first_request(
        monkeypatch, lambda: fleet.ok("config", "set", "pending.retryMs", "600000", now=None)
    )
    work = write_jsonl(db_dir / "w.jsonl", _filled_then_one_more())
    report = fleet.ok("simulate", "--workload", work, "--format", "jsonl", "--until", "+5m")
    assert ran and (report["placedAtOnce"], report["neverPlaced"]) == (4, 1), report
    pending = [e for e in fleet.ok("events") if e["type"] == "reservation.pending"]
    assert [e["data"]["nextAttemptAt"] - e["at"] for e in pending] == [600_000], pending


def test_a_setting_changed_before_the_tick_at_until_applies_to_it(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: the tick that takes a replay to `--until` ran with the settings of the
    replay's last transaction: a time-out set just before it did not release the request that
    waited, where `tick` at that instant does. (Its retries are due every 30 s up to 10 min;
    that tick is the one at 10 min 10 s.)"""
    from better_compute.service import simulate

    real = simulate._arrivals_and_ticks

    def then_a_setting(*args: Any) -> None:
        real(*args)
        fleet.ok("config", "set", "pending.maxWaitMs", "60000", now=None)

    monkeypatch.setattr(simulate, "_arrivals_and_ticks", then_a_setting)
    work = write_jsonl(db_dir / "w.jsonl", _filled_then_one_more())
    fleet.ok("simulate", "--workload", work, "--format", "jsonl", "--until", "+10m10s")
    waited = [r for r in fleet.ok("list") if r["durationMs"] == 3_600_000]
    assert [(r["state"], r["releaseReason"]) for r in waited] == [("released", "timeout")], waited


def test_a_pool_added_meanwhile_does_not_change_where_requests_go(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile review: a second pool created during a replay made every later request that
    names no pool refused ("several pools exist"), counted as never placed. Requests go to the
    pool the run began with."""
    ran = _after_the_first_request(monkeypatch, lambda: fleet.ok("pool", "create", "east"))
    work = write_jsonl(db_dir / "w.jsonl", _filled_then_one_more()[:4])
    code, report, err = fleet("simulate", "--workload", work, "--format", "jsonl")
    assert ran and code == 0 and err == "", err
    assert (report["placedAtOnce"], report["neverPlaced"]) == (4, 0), report


def test_an_admin_removed_meanwhile_stops_the_replay(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile review: once its principal was no longer an admin, every later request was
    refused FORBIDDEN one by one and counted as never placed, exit 0. A replay is admin-only:
    it stops, saying what the ledger holds."""
    ran = _after_the_first_request(
        monkeypatch, lambda: fleet.ok("--as", "admin", "admin", "remove", ME, now=None)
    )
    work = write_jsonl(db_dir / "w.jsonl", _filled_then_one_more())
    err = fleet.fails(6, "simulate", "--workload", work, "--format", "jsonl", "--until", "+5m")
    assert ran and err["message"].startswith(
        f"{ME!r} is no longer an admin: it was removed while it replayed; a replay is"
        " admin-only; the replay stopped at request 2 of 5"
    ), err
    assert len(fleet.ok("list")) == 1  # the first request, and nothing after


def test_usage_counts_over_the_runs_span_when_another_tick_goes_past_until(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile review: another writer's `tick` past `--until` made the replay's later request
    start after the run's end, and its open usage window counted negative (end - start)."""
    ran = _after_the_first_request(monkeypatch, lambda: fleet.ok("tick", now="+2h"))
    lines = [
        {"at": NOW_MS + m * MIN, "tenant": "acme", "gpus": 1, "duration": "10h"} for m in (0, 1)
    ]
    work = write_jsonl(db_dir / "w.jsonl", lines)
    report = fleet.ok("simulate", "--workload", work, "--format", "jsonl", "--until", "+30m")
    assert ran and report["placedAtOnce"] == 2, report
    assert report["gpuHoursUsed"] == 0.5, report  # the first, over the run's half hour


def test_a_ledger_replaced_meanwhile_says_the_runs_work_went_with_it(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile review: after `init --force` (or `restore`) during a replay, the error said
    both "nothing was written, run it again" and that the requests before were in the ledger,
    which now held none of them."""
    ran = _after_the_first_request(monkeypatch, lambda: fleet.ok("init", "--force"))
    work = write_jsonl(db_dir / "w.jsonl", _filled_then_one_more())
    err = fleet.fails(7, "simulate", "--workload", work, "--format", "jsonl", "--until", "+5m")
    assert ran and err["message"].startswith("database "), err
    assert err["message"].endswith(  # on PostgreSQL too (a review: it said the old message)
        " was replaced while the replay ran (`restore`, or `init --force`): the 1 request it"
        " had replayed, and their ticks, went with the ledger it replaced; nothing more was"
        " written"
    ), err
    assert fleet.ok("list") == []


def _raising_at(monkeypatch: pytest.MonkeyPatch, n: int, exc: BaseException) -> None:
    """The replay's n-th request raises `exc` instead of reserving (1: the first)."""
    one_request = simulate_service._reserve
    calls: list[int] = []

    def raising(*args: Any) -> bool:
        calls.append(1)
        if len(calls) == n:
            raise exc
        return one_request(*args)

    monkeypatch.setattr(simulate_service, "_reserve", raising)


def test_a_replay_that_stops_midway_says_what_the_ledger_holds(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One transaction per request: a lock another writer held past the busy timeout at the
    third request leaves the first two committed, and "try again" would make them twice."""
    lines = [{"at": f"+{m}m", "tenant": "acme", "gpus": 1, "duration": "1h"} for m in range(5)]
    work = write_jsonl(db_dir / "w.jsonl", lines)
    locked = Unavailable("database sim.db stayed locked past the busy timeout; try again")
    _raising_at(monkeypatch, 3, locked)
    err = fleet.fails(7, "simulate", "--workload", work, "--format", "jsonl", now=None)
    assert err["message"] == (
        "database sim.db stayed locked past the busy timeout; the replay stopped at request 3"
        f" of 5 (line 3, arriving at {iso(NOW_MS + 2 * MIN)}): the 2 before it are in the ledger"
        " with their ticks (`better-compute list`), so the same workload again would make them"
        " twice; to replay it whole, restore a backup from before the run"
    )
    assert len(fleet.ok("list")) == 2
    first = write_jsonl(db_dir / "first.jsonl", lines[:1])
    _raising_at(monkeypatch, 1, locked)
    err = fleet.fails(7, "simulate", "--workload", first, "--format", "jsonl", now=None)
    assert err["message"].endswith("; try again")  # nothing of it was committed


def test_an_interrupted_replay_says_how_far_it_got(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile review: Ctrl-C exited 130 saying nothing, while the requests before it stay in
    the ledger and the same workload again would make them twice."""
    lines = [{"at": f"+{m}m", "tenant": "acme", "gpus": 1, "duration": "1h"} for m in range(5)]
    _raising_at(monkeypatch, 3, KeyboardInterrupt())  # before the third is written
    work = write_jsonl(db_dir / "w.jsonl", lines)
    code, out, err = fleet("simulate", "--workload", work, "--format", "jsonl", now=None)
    assert (code, out) == (130, ""), (code, out, err)
    assert err.startswith(
        "interrupted: the replay stopped at request 3 of 5 (line 3, arriving at"
        f" {iso(NOW_MS + 2 * MIN)}): the 2 before it are in the ledger"
    ), err
    assert len(fleet.ok("list")) == 2


def test_where_a_replay_stopped_names_the_requests_line(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests go in time order, not file order: the one it stopped at is told by both."""
    lines = [{"at": f"+{m}m", "tenant": "acme", "gpus": 1, "duration": "1h"} for m in (3, 2, 1, 0)]
    _raising_at(monkeypatch, 2, KeyboardInterrupt())
    work = write_jsonl(db_dir / "w.jsonl", lines)
    code, _out, err = fleet("simulate", "--workload", work, "--format", "jsonl", now=None)
    assert code == 130 and err.startswith(
        "interrupted: the replay stopped at request 2 of 4 (line 3, arriving at"
        f" {iso(NOW_MS + MIN)})"
    ), err


def _signal_in_the_second_request(monkeypatch: pytest.MonkeyPatch, signum: int) -> None:
    """A real signal raised while the replay's second request is booked, inside its
    transaction, before its commit."""
    one_request, calls = simulate_service._reserve, list[int]()

    def signal_in_the_second(*args: Any) -> bool:
        calls.append(1)
        placed = bool(one_request(*args))
        if len(calls) == 2:
            signal.raise_signal(signum)
        return placed

    monkeypatch.setattr(simulate_service, "_reserve", signal_in_the_second)


def test_ctrl_c_during_a_requests_transaction_comes_once_it_is_counted(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: Ctrl-C just after a request's COMMIT told one request fewer than the ledger
    held (1 run in 18), and replaying the lines after them made that one twice. SIGINT waits
    for the transaction and the count: here it comes while the second request is booked."""
    _signal_in_the_second_request(monkeypatch, signal.SIGINT)
    lines = [{"at": f"+{m}m", "tenant": "acme", "gpus": 1, "duration": "1h"} for m in range(5)]
    work = write_jsonl(db_dir / "w.jsonl", lines)
    code, _out, err = fleet("simulate", "--workload", work, "--format", "jsonl", now=None)
    assert code == 130 and "stopped at request 3 of 5" in err and "the 2 before it" in err, err
    assert len(fleet.ok("list")) == 2


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_ignored_signal_stays_ignored_through_a_replay(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch, signum: int
) -> None:
    """A replay started with SIGINT or SIGTERM ignored (`nohup`, a job started in the
    background by a shell, a supervisor's choice) neither turns the signal into a stop nor
    leaves a handler of its own behind."""
    _signal_in_the_second_request(monkeypatch, signum)
    before = signal.signal(signum, signal.SIG_IGN)
    try:
        lines = [{"at": f"+{m}m", "tenant": "acme", "gpus": 1, "duration": "1h"} for m in range(5)]
        work = write_jsonl(db_dir / "w.jsonl", lines)
        code, _out, err = fleet("simulate", "--workload", work, "--format", "jsonl", now=None)
        assert signal.getsignal(signum) is signal.SIG_IGN
    finally:
        signal.signal(signum, before)
    assert code == 0, err
    assert len(fleet.ok("list")) == 5


def test_sigterm_stops_a_replay_once_its_transaction_is_counted(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`timeout` and CI runners stop with SIGTERM, whose default action ended the replay without
    a word while the requests before it stayed in the ledger. It now stops as Ctrl-C does, with
    the default action's status, once the request it came in is committed and counted."""
    _signal_in_the_second_request(monkeypatch, signal.SIGTERM)
    lines = [{"at": f"+{m}m", "tenant": "acme", "gpus": 1, "duration": "1h"} for m in range(5)]
    work = write_jsonl(db_dir / "w.jsonl", lines)
    code, out, err = fleet("simulate", "--workload", work, "--format", "jsonl", now=None)
    assert (code, out) == (143, ""), (code, out, err)
    assert err.startswith(
        "terminated: the replay stopped at request 3 of 5 (line 3, arriving at"
        f" {iso(NOW_MS + 2 * MIN)}): the 2 before it are in the ledger"
    ), err
    assert err.count("\n") == 1, err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert len(fleet.ok("list")) == 2


def test_a_replay_terminated_before_its_first_commit_says_so(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing of the workload was committed: one word, the default action's status."""
    _raising_at(monkeypatch, 1, Terminated())
    lines = [{"at": f"+{m}m", "tenant": "acme", "gpus": 1, "duration": "1h"} for m in range(2)]
    work = write_jsonl(db_dir / "w.jsonl", lines)
    code, out, err = fleet("simulate", "--workload", work, "--format", "jsonl", now=None)
    assert (code, out, err) == (143, "", "terminated\n")
    assert fleet.ok("list") == []


def test_a_full_disk_midway_says_changes_were_committed(
    fleet: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [{"at": f"+{m}m", "tenant": "acme", "gpus": 1, "duration": "1h"} for m in range(3)]
    _raising_at(monkeypatch, 2, sqlite3.OperationalError("database or disk is full"))
    work = write_jsonl(db_dir / "w.jsonl", lines)
    err = fleet.fails(7, "simulate", "--workload", work, "--format", "jsonl", now=None)
    assert err["message"].endswith(
        "cannot be used: database or disk is full, after some of the command's changes were"
        " committed: see them (`better-compute events`) before running it again"
    )
    assert len(fleet.ok("list")) == 1
