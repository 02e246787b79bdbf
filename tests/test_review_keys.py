"""Idempotency keys after the second review (2026-12-02): what today's series and `--start now`
fixes must not break. Each test fails on the code before its fix."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import DAY, HOUR, NOW_MS, Cli, at

CONFLICT, INVALID = 4, 2
SERIES = ("--tenant", "acme", "--gpus", "1", "--for", "1h", "--every", "1d")


def test_start_now_and_the_same_instant_written_out_are_one_request(run: Cli) -> None:
    first = run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--start", "now",
                   "--key", "k")  # fmt: skip
    again = run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--start",
                   str(NOW_MS), "--key", "k")  # fmt: skip
    assert again == first


def test_a_series_until_matches_as_an_instant_or_as_the_same_text(run: Cli) -> None:
    rows = run.ok("reserve", *SERIES, "--start", "+2h", "--until", "+3d", "--key", "s")
    assert len(rows) == 3
    same = run.ok("reserve", *SERIES, "--start", str(NOW_MS + 2 * HOUR), "--until",
                  str(NOW_MS + 3 * DAY), "--key", "s")  # fmt: skip
    assert same == rows
    later = run.ok("reserve", *SERIES, "--start", "+2h", "--until", "+3d", "--key", "s",
                   now=at(HOUR))  # fmt: skip
    assert [r["id"] for r in later] == [r["id"] for r in rows]
    run.fails(CONFLICT, "reserve", *SERIES, "--start", "+2h", "--until", "+4d", "--key", "s")


def test_list_key_finds_only_the_series_of_that_key(run: Cli) -> None:
    series = run.ok("reserve", *SERIES, "--count", "2", "--key", "S")
    for other in ("S+1", "S~x", "S=2", "S%", "Sa"):
        run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", other)
    assert [r["id"] for r in run.ok("list", "--key", "S")] == [r["id"] for r in series]
    assert [r["idempotencyKey"] for r in run.ok("list", "--key", "S+1")] == ["S+1"]


def test_a_policy_shortest_duration_past_the_horizon_is_refused(run: Cli) -> None:
    err = run.fails(
        INVALID, "pool", "policy", "set", "west", "--min-duration", "3d", "--max-horizon", "1d"
    )
    assert "--min-duration 3d" in err["message"] and "--max-horizon 1d" in err["message"]


def test_tick_until_counts_its_ticks_from_the_ledgers_time(run: Cli) -> None:
    run.ok("tick", now=at(HOUR))
    doc = run.ok("tick", "--until", at(2 * HOUR), "--step", "1m", now="2024-01-01T00:00:00Z")
    assert doc["now"] == NOW_MS + 2 * HOUR


def _sql(run: Cli, *statements: str) -> None:
    with sqlite3.connect(run.db) as conn:
        for statement in statements:
            conn.execute(statement)


@pytest.mark.sqlite_only(reason="writes a ledger's older rows by hand")
def test_keys_from_before_these_rules_still_replay(run: Cli) -> None:
    """A series booked before series were compared whole (its occurrences' params carry each
    start and no `series`), and a single key with '#', both as an older version wrote them."""
    rows = run.ok("reserve", *SERIES, "--start", "+2h", "--count", "3", "--key", "nightly")
    for row in rows:
        old = f"json_set(json_remove(params, '$.series'), '$.start', {row['start']})"
        _sql(run, f"UPDATE reservations SET params = {old} WHERE id = '{row['id']}'")
    again = run.ok("reserve", *SERIES, "--start", "+2h", "--count", "3", "--key", "nightly")
    assert [r["id"] for r in again] == [r["id"] for r in rows]
    single = run.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--key", "ci-7")
    build = run.ok("reserve", "--tenant", "acme", "--gpus", "3", "--for", "1h", "--key", "b-1")
    rekey = "UPDATE reservations SET idempotency_key = '{}' WHERE id = '{}'"
    _sql(run, rekey.format("ci#7", single["id"]), rekey.format("build#1", build["id"]))
    same = run.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--key", "ci#7")
    assert same["id"] == single["id"]
    run.fails(INVALID, "reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--key", "ci#8")
    # `build#1` is a single reservation's key, not a series': `build` is free
    run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "build")


@pytest.mark.sqlite_only(reason="a file name")
def test_a_file_named_like_one_keyword_pair_is_a_file(
    db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(db_dir)
    cli = Cli(Path("user=alice.db"))
    cli.ok("init")
    assert cli.ok("pool", "list") == []
    assert (db_dir / "user=alice.db").is_file()
