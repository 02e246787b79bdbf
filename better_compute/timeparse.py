"""Parse and format times and durations (PRODUCT.md §2). Pure: `now` is always passed in.

Times are epoch milliseconds, durations milliseconds. Every bad input raises InvalidInput with one
line saying what was wrong and what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from better_compute.errors import InvalidInput

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Times outside [1970, 9999] are refused so every time can be stored and printed by `iso`.
MIN_MS = 0
MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
#: About 1000 years: longer is a typo; the cap keeps `start + duration` well inside int64.
MAX_DURATION_MS = 365_000 * 86_400_000

TIME_HELP = "use ISO 8601 (2026-09-28T08:00:00Z), epoch ms, now, or +2h / +1d12h"
DURATION_HELP = "use a number and a unit (500ms, 30s, 90m, 12h, 3d, 2w) or compounds like 1d12h"

_UNITS_MS = {"w": 604_800_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
# Units largest first, each at most once, so `1h30m` has exactly one reading.
_DURATION_RE = re.compile(
    r"(?:(?P<w>\d+)w)?(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?"
    r"(?:(?P<ms>\d+)ms)?",
    re.ASCII,  # `\d` would otherwise take any script's digits
)
# Extended ISO 8601 with a calendar date only: dateutil alone also takes `2026-W39`, `2026-09` or
# any separator character, which are more likely typos than intent.
_ISO_RE = re.compile(
    r"\d{4}-\d{2}-\d{2}"
    r"(?:[Tt ]\d{2}(?::\d{2}(?::\d{2}(?:[.,]\d+)?)?)?(?:[Zz]|[+-]\d{2}(?::?\d{2})?)?)?",
    re.ASCII,
)
# The common form, whole seconds in UTC: read without importing dateutil (start-up, issue 8).
_PLAIN_UTC_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})Z?", re.ASCII)
_MAX_TEXT = 64  # longer inputs are never valid; also keeps int() away from huge digit strings


def _units_ms(text: str) -> int | None:
    """The ms of a duration text (0 allowed), or None when it is not one."""
    m = _DURATION_RE.fullmatch(text) if len(text) <= _MAX_TEXT else None
    if m is None or not any(m.groupdict().values()):
        return None
    return sum(int(v) * _UNITS_MS[u] for u, v in m.groupdict().items() if v is not None)


def parse_duration(text: str) -> int:
    """`30s`, `90m`, `12h`, `3d`, `2w`, `500ms` or compounds (`1d12h`, `1h30m`) → ms (> 0)."""
    ms = _units_ms(text)
    if ms is None:
        raise InvalidInput(f"bad DURATION {text!r}: {DURATION_HELP}")
    if ms <= 0:
        raise InvalidInput(f"bad DURATION {text!r}: must be more than 0")
    if ms > MAX_DURATION_MS:
        raise InvalidInput(
            f"bad DURATION {text!r}: too long (at most {human_duration(MAX_DURATION_MS)})"
        )
    return ms


def check_time(text: str) -> None:
    """A TIME's form, before the instant it is read against is known (the ledger not opened
    yet, or its state not read). A relative one passes when its offset could land in the range
    from some instant in it, and is judged against the real now later: read against the middle
    of the range, `+250000w` from today (year 6818) was refused (a review)."""
    s = text.strip()
    if s[:1] in ("+", "-") and (delta := _units_ms(s[1:])) is not None:
        if delta > MAX_MS - MIN_MS:
            raise _out_of_range(text)
        return
    parse_time(text, MIN_MS)  # an instant written out, or `now`: no offset to judge


def parse_time(text: str, now: int) -> int:
    """ISO 8601, epoch ms (all digits), `now`, or `+2h` / `-30m` relative to `now` → epoch ms."""
    s = text.strip()
    if s.lower() == "now":
        ms = now
    elif s.isascii() and s.isdigit():
        ms = int(s) if len(s) <= _MAX_TEXT else MAX_MS + 1
    elif s[:1] in ("+", "-") and (delta := _units_ms(s[1:])) is not None:
        ms = now + delta if s[0] == "+" else now - delta  # +0s is allowed: it is now
    elif (plain := _plain_utc(s)) is not None:
        ms = plain
    elif _ISO_RE.fullmatch(s):
        from dateutil.parser import isoparse

        try:
            dt = isoparse(s)
        except (ValueError, OverflowError) as e:  # e.g. 2026-02-30: name the field that is wrong
            raise InvalidInput(f"bad TIME {text!r}: {e}; {TIME_HELP}") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)  # no offset means UTC, never the local zone
        ms = (dt - _EPOCH) // timedelta(milliseconds=1)
    else:
        raise InvalidInput(f"bad TIME {text!r}: {TIME_HELP}")
    if not MIN_MS <= ms <= MAX_MS:
        raise _out_of_range(text)
    return ms


def _out_of_range(text: str) -> InvalidInput:
    return InvalidInput(f"bad TIME {text!r}: out of range (from {iso(MIN_MS)} to {iso(MAX_MS)})")


def _plain_utc(text: str) -> int | None:
    """`2026-09-28T08:00:00Z` (or without the Z) → epoch ms, as isoparse reads it; None for any
    other form or an impossible date, which isoparse then reads or explains."""
    m = _PLAIN_UTC_RE.fullmatch(text)
    if m is None:
        return None
    try:
        year, month, day, hour, minute, second = (int(g) for g in m.groups())
        dt = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None
    return (dt - _EPOCH) // timedelta(milliseconds=1)


def parse_range(
    text: str, parse: Callable[[str], int], *, allow_equal: bool | None = None
) -> tuple[int, int]:
    """`FROM..TO` → (from, to) with each side read by `parse`.

    FROM must be before TO; with `allow_equal` (default: only when `parse` is `parse_duration`,
    i.e. a `MIN..MAX` duration range) they may be equal.
    """
    parts = text.split("..")
    if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
        raise InvalidInput(f"bad RANGE {text!r}: use FROM..TO with both sides given")
    lo, hi = parse(parts[0].strip()), parse(parts[1].strip())
    if allow_equal is None:
        allow_equal = parse is parse_duration
    if hi < lo or (hi == lo and not allow_equal):
        rule = "must not be after" if allow_equal else "must be before"
        raise InvalidInput(f"bad RANGE {text!r}: FROM {rule} TO")
    return lo, hi


def iso(ms: int) -> str:
    """Epoch ms → `2026-09-28T08:00:00Z` (`.123Z` only when not a whole second)."""
    dt = (_EPOCH + timedelta(milliseconds=ms)).replace(tzinfo=None)
    return dt.isoformat(timespec="milliseconds" if ms % 1000 else "seconds") + "Z"


def human_duration(ms: int) -> str:
    """Ms → the shortest compound that `parse_duration` reads back: `1d12h`, `1h30m`, `500ms`.

    Days are the largest unit shown: `10d` reads better than `1w3d`.
    """
    if ms < 0:
        return "-" + human_duration(-ms)
    if ms == 0:
        return "0s"
    out = []
    for unit in ("d", "h", "m", "s", "ms"):
        n, ms = divmod(ms, _UNITS_MS[unit])
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)


def is_relative(text: str) -> bool:
    """`now`, `+2h`, `-30m`: a TIME that means something else at every instant."""
    s = text.strip()
    return s.lower() == "now" or s[:1] in ("+", "-")
