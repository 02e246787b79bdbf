"""`preview --start-range FROM..TO [--duration-range MIN..MAX]`: the same flags as reserve
(PRODUCT.md §5.2), answered for the window `reserve --start-range` would book; books nothing.

The demo pool `west` has 7 nodes of 8 h100 GPUs in two fabric domains (c1.1: 4 nodes, c1.2: 3).
"""

from __future__ import annotations

import pytest

from tests.conftest import DAY, HOUR, NOW_MS, Cli, at
from tests.test_advice_cli import fill_west, set_policy

INVALID, CONFLICT, QUOTA = 2, 4, 5
GANG = ["--tenant", "globex", "--gpus", "8", "--gang", "2"]
KEYS = {"fits", "candidates", "reason", "preemptible", "window", "search"}


def test_preview_answers_for_the_window_reserve_books(run: Cli) -> None:
    fill_west(run, hours=10)
    flags = [*GANG, "--start-range", "now..+2d", "--duration-range", "1h..5h"]
    doc = run.ok("preview", *flags)
    assert set(doc) == KEYS
    assert doc["fits"] is True and doc["reason"] is None and doc["preemptible"] is None
    assert doc["window"] == {"start": NOW_MS + 10 * HOUR, "end": NOW_MS + 15 * HOUR}
    assert doc["search"] == {
        "startRange": {"from": NOW_MS, "to": NOW_MS + 2 * DAY},
        "durationRange": {"min": HOUR, "max": 5 * HOUR},
    }
    assert len(doc["candidates"]) == 2  # the members of the best gang
    assert len(run.ok("list", "--tenant", "globex")) == 0  # it booked nothing
    rsv = run.ok("reserve", *flags, "--key", "sr")
    assert rsv["during"] == doc["window"]


def test_preview_with_a_fixed_length_and_a_range_that_began_in_the_past(run: Cli) -> None:
    fill_west(run, hours=6)
    doc = run.ok("preview", "--tenant", "globex", "--gpus", "4", "--start-range", "-1d..+1d",
                 "--for", "2h")  # fmt: skip
    assert doc["window"] == {"start": NOW_MS + 6 * HOUR, "end": NOW_MS + 8 * HOUR}
    assert doc["search"]["startRange"]["from"] == NOW_MS  # a range never starts before now
    assert doc["search"]["durationRange"] == {"min": 2 * HOUR, "max": 2 * HOUR}
    node, score, atoms = (doc["candidates"][0][k] for k in ("node", "score", "atoms"))
    assert node.startswith("west-") and len(atoms) == 4 and score > 0


def test_no_window_is_an_answer_not_an_error(run: Cli) -> None:
    fill_west(run, hours=48)
    doc = run.ok("preview", "--tenant", "globex", "--gpus", "1", "--start-range", "now..+1d",
                 "--for", "1h")  # fmt: skip
    assert doc["fits"] is False and doc["candidates"] == []
    assert doc["reason"].startswith("no window fits in pool west with a start from")
    assert doc["preemptible"] is None  # reserve --start-range never preempts
    assert doc["window"] == {"start": NOW_MS, "end": NOW_MS + HOUR}  # the first one asked for
    # reserve refuses the same request, and neither wrote anything
    err = run.fails(CONFLICT, "reserve", "--tenant", "globex", "--gpus", "1", "--start-range",
                    "now..+1d", "--for", "1h", "--key", "x")  # fmt: skip
    assert doc["reason"] in err["message"]
    assert run.ok("list", "--tenant", "globex") == []


