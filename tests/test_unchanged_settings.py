"""Setting a pool's auto-bind, a quota, a GPU-hour budget, a policy or a pool's calendar policy
to what is stored for it changes nothing: no write, no event, no webhook (README, "A change to
what already is so changes nothing"; a review found each logged again)."""

from __future__ import annotations

import pytest
from conftest import Cli

SETTINGS = [
    ("pool", "set", "west", "--auto-bind", "on"),
    ("quota", "set", "--tenant", "acme", "--gpus", "40"),
    ("quota", "set", "--tenant", "globex", "--gpu-hours", "12", "--period", "1d"),
    ("policy", "set", "--tenant", "acme", "--principal", "p1", "--max-gpus", "4"),
    ("pool", "policy", "set", "west", "--min-lead", "1h"),
]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: " ".join(s[:2]))
def test_setting_what_is_stored_logs_nothing(run: Cli, setting: tuple[str, ...]) -> None:
    run.ok(*setting)
    before = run.ok("events")
    run.ok(*setting)
    assert run.ok("events") == before


def test_a_change_is_still_logged(run: Cli) -> None:
    run.ok("quota", "set", "--tenant", "acme", "--gpus", "40")
    before = len(run.ok("events"))
    run.ok("quota", "set", "--tenant", "acme", "--gpus", "41")
    run.ok("pool", "set", "west", "--auto-bind", "off")
    run.ok("policy", "set", "--tenant", "acme", "--principal", "p1", "--spot-only")
    after = run.ok("events")[before:]
    assert [e["type"] for e in after] == ["quota.set", "pool.updated", "policy.set"]
