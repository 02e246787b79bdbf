"""GPU-hour budgets over a rolling period (issue 12): `quota set --gpu-hours H --period P`."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import DAY, MIN, NOW_MS, Cli, at
from hypothesis import given
from hypothesis import strategies as st
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
    # Every rolling day the request reaches into must hold it, not only the one ending at its
    # end: [0, 1h) ends a day holding 13, but the day [0, 24h) would hold 101.
    msg = refused(run, 1, "now", 1)
    assert msg == (
        "tenant 'acme' has booked 100 of its 100 GPU-hour budget in all pools over the 1d ending"
        f" {iso(NOW_MS + DAY)}; this request needs 1 more"
    )
    assert refused(run, 1, "+12h", 1).startswith("tenant 'acme' has booked 100 of its 100")
    # a cancelled booking gives its GPU-hours back; a changed one is judged on its new shape
    run.ok("cancel", b["id"])
    d = reserve(run, 1, "now", 1)  # the day [0, 24h) holds 97, [1h, 25h) 100: admitted
    err = run.fails(5, "update", c["id"], "--gpus", "7")  # [1h, 25h): a 88 + 14
    assert "has booked 88 of its 100" in err["message"] and "needs 14 more" in err["message"]
    assert run.ok("get", c["id"])["allocations"] == c["allocations"]
    err = run.fails(5, "extend", a["id"], "--by", "3h")  # [1h, 25h): a 88, c 12, + 24
    assert "has booked 100 of its 100" in err["message"] and "needs 24 more" in err["message"]
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
            "bookedAhead": 97,  # a 96, d 1 in [now, now + 1d)
        }
    ]
    # a day later, what was used in the last day is spent
    run.ok("tick", now=at(DAY))
    later = run.ok("quota", "show", "--tenant", "acme", now=at(DAY))["budgets"][0]
    assert (later["used"], later["remaining"], later["bookedAhead"]) == (97, 3, 12)
    assert {r["id"] for r in run.ok("list")} >= {a["id"], c["id"], d["id"]}


def test_no_rolling_period_goes_over_whatever_the_order_of_booking() -> None:
    """The reviewer's ways past a budget checked only at the period ending at the request's end:
    a shorter job after a long one, and the later window booked first."""
    from better_compute.model import Window
    from better_compute.service.budgets import fullest_period

    h = 3_600_000
    long_then_short = [(0, 10 * h, 1), (0, h, 8)]  # 10 + 8 GPU-hours inside one day
    assert fullest_period(long_then_short, Window(0, h), 24 * h)[1] == 18 * h
    later_first = [(48 * h, 58 * h, 1), (38 * h, 48 * h, 1)]
    assert fullest_period(later_first, Window(38 * h, 48 * h), 24 * h)[1] == 20 * h


@given(
    st.lists(st.tuples(st.integers(0, 60), st.integers(1, 30), st.integers(1, 4)), max_size=8),
    st.integers(0, 60),
    st.integers(1, 30),
    st.integers(1, 40),
)
def test_the_fullest_period_is_the_most_any_period_holds(
    spans: list[tuple[int, int, int]], start: int, length: int, period: int
) -> None:
    """The sweep agrees with trying every period [t, t + p) that meets the window."""
    from better_compute.model import Window
    from better_compute.service.budgets import fullest_period

    window = Window(start, start + length)
    spans = [(s, s + d, n) for s, d, n in spans] + [(start, start + length, 1)]

    def held(t: int) -> int:
        return sum(n * max(0, min(e, t + period) - max(s, t)) for s, e, n in spans)

    t, most = fullest_period(spans, window, period)
    assert window.start - period < t < window.end and held(t) == most
    assert most == max(held(u) for u in range(window.start - period + 1, window.end))


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
    reason=(
        "acts as another OS user (test_trust.be); on PostgreSQL the principal is the"
        " server's role, tested with real roles in test_postgres.py"
    )
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


def test_a_pending_reservation_placed_later_is_judged_on_its_budget_again(run: Cli) -> None:
    """Admission counts a pending request as placed at once; a retry that places it later
    lands its GPU-time in other periods, which a booking made since may have filled."""
    run.ok("quota", "set", "--tenant", "acme", "--gpu-hours", "8", "--period", "2h")
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "100")
    run.ok("reserve", "--tenant", "globex", "--gpus", "8", "--gang", "7", "--for", "75m")
    a = reserve(run, 8, "now", 1)
    assert a["state"] == "pending"  # promised [0, 1h): 8 GPU-hours
    b = reserve(run, 8, "+2h", 1)  # [2h, 3h): no 2h period holds both: admitted
    assert b["state"] == "placed"
    run.ok("tick", now=at(75 * MIN))  # the pool is free; from 75m, a would share a period with b
    got = run.ok("get", a["id"], now=at(75 * MIN))
    assert got["state"] == "pending"
    assert got["conditions"][0]["reason"] == "BudgetExceeded"
    assert got["conditions"][0]["message"].startswith("tenant 'acme' has booked 8 of its 8")
    assert got["allocations"] == []  # nothing booked: b alone holds the period's 8
    # once b is given back, the next retry places it
    run.ok("cancel", b["id"], now=at(80 * MIN))
    run.ok("tick", now=at(90 * MIN))
    placed = run.ok("get", a["id"], now=at(90 * MIN))
    assert (
        placed["state"] in ("placed", "active") and placed["during"]["start"] == NOW_MS + 90 * MIN
    )


def _waiting_on_its_budget(run: Cli, until: int) -> Any:
    """acme's 8 GPUs for an hour, waiting for room (globex's gang fills the pool for 75 min),
    then past its 8 GPU-hour budget over 2 h from where it would fit (its next booking at +2h),
    ticked every 30 s until `until` ms after NOW: the reservation as it was made."""
    run.ok("quota", "set", "--tenant", "acme", "--gpu-hours", "8", "--period", "2h")
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "200")
    run.ok("reserve", "--tenant", "globex", "--gpus", "8", "--gang", "7", "--for", "75m")
    a = reserve(run, 8, "now", 1)
    reserve(run, 8, "+2h", 1)
    run.ok("tick", "--until", at(until), "--step", "30s", now=at(0))
    return a


def test_a_wait_on_a_budget_writes_one_event_however_its_figures_move(run: Cli) -> None:
    """Retried every 30 s, a request held back by its budget says so once: the figures in its
    message move with time (how much more it needs, the period's end) but its condition does
    not (a review counted 21 `reservation.pending` in ten minutes); `get` shows the latest."""
    a = _waiting_on_its_budget(run, until=100 * MIN)
    events = run.ok("events", "--reservation", a["id"], now=at(100 * MIN))
    pending = [e["data"]["reason"] for e in events if e["type"] == "reservation.pending"]
    assert pending == ["NoCapacity", "BudgetExceeded"]
    got = run.ok("get", a["id"], now=at(100 * MIN))
    assert got["conditions"][0]["reason"] == "BudgetExceeded"


def test_a_budget_wait_that_becomes_a_wait_for_room_says_so(run: Cli) -> None:
    """Past its budget, a retry that then finds no room waits NoCapacity, with an event: not
    BudgetExceeded with a capacity message and no event (a review)."""
    a = _waiting_on_its_budget(run, until=5 * MIN)
    assert run.ok("get", a["id"], now=at(5 * MIN))["conditions"][0]["reason"] == "BudgetExceeded"
    later = iso(NOW_MS + 75 * MIN)  # the pool full again from where the first gang ends
    run.ok("reserve", "--tenant", "globex", "--gpus", "8", "--gang", "7", "--for", "5h",
           "--start", later, now=at(5 * MIN))  # fmt: skip
    run.ok("quota", "set", "--tenant", "acme", "--gpu-hours", "1000", "--period", "2h",
           now=at(5 * MIN))  # fmt: skip
    run.ok("tick", "--until", at(10 * MIN), "--step", "30s", now=at(5 * MIN))
    got = run.ok("get", a["id"], now=at(10 * MIN))["conditions"][0]
    assert got["reason"] == "NoCapacity" and got["message"].startswith("no node fits")
    events = run.ok("events", "--reservation", a["id"], now=at(10 * MIN))
    pending = [e["data"]["reason"] for e in events if e["type"] == "reservation.pending"]
    assert pending == ["NoCapacity", "BudgetExceeded", "NoCapacity"]


def test_a_request_placed_from_a_preemption_deadline_is_judged_there(run: Cli) -> None:
    """Admitted for a window from now, a request that preempts spot work books from the
    notice's deadline: where its GPU-time may take the tenant over its budget. Then it waits
    `BudgetExceeded` (it said NoCapacity until its first retry), and preview promises no
    preemption (it did: a review)."""
    run.ok("config", "set", "capacity.spotNoticeMs", str(30 * MIN))
    run.ok("quota", "set", "--tenant", "acme", "--gpu-hours", "8", "--period", "2h")
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "100")
    spot = ("--tenant", "globex", "--gpus", "8", "--gang", "7", "--for", "75m", "--spot")
    run.ok("reserve", *spot)
    b = reserve(run, 8, "+2h", 1)  # after the spot work: placed
    assert b["state"] == "placed"
    ask = ("--tenant", "acme", "--gpus", "8", "--for", "1h")
    seen = run.ok("preview", *ask)
    assert (seen["fits"], seen["preemptible"]) == (False, None)
    a = reserve(run, 8, "now", 1)  # [0, 1h) meets no period with b; [30m, 90m) would
    assert a["state"] == "pending" and a["conditions"][0]["reason"] == "BudgetExceeded"
    assert "has booked 8 of its 8" in a["conditions"][0]["message"]
    notices = ("reservation.preempting", "reservation.preempted")
    assert not [e for e in run.ok("events") if e["type"] in notices]


def test_a_refusal_shows_the_excess_that_hundredths_would_hide(run: Cli) -> None:
    """12 of 16 booked and a request of 4 GPU-hours and 1 s: to the hundredth it read "needs 4
    more", which fits exactly and would be admitted (a review); the figures get the places that
    show the excess, and a plain refusal keeps its hundredths."""
    run.ok("quota", "set", "--tenant", "acme", "--gpu-hours", "16", "--period", "1d")
    reserve(run, 4, "now", 3)
    args = ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "4h1s")
    msg = run.fails(5, *args)["message"]
    assert msg.startswith("tenant 'acme' has booked 12 of its 16") and "needs 4.0003 more" in msg
    assert "needs 5 more" in refused(run, 1, "now", 5)
    run.ok("quota", "set", "--tenant", "acme", "--gpu-hours", "0", "--period", "1d")
    msg = run.fails(5, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1s")["message"]
    assert "has booked 12 of its 0" in msg and "needs 0.0003 more" in msg


def test_json_and_events_carry_the_budget_enforced(run: Cli) -> None:
    """To the hundredth, a budget of 0.125 GPU-hours read 0.12 (and 0.004 read 0.0) in JSON and
    in its event, while the stored 0.125 was enforced (a review)."""
    run.ok("quota", "set", "--tenant", "globex", "--gpu-hours", "0.125", "--period", "1h")
    run.ok("reserve", "--tenant", "globex", "--gpus", "1", "--for", "7m30s")
    doc = run.ok("quota", "show", "--tenant", "globex")["budgets"][0]
    assert (doc["gpuHours"], doc["bookedAhead"]) == (0.125, 0.125)
    run.ok("quota", "set", "--tenant", "acme", "--gpu-hours", "0.004", "--period", "1h")
    events = [e for e in run.ok("events") if "gpuHours" in e["data"]]
    assert [e["data"]["gpuHours"] for e in events] == [0.125, 0.004]
