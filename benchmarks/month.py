"""A generated month of demand for `simulate` (issue 8 "Speed" item 2): what builds the benchmark's
pools through the real engine, instead of writing their rows directly.

Not part of the test suite. `month(requests, seed)` gives the JSON Lines of one month of arrivals
ending at bench.NOW, one request per line in the `simulate --format jsonl` form; run.py's
`build_with_simulate` replays them with `simulate --until NOW`, so the ledger stops live there:
work that began before NOW is active, calendar bookings reach up to 30 days past it, and what
ended is history. Seeded: the same arguments give the same lines, byte for byte.

The mix (weights below): three in ten requests start on arrival, seven in ten are calendar
bookings made 1 h to 30 days ahead; 1 to 8 GPUs; 1 to 24 h; one in ten spot; one in two hundred
a gang of 2 to 4 members of 8 GPUs in one fabric domain; ten tenants. Arrivals fall on 15-minute
marks, as do all starts and durations, so every start and end is a 15-minute mark (run.py's
`tick` item relies on nothing else being due one minute after NOW).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import bench_reserve as bench

QUARTER = 15 * bench.MINUTE
DAYS = 30
#: The month's first instant: the ledger is initialised here and the replay runs to bench.NOW.
START = bench.NOW - DAYS * bench.DAY
START_TEXT = "2025-12-02T00:00:00Z"
SIZES = (1, 2, 3, 4, 5, 6, 7, 8)
SIZE_WEIGHTS = (24, 22, 6, 20, 3, 5, 2, 18)
HOURS = (1, 2, 4, 8, 12, 24)
HOUR_WEIGHTS = (10, 15, 20, 25, 15, 15)
CALENDAR = 0.7
SPOT = 0.1
GANG = 0.005


def requests(count: int, seed: int) -> Iterator[dict[str, object]]:
    """`count` requests of the month, in arrival order."""
    rng = random.Random(seed)
    marks = DAYS * 24 * 4
    arrivals = sorted(rng.randrange(marks) for _ in range(count))
    for mark in arrivals:
        at = START + mark * QUARTER
        line: dict[str, object] = {"at": at, "tenant": f"t{rng.randrange(bench.TENANTS)}"}
        hours = rng.choices(HOURS, HOUR_WEIGHTS)[0]
        if rng.random() < GANG:
            line.update(gpus=8, gang=rng.randint(2, 4), topologyKey="fabric.domain")
            hours = max(4, hours)
        else:
            line["gpus"] = rng.choices(SIZES, SIZE_WEIGHTS)[0]
            if rng.random() < SPOT:
                line["spot"] = True
        line["duration"] = f"{hours}h"
        if rng.random() < CALENDAR:
            line["start"] = at + rng.randrange(4, DAYS * 24 * 4) * QUARTER
        yield line


def month(count: int, seed: int) -> str:
    """The JSON Lines text of `requests(count, seed)`."""
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in requests(count, seed))
