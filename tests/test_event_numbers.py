"""Events are numbered 1, 2, 3, … on both backends, whatever rolled back in between.

A PostgreSQL identity column spends its values in transactions that roll back, so a series that
did not fit (or a killed command) left gaps in its log that SQLite's has not: `events --json`,
and the `seq` of webhook deliveries, differed by backend for the same commands (PRODUCT.md §2).
"""

from __future__ import annotations

from conftest import Cli


def test_a_write_that_rolls_back_leaves_no_gap_in_the_event_numbers(run: Cli) -> None:
    start = "2026-09-29T10:00:00Z"
    run.ok("reserve", "--tenant", "acme", "--gpus", 8, "--gang", 7, "--for", "2h", "--start", start)
    before = [e["seq"] for e in run.ok("events")]
    series = ["--gpus", 1, "--for", "2h", "--start", "2026-09-28T10:00:00Z", "--every", "1d"]
    assert run.fails(4, "reserve", "--tenant", "globex", *series, "--count", 2)
    assert [e["seq"] for e in run.ok("events")] == before  # nothing of it was written
    run.ok("reserve", "--tenant", "globex", "--gpus", 1, "--for", "1h")
    seqs = [e["seq"] for e in run.ok("events")]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > len(before)
