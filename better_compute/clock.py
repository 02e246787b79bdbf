"""The one reader of the system clock (PRODUCT.md §2). Everything else gets `now` passed in."""

from __future__ import annotations

import time

from better_compute.timeparse import parse_time


def now_ms(override: str | None) -> int:
    """Now in epoch ms: `override` (from --now or BETTER_COMPUTE_NOW) if given, else the clock.

    The override is read relative to the real clock, so `--now +1h` means an hour from now.
    """
    real = time.time_ns() // 1_000_000
    return real if override is None else parse_time(override, real)
