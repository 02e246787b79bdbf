"""Issue 8 item 3, in-process: run.py's `in_process_reserve` alone, on copies of its three pools.

run.py times the same call among everything else; this times only it, so a change to placement
can be measured before and after in a minute, back to back on one machine. The pools are run.py's
(`--workdir`, default /tmp/bc-simbuild, as `--builder simulate` names them); they are copied to
`--copy-to` first and never written in place. A copy made by an older schema is migrated when it
is first opened, so keep one set of copies per code version:

    python benchmarks/inprocess_growth.py --copy-to /tmp/growth3/after
    PYTHONPATH=/old/tree python benchmarks/inprocess_growth.py --copy-to /tmp/growth3/before

(PYTHONPATH puts the older tree's better_compute ahead of this one; the script says which it ran.)

Prints each pool's median wall and CPU ms over `--repeat` runs and the two growth ratios (limits
1.5x from 400 to 4,000 nodes, 1.3x from 20,000 to 200,000 reservations).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (in_process_reserve, and the pools' names)

POOLS = ("400n-20000r", "4000n-20000r", "4000n-200000r")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/bc-simbuild", type=Path)
    parser.add_argument("--copy-to", required=True, type=Path)
    parser.add_argument("--repeat", default=9, type=int)
    opts = parser.parse_args()
    opts.copy_to.mkdir(parents=True, exist_ok=True)
    import better_compute

    print(f"better_compute from {Path(better_compute.__file__).parent}")
    times = {}
    for name in POOLS:
        copy = opts.copy_to / f"{name}.db"
        if not copy.exists():
            shutil.copyfile(opts.workdir / f"{name}-simulate.db", copy)
        times[name] = run.in_process_reserve(copy, opts.repeat)
        wall, cpu = times[name]
        print(f"{name}: wall {wall:.1f} ms, CPU {cpu:.1f} ms", flush=True)
    big = times[POOLS[2]]
    for small, limit in ((POOLS[0], 1.5), (POOLS[1], 1.3)):
        wall, cpu = times[small]
        print(
            f"{small} -> {POOLS[2]}: wall {big[0] / wall:.2f}x, CPU {big[1] / cpu:.2f}x"
            f" (limit {limit}x)"
        )


if __name__ == "__main__":
    main()
