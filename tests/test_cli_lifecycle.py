"""Running: tick, binding, expiry, pending retries, events, timeline, determinism."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import DAY, HOUR, MIN, NOW, NOW_MS, SEC, Cli, at, init_db, invoke


def reserve(cli: Cli, key: str, *flags: object, tenant: str = "acme", **kw: Any) -> Any:
    return cli.ok("reserve", "--tenant", tenant, "--key", key, *flags, **kw)


def changes(cli: Cli, now: str = NOW) -> list[tuple[str, str | None]]:
    doc = cli.ok("tick", now=now)
    return [(e["type"], e["reservationId"]) for e in doc["changes"]]


def copy_db(src: Path, dst: Path) -> Path:
    """A copy of a closed database (the file and any WAL beside it)."""
    for suffix in ("", "-wal"):
        if Path(str(src) + suffix).exists():
            shutil.copyfile(str(src) + suffix, str(dst) + suffix)
    return dst


# ---------------------------------------------------------------- tick


def test_tick_at_the_start_binds_and_activates_in_one_tick(run: Cli) -> None:
    rsv = reserve(run, "a", "--gpus", "4", "--for", "2h")
    doc = run.ok("tick")
    assert doc["now"] == NOW_MS
    assert [(e["type"], e["reservationId"], e["at"]) for e in doc["changes"]] == [
        ("reservation.binding", rsv["id"], NOW_MS),
        ("reservation.active", rsv["id"], NOW_MS),
    ]
    got = run.ok("get", rsv["id"])
    assert got["state"] == "active"
    assert all(a["bound"] for a in got["allocations"])
    # the same instant again changes nothing
    assert run.ok("tick") == {"now": NOW_MS, "changes": []}
    code, text, _ = run("tick", json=False)
    assert code == 0 and text.strip() == "nothing to do"
    assert run.ok("get", rsv["id"]) == got


def test_released_at_the_instant_it_started_it_keeps_that_instant(run: Cli) -> None:
    """Made active by a tick at T and released at T, a reservation keeps `during` {T, T} beside
    its bound allocation and its usage window of that instant (a review found `during: null`);
    one cancelled before its start keeps none, and one released later keeps what it held."""
    rsv = reserve(run, "a", "--gpus", "4", "--for", "2h")
    run.ok("tick")
    done = run.ok("release", rsv["id"])
    assert (done["state"], done["releaseReason"]) == ("released", "released")
    assert done["during"] == {"start": NOW_MS, "end": NOW_MS}
    assert all(a["bound"] for a in done["allocations"])
    windows = [u for u in run.ok("usage", "--dead-letter") if u["reservationId"] == rsv["id"]]
    assert [(u["start"], u["end"]) for u in windows] == [(NOW_MS, NOW_MS)]
    ahead = reserve(run, "b", "--gpus", "4", "--for", "2h", "--start", "+1h")
    assert run.ok("cancel", ahead["id"])["during"] is None
    later = reserve(run, "c", "--gpus", "4", "--for", "2h")
    run.ok("tick")
    kept = run.ok("release", later["id"], now=at(30 * MIN))["during"]
    assert kept == {"start": NOW_MS, "end": NOW_MS + 30 * MIN}


def test_tick_before_the_start_leaves_a_calendar_reservation_placed(run: Cli) -> None:
    rsv = reserve(run, "a", "--gpus", "4", "--for", "2h", "--start", "+1h")
    assert changes(run, at(44 * MIN)) == []
    # within repair.leadMs of the start, the check passes and the tenant is told (issue 11)
    assert changes(run, at(59 * MIN)) == [("reservation.starting", rsv["id"])]
    assert changes(run, at(59 * MIN)) == []
    assert run.ok("get", rsv["id"])["state"] == "placed"
    assert changes(run, at(HOUR)) == [
        ("reservation.binding", rsv["id"]),
        ("reservation.active", rsv["id"]),
    ]


def test_without_auto_bind_a_reservation_waits_for_the_node_agent(run: Cli) -> None:
    run.ok("config", "set", "binding.autoBind", "false")
    rsv = reserve(run, "a", "--gpus", "8", "--gang", "2", "--for", "2h")
    nodes = [a["nodeId"] for a in rsv["allocations"]]
    # before binding, a report is refused
    assert run.fails(4, "node", "report-bound", nodes[0], rsv["id"])["code"] == "CONFLICT"
    assert changes(run) == [("reservation.binding", rsv["id"])]
    assert changes(run, at(MIN)) == []
    assert run.ok("get", rsv["id"], now=at(MIN))["state"] == "binding"
    desired = run.ok("node", "show", nodes[0])["desiredState"]
    assert [d["reservationId"] for d in desired] == [rsv["id"]]
    # a node that is not part of it cannot report it
    other = next(n for n in (f"west-0{i}" for i in range(1, 8)) if n not in nodes)
    assert run.fails(3, "node", "report-bound", other, rsv["id"])["code"] == "NOT_FOUND"
    half = run.ok("node", "report-bound", nodes[0], rsv["id"], now=at(2 * MIN))
    assert half["state"] == "binding"  # a gang is active only when every member is bound
    assert [a["bound"] for a in half["allocations"]] == [True, False]
    full = run.ok("node", "report-bound", nodes[1], rsv["id"], now=at(3 * MIN))
    assert full["state"] == "active"
    types = [e["type"] for e in run.ok("events", "--reservation", rsv["id"])]
    assert types[-2:] == ["reservation.binding", "reservation.active"]
    assert run.ok("events", "--reservation", rsv["id"])[-1]["at"] == NOW_MS + 3 * MIN


def test_the_end_of_the_window_releases_it_as_expired(solo: Cli) -> None:
    solo.ok("quota", "set", "--tenant", "acme", "--gpus", "8")
    rsv = reserve(solo, "a", "--gpus", "8", "--for", "2h")
    changes(solo)
    # notice.expiringMs (40 min) before the end, once (issue 11)
    assert changes(solo, at(80 * MIN - SEC)) == []
    assert changes(solo, at(80 * MIN)) == [("reservation.expiring", rsv["id"])]
    assert changes(solo, at(2 * HOUR - SEC)) == []
    assert changes(solo, at(2 * HOUR)) == [("reservation.released", rsv["id"])]
    done = solo.ok("get", rsv["id"])
    assert (done["state"], done["releaseReason"]) == ("released", "expired")
    assert done["during"] == {"start": NOW_MS, "end": NOW_MS + 2 * HOUR}
    assert solo.ok("quota", "show", "--tenant", "acme")["quotas"][0]["held"] == 0
    assert solo.ok("pool", "show", "solo", now=at(2 * HOUR))["inUse"] == 0
    last = solo.ok("events", "--reservation", rsv["id"])[-1]
    assert (last["type"], last["at"], last["data"]) == (
        "reservation.released",
        NOW_MS + 2 * HOUR,
        {"reason": "expired"},
    )


def test_a_late_tick_releases_at_the_end_not_at_the_tick(solo: Cli) -> None:
    rsv = reserve(solo, "a", "--gpus", "8", "--for", "2h")
    changes(solo)
    changes(solo, at(5 * HOUR))
    done = solo.ok("get", rsv["id"])
    assert done["releaseReason"] == "expired"
    assert done["during"]["end"] == NOW_MS + 2 * HOUR


# ---------------------------------------------------------------- pending retries


def test_a_pending_request_is_retried_when_due(solo: Cli) -> None:
    blocker = reserve(solo, "a", "--gpus", "8", "--for", "2h")
    waiting = reserve(solo, "b", "--gpus", "8", "--for", "1h", tenant="globex")
    assert waiting["nextAttemptAt"] == NOW_MS + 30 * SEC
    solo.ok("cancel", blocker["id"], now=at(10 * SEC))
    # not before the retry is due
    assert changes(solo, at(29 * SEC)) == []
    assert solo.ok("get", waiting["id"])["state"] == "pending"
    assert changes(solo, at(30 * SEC)) == [
        ("reservation.placed", waiting["id"]),
        ("reservation.binding", waiting["id"]),
        ("reservation.active", waiting["id"]),
    ]
    placed = solo.ok("get", waiting["id"])
    assert placed["during"] == {"start": NOW_MS + 30 * SEC, "end": NOW_MS + 30 * SEC + HOUR}
    assert placed["conditions"] == [] and placed["nextAttemptAt"] is None


def test_a_failed_retry_waits_another_30s_and_logs_nothing_new(solo: Cli) -> None:
    reserve(solo, "a", "--gpus", "8", "--for", "2h")
    waiting = reserve(solo, "b", "--gpus", "8", "--for", "1h")
    changes(solo)
    assert changes(solo, at(30 * SEC)) == []  # same reason: no new pending event
    again = solo.ok("get", waiting["id"])
    assert again["state"] == "pending"
    assert again["nextAttemptAt"] == NOW_MS + 60 * SEC


def test_a_calendar_retry_before_its_start_keeps_the_window(solo: Cli) -> None:
    blocker = reserve(solo, "a", "--gpus", "8", "--for", "2h")
    waiting = reserve(solo, "b", "--gpus", "8", "--for", "2h", "--start", "+1h")
    changes(solo)
    solo.ok("release", blocker["id"], now=at(20 * MIN))
    assert changes(solo, at(20 * MIN)) == [("reservation.placed", waiting["id"])]
    placed = solo.ok("get", waiting["id"])
    assert placed["state"] == "placed"
    assert placed["during"] == {"start": NOW_MS + HOUR, "end": NOW_MS + 3 * HOUR}


def test_a_late_calendar_retry_books_from_then_for_the_full_duration(solo: Cli) -> None:
    blocker = reserve(solo, "a", "--gpus", "8", "--for", "2h")
    waiting = reserve(solo, "b", "--gpus", "8", "--for", "2h", "--start", "+1h")
    changes(solo)
    assert changes(solo, at(HOUR)) == []  # its start came, the node is still busy
    solo.ok("release", blocker["id"], now=at(90 * MIN))
    assert changes(solo, at(90 * MIN)) == [
        ("reservation.placed", waiting["id"]),
        ("reservation.binding", waiting["id"]),
        ("reservation.active", waiting["id"]),
    ]
    got = solo.ok("get", waiting["id"])
    assert got["start"] == NOW_MS + HOUR
    assert got["during"] == {"start": NOW_MS + 90 * MIN, "end": NOW_MS + 90 * MIN + 2 * HOUR}


@pytest.mark.sqlite_only(reason="copies the ledger file")
def test_tick_until_equals_ticking_at_each_step(db_dir: Path) -> None:
    source = init_db(db_dir / "src.db", "--demo")
    setup = Cli(source)
    reserve(setup, "a", "--gpus", "8", "--gang", "3", "--for", "1h")
    reserve(setup, "b", "--gpus", "8", "--gang", "4", "--for", "2h")
    reserve(setup, "c", "--gpus", "8", "--for", "1h", "--start", "+30m")
    reserve(setup, "d", "--gpus", "8", "--for", "1h", "--start", "+90m", tenant="globex")
    reserve(setup, "e", "--gpus", "8", "--gang", "2", "--for", "30m", tenant="globex")
    once = Cli(copy_db(source, db_dir / "once.db"))
    stepped = Cli(copy_db(source, db_dir / "stepped.db"))

    doc = once.ok("tick", "--until", at(3 * HOUR), "--step", "10m")
    assert doc["now"] == NOW_MS + 3 * HOUR  # where the ledger acted last
    collected: list[Any] = []
    for i in range(0, 19):
        collected.extend(stepped.ok("tick", now=at(i * 10 * MIN))["changes"])
    assert doc["changes"] == collected
    assert {e["type"] for e in collected} >= {
        "reservation.binding",
        "reservation.active",
        "reservation.released",
        "reservation.placed",
    }
    assert once.ok("list") == stepped.ok("list")
    assert once.ok("events") == stepped.ok("events")
    # every reservation ran to its end
    assert {r["state"] for r in once.ok("list")} == {"released"}


def test_tick_until_includes_the_last_instant_and_refuses_bad_ranges(solo: Cli) -> None:
    rsv = reserve(solo, "a", "--gpus", "8", "--for", "25m")
    doc = solo.ok("tick", "--until", at(25 * MIN), "--step", "10m")
    assert [(e["type"], e["at"]) for e in doc["changes"]] == [
        ("reservation.binding", NOW_MS),
        ("reservation.active", NOW_MS),
        ("reservation.expiring", NOW_MS),  # 25 minutes is within notice.expiringMs (issue 11)
        ("reservation.released", NOW_MS + 25 * MIN),
    ]
    assert solo.ok("get", rsv["id"])["state"] == "released"
    assert solo.fails(2, "tick", "--until", at(-MIN))["code"] == "INVALID_INPUT"
    assert solo.fails(2, "tick", "--until", "+1h", "--step", "soon")["code"] == "INVALID_INPUT"
    assert solo.fails(2, "tick", "--until", "yesterday")["code"] == "INVALID_INPUT"
    # JSON's now is where the ledger acted last, and time never goes back (review finding)
    assert solo.ok("tick", "--until", at(HOUR), "--step", "10m")["now"] == NOW_MS + HOUR
    behind = solo.fails(2, "tick", "--until", at(30 * MIN), now=NOW)  # an older --now
    assert "before the ledger's time" in behind["message"]
    assert solo.ok("tick", "--until", at(2 * HOUR), "--step", "30m", now=NOW)["now"] == (
        NOW_MS + 2 * HOUR
    )


# ---------------------------------------------------------------- events


def test_the_event_log_has_every_transition_in_order(solo: Cli) -> None:
    rsv = reserve(solo, "a", "--gpus", "8", "--for", "1h", "--start", "+30m")
    solo.ok("extend", rsv["id"], "--by", "30m")
    solo.ok("tick", "--until", at(3 * HOUR), "--step", "15m")
    events = solo.ok("events", "--reservation", rsv["id"])
    assert [e["type"] for e in events] == [
        "reservation.created",
        "reservation.placed",
        "reservation.extended",
        "reservation.starting",
        "reservation.binding",
        "reservation.active",
        "reservation.expiring",
        "reservation.released",
    ]
    assert [e["at"] for e in events] == [
        NOW_MS,
        NOW_MS,
        NOW_MS,
        NOW_MS + 15 * MIN,  # repair.leadMs before the start
        NOW_MS + 30 * MIN,
        NOW_MS + 30 * MIN,
        NOW_MS + 90 * MIN,  # the first step at or after 40 minutes before the end
        NOW_MS + 2 * HOUR,
    ]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    for e in events:
        assert list(e) == ["seq", "type", "at", "tenantId", "reservationId", "actor", "data"]
        assert (e["tenantId"], e["reservationId"]) == ("acme", rsv["id"])
    assert events[1]["data"] == {
        "nodeIds": ["n1"],
        "start": NOW_MS + 30 * MIN,
        "end": NOW_MS + 90 * MIN,
    }


def test_events_filters(solo: Cli) -> None:
    a = reserve(solo, "a", "--gpus", "4", "--for", "1h")
    b = reserve(solo, "b", "--gpus", "4", "--for", "1h", tenant="globex")
    everything = solo.ok("events")
    seqs = [e["seq"] for e in everything]
    assert seqs == sorted(seqs)
    mine = solo.ok("events", "--tenant", "acme")
    assert mine and {e["tenantId"] for e in mine} == {"acme"}
    assert {e["reservationId"] for e in mine if e["type"] != "tenant.created"} == {a["id"]}, mine
    theirs = solo.ok("events", "--reservation", b["id"])
    assert [e["type"] for e in theirs] == ["reservation.created", "reservation.placed"]
    cut = mine[0]["seq"]
    since = solo.ok("events", "--since", cut)
    assert since == [e for e in everything if e["seq"] > cut]
    assert solo.ok("events", "--since", everything[-1]["seq"]) == []
    both = solo.ok("events", "--tenant", "globex", "--since", cut)
    assert both == [e for e in everything if e["seq"] > cut and e["tenantId"] == "globex"]
    assert solo.fails(3, "events", "--tenant", "ghost")["code"] == "NOT_FOUND"
    code, text, _ = solo("events", "--reservation", a["id"], json=False, env={"COLUMNS": "200"})
    assert code == 0 and "reservation.placed" in text


# ---------------------------------------------------------------- timeline


def test_timeline_json_counts_distinct_gpus_per_bucket(solo: Cli) -> None:
    reserve(solo, "a", "--gpus", "4", "--for", "2h")
    reserve(solo, "b", "--gpus", "4", "--for", "2h", "--start", "+1h")
    # the same 8 GPUs twice inside one hour: counted once
    reserve(solo, "c", "--gpus", "8", "--for", "30m", "--start", "+5h")
    reserve(solo, "d", "--gpus", "8", "--for", "30m", "--start", "+5h30m")
    doc = solo.ok("timeline", "--from", "now", "--to", "+6h", "--step", "60")
    assert list(doc) == ["poolId", "allocatable", "buckets"]
    assert doc["poolId"] == solo.ok("pool", "show", "solo")["id"]
    assert doc["allocatable"] == 8
    buckets = doc["buckets"]
    assert [list(b) for b in buckets] == [["start", "end", "booked", "free"]] * 6
    assert [(b["start"], b["end"]) for b in buckets] == [
        (NOW_MS + i * HOUR, NOW_MS + (i + 1) * HOUR) for i in range(6)
    ]
    assert [b["booked"] for b in buckets] == [4, 8, 4, 0, 0, 8]
    assert [b["free"] for b in buckets] == [4, 0, 4, 8, 8, 0]
    # 30-minute buckets: a booking ending at a bucket's start does not count in it
    half = solo.ok("timeline", "--from", "now", "--to", "+3h", "--step", "30")
    assert [b["booked"] for b in half["buckets"]] == [4, 4, 8, 8, 4, 4]
    # a tenant's view adds its own bookings; booked and free stay the pool's (issue 7)
    solo.ok("cancel", solo.ok("list", "--tenant", "acme")[1]["id"])
    reserve(solo, "e", "--gpus", "2", "--for", "1h", "--start", "+1h", tenant="globex")
    acme = solo.ok("timeline", "--tenant", "acme", "--from", "now", "--to", "+2h", "--step", "60")
    assert [b["tenantBooked"] for b in acme["buckets"]] == [4, 4]
    assert [b["booked"] for b in acme["buckets"]] == [4, 6]
    assert [b["free"] for b in acme["buckets"]] == [4, 2]


def test_timeline_defaults_to_24_hours_from_the_start_of_this_hour(solo: Cli) -> None:
    doc = solo.ok("timeline", now=at(20 * MIN))
    buckets = doc["buckets"]
    assert len(buckets) == 24
    assert buckets[0]["start"] == NOW_MS
    assert buckets[-1]["end"] == NOW_MS + DAY
    assert all(b["booked"] == 0 and b["free"] == 8 for b in buckets)


def test_timeline_limits(solo: Cli) -> None:
    for flags in (
        ("--step", "4"),
        ("--step", "1441"),
        ("--step", "0"),
        ("--from", "now", "--to", "+7d1h", "--step", "1440"),
        ("--from", "now", "--to", "+3d", "--step", "5"),  # 864 buckets
        ("--from", "now", "--to", "+2d", "--step", "5"),  # 576 buckets
        ("--from", "+2h", "--to", "+1h"),
        ("--from", "whenever"),
    ):
        err = solo.fails(2, "timeline", *flags)
        assert err["code"] == "INVALID_INPUT", flags
    # the edges themselves are allowed
    assert (
        len(solo.ok("timeline", "--from", "now", "--to", "+7d", "--step", "30")["buckets"]) == 336
    )
    assert len(solo.ok("timeline", "--step", "5", "--to", "+1h")["buckets"]) == 12
    assert (
        len(solo.ok("timeline", "--from", "now", "--to", "+7d", "--step", "1440")["buckets"]) == 7
    )
    assert solo.fails(3, "timeline", "--pool", "nowhere")["code"] == "NOT_FOUND"


def test_timeline_chart_fits_in_80_columns(solo: Cli) -> None:
    reserve(solo, "a", "--gpus", "6", "--for", "3h", "--start", "+2h")
    code, text, err = solo("timeline", "--step", "60", json=False, env={"COLUMNS": "80"})
    assert code == 0, err
    assert "solo" in text
    lines = text.splitlines()
    assert len(lines) >= 24
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    wide = solo("timeline", "--step", "60", json=False, env={"COLUMNS": "200"})[1]
    assert max(len(line) for line in wide.splitlines()) <= 100


def test_list_keeps_every_value_whole_at_any_width(run: Cli) -> None:
    """A review read `08:00–08:0` over `6` at 80 columns and a tenant one letter a line at 40:
    ids, states and windows stay on one line while the table fits with the other columns
    folded; narrower, the table's plain lines wrap between words, never inside one."""
    reserve(run, "a", "--gpus", "8", "--gang", "4", "--for", "1h", "--name", "nightly-eval")
    reserve(run, "b", "--gpus", "4", "--for", "2h", "--start", "+1h")
    listed = run.ok("list")
    words = {w for r in listed for w in (r["id"], r["tenantId"], r["state"], "08:00–09:00")}
    for width in (80, 60, 40):
        code, text, err = run("list", json=False, env={"COLUMNS": str(width)})
        assert code == 0, err
        shown = set(text.split())
        assert words <= shown, (width, sorted(words - shown), text)
        assert max(len(line) for line in text.splitlines()) <= width, text
    run.ok("reserve", "--tenant", "globex", "--gpus", "8", "--for", "1h", "--spot")
    run.ok("tick")
    code, text, err = run("usage", "--dead-letter", json=False, env={"COLUMNS": "80"})
    assert code == 0 and "gpu.h100.spot.hours" in text, err
    assert "…" not in text, text  # the tenant folds, never `glob…`