def test_preview_without_a_range_keeps_its_answer(run: Cli) -> None:
    doc = run.ok("preview", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--start", "+1h")
    assert set(doc) == KEYS and doc["search"] is None and doc["fits"] is True
    assert doc["window"] == {"start": NOW_MS + HOUR, "end": NOW_MS + 2 * HOUR}


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--duration-range", "1h..2h"], "--start-range"),
        (["--start-range", "now..+1d", "--for", "1h", "--duration-range", "1h..2h"], "not both"),
        (["--start-range", "now..+1d", "--start", "+1h", "--for", "1h"], "not both"),
        (["--start-range", "now..+1d"], "--for is required"),
        (["--start-range", "+1d..now", "--for", "1h"], "FROM must not be after TO"),
        (["--start-range", "now..+1d", "--duration-range", "5h..1h"], "FROM must not be after"),
        (["--start-range", "now..+1d", "--duration-range", "0s..1h"], "--duration-range: bad"),
        (["--start-range", "-2d..-1d", "--for", "1h"], "before now"),
        (["--start-range", "soon..+1d", "--for", "1h"], "--start-range"),
        (["--start-range", "now+1d", "--for", "1h"], "--start-range"),
        (["--start-range", "now..+1d", "--duration-range", "1h"], "--duration-range"),
        (["--for", "1h", "--every", "1d", "--count", "2"], "preview takes no --every"),
        (["--for", "1h", "--count", "2"], "preview takes no --every"),
        (["--for", "1h", "--every", "1d", "--until", "+3d"], "preview takes no --every"),
        (["--start-range", "now..+1d", "--for", "1h", "--every", "1d", "--count", "2"], "--every"),
    ],
)
def test_preview_range_errors_are_reserves(run: Cli, flags: list[str], needle: str) -> None:
    err = run.fails(INVALID, "preview", "--tenant", "acme", "--gpus", "1", *flags)
    assert needle in err["message"], err
    if "--every" not in flags and "--count" not in flags:  # reserve says the same
        same = run.fails(
            INVALID, "reserve", "--tenant", "acme", "--gpus", "1", "--key", "e", *flags
        )
        assert same["message"] == err["message"]
    assert run.ok("list") == []


def test_the_calendar_policy_applies_to_a_previewed_range(run: Cli) -> None:
    set_policy(run, "--min-lead", "1d", "--max-duration", "2d", "--sizes", "8,16")
    doc = run.ok("preview", *GANG[:4], "--start-range", "now..+3d", "--duration-range", "1d..5d")
    # Starts no sooner than the lead, lengths clipped to the maximum duration.
    assert doc["search"]["startRange"]["from"] == NOW_MS + DAY
    assert doc["search"]["durationRange"] == {"min": DAY, "max": 2 * DAY}
    assert doc["window"] == {"start": NOW_MS + DAY, "end": NOW_MS + 3 * DAY}
    err = run.fails(INVALID, "preview", "--tenant", "globex", "--gpus", "2", "--start-range",
                    "now..+3d", "--for", "1d")  # fmt: skip
    assert "calendar policy" in err["message"] and "allowed sizes: 8, 16" in err["message"]
    err = run.fails(INVALID, "preview", *GANG[:4], "--start-range", "now..+3h", "--for", "1d")
    assert "minimum lead time 1d" in err["message"]


def test_quota_is_checked_as_reserve_checks_it(run: Cli) -> None:
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "8")
    err = run.fails(QUOTA, "preview", *GANG, "--start-range", "now..+1d", "--for", "1h")
    assert "quota" in err["message"]


def test_explain_explains_the_window_found(run: Cli) -> None:
    fill_west(run, hours=10)
    doc = run.ok("preview", *GANG, "--start-range", "now..+1d", "--for", "2h", "--explain")
    assert doc["window"]["start"] == NOW_MS + 10 * HOUR
    verdicts = " ".join(line["verdict"] for line in doc["explain"])
    assert "nodes fit" in verdicts and "0 of 8 gpu free" not in verdicts, doc["explain"]


def test_preview_range_for_people(run: Cli) -> None:
    fill_west(run, hours=10)
    text = run.ok("preview", *GANG, "--start-range", "now..+1d", "--for", "2h", json=False)
    assert "earliest window with a start from" in text and "fits for" in text
    text = run.ok("preview", *GANG, "--start-range", "now..+1h", "--for", "2h", json=False)
    assert "does not fit: no window fits in pool west" in text


def test_a_preview_later_answers_from_its_own_now(run: Cli) -> None:
    fill_west(run, hours=10)
    doc = run.ok("preview", *GANG, "--start-range", "now..+1d", "--for", "2h", now=at(11 * HOUR))
    assert doc["window"]["start"] == NOW_MS + 11 * HOUR
