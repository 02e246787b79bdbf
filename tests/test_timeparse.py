from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from better_compute import clock
from better_compute.errors import InvalidInput
from better_compute.timeparse import (
    MAX_DURATION_MS,
    MAX_MS,
    human_duration,
    iso,
    parse_duration,
    parse_range,
    parse_time,
)

NOW = 1_790_000_000_000  # 2026-09-21T14:13:20Z
T0 = 1_790_582_400_000  # 2026-09-28T08:00:00Z
H, M, D = 3_600_000, 60_000, 86_400_000


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2026-09-28T08:00:00Z", T0),
        ("2026-09-28T08:00:00z", T0),
        ("2026-09-28t08:00:00Z", T0),
        ("2026-09-28 08:00:00Z", T0),
        ("2026-09-28T08:00:00", T0),  # no offset means UTC
        ("2026-09-28T08:00Z", T0),
        ("2026-09-28T08Z", T0),
        ("2026-09-28T10:00:00+02:00", T0),
        ("2026-09-28T03:00:00-0500", T0),
        ("2026-09-28T10:00:00+02", T0),
        ("2026-09-28T08:00:00.250Z", T0 + 250),
        ("2026-09-28T08:00:00,5Z", T0 + 500),
        ("2026-09-28T08:00:00.1239Z", T0 + 123),  # sub-ms digits are dropped
        ("2026-09-28", T0 - 8 * H),  # date only: midnight UTC
        ("2026-09-27T24:00:00Z", T0 - 8 * H),
        ("1970-01-01T00:00:00Z", 0),
        ("9999-12-31T23:59:59.999Z", MAX_MS),
        ("1790582400000", T0),
        ("0", 0),
        ("now", NOW),
        ("NOW", NOW),
        ("  now ", NOW),
        ("+2h", NOW + 2 * H),
        ("+90m", NOW + 90 * M),
        ("+1d12h", NOW + D + 12 * H),
        ("-30m", NOW - 30 * M),
        ("+500ms", NOW + 500),
        ("+0s", NOW),
    ],
)
def test_parse_time_accepts(text: str, want: int) -> None:
    assert parse_time(text, NOW) == want


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("tomorrow", "use ISO 8601 (2026-09-28T08:00:00Z), epoch ms, now, or +2h / +1d12h"),
        ("", "use ISO 8601"),
        ("+", "use ISO 8601"),
        ("+2", "use ISO 8601"),
        ("+2x", "use ISO 8601"),
        ("2h", "use ISO 8601"),
        ("+ 2h", "use ISO 8601"),
        ("now+2h", "use ISO 8601"),
        ("-1", "use ISO 8601"),
        ("1.5", "use ISO 8601"),
        ("2026-09", "use ISO 8601"),
        ("2026-W39", "use ISO 8601"),
        ("20260928T080000Z", "use ISO 8601"),
        ("2026-09-28x08:00", "use ISO 8601"),
        ("2026-09-28T08:00:00 Z", "use ISO 8601"),
        ("٣", "use ISO 8601"),  # a non-ASCII digit is not epoch ms
        ("+٣h", "use ISO 8601"),
        ("٢٠٢٦-09-28", "use ISO 8601"),
        ("2026-02-30", "day is out of range for month; use ISO 8601"),
        ("2026-09-28T25:00:00Z", "use ISO 8601"),
        ("1969-12-31T23:59:59Z", "out of range (from 1970-01-01T00:00:00Z to 9999-12-31"),
        ("253402300800000", "out of range"),
        ("9" * 100, "out of range"),
        ("-99999d", "out of range"),
        ("+99999999w", "out of range"),
    ],
)
def test_parse_time_rejects(text: str, why: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_time(text, NOW)
    assert e.value.message.startswith(f"bad TIME {text!r}: ")
    assert why in e.value.message
    assert "\n" not in e.value.message


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("30s", 30_000),
        ("90m", 90 * M),
        ("12h", 12 * H),
        ("3d", 3 * D),
        ("2w", 14 * D),
        ("500ms", 500),
        ("1d12h", D + 12 * H),
        ("1h30m", 90 * M),
        ("1w2d3h4m5s6ms", 7 * D + 2 * D + 3 * H + 4 * M + 5006),
        ("0h30m", 30 * M),
        ("007s", 7000),
    ],
)
def test_parse_duration_accepts(text: str, want: int) -> None:
    assert parse_duration(text) == want


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "use a number and a unit (500ms, 30s, 90m, 12h, 3d, 2w) or compounds like 1d12h"),
        ("30", "use a number and a unit"),
        ("30x", "use a number and a unit"),
        ("h", "use a number and a unit"),
        ("1.5h", "use a number and a unit"),
        ("-5m", "use a number and a unit"),
        ("+5m", "use a number and a unit"),
        ("30m1h", "use a number and a unit"),  # units go largest first
        ("1h1h", "use a number and a unit"),
        ("1H", "use a number and a unit"),
        ("1 h", "use a number and a unit"),
        ("٣h", "use a number and a unit"),
        (" 1h", "use a number and a unit"),
        ("1" * 100 + "s", "use a number and a unit"),
        ("0s", "must be more than 0"),
        ("0d0h", "must be more than 0"),
        ("99999999w", "too long (at most 365000d)"),
    ],
)
def test_parse_duration_rejects(text: str, why: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_duration(text)
    assert e.value.message.startswith(f"bad DURATION {text!r}: ")
    assert why in e.value.message


def _at_now(text: str) -> int:
    return parse_time(text, NOW)


@pytest.mark.parametrize(
    ("text", "parse", "want"),
    [
        ("+1h..+3h", _at_now, (NOW + H, NOW + 3 * H)),
        ("2026-09-28..2026-09-28T08:00:00Z", _at_now, (T0 - 8 * H, T0)),
        ("2026-09-28T08:00:00.500Z..1790582401000", _at_now, (T0 + 500, T0 + 1000)),
        ("now..+1d", _at_now, (NOW, NOW + D)),
        (" +1h .. +2h ", _at_now, (NOW + H, NOW + 2 * H)),
        ("1h..3d", parse_duration, (H, 3 * D)),
        ("2h..2h", parse_duration, (2 * H, 2 * H)),  # a duration range may be one value
    ],
)
def test_parse_range_accepts(text: str, parse: Callable[[str], int], want: tuple[int, int]) -> None:
    assert parse_range(text, parse) == want


@pytest.mark.parametrize(
    ("text", "parse", "why"),
    [
        ("+1h", _at_now, "bad RANGE '+1h': use FROM..TO with both sides given"),
        ("+1h..", _at_now, "bad RANGE '+1h..': use FROM..TO"),
        ("..+1h", _at_now, "use FROM..TO"),
        ("+1h..+2h..+3h", _at_now, "use FROM..TO"),
        ("+1h...+2h", _at_now, "bad TIME '.+2h'"),
        ("+3h..+1h", _at_now, "bad RANGE '+3h..+1h': FROM must be before TO"),
        ("+1h..+1h", _at_now, "FROM must be before TO"),
        ("soon..+1h", _at_now, "bad TIME 'soon'"),
        ("3d..1h", parse_duration, "bad RANGE '3d..1h': FROM must not be after TO"),
        ("1h..0s", parse_duration, "bad DURATION '0s'"),
    ],
)
def test_parse_range_rejects(text: str, parse: Callable[[str], int], why: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_range(text, parse)
    assert why in e.value.message


def test_parse_range_allow_equal_override() -> None:
    assert parse_range("+1h..+1h", _at_now, allow_equal=True) == (NOW + H, NOW + H)
    with pytest.raises(InvalidInput, match="FROM must be before TO"):
        parse_range("1h..1h", parse_duration, allow_equal=False)


@pytest.mark.parametrize(
    ("ms", "want"),
    [
        (T0, "2026-09-28T08:00:00Z"),
        (T0 + 123, "2026-09-28T08:00:00.123Z"),
        (T0 + 5, "2026-09-28T08:00:00.005Z"),
        (0, "1970-01-01T00:00:00Z"),
        (MAX_MS, "9999-12-31T23:59:59.999Z"),
    ],
)
def test_iso(ms: int, want: str) -> None:
    assert iso(ms) == want


@pytest.mark.parametrize(
    ("ms", "want"),
    [
        (D + 12 * H, "1d12h"),
        (90 * M, "1h30m"),
        (30_000, "30s"),
        (500, "500ms"),
        (14 * D, "14d"),
        (D + 1, "1d1ms"),
        (0, "0s"),
        (-90 * M, "-1h30m"),
    ],
)
def test_human_duration(ms: int, want: str) -> None:
    assert human_duration(ms) == want


@given(st.integers(1, MAX_DURATION_MS))
def test_duration_round_trip(ms: int) -> None:
    assert parse_duration(human_duration(ms)) == ms


@given(st.integers(0, MAX_MS))
def test_iso_round_trip(ms: int) -> None:
    assert parse_time(iso(ms), NOW) == ms


def test_clock_override_is_relative_to_the_real_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: NOW * 1_000_000 + 999_999)
    assert clock.now_ms(None) == NOW
    assert clock.now_ms("+1h") == NOW + H
    assert clock.now_ms("2026-09-28T08:00:00Z") == T0
    with pytest.raises(InvalidInput, match="bad TIME 'later'"):
        clock.now_ms("later")