def test_pool_and_node_lists_keep_names_and_ids_whole(run: Cli) -> None:
    """`pool list` at 50 columns cut the pool's id to `pool_…`, which nobody can copy, and
    `node list` at 35 cut labels to `fabri…`: names, ids and states stay whole, and no value is
    cut, down to 35 columns."""
    pool = run.ok("pool", "list")[0]
    nodes = run.ok("node", "list")
    words = {pool["name"], pool["id"], *(n["name"] for n in nodes)}
    for width in (80, 50, 35):
        for command in (["pool", "list"], ["node", "list"]):
            code, text, err = run(*command, json=False, env={"COLUMNS": str(width)})
            assert code == 0, err
            assert "…" not in text, (width, text)
            assert max(len(line) for line in text.splitlines()) <= width, text
        shown = set(run("pool", "list", json=False, env={"COLUMNS": str(width)})[1].split())
        shown |= set(run("node", "list", json=False, env={"COLUMNS": str(width)})[1].split())
        assert words <= shown, (width, sorted(words - shown))


# ---------------------------------------------------------------- determinism


SCRIPT: list[tuple[str, list[str]]] = [
    (NOW, ["reserve", "--tenant", "acme", "--gpus", "4", "--for", "2h", "--key", "a"]),
    (NOW, ["reserve", "--tenant", "acme", "--gpus", "2", "--for", "2h", "--key", "b"]),
    (
        NOW,
        [
            "reserve",
            "--tenant",
            "acme",
            "--gpus",
            "8",
            "--gang",
            "2",
            "--topology-key",
            "fabric.domain",
            "--for",
            "3h",
            "--key",
            "c",
        ],
    ),
    (
        NOW,
        [
            "reserve",
            "--tenant",
            "globex",
            "--gpus",
            "8",
            "--gang",
            "3",
            "--for",
            "12h",
            "--spot",
            "--key",
            "d",
        ],
    ),
    (
        NOW,
        [
            "reserve",
            "--tenant",
            "acme",
            "--gpus",
            "8",
            "--for",
            "12h",
            "--start",
            "+1d",
            "--key",
            "e",
        ],
    ),
    (
        NOW,
        ["reserve", "--tenant", "acme", "--gpus", "8", "--gang", "4", "--for", "1h", "--key", "f"],
    ),
    (NOW, ["preview", "--tenant", "globex", "--gpus", "3", "--for", "1h"]),
    (at(MIN), ["tick"]),
    (at(2 * MIN), ["tick", "--until", at(4 * HOUR), "--step", "5m"]),
    (at(4 * HOUR), ["list"]),
    (at(4 * HOUR), ["pool", "show", "west"]),
    (at(4 * HOUR), ["timeline", "--step", "30"]),
    (at(4 * HOUR), ["events"]),
]


