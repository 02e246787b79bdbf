"""GPU-hour budgets over a rolling period (issue 12): `quota set --gpu-hours H --period P`."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import DAY, NOW_MS, Cli, at
from test_trust import be

from better_compute.timeparse import iso


def reserve(cli: Cli, gpus: int, start: str, hours: int, *extra: str) -> Any:
    args = ("reserve", "--tenant", "acme", "--gpus", gpus, "--start", start, "--for", f"{hours}h")
    return cli.ok(*args, *extra)


def refused(cli: Cli, gpus: int, start: str, hours: int, *extra: str) -> str:
    args = ("reserve", "--tenant", "acme", "--gpus", gpus, "--start", start, "--for", f"{hours}h")
    return cli.fails(5, *args, *extra)["message"]


def test_budget_admission_at_the_periods_edges(run: Cli) -> None:
    run.ok("quota", "set", "--tenant", "acme", "--gpu-hours", "100", "--period", "1d")
    a = reserve(run, 8, "now", 12)  # [0, 12h): 96 GPU-hours
    b = reserve(run, 4, "now", 1)  # [0, 1h): 4 more, exactly the budget
    # [23h, 24h): the day ending at 24h holds all 100 already
    msg = refused(run, 1, "+23h", 1)
    assert msg == (
        "tenant 'acme' has booked 100 of its 100 GPU-hour budget in all pools over the 1d ending"
        f" {iso(NOW_MS + DAY)}; this request needs 1 more"
    )
    # [24h, 25h): the day ending at 25h starts at 1h, so b (ending at 1h) is out and a counts 88
    msg = refused(run, 7, "+24h", 1, "--gang", "2")
    assert msg.startswith("tenant 'acme' has booked 88 of its 100") and "needs 14 more" in msg
    c = reserve(run, 6, "+24h", 1, "--gang", "2")  # 88 + 12 = 100 again: admitted
    # only bookings inside the period count: a request ending at 1h sees 8 + 4 of a and b
    d = reserve(run, 1, "now", 1)
    assert refused(run, 1, "+12h", 1).startswith("tenant 'acme' has booked 101 of its 100")
    # a cancelled booking gives its GPU-hours back; a changed one is judged on its new shape
    run.ok("cancel", b["id"])
    e = reserve(run, 1, "+12h", 1)  # 96 + 1 (d) + 1
    err = run.fails(5, "update", c["id"], "--gpus", "7")
    assert "has booked 89 of its 100" in err["message"] and "needs 14 more" in err["message"]
    assert run.ok("get", c["id"])["allocations"] == c["allocations"]
    err = run.fails(5, "extend", a["id"], "--by", "3h")  # a 96, d 1, e 1 in [−9h, 15h)
    assert "has booked 98 of its 100" in err["message"] and "needs 24 more" in err["message"]
    assert (
        run.fails(
            5, "preview", "--tenant", "acme", "--gpus", "3", "--for", "1h", "--start", "+23h"
        )["code"]
        == "QUOTA_EXCEEDED"
    )
    shown = run.ok("quota", "show", "--tenant", "acme")
    assert shown["budgets"] == [
        {
            "poolId": None,
            "pool": None,
            "gpuHours": 100,
            "periodMs": DAY,
            "used": 0,
            "remaining": 100,
            "bookedAhead": 98,  # a 96, d 1, e 1 in [now, now + 1d)
        }
    ]
    # a day later, what was used in the last day is spent
    run.ok("tick", now=at(DAY))
    later = run.ok("quota", "show", "--tenant", "acme", now=at(DAY))["budgets"][0]
    assert (later["used"], later["remaining"], later["bookedAhead"]) == (98, 2, 12)
    assert {r["id"] for r in run.ok("list")} >= {a["id"], c["id"], d["id"], e["id"]}


def test_a_pool_budget_and_pending_requests_count(run: Cli) -> None:
    run.ok("quota", "set", "--tenant", "acme", "--pool", "west", "--gpu-hours", "10.5")
    doc = run.ok("quota", "show", "--tenant", "acme")
    assert doc["budgets"][0]["pool"] == "west" and doc["budgets"][0]["periodMs"] == 30 * DAY
    assert doc["quotas"][0]["gpus"] == 64  # the GPUs cap stays beside it
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "100")
    run.ok("reserve", "--tenant", "globex", "--gpus", "8", "--gang", "7", "--for", "1d")
    waiting = reserve(run, 5, "now", 2)
    assert waiting["state"] == "pending"  # promised 10 GPU-hours, though nothing is booked
    msg = refused(run, 1, "now", 2)
    assert "has booked 10 of its 10.5 GPU-hour budget in pool west over the 30d" in msg
    assert msg.endswith("needs 2 more")


@pytest.mark.sqlite_only(
    reason="acts as another OS user; on PostgreSQL the principal is the role (test_postgres)"
)
def test_quota_set_flags(run: Cli, monkeypatch: Any) -> None:
    def bad(*flags: str) -> str:
        return run.fails(2, "quota", "set", "--tenant", "acme", *flags)["message"]

    assert "give --gpus N, --gpu-hours H, or both" in bad()
    assert "add --gpu-hours" in bad("--period", "7d")
    assert "--gpu-hours must be from 0" in bad("--gpu-hours", "-1")
    assert "--period must be from 1h to 366d" in bad("--gpu-hours", "1", "--period", "30m")
    assert "--period must be from 1h to 366d" in bad("--gpu-hours", "1", "--period", "400d")
    assert run.ok("quota", "show", "--tenant", "acme")["budgets"] == []
    both = run.ok("quota", "set", "--tenant", "acme", "--gpus", "8", "--gpu-hours", "5")
    assert both["quotas"][0]["gpus"] == 8 and both["budgets"][0]["gpuHours"] == 5
    ev = run.ok("events")[-1]
    assert ev["type"] == "quota.set"
    assert ev["data"] == {"poolId": None, "gpuHours": 5, "periodMs": 30 * DAY, "by": ev["actor"]}
    run.ok("policy", "set", "--tenant", "acme", "--principal", "alice")
    be(monkeypatch, "alice")
    assert run.fails(6, "quota", "set", "--tenant", "acme", "--gpu-hours", "9")["code"] == (
        "FORBIDDEN"
    )
    assert run.ok("quota", "show", "--tenant", "acme")["budgets"][0]["gpuHours"] == 5
