"""`tick --until +10m` while another writer moves the ledger on (a hostile review, 2026-12-03):
two admins advancing time at once made one of them exit INVALID_INPUT "--until … is before the
ledger's time", 1 or 2 runs in 60, because `+10m` was read against the instant the command
opened the ledger at, before its write lock. A relative --until now counts from the instant the
command first acts at, which is read with the lock held (PRODUCT.md §2)."""

from __future__ import annotations

from typing import Any

import pgtest
import pytest
from conftest import ME, NOW_MS, Cli

from better_compute.model import Event
from better_compute.service import ticking
from better_compute.service.context import Ctx, open_ctx
from better_compute.timeparse import parse_time

MINUTE = 60_000


def _plus_10m(base: int) -> int:
    """What the CLI passes for `--until +10m`."""
    return parse_time("+10m", base)


def _another_admin_moves_the_ledger_first(run: Cli, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Before the first tick of the command under test takes the lock, another admin's `tick
    --until +20m` (run in this process, through the same hook) commits. Returns the instants
    the command under test's own ticks act at, filled as it runs."""
    one_tick = ticking.tick
    acted: list[int] = []
    nested: list[bool] = []

    def another_admin_first(step: Ctx, **kw: Any) -> list[Event]:
        if not nested:
            nested.append(True)
            run.ok("tick", "--until", "+20m", "--step", "10m")
            nested.append(False)
        got = one_tick(step, **kw)
        if not nested[-1]:  # not the other admin's own ticks
            acted.append(step.now)
        return got

    monkeypatch.setattr(ticking, "tick", another_admin_first)
    return acted


def test_a_relative_until_counts_from_the_ledgers_time_when_it_moved_before(run: Cli) -> None:
    ctx = open_ctx(pgtest.ledger(str(run.db)), None, ME, None)  # opened at NOW
    try:
        run.ok("tick", "--until", "+20m", "--step", "10m")  # another admin, meanwhile
        ticking.tick_until(ctx, _plus_10m, 5 * MINUTE)
    finally:
        ctx.db.close()
    assert ctx.now == NOW_MS + 30 * MINUTE
    assert run.ok("tick")["now"] == NOW_MS + 30 * MINUTE


def test_a_relative_until_counts_from_where_the_first_tick_acted(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other writer commits after this command read the ledger's time, before its first
    tick takes the lock: the first tick acts at the ledger's time, and +10m counts from it."""
    ctx = open_ctx(pgtest.ledger(str(run.db)), None, ME, None)
    acted = _another_admin_moves_the_ledger_first(run, monkeypatch)
    try:
        ticking.tick_until(ctx, _plus_10m, 5 * MINUTE)
    finally:
        ctx.db.close()
    assert acted == [NOW_MS + (20 + m) * MINUTE for m in (0, 5, 10)]
    assert ctx.now == NOW_MS + 30 * MINUTE


@pytest.mark.parametrize("until", [str(NOW_MS + 5 * MINUTE), "2026-09-28T08:05:00Z"])
def test_an_absolute_until_the_ledger_passed_while_waiting_acts_once_and_succeeds(
    run: Cli, monkeypatch: pytest.MonkeyPatch, until: str
) -> None:
    """An instant written out is not moved (a review of the fix above: it was, and the command
    wrote its first tick, then exited INVALID_INPUT). As before that fix, the tick that finds the
    ledger past the instant acts at the ledger's time, and the rest add nothing."""
    assert parse_time("2026-09-28T08:05:00Z", 0) == NOW_MS + 5 * MINUTE
    acted = _another_admin_moves_the_ledger_first(run, monkeypatch)
    doc = run.ok("tick", "--until", until, "--step", "1m", now=None)
    assert doc["now"] == NOW_MS + 20 * MINUTE
    assert set(acted) == {NOW_MS + 20 * MINUTE}


def test_an_absolute_until_or_one_relative_to_now_given_stays_where_it_was(run: Cli) -> None:
    """Only a relative --until without --now moves: an instant written out, or `+10m` from a
    `--now` the command was given, is still refused once the ledger is past it."""
    run.ok("tick", "--until", "+20m", "--step", "10m")
    for until in (str(NOW_MS + 10 * MINUTE), "+10m"):
        err = run.fails(2, "tick", "--until", until)
        assert "is before the ledger's time" in err["message"]
    assert run.ok("tick", "--until", "+10m", now=None)["now"] == NOW_MS + 30 * MINUTE
