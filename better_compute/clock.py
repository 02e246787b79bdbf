"""The one reader of the system clock (PRODUCT.md §2). Everything else gets `now` passed in."""

from __future__ import annotations

import time

from better_compute.errors import InvalidInput
from better_compute.timeparse import parse_time


def real_ms() -> int:
    """The system clock in epoch ms."""
    return time.time_ns() // 1_000_000


def now_ms(override: str | None, base: int | None = None) -> int:
    """`override` (from --now or BETTER_COMPUTE_NOW) if given, else the clock.

    A relative override (`+1h`) counts from `base` when given (a manual-clock ledger's own
    instant), else from the real clock.
    """
    if override is None:
        return real_ms()
    try:
        return parse_time(override, real_ms() if base is None else base)
    except InvalidInput as exc:  # where it came from: a stale variable in a cron line, say
        raise InvalidInput(f"--now (or BETTER_COMPUTE_NOW): {exc.message}") from None


def elapsed_s() -> float:
    """A monotonic clock in seconds, for measuring how long work took (never an instant)."""
    return time.perf_counter()
