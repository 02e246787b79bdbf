"""A relative TIME on a write counts from the instant the write acts at, which is read with its
write lock held (PRODUCT.md §2), not from the instant the command opened the ledger at (a
hostile review, helper-146, D2). Another admin moving a manual clock while `reserve --start +1h`
waited made its one-hour lead 40 minutes; `node cordon --from +5m --until +10m` was refused as
a window already past. `tick --until +10m` already worked so (tests/test_tick_until_race.py);
with --now given, a relative TIME counts from that instant, as tick's does."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import NOW, NOW_MS, Cli

from better_compute.service.context import Ctx

MINUTE = 60_000
#: reserve one GPU for an hour, for acme
ONE_HOUR = ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")
HOUR = 60 * MINUTE


def _another_admin_moves_the_ledger_first(run: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the command under test takes its write lock (having read the ledger's time as it
    opened it), another admin's `tick --until +20m` commits."""
    one_write = Ctx.write
    nested: list[bool] = []

    @contextmanager
    def another_admin_first(self: Ctx) -> Iterator[Any]:
        if not nested:
            nested.append(True)
            run.ok("tick", "--until", "+20m", "--step", "10m")
        with one_write(self) as conn:
            yield conn

    monkeypatch.setattr(Ctx, "write", another_admin_first)