@pytest.mark.sqlite_only(reason="copies the ledger file")
def test_replays_on_copies_are_byte_identical(db_dir: Path) -> None:
    source = init_db(db_dir / "src.db", "--demo")
    outputs = []
    for name in ("one.db", "two.db"):
        db = copy_db(source, db_dir / name)
        lines = []
        for now, args in SCRIPT:
            result = invoke(["--db", str(db), "--now", now, "--json", *args])
            assert result.exit_code == 0, result.stderr
            lines.append(result.stdout)
        outputs.append(lines)
    assert outputs[0] == outputs[1]
    assert "rsv_" in outputs[0][0]


def test_a_retry_near_the_end_of_time_waits_instead_of_booking_past_it(db_dir: Path) -> None:
    """Admitted at 23:50 of 9999-12-31 for 5 minutes, a request retried at 23:55 would end
    after the last instant there is: it stays pending saying so (the tick committed the booking
    and failed on printing it, and every later read of it failed too)."""
    end = "9999-12-31T23:"
    cli = Cli(init_db(db_dir / "end.db", "--demo", now=f"{end}50:00Z"))
    full = ("--tenant", "acme", "--gpus", "8", "--gang", "7", "--for", "5m")
    cli.ok("reserve", *full, now=f"{end}50:00Z")
    waits = cli.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "5m", now=f"{end}50:00Z")
    assert waits["state"] == "pending"
    cli.ok("tick", now=f"{end}55:00Z")
    got = cli.ok("get", waits["id"], now=f"{end}55:00Z")
    assert got["state"] == "pending" and got["during"] is None
    assert "would end after 9999-12-31T23:59:59.999Z" in got["conditions"][0]["message"]
    assert len(cli.ok("list", now=f"{end}55:00Z")) == 2
