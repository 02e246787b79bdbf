"""Calendar policies at their edges (a hostile review, 2026-12-01).

- `extend` is judged by the pool's calendar policy as `update` is: before, booking the longest
  allowed window and then extending it went past the maximum duration and horizon.
- `--start now` (or a start already past) is a request for now, as the README says: the policy
  does not judge it and a `--commit` policy does not make it final, as with no --start.
"""

from __future__ import annotations

from conftest import DAY, HOUR, NOW_MS, Cli, at


def _policy(solo: Cli, *limits: str) -> None:
    solo.ok("pool", "policy", "set", "solo", *limits)


def _reserve(solo: Cli, key: str, *args: str) -> dict[str, object]:
    out: dict[str, object] = solo.ok(
        "reserve", "--tenant", "acme", "--gpus", "1", "--key", key, *args
    )
    return out


def test_extend_stays_within_the_maximum_duration_and_horizon(solo: Cli) -> None:
    _policy(solo, "--max-duration", "1d", "--max-horizon", "2d", "--min-lead", "1h")
    rsv = _reserve(solo, "k", "--for", "20h", "--start", "+1d")
    error = solo.fails(2, "extend", rsv["id"], "--by", "5d")
    assert "at most 1d" in error["message"] and "nothing was changed" in error["message"]
    assert solo.ok("get", rsv["id"])["during"] == rsv["during"]
    grown = solo.ok("extend", rsv["id"], "--by", "4h")  # exactly the longest allowed
    assert grown["durationMs"] == 24 * 3600_000
    error = solo.fails(2, "extend", rsv["id"], "--by", "1ms")
    assert "at most 1d" in error["message"]
    # The horizon: a later start whose longer end would pass now + 2d.
    late = _reserve(solo, "late", "--for", "3h", "--start", "+1d20h")
    error = solo.fails(2, "extend", late["id"], "--by", "2h")
    assert "beyond the maximum horizon 2d" in error["message"]
    assert solo.ok("extend", late["id"], "--by", "1h")["durationMs"] == 4 * 3600_000  # to 2d


def test_a_request_for_now_is_never_judged_and_its_extension_neither(solo: Cli) -> None:
    _policy(solo, "--max-duration", "1h", "--min-lead", "1h")
    rsv = _reserve(solo, "now", "--for", "2h")
    assert solo.ok("extend", rsv["id"], "--by", "1h")["durationMs"] == 3 * 3600_000


def test_start_now_is_the_same_request_as_no_start(solo: Cli) -> None:
    _policy(solo, "--min-lead", "1h", "--max-duration", "1h", "--commit")
    spelled = _reserve(solo, "a", "--for", "2h", "--start", "now")
    assert spelled["start"] is None and spelled["state"] == "placed"
    assert _reserve(solo, "a", "--for", "2h")["id"] == spelled["id"]  # the key's same request
    assert solo.ok("preview", "--tenant", "acme", "--gpus", "1", "--for", "2h", "--start", "now")[
        "fits"
    ]
    past = _reserve(solo, "b", "--for", "2h", "--start", "2026-01-01T00:00:00Z")
    assert past["start"] is None and past["during"]["start"] == spelled["during"]["start"]
    # Not made final by --commit: a request for now never was a calendar request.
    assert solo.ok("cancel", spelled["id"])["releaseReason"] == "cancelled"
    # A real calendar request is still judged.
    error = solo.fails(
        2, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "30m", "--start", "+30m"
    )
    assert "minimum lead time 1h" in error["message"]


def test_a_series_first_occurrence_is_still_a_calendar_request(solo: Cli) -> None:
    """--every makes every occurrence a calendar request, the first at now included."""
    _policy(solo, "--max-duration", "2h", "--commit")
    rows = solo.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--every", "1d",
                   "--count", "2", "--key", "ser")  # fmt: skip
    assert rows[0]["start"] is not None
    assert "--commit" in solo.fails(4, "cancel", rows[0]["id"])["message"]
    _policy(solo, "--min-lead", "1h")
    error = solo.fails(2, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--every",
                       "1d", "--count", "2")  # fmt: skip
    assert "minimum lead time" in error["message"]


