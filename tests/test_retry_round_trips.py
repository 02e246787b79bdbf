"""A replay of demand that waits: every pending request is retried every 30 s (§5.4), and each
retry used to ask the ledger the same questions again. On PostgreSQL each is a round trip, so a
400-request workload on a 3-node pool took 20 minutes there against a minute on SQLite (a
hostile review). Now, within one transaction, the pool's row lock is taken once
(storage/locks.lock_pool, memoised until the transaction ends or a savepoint rolls back), the
ledger's id is read once per command step (Ctx.db_id), and the fleet in memory asks the event
log only after this process appended an event (service/fleet.Fleet._catch_up).

These tests count the questions and check the answers did not change: the same report and the
same ledger as one request at a time through the CLI (tests/test_simulate.py compares those).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import Cli
from test_simulate import small_fleet, without_machine, write_jsonl

from better_compute.storage import simulation


def _crowded(db_dir: Path) -> Path:
    """Four requests that fill the pool's four nodes for an hour, then twenty that wait."""
    first = {"at": "+0s", "tenant": "acme", "gpus": 4, "duration": "1h"}
    lines: list[dict[str, Any]] = [first] * 4
    lines += [
        {"at": f"+{i + 1}m", "tenant": "acme", "gpus": 4, "duration": "5m"} for i in range(20)
    ]
    return write_jsonl(db_dir / "crowded.jsonl", lines)


def test_waiting_requests_ask_the_event_log_only_after_a_change(
    db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = small_fleet(db_dir / "sim.db")
    pool = fleet.ok("pool", "show", "small")
    assert pool["allocatable"] == 16, "four nodes of 4: the first four requests fill them"
    asked = [0]
    real = simulation.touched_since

    def counted(*args: Any, **kwargs: Any) -> Any:
        asked[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(simulation, "touched_since", counted)
    report = fleet.ok("simulate", "--workload", _crowded(db_dir), "--format", "jsonl")
    assert (report["placedAtOnce"], report["placedAfterWaiting"]) == (4, 20)
    # Over the hour, about 120 ticks retry up to 20 requests each: thousands of retries, but
    # the log is asked only when something was written (a placement, a release, a notice).
    assert asked[0] < 200, asked[0]


@pytest.mark.sqlite_only(reason="copies the ledger file")
def test_the_crowded_replay_is_the_same_as_before_the_memos(
    db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memos change no answer: the replay with the event log asked before every attempt
    (the fleet told nothing was appended is the old path) gives the same report and events."""
    fleet = small_fleet(db_dir / "sim.db")
    copy = Cli(db_dir / "copy.db")
    fleet.ok("backup", copy.db)
    workload = _crowded(db_dir)
    fast = fleet.ok("simulate", "--workload", workload, "--format", "jsonl")
    from better_compute.storage import repo

    ticks = iter(range(10**9))
    monkeypatch.setattr(repo, "events_appended", lambda: next(ticks))  # never the same count
    slow = copy.ok("simulate", "--workload", workload, "--format", "jsonl")
    assert without_machine(fast) == without_machine(slow)
    assert fleet.ok("events") == copy.ok("events")
    assert fleet.ok("list") == copy.ok("list")
