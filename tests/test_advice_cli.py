"""`advice`, `reserve --start-range`, calendar policies and recurring series, through the CLI.

The demo pool `west` has 7 nodes of 8 h100 GPUs in two fabric domains (c1.1: 4 nodes, c1.2: 3).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from better_compute.timeparse import MAX_DURATION_MS, human_duration
from tests.conftest import DAY, HOUR, MIN, NOW_MS, Cli, at, init_db

INVALID, NOT_FOUND, CONFLICT, FORBIDDEN = 2, 3, 4, 6


def fill_west(run: Cli, start: str | None = None, hours: int = 48, key: str = "fill") -> dict:
    """Every GPU of west booked by one gang of 7 (acme), now or from `start`."""
    flags = ["--start", start] if start else []
    return run.ok(
        "reserve", "--tenant", "acme", "--pool", "west", "--gpus", "8", "--gang", "7",
        "--for", f"{hours}h", "--key", key, *flags,
    )  # fmt: skip


def advise(run: Cli, *flags: object) -> list[dict]:
    doc = run.ok("advice", *flags)
    assert set(doc) == {"recommendations"}
    return doc["recommendations"]


# ---------------------------------------------------------------- advice


def test_advice_answers_the_earliest_window_with_the_seed_fields(run: Cli) -> None:
    fill_west(run)
    recs = advise(
        run, "--gpus", "8", "--gang", "4", "--start-range", "now..+5d", "--duration", "1d"
    )
    assert recs, recs
    first = recs[0]
    assert first["startTime"] == NOW_MS + 2 * DAY
    assert first["endTime"] == NOW_MS + 3 * DAY
    assert first["durationMs"] == DAY
    assert first["location"] == "west" and first["poolId"].startswith("pool_")
    assert first["otherLocations"] == {} and first["nearMiss"] is None
    assert [r["startTime"] for r in recs] == sorted({r["startTime"] for r in recs})


def test_every_window_advice_returns_can_be_booked_at_once(run: Cli) -> None:
    run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--gang", "3", "--for", "5h", "--key", "a")
    run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "7h", "--key", "b")
    recs = advise(
        run, "--gpus", "8", "--gang", "4", "--topology-key", "fabric.domain",
        "--start-range", "now..+1d", "--duration", "3h", "--limit", "4",
    )  # fmt: skip
    assert recs
    for i, rec in enumerate(recs):
        rsv = run.ok(
            "reserve", "--tenant", "globex", "--gpus", "8", "--gang", "4", "--topology-key",
            "fabric.domain", "--start", rec["startTime"], "--for", "3h", "--key", f"w{i}",
        )  # fmt: skip
        assert rsv["state"] == "placed", rsv
        assert rsv["during"] == {"start": rec["startTime"], "end": rec["endTime"]}
        run.ok("cancel", rsv["id"])


def test_a_gang_whose_group_lies_past_the_first_candidates_is_still_found(
    db_dir: Path,
) -> None:
    """A gang plans GANG_FIRST_TRY candidates a member first (service/windows.py); when those
    split the topology key's groups too thinly, every candidate is planned: 16 nodes in a
    fabric domain each come first by name, and the only pair sharing one comes last."""
    nodes = [
        {"name": f"a-{i:02}", "gpus": {"count": 8, "model": "h100",
         "fabric": {"cluster": "c1", "clique": i}}}
        for i in range(16)
    ] + [
        {"name": f"z-{i}", "gpus": {"count": 8, "model": "h100",
         "fabric": {"cluster": "c1", "clique": 99}}}
        for i in (1, 2)
    ]  # fmt: skip
    inv = db_dir / "wide.json"
    inv.write_text(json.dumps({"pools": [{"name": "wide", "nodes": nodes}]}))
    run = Cli(init_db(db_dir / "wide.db"))
    run.ok("inventory", "import", str(inv))
    ask = ["--pool", "wide", "--gpus", "8", "--gang", "2", "--start-range", "now..+1d",
           "--duration", "4h", "--limit", "1"]  # fmt: skip
    paired = advise(run, *ask, "--topology-key", "fabric.domain")
    assert [r["startTime"] for r in paired] == [NOW_MS]
    assert [r["startTime"] for r in advise(run, *ask)] == [NOW_MS]
    # One of the pair in maintenance over the whole range: no pair is left in any domain.
    run.ok("node", "cordon", "z-2", "--from", "now", "--until", "+3d")
    assert advise(run, *ask, "--topology-key", "fabric.domain") == []
    assert [r["startTime"] for r in advise(run, *ask)] == [NOW_MS]


def test_a_duration_range_gives_the_longest_window_at_each_start(run: Cli) -> None:
    fill_west(run, start="+3d", hours=24)
    recs = advise(
        run, "--pool", "west", "--gpus", "8", "--start-range", "now..+6d",
        "--duration-range", "1d..5d",
    )  # fmt: skip
    assert recs[0]["startTime"] == NOW_MS and recs[0]["endTime"] == NOW_MS + 3 * DAY
    assert recs[1]["startTime"] == NOW_MS + 4 * DAY
    assert recs[1]["endTime"] == NOW_MS + 9 * DAY


def test_an_end_range_gives_the_latest_end(run: Cli) -> None:
    fill_west(run, hours=10)
    recs = advise(
        run, "--gpus", "8", "--start-range", "now..+1d", "--end-range", "+12h..+20h",
    )  # fmt: skip
    assert (recs[0]["startTime"], recs[0]["endTime"]) == (NOW_MS + 10 * HOUR, NOW_MS + 20 * HOUR)


def test_other_pools_say_no_capacity_not_supported_or_available(run: Cli) -> None:
    run.ok("pool", "create", "east")
    run.ok("node", "add", "e1", "--pool", "east", "--gpus", "8", "--model", "a100")
    run.ok("pool", "create", "north")
    run.ok("node", "add", "n1", "--pool", "north", "--gpus", "8", "--model", "h100")
    run.ok("reserve", "--tenant", "acme", "--pool", "north", "--gpus", "8", "--for", "1d",
           "--key", "n")  # fmt: skip
    recs = advise(
        run, "--pool", "west", "--gpus", "8", "--model", "h100", "--start-range", "now..+2d",
        "--duration", "2h", "--limit", "1",
    )  # fmt: skip
    others = recs[0]["otherLocations"]
    assert others["east"]["status"] == "NOT_SUPPORTED"
    assert "no h100 GPUs" in others["east"]["details"]
    assert others["north"]["status"] == "NO_CAPACITY"
    assert "no node fits" in others["north"]["details"]
    later = advise(
        run, "--pool", "west", "--gpus", "8", "--model", "h100",
        "--start-range", "+1d..+2d", "--duration", "2h", "--limit", "1",
    )  # fmt: skip
    assert later[0]["otherLocations"]["north"] == {
        "status": "AVAILABLE",
        "details": "fits in this window",
    }


def test_without_pool_every_pool_is_searched(run: Cli) -> None:
    run.ok("pool", "create", "north")
    run.ok("node", "add", "n1", "--pool", "north", "--gpus", "8", "--model", "h100")
    fill_west(run)
    recs = advise(run, "--gpus", "8", "--start-range", "now..+3d", "--duration", "1h")
    assert recs[0]["location"] == "north" and recs[0]["startTime"] == NOW_MS
    assert recs[0]["otherLocations"]["west"]["status"] == "NO_CAPACITY"


def test_nothing_fits_gives_near_misses_marked_as_such(run: Cli) -> None:
    fill_west(run, hours=30)
    recs = advise(run, "--gpus", "8", "--start-range", "now..+1d", "--duration", "1d")
    assert [r["nearMiss"]["kind"] for r in recs] == ["later"]
    assert recs[0]["startTime"] == NOW_MS + 30 * HOUR
    # A shorter window: 6 hours are free before a booking at +6h, 10 hours were asked.
    run.ok("cancel", run.ok("list", "--tenant", "acme")[0]["id"])
    fill_west(run, start="+6h", hours=100, key="later")
    recs = advise(run, "--gpus", "8", "--start-range", "now..+1h", "--duration", "10h")
    kinds = [r["nearMiss"]["kind"] for r in recs]
    assert kinds == ["shorter"], recs
    assert (recs[0]["startTime"], recs[0]["endTime"]) == (NOW_MS, NOW_MS + 6 * HOUR)
    assert recs[0]["nearMiss"]["details"] == "shorter: 6h of 10h"
    # Less than half the asked length is no near miss.
    assert advise(run, "--gpus", "8", "--start-range", "now..+1h", "--duration", "13h") == []


def test_fewer_gpus_is_a_near_miss(run: Cli) -> None:
    # Every node keeps 2 GPUs free for two days: 8 do not fit, 6 do.
    run.ok("reserve", "--tenant", "acme", "--gpus", "6", "--gang", "7", "--for", "2d", "--key", "f")
    recs = advise(run, "--gpus", "8", "--start-range", "now..+1h", "--duration", "3d")
    kinds = [r["nearMiss"]["kind"] for r in recs]
    assert "fewer-gpus" in kinds, recs
    fewer = recs[kinds.index("fewer-gpus")]
    assert fewer["gpus"] == 2 and fewer["nearMiss"]["details"] == "fewer GPUs: 2 of 8"


def test_an_empty_answer_is_not_an_error(run: Cli) -> None:
    fill_west(run, hours=24 * 30)
    assert advise(run, "--gpus", "8", "--start-range", "now..+1h", "--duration", "1d") == []
    code, out, _ = run("advice", "--gpus", "8", "--start-range", "now..+1h", "--duration", "1d",
                       json=False)  # fmt: skip
    assert code == 0 and "no window fits" in out


def test_advice_for_people_draws_a_table_and_a_picture(run: Cli) -> None:
    fill_west(run)
    code, out, _ = run(
        "advice", "--gpus", "8", "--start-range", "now..+5d", "--duration", "1d", json=False
    )
    assert code == 0
    assert "window (UTC 2026)" in out and "09-30 08:00 → 10-01 08:00" in out
    assert "█" in out and "·" in out
    # The picture's axis fits a narrow terminal: at 40 columns it wrapped over two lines.
    code, out, _ = run(
        "advice", "--gpus", "8", "--start-range", "now..+5d", "--duration", "1d", json=False,
        env={"COLUMNS": "40"},
    )  # fmt: skip
    picture = out.split("\n\n")[-1].splitlines()
    assert code == 0 and len(picture) == 2, out  # the axis's labels, then the one window
    assert all(len(line) <= 40 for line in picture) and "█" in picture[1], out


def test_advice_for_people_keeps_a_long_pool_name_whole(db_dir: Path) -> None:
    """rich cut `a-very-long-pool-name-for-t…` at 80 columns (a review): empty columns (no other
    pool, no near miss) are left out, and pools and windows stay whole at any width."""
    cli = Cli(init_db(db_dir / "long.db"))
    name = "a-very-long-pool-name-for-the-team"
    cli.ok("pool", "create", name)
    cli.ok("node", "add", "n1", "--pool", name, "--gpus", "8", "--model", "h100")
    cli.ok("tenant", "create", "t")
    for width in ("80", "53", "40"):
        code, out, err = cli("advice", "--gpus", "1", "--start-range", "now..+1d", "--duration",
                             "2h", json=False, env={"COLUMNS": width})  # fmt: skip
        assert code == 0 and name in out.split() and "…" not in out, (width, out, err)
        assert all(len(line) <= int(width) for line in out.splitlines()), out
    code, out, _ = cli("advice", "--gpus", "1", "--start-range", "now..+1d", "--duration", "2h",
                       json=False, env={"COLUMNS": "80"})  # fmt: skip
    assert "note" not in out and "other pools" not in out, out


@pytest.mark.parametrize(
    ("flags", "code", "needle"),
    [
        (["--start-range", "+2d..+1d", "--duration", "1d"], INVALID, "FROM must not be after TO"),
        (["--start-range", "tomorrow", "--duration", "1d"], INVALID, "--start-range"),
        (["--start-range", "now..+1d"], INVALID, "exactly one of"),
        (["--start-range", "now..+1d", "--duration", "1d", "--end-range", "+1d..+2d"], INVALID,
         "exactly one of"),
        (["--start-range", "now..+1d", "--duration", "1d", "--limit", "0"], INVALID, "--limit"),
        (["--start-range", "now..+1d", "--duration-range", "2d..1d"], INVALID, "--duration-range"),
        (["--start-range", "now..+1d", "--duration-range", "0s..1d"], INVALID, "more than 0"),
        (["--start-range", "+1d..+2d", "--end-range", "now..+1h"], INVALID, "--end-range"),
        (["--start-range", "-2d..-1d", "--duration", "1h"], INVALID, "before now"),
        (["--start-range", "now..+1d", "--duration", "fortnight"], INVALID, "DURATION"),
        (["--start-range", "now..+1d", "--duration", "1h", "--pool", "nowhere"], NOT_FOUND,
         "no pool"),
        (["--start-range", "now..+1d", "--duration", "1h", "--topology-key", "rack"], INVALID,
         "--gang"),
        (["--start-range", "now..+1d", "--duration", "1h", "--gang", "9"], INVALID, "gang"),
        (["--start-range", "now..+1d", "--duration", "1h", "--model", "b200"], INVALID,
         "no b200 GPUs"),
        (["--start-range", "now..+1d", "--duration", "1h", "--model", ","], INVALID,
         "--model needs a model"),
    ],
)  # fmt: skip
def test_advice_errors(run: Cli, flags: list[str], code: int, needle: str) -> None:
    err = run.fails(code, "advice", "--gpus", "8", *flags)
    assert needle in err["message"], err


def test_advice_books_nothing(run: Cli) -> None:
    advise(run, "--gpus", "8", "--gang", "7", "--start-range", "now..+1d", "--duration", "1d")
    assert run.ok("list") == []


# ---------------------------------------------------------------- reserve --start-range


def test_reserve_start_range_books_the_earliest_window(run: Cli) -> None:
    fill_west(run, hours=10)
    rsv = run.ok(
        "reserve", "--tenant", "globex", "--gpus", "8", "--gang", "2", "--start-range",
        "now..+2d", "--duration-range", "1h..5h", "--key", "sr",
    )  # fmt: skip
    assert rsv["state"] == "placed"
    assert rsv["during"] == {"start": NOW_MS + 10 * HOUR, "end": NOW_MS + 15 * HOUR}
    assert rsv["start"] == NOW_MS + 10 * HOUR and rsv["durationMs"] == 5 * HOUR
    again = run.ok(
        "reserve", "--tenant", "globex", "--gpus", "8", "--gang", "2", "--start-range",
        "now..+2d", "--duration-range", "1h..5h", "--key", "sr", now=at(HOUR),
    )  # fmt: skip
    assert again["id"] == rsv["id"]
    err = run.fails(
        CONFLICT, "reserve", "--tenant", "globex", "--gpus", "8", "--start-range", "now..+2d",
        "--for", "1h", "--key", "sr",
    )  # fmt: skip
    assert "other parameters" in err["message"]


def test_reserve_start_range_with_nothing_fitting_books_nothing(run: Cli) -> None:
    fill_west(run, hours=48)
    err = run.fails(
        CONFLICT, "reserve", "--tenant", "globex", "--gpus", "1", "--start-range", "now..+1d",
        "--for", "1h", "--key", "x",
    )  # fmt: skip
    assert "nothing was booked" in err["message"]
    assert run.ok("list", "--tenant", "globex") == []


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--duration-range", "1h..2h"], "--start-range"),
        (["--start-range", "now..+1d", "--for", "1h", "--duration-range", "1h..2h"], "not both"),
        (["--start-range", "now..+1d", "--start", "+1h", "--for", "1h"], "not both"),
        (["--start-range", "now..+1d"], "--for is required"),
        (["--start-range", "+1d..now", "--for", "1h"], "FROM must not be after TO"),
        (["--start-range", "now..+1d", "--duration-range", "5h..1h"], "FROM must not be after"),
    ],
)
def test_reserve_start_range_errors(run: Cli, flags: list[str], needle: str) -> None:
    err = run.fails(INVALID, "reserve", "--tenant", "acme", "--gpus", "1", "--key", "e", *flags)
    assert needle in err["message"], err
    assert run.ok("list") == []


# ---------------------------------------------------------------- calendar policies


def set_policy(run: Cli, *flags: str) -> dict:
    return run.ok("pool", "policy", "set", "west", *flags)


def test_policy_set_show_clear_and_events(run: Cli) -> None:
    doc = set_policy(
        run, "--min-duration", "1d", "--max-duration", "3d", "--min-lead", "1h",
        "--max-horizon", "30d", "--sizes", "16,8,32", "--commit",
    )  # fmt: skip
    assert doc == {
        "pool": "west",
        "policy": {
            "minDurationMs": DAY,
            "maxDurationMs": 3 * DAY,
            "minLeadMs": HOUR,
            "maxHorizonMs": 30 * DAY,
            "sizes": [8, 16, 32],
            "commit": True,
        },
    }
    assert run.ok("pool", "policy", "show", "west") == doc
    types = [e["type"] for e in run.ok("events")]
    assert "pool.policy.set" in types
    assert run.ok("pool", "policy", "clear", "west") == {"pool": "west", "cleared": True}
    assert run.ok("pool", "policy", "show", "west") == {"pool": "west", "policy": None}
    assert "pool.policy.cleared" in [e["type"] for e in run.ok("events")]
    code, out, _ = run("pool", "policy", "show", "west", json=False)
    assert code == 0 and "no calendar policy" in out


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--min-duration", "3d", "--max-duration", "1d"], "longer than --max-duration"),
        (["--sizes", "8,x"], "--sizes"),
        (["--sizes", "0"], "--sizes"),
        (["--min-lead", "soon"], "--min-lead"),
    ],
)
def test_policy_set_errors(run: Cli, flags: list[str], needle: str) -> None:
    err = run.fails(INVALID, "pool", "policy", "set", "west", *flags)
    assert needle in err["message"], err
    assert run.ok("pool", "policy", "show", "west")["policy"] is None


def test_policy_is_admin_only(run: Cli) -> None:
    err = run.fails(FORBIDDEN, "--as", "bob", "pool", "policy", "set", "west", "--commit")
    assert "only an admin" in err["message"]
    run.fails(FORBIDDEN, "--as", "bob", "pool", "policy", "clear", "west")
    run.fails(NOT_FOUND, "pool", "policy", "set", "nowhere", "--commit")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--gpus", "2", "--for", "1d", "--start", "+2d"], "allowed sizes: 8, 16"),
        (["--gpus", "8", "--for", "1h", "--start", "+2d"], "allowed durations (from 1d to 3d)"),
        (["--gpus", "8", "--for", "4d", "--start", "+2d"], "allowed durations (from 1d to 3d)"),
        (["--gpus", "8", "--for", "1d", "--start", "+10m"], "minimum lead time 1h"),
        (["--gpus", "8", "--for", "1d", "--start", "+9d1m"], "maximum horizon 10d"),
        (["--gpus", "8", "--for", "1d", "--start-range", "+9d1m..+12d"], "10d"),
        (["--gpus", "8", "--for", "1d", "--start", "+2d", "--every", "1d", "--count", "2",
          "--tenant", "globex"], "sizes"),
    ],
)  # fmt: skip
def test_calendar_requests_outside_the_policy_are_invalid(
    run: Cli, flags: list[str], needle: str
) -> None:
    set_policy(
        run, "--min-duration", "1d", "--max-duration", "3d", "--min-lead", "1h",
        "--max-horizon", "10d", "--sizes", "8,16",
    )  # fmt: skip
    if "--tenant" in flags:  # the series case: its size 8 passes, so ask 4 GPUs instead
        flags = [f if f != "8" else "4" for f in flags if f not in ("--tenant", "globex")]
    err = run.fails(INVALID, "reserve", "--tenant", "acme", "--key", "p", *flags)
    assert needle in err["message"] and "calendar policy" in err["message"], err
    assert run.ok("list") == []


def test_requests_without_a_start_are_not_calendar_requests(run: Cli) -> None:
    set_policy(run, "--min-duration", "1d", "--sizes", "8")
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--key", "now")
    assert rsv["state"] == "placed"


def test_advice_proposes_only_what_the_policy_allows(run: Cli) -> None:
    set_policy(run, "--min-lead", "87h", "--max-duration", "2d", "--sizes", "8,16")
    recs = advise(run, "--gpus", "8", "--start-range", "now..+10d", "--duration-range", "1d..5d")
    assert recs[0]["startTime"] == NOW_MS + 87 * HOUR
    assert recs[0]["durationMs"] == 2 * DAY
    err = run.fails(INVALID, "advice", "--gpus", "4", "--start-range", "now..+10d",
                    "--duration", "1d")  # fmt: skip
    assert "allowed sizes: 8, 16" in err["message"]
    err = run.fails(INVALID, "advice", "--gpus", "8", "--start-range", "now..+1d",
                    "--duration", "1d")  # fmt: skip
    assert "minimum lead time 3d15h" in err["message"]


def test_commit_makes_a_placed_calendar_reservation_final(run: Cli) -> None:
    before = run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1d", "--start", "+1d",
                    "--key", "before")  # fmt: skip
    set_policy(run, "--commit")
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1d", "--start", "+1d",
                 "--key", "c")  # fmt: skip
    for verb, extra in (("cancel", []), ("extend", ["--by", "1h"])):
        err = run.fails(CONFLICT, verb, rsv["id"], *extra)
        assert "--commit" in err["message"], err
    run.ok("tick", now=at(DAY))
    run.ok("tick", now=at(DAY + MIN))
    assert run.ok("get", rsv["id"], now=at(DAY + MIN))["state"] == "active"
    err = run.fails(CONFLICT, "release", rsv["id"], now=at(DAY + MIN))
    assert "released early" in err["message"]
    # Booked before the policy: not bound by it. A reservation without a start: not either.
    assert run.ok("release", before["id"], now=at(DAY + MIN))["state"] == "released"
    now_rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "n",
                     now=at(DAY + MIN))  # fmt: skip
    assert run.ok("cancel", now_rsv["id"], now=at(DAY + MIN))["state"] == "released"


def test_commit_lets_a_pending_calendar_reservation_be_cancelled(run: Cli) -> None:
    fill_west(run, start="+1d", hours=24)
    set_policy(run, "--commit")
    rsv = run.ok("reserve", "--tenant", "globex", "--gpus", "8", "--for", "1h", "--start",
                 "+1d", "--key", "p")  # fmt: skip
    assert rsv["state"] == "pending"
    assert run.ok("cancel", rsv["id"])["releaseReason"] == "cancelled"


# ---------------------------------------------------------------- recurring windows


def nightly(run: Cli, *flags: str, key: str = "nightly", **kw: object) -> list[dict]:
    return run.ok(  # type: ignore[no-any-return]
        "reserve", "--tenant", "acme", "--gpus", "8", "--gang", "2", "--for", "6h",
        "--start", "+14h", "--every", "1d", "--key", key, *flags, **kw,
    )  # fmt: skip


def test_every_books_a_series_all_placed_under_one_series_id(run: Cli) -> None:
    run.ok("quota", "set", "--tenant", "acme", "--gpus", "1000")  # each occurrence is charged
    rows = nightly(run, "--count", "7")
    assert len(rows) == 7
    assert {r["state"] for r in rows} == {"placed"}
    assert len({r["seriesId"] for r in rows}) == 1 and rows[0]["seriesId"].startswith("ser_")
    assert [r["start"] for r in rows] == [NOW_MS + 14 * HOUR + i * DAY for i in range(7)]
    assert [r["idempotencyKey"] for r in rows] == [f"nightly#{i}" for i in range(1, 8)]
    assert nightly(run, "--count", "7") == rows  # the same command again: the same series
    until = nightly(run, "--until", "+3d", key="until")
    assert [r["start"] for r in until] == [NOW_MS + 14 * HOUR + i * DAY for i in range(3)]


def test_a_series_key_is_compared_as_the_whole_command(run: Cli) -> None:
    """Review findings: the same series command again returns the series as it is now, even once
    an occurrence has begun or was cancelled; another --count, --every or --until is a CONFLICT
    with nothing booked; a series' key and a single reservation's key never name each other."""
    run.ok("quota", "set", "--tenant", "acme", "--gpus", "1000")
    rows = nightly(run, "--count", "3")
    run.ok("tick", now=at(14 * HOUR))
    run.ok("cancel", rows[2]["id"], now=at(14 * HOUR))
    again = nightly(run, "--count", "3", now=at(15 * HOUR))
    assert [r["id"] for r in again] == [r["id"] for r in rows]
    assert [r["state"] for r in again] == ["active", "placed", "released"]
    held = run.ok("quota", "show", "--tenant", "acme")
    for other in (["--count", "5"], ["--count", "1"], ["--until", "+3d"]):
        err = run.fails(CONFLICT, "reserve", "--tenant", "acme", "--gpus", "8", "--gang", "2",
                        "--for", "6h", "--start", "+14h", "--every", "1d", *other,
                        "--key", "nightly")  # fmt: skip
        assert "other parameters" in err["message"], err
    err = run.fails(CONFLICT, "reserve", "--tenant", "acme", "--gpus", "8", "--gang", "2",
                    "--for", "6h", "--start", "+14h", "--every", "1w", "--count", "3",
                    "--key", "nightly")  # fmt: skip
    assert "other parameters" in err["message"], err
    assert run.ok("quota", "show", "--tenant", "acme") == held  # nothing more booked
    # a single reservation may not take the series' key, nor a series a single one's
    err = run.fails(CONFLICT, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h",
                    "--key", "nightly")  # fmt: skip
    assert "names a series" in err["message"]
    run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "solo")
    err = run.fails(CONFLICT, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h",
                    "--every", "1d", "--count", "2", "--key", "solo")  # fmt: skip
    assert "single reservation" in err["message"]
    assert run.fails(INVALID, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h",
                     "--key", "job#1")["code"] == "INVALID_INPUT"  # fmt: skip
    # list --key finds the series by its key
    listed = run.ok("list", "--key", "nightly")
    assert [r["id"] for r in listed] == [r["id"] for r in rows]
    assert [r["id"] for r in run.ok("list", "--key", "solo")] != []


def test_a_series_is_all_or_nothing(run: Cli) -> None:
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "1000")
    fill_west(run, start=f"{NOW_MS + 3 * DAY + 14 * HOUR}", hours=1)
    err = run.fails(CONFLICT, "reserve", "--tenant", "globex", "--gpus", "8", "--gang", "2",
                    "--for", "6h", "--start", "+14h", "--every", "1d", "--count", "5",
                    "--key", "n")  # fmt: skip
    assert "occurrence 4" in err["message"] and "nothing of the series" in err["message"]
    assert run.ok("list", "--tenant", "globex") == []


def test_cancel_series_cancels_what_has_not_started(run: Cli) -> None:
    run.ok("quota", "set", "--tenant", "acme", "--gpus", "1000")
    rows = nightly(run, "--count", "3")
    run.ok("tick", now=at(14 * HOUR))
    left = run.ok("cancel", rows[0]["id"], "--series", now=at(14 * HOUR))
    states = [r["state"] for r in left]
    assert states[0] in ("binding", "active") and states[1:] == ["released", "released"]
    assert [r["releaseReason"] for r in left[1:]] == ["cancelled", "cancelled"]
    run.fails(CONFLICT, "cancel", rows[0]["id"], "--series", now=at(14 * HOUR))
    single = run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "one",
                    now=at(14 * HOUR))  # fmt: skip
    run.fails(INVALID, "cancel", single["id"], "--series", now=at(14 * HOUR))


def test_cancel_series_leaves_an_occurrence_begun_with_no_tick_since(run: Cli) -> None:
    """Whether cron ticked just before must not decide what is cancelled (a review: the first
    occurrence, placed and begun but not yet bound, was cancelled)."""
    run.ok("quota", "set", "--tenant", "acme", "--gpus", "1000")
    rows = nightly(run, "--count", "3")
    left = run.ok("cancel", rows[0]["id"], "--series", now=at(14 * HOUR + 30 * 60_000))
    assert [r["state"] for r in left] == ["placed", "released", "released"]
    run.ok("tick", now=at(14 * HOUR + 30 * 60_000))
    assert run.ok("get", rows[0]["id"])["state"] in ("binding", "active")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--every", "1h", "--count", "3"], "overlap"),
        (["--every", "1d"], "exactly one of --count"),
        (["--every", "1d", "--count", "2", "--until", "+3d"], "exactly one of --count"),
        (["--every", "1d", "--count", "0"], "--count"),
        (["--every", "1d", "--count", "999"], "--count"),
        (["--every", "1d", "--until", "+1h"], "--until"),
        (["--every", "1d", "--count", "2", "--start-range", "now..+1d"], "--start-range"),
        (["--count", "2"], "need --every"),
        (["--every", "0s", "--count", "2"], "more than 0"),
    ],
)
def test_series_errors(run: Cli, flags: list[str], needle: str) -> None:
    base = ["reserve", "--tenant", "acme", "--gpus", "1", "--for", "6h", "--key", "s"]
    if "--start-range" not in flags:
        base += ["--start", "+14h"]
    err = run.fails(INVALID, *base, *flags)
    assert needle in err["message"], err
    assert run.ok("list") == []


# ---------------------------------------------------------------- the property, end to end


@st.composite
def busy_west(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    """Reservations (GPUs, start offset, duration) in 10-minute steps over the next 4 hours."""
    return draw(
        st.lists(
            st.tuples(st.sampled_from([4, 8]), st.integers(0, 24), st.integers(1, 18)),
            max_size=10,
        )
    )


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(busy_west(), st.integers(1, 12), st.sampled_from([4, 8, 16, 32]))
def test_advice_windows_book_at_once_and_none_earlier_was_missed(
    db_dir: object, bookings: list[tuple[int, int, int]], steps: int, need: int
) -> None:
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(dir=str(db_dir))) / "p.db"
    run = Cli(init_db(path, "--demo"))
    run.ok("config", "set", "placement.topN", "1")
    step = 10 * MIN
    for i, (gpus, start, length) in enumerate(bookings):
        run("reserve", "--tenant", "acme", "--gpus", gpus, "--for", f"{length * 10}m",
            "--start", str(NOW_MS + start * step), "--key", f"b{i}")  # fmt: skip
    gang = ["--gang", str(need // 8)] if need > 8 else []
    per_node = str(min(need, 8))  # 4: GPUs counted one by one; 8: whole nodes
    minutes = steps * 10
    recs = advise(run, "--gpus", per_node, *gang, "--start-range", "now..+4h",
                  "--duration", f"{minutes}m", "--limit", "3")  # fmt: skip
    first = recs[0]["startTime"] if recs else None
    # Brute force: preview every 10-minute start before the first window (bookings lie on it).
    for k in range(0, 25):
        start = NOW_MS + k * step
        if first is not None and start >= first:
            break
        doc = run.ok("preview", "--tenant", "globex", "--gpus", per_node, *gang, "--for",
                     f"{minutes}m", "--start", str(start))  # fmt: skip
        assert not doc["fits"], (start, recs)
    for i, rec in enumerate(recs):
        rsv = run.ok("reserve", "--tenant", "globex", "--gpus", per_node, *gang, "--for",
                     f"{minutes}m", "--start", rec["startTime"], "--key", f"r{i}")  # fmt: skip
        assert rsv["state"] == "placed", (rec, rsv)
        run.ok("cancel", rsv["id"])


def test_preview_of_a_calendar_request_is_judged_by_the_policy(run: Cli) -> None:
    set_policy(run, "--min-duration", "1d")
    err = run.fails(INVALID, "preview", "--tenant", "acme", "--gpus", "8", "--for", "1h",
                    "--start", "+1d")  # fmt: skip
    assert "allowed durations (at least 1d)" in err["message"]
    assert run.ok("preview", "--tenant", "acme", "--gpus", "8", "--for", "1h")["fits"]


def test_a_series_retried_later_with_a_relative_start_is_the_same_series(run: Cli) -> None:
    run.ok("quota", "set", "--tenant", "acme", "--gpus", "1000")
    rows = nightly(run, "--count", "2")
    again = nightly(run, "--count", "2", now=at(MIN))
    assert [r["id"] for r in again] == [r["id"] for r in rows]


def test_advice_on_a_ledger_without_pools_says_so(db_dir: object) -> None:
    from pathlib import Path

    run = Cli(init_db(Path(str(db_dir)) / "empty.db"))
    err = run.fails(NOT_FOUND, "advice", "--gpus", "1", "--start-range", "now..+1d",
                    "--duration", "1h")  # fmt: skip
    assert "no pool exists" in err["message"]


def test_a_gang_on_one_fabric_waits_for_its_domain_not_for_free_nodes_elsewhere(run: Cli) -> None:
    # west-01 (c1.1) busy for 5h: 6 nodes are free, but only 3 of them share c1.1.
    run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "5h", "--key", "one")
    assert run.ok("get", run.ok("list")[0]["id"])["allocations"][0]["nodeId"] == "west-01"
    recs = advise(run, "--gpus", "8", "--gang", "4", "--topology-key", "fabric.domain",
                  "--start-range", "now..+1d", "--duration", "1h")  # fmt: skip
    assert recs[0]["startTime"] == NOW_MS + 5 * HOUR
    anywhere = advise(run, "--gpus", "8", "--gang", "4", "--start-range", "now..+1d",
                      "--duration", "1h")  # fmt: skip
    assert anywhere[0]["startTime"] == NOW_MS


def test_advice_model_and_nvlink_flags(run: Cli) -> None:
    run.ok("pool", "create", "east")
    run.ok("node", "add", "e1", "--pool", "east", "--gpus", "8", "--model", "a100",
           "--nvlink-groups", "2")  # fmt: skip
    recs = advise(run, "--gpus", "4", "--model", "A100", "--topology", "nvlink-all",
                  "--start-range", "now..+1d", "--duration", "1h")  # fmt: skip
    assert recs[0]["location"] == "east"
    assert recs[0]["otherLocations"]["west"]["status"] == "NOT_SUPPORTED"
    # 5 GPUs in one NVLink group of 4 never fit: refused as reserve and preview refuse it.
    err = run.fails(INVALID, "advice", "--gpus", "5", "--pool", "east", "--topology",
                    "nvlink-all", "--model", "a100", "--start-range", "now..+1d", "--duration",
                    "1h")  # fmt: skip
    assert err["message"] == "the largest NVLink group of pool east's nodes has 4 a100 GPUs"
    # A gang on a key no node has (a typo), or larger than any value's nodes, is refused too.
    for gang, key, said in [
        ("2", "fabric.domian", "has the label fabric.domian (their labels: fabric.domain, rack);"
                               " did you mean fabric.domain?"),
        ("5", "fabric.domain", "at most 4 of pool west's nodes with 8 or more GPUs share one"),
    ]:  # fmt: skip
        err = run.fails(INVALID, "advice", "--pool", "west", "--gpus", "8", "--gang", gang,
                        "--topology-key", key, "--start-range", "now..+1d",
                        "--duration", "2h")  # fmt: skip
        assert said in err["message"], err
    err = run.fails(INVALID, "advice", "--gpus", "1", "--topology", "ring", "--start-range",
                    "now..+1d", "--duration", "1h")  # fmt: skip
    assert "--topology" in err["message"]


def test_fewer_gpus_keeps_to_the_policy_sizes(run: Cli) -> None:
    run.ok("reserve", "--tenant", "acme", "--gpus", "6", "--gang", "7", "--for", "2d", "--key", "f")
    set_policy(run, "--sizes", "1,8")
    recs = advise(run, "--gpus", "8", "--start-range", "now..+1h", "--duration", "3d")
    fewer = [r for r in recs if r["nearMiss"]["kind"] == "fewer-gpus"]
    assert [r["gpus"] for r in fewer] == [1]


def test_update_keeps_to_the_calendar_policy_and_commit(run: Cli) -> None:
    set_policy(run, "--min-duration", "2h", "--commit")
    pending = fill_west(run, start="+1d", hours=24, key="block")
    assert pending["state"] == "placed"
    rsv = run.ok("reserve", "--tenant", "globex", "--gpus", "8", "--for", "3h", "--start",
                 "+1d", "--key", "u")  # fmt: skip
    assert rsv["state"] == "pending"  # west is full then: not placed, so still changeable
    err = run.fails(INVALID, "update", rsv["id"], "--for", "1h")
    assert "allowed durations (at least 2h)" in err["message"]
    err = run.fails(CONFLICT, "update", pending["id"], "--for", "30h")
    assert "--commit" in err["message"]


def test_a_node_of_64_gpus_is_counted_to_its_last_gpu(run: Cli) -> None:
    """The counted test reads a booking's GPUs as a 64-bit mask: GPU 63 is its sign bit."""
    run.ok("pool", "create", "big")
    run.ok("node", "add", "b1", "--pool", "big", "--gpus", "64", "--model", "h100")
    run.ok("reserve", "--tenant", "acme", "--pool", "big", "--gpus", "64", "--for", "1h",
           "--key", "all")  # fmt: skip
    run.ok("reserve", "--tenant", "globex", "--pool", "big", "--gpus", "32", "--for", "1h",
           "--start", "+1h", "--key", "half")  # fmt: skip
    ask = ["--pool", "big", "--start-range", "now..+3h", "--duration", "30m", "--limit", "1"]
    assert advise(run, "--gpus", "1", *ask)[0]["startTime"] == NOW_MS + HOUR
    assert advise(run, "--gpus", "32", *ask)[0]["startTime"] == NOW_MS + HOUR
    assert advise(run, "--gpus", "33", *ask)[0]["startTime"] == NOW_MS + 2 * HOUR
    assert advise(run, "--gpus", "64", *ask)[0]["startTime"] == NOW_MS + 2 * HOUR


def test_an_end_range_to_the_end_of_time_advises_no_window_reserve_cannot_say(run: Cli) -> None:
    """Up to year 9999 an end range allowed a window of 2,912,172 days, which no DURATION can
    say (at most 365000d): advice answers only what `reserve --start S --for D` books."""
    got = run.ok(
        "advice", "--gpus", "1", "--start-range", "now..+1h",
        "--end-range", "+1h..9999-12-31T23:59:59.999Z",
    )["recommendations"]  # fmt: skip
    assert got and all(r["durationMs"] <= MAX_DURATION_MS for r in got)
    first = got[0]
    booked = run.ok(
        "reserve", "--tenant", "acme", "--gpus", "1", "--start", str(first["startTime"]),
        "--for", human_duration(first["durationMs"]),
    )  # fmt: skip
    assert booked["during"] == {"start": first["startTime"], "end": first["endTime"]}