def test_reserve_start_counts_from_the_instant_the_write_acts_at(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    _another_admin_moves_the_ledger_first(run, monkeypatch)
    r = run.ok(*ONE_HOUR, "--start", "+1h", now=None)
    assert r["start"] == NOW_MS + 80 * MINUTE  # the old code: NOW + 60m, a lead of 40 minutes
    assert r["createdAt"] == NOW_MS + 20 * MINUTE


def test_a_series_start_and_until_count_from_the_instant_the_write_acts_at(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    _another_admin_moves_the_ledger_first(run, monkeypatch)
    rows = run.ok(
        *ONE_HOUR,
        *("--start", "+1h", "--every", "1h", "--until", "+3h"),
        now=None,
    )
    # From NOW + 20m: starts at +80m, +140m and +200m; +3h is NOW + 200m, not after the third.
    assert [r["start"] for r in rows] == [NOW_MS + m * MINUTE for m in (80, 140)]


def test_a_maintenance_window_counts_from_the_instant_the_write_acts_at(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    _another_admin_moves_the_ledger_first(run, monkeypatch)
    doc = run.ok("node", "cordon", "west-01", "--from", "+5m", "--until", "+10m", now=None)
    # The old code read +10m as NOW + 10m, past once the ledger stood at NOW + 20m: refused.
    assert doc["maintenance"]["from"] == NOW_MS + 25 * MINUTE
    assert doc["maintenance"]["until"] == NOW_MS + 30 * MINUTE


def test_with_now_given_a_relative_time_counts_from_it(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--now T --start +1h` means T + 1h, wherever the ledger stands when the write acts."""
    _another_admin_moves_the_ledger_first(run, monkeypatch)
    r = run.ok(*ONE_HOUR, "--start", "+1h", now=NOW)
    assert r["start"] == NOW_MS + HOUR
    err = run.fails(2, "node", "cordon", "west-01", "--from", "+5m", "--until", "+10m", now=NOW)
    assert "has passed" in err["message"]


def test_a_time_written_out_stays_where_it_was(run: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    _another_admin_moves_the_ledger_first(run, monkeypatch)
    start = str(NOW_MS + HOUR)
    r = run.ok(*ONE_HOUR, "--start", start, now=None)
    assert r["start"] == NOW_MS + HOUR


def test_bad_relative_times_are_still_refused_before_anything_is_written(run: Cli) -> None:
    before = run.ok("events")
    for args in (
        (*ONE_HOUR, "--start", "+1x"),
        (*ONE_HOUR, "--start", "+1h", "--start-range", "+1h..+2h"),
        (*ONE_HOUR, "--start", "now", "--start-range", "+1h..+2h"),
        (*ONE_HOUR, "--every", "1d", "--until", "+1x"),
        ("node", "cordon", "west-01", "--from", "+2h", "--until", "+1h"),
        ("node", "cordon", "west-01", "--from", "+1h", "--until", "+1q"),
    ):
        err = run.fails(2, *args, now=None)
        assert err["code"] == "INVALID_INPUT", args
    assert run.ok("events") == before


def test_update_start_counts_as_reserves_does(run: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the instant the write acts at without --now; from --now when given."""
    rsv = run.ok(*ONE_HOUR, "--start", "+2h")
    _another_admin_moves_the_ledger_first(run, monkeypatch)
    moved = run.ok("update", rsv["id"], "--start", "+1h", now=None)
    assert moved["start"] == NOW_MS + 80 * MINUTE
    err = run.fails(2, "update", rsv["id"], "--start", "+10m", now=NOW)
    assert "is in the past" in err["message"]  # NOW + 10m, and the ledger stands at NOW + 20m
    assert run.ok("update", rsv["id"], "--start", "+1h", now=NOW)["start"] == NOW_MS + HOUR


@pytest.mark.sqlite_only(reason="holds SQLite's write lock from another connection")
def test_bad_input_is_refused_at_once_while_another_writer_holds_the_lock(run: Cli) -> None:
    """Read again under the lock, these are still judged first as the command opens the ledger:
    INVALID_INPUT at once, not UNAVAILABLE ("try again") after the busy timeout (a review)."""
    run.ok("config", "set", "db.busyTimeoutMs", "200")
    holder = sqlite3.connect(run.db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        for args in (
            ("node", "cordon", "west-01", "--from", "2026-10-05T00:00:00Z", "--until", "+1h"),
            ("node", "cordon", "west-01", "--from", "+2h", "--until", "+1h"),
            (*ONE_HOUR, "--start", "9999-12-31T23:30:00Z"),
            (*ONE_HOUR, "--start", "-3000w"),
            (*ONE_HOUR, "--every", "1d", "--until", "+417000w"),
        ):
            for now in (None, NOW):
                assert run.fails(2, *args, now=now)["code"] == "INVALID_INPUT", (args, now)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_relative_until_is_judged_against_the_real_now(run: Cli) -> None:
    """`+250000w` lands in year 6818: read against the middle of the range before the ledger
    was opened, it was refused as out of range (a review)."""
    rows = run.ok(
        *ONE_HOUR,
        *("--every", "52000w", "--until", "+250000w"),
    )
    assert len(rows) == 5
    doc = run.ok(*ONE_HOUR, "--start", "+250000w")
    assert doc["start"] == NOW_MS + 250_000 * 7 * 24 * HOUR


def test_a_start_range_under_now_counts_from_it(run: Cli) -> None:
    run.ok("tick", "--until", "+2h", "--step", "1h")
    doc = run.ok(*ONE_HOUR, "--start-range", "+3h..+4h")
    assert doc["start"] == NOW_MS + 3 * HOUR  # from --now, not from the ledger's NOW + 2h


@pytest.mark.sqlite_only(reason="holds SQLite's write lock from another connection")
def test_what_is_past_as_the_command_opens_the_ledger_is_refused_at_once(run: Cli) -> None:
    """Past then is past under the lock (time only moves on; a relative TIME moves with it), so
    these are refused without waiting for it (a review: each waited, then exited UNAVAILABLE)."""
    rsv = run.ok(*ONE_HOUR, "--start", "+2h")
    run.ok("config", "set", "db.busyTimeoutMs", "200")
    holder = sqlite3.connect(run.db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        for args, says in (
            (("node", "cordon", "west-01", "--from", "-3h", "--until", "-1h"), "has passed"),
            (("update", rsv["id"], "--start", "-3h"), "is in the past"),
            ((*ONE_HOUR, "--start-range", "-5h..-2h"), "before now"),
            ((*ONE_HOUR, "--start-range", "+2h..+1h"), "FROM must not be after TO"),
            ((*ONE_HOUR, "--start-range", "+1h..+600000w"), "out of range"),
        ):
            for now in (None, NOW):
                assert says in run.fails(2, *args, now=now)["message"], (args, now)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