def test_a_series_asked_with_a_clock_behind_the_ledger_books_from_now(solo: Cli) -> None:
    """A CI job's --now behind cron's ticks: the ledger acts at its own time (§2), so the
    series' first occurrence (`--start +1h` of the job's clock) is already past. Under a policy
    with no lead time it books from now, as on a pool with no policy; it was INTERNAL (an
    assertion that a start too soon meant a lead time). With a lead time it is refused."""
    _policy(solo, "--min-duration", "1h")
    solo.ok("tick", "--until", at(3 * HOUR), "--step", "30m")
    args = ["--for", "2h", "--start", "+1h", "--every", "1d", "--count", "2"]
    first, second = solo.ok("reserve", "--tenant", "acme", "--gpus", "1", "--key", "late", *args)
    assert first["start"] == NOW_MS + HOUR
    assert first["during"] == {"start": NOW_MS + 3 * HOUR, "end": NOW_MS + 5 * HOUR}
    assert second["during"]["start"] == NOW_MS + HOUR + DAY
    _policy(solo, "--min-lead", "30m")
    error = solo.fails(2, "reserve", "--tenant", "acme", "--gpus", "1", "--key", "lead", *args)
    assert "minimum lead time 30m" in error["message"]
    # The horizon judges the window as booked, from now: a past start does not pull its end in.
    _policy(solo, "--max-horizon", "30m")
    # Two occurrences begun (both past) would both be booked from now, one on the other:
    # refused. One begun is booked from now, as the policy's refusal here shows.
    for every, said in [
        (
            "3h",
            "occurrence 1 (2026-09-28T09:00:00Z): pool solo's calendar policy: end"
            " 2026-09-28T12:00:00Z is beyond the maximum horizon 30m (end at"
            " 2026-09-28T11:30:00Z or sooner); nothing of the series was booked",
        ),
        (
            "1h",
            "--start 2026-09-28T09:00:00Z is before the ledger's time 2026-09-28T11:00:00Z, and"
            " the next occurrence's, 2026-09-28T10:00:00Z, is not after it: booked from now, they"
            " would run into each other; give a later --start, or none to begin now",
        ),
    ]:
        series = ["--for", "1h", "--start", "+1h", "--every", every, "--count", "2"]
        error = solo.fails(2, "reserve", "--tenant", "acme", "--gpus", "1", "--key", every, *series)
        assert error["message"] == said


def test_update_start_now_is_a_request_for_now_too(solo: Cli) -> None:
    rsv = _reserve(solo, "b", "--for", "1h", "--start", "+2h")
    _policy(solo, "--min-lead", "1h")
    moved = solo.ok("update", rsv["id"], "--start", "now")
    assert moved["start"] is None and moved["during"]["start"] == solo.ok("tick")["now"]


def test_a_series_started_days_ago_is_refused_not_stacked_at_now(solo: Cli) -> None:
    """Its past occurrences would each be booked from now, on top of one another."""
    series = ["--for", "2h", "--every", "1d", "--count", "5", "--key", "past"]
    error = solo.fails(
        2, "reserve", "--tenant", "acme", "--gpus", "1", "--start", at(-3 * DAY + HOUR), *series
    )
    assert "is before the ledger's time" in error["message"], error
    assert "they would run into each other" in error["message"]
    assert solo.ok("list") == []
    error = solo.fails(2, "reserve", "--tenant", "acme", "--gpus", "1", "--start-range",
                       "+1h..+1d", "--key", "r")  # fmt: skip
    assert "--duration-range MIN..MAX" in error["message"]


def test_a_back_to_back_series_from_now_books_with_a_clock_behind_the_ledger(solo: Cli) -> None:
    """`--start now` is read from the command's clock, a moment (or, here, 30 minutes) before
    the ledger's: its first occurrence is booked from now, and the series is not refused. It
    ends when the next one starts: booked for its whole hour, it ran into the next one, holding
    the series' GPUs twice meanwhile, and a series of the whole pool refused itself (a review)."""
    solo.ok("tick", "--until", at(30 * 60_000), "--step", "30m")
    series = ["--for", "1h", "--every", "1h", "--count", "3", "--start", "now", "--key", "b2b"]
    booked = solo.ok("reserve", "--tenant", "acme", "--gpus", "8", *series)  # the whole node
    assert [r["state"] for r in booked] == ["placed"] * 3
    assert booked[0]["during"] == {"start": NOW_MS + 30 * 60_000, "end": NOW_MS + HOUR}
    assert [r["during"]["start"] for r in booked[1:]] == [NOW_MS + HOUR, NOW_MS + 2 * HOUR]
    assert [r["durationMs"] for r in booked] == [30 * 60_000, HOUR, HOUR]
    # the same command again is the same series (its key compares the command as written)
    assert solo.ok("reserve", "--tenant", "acme", "--gpus", "8", *series) == booked


def test_a_series_refused_whole_is_not_blamed_on_an_occurrence(run: Cli) -> None:
    """A calendar policy judges each occurrence, and its refusal names the one; a request no
    node could ever hold is refused as itself."""
    series = ["--for", "1h", "--start", "+1h", "--every", "1d", "--count", "2", "--key", "s"]
    error = run.fails(2, "reserve", "--tenant", "acme", "--gpus", "8", "--gang", "5",
                      "--topology-key", "rack", *series)  # fmt: skip
    assert error["message"].startswith("--gang 5 --topology-key rack: at most 4"), error
    run.ok("pool", "policy", "set", "west", "--max-horizon", "1d")
    error = run.fails(2, "reserve", "--tenant", "acme", "--gpus", "8", *series)
    assert error["message"].startswith("occurrence 2 (2026-09-29T09:00:00Z): pool west's"), error
    assert error["message"].endswith("; nothing of the series was booked")
    assert run.ok("list") == []
