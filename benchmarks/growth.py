"""Issue 8 "Speed" item 3 as curves: `reserve` time against nodes and against bookings.

Not part of the test suite. Run from the repository root:

    python benchmarks/growth.py [--repeat 5] [--workdir /tmp/bc-bench] [--svg docs/growth.svg]

Two series of pools, built as benchmarks/run.py builds them (`--builder`: `direct` by default, since
seven pools through `simulate` take the better part of an hour; under the same file names, so a
`--workdir` shared with run.py reuses its three pools built the same way):

- against nodes: 100, 400, 1,000 and 4,000 nodes x 8 GPUs at 50 reservations per node (the big
  pool's 200,000 / 4,000);
- against bookings: 20,000, 50,000, 100,000 and 200,000 reservations on 4,000 nodes.

For each pool: `reserve --tenant t0 --gpus 4 --for 8h --json` as a whole process (median of
`--repeat` interleaved rounds after a warm-up, as run.py measures) and in-process (the service call
alone, median of `--repeat`). Prints a Markdown table and writes the chart as a small SVG (log-log
axes, written by hand: no plotting dependency).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (builders and measurements shared with the table)

PER_NODE = 50
NODES = (100, 400, 1000, 4000)
BOOKINGS = (20_000, 50_000, 100_000, 200_000)
BIG_NODES = 4000


def points() -> dict[str, list[tuple[int, int]]]:
    return {
        "nodes": [(n, n * PER_NODE) for n in NODES],
        "bookings": [(BIG_NODES, b) for b in BOOKINGS],
    }


def ledger(workdir: Path, nodes: int, reservations: int, seed: int, builder: str) -> Path:
    path = workdir / f"{nodes}n-{reservations}r-{builder}.db"
    if path.exists():
        print(f"{nodes} nodes, {reservations} reservations: reusing {path}")
    else:
        print(run.BUILDERS[builder](path, run.Pool(f"{nodes}n", nodes, reservations), seed))
    return run.migrated(path)


# ---------------------------------------------------------------- the chart

W, H = 360, 260  # one panel
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 34, 44
Y_LO, Y_HI = 1.0, 1000.0
SERIES = (
    ("process", "#1f77b4", "whole process"),
    ("in_process", "#d62728", "in-process"),
    ("in_process_cpu", "#2ca02c", "in-process CPU"),
)


def _y(ms: float) -> float:
    frac = (math.log10(max(ms, Y_LO)) - math.log10(Y_LO)) / (math.log10(Y_HI) - math.log10(Y_LO))
    return TOP + (1 - frac) * (H - TOP - BOTTOM)


def _panel(
    x0: float,
    title: str,
    xlabel: str,
    xs: list[int],
    rows: list[dict[str, float]],
    fmt_x: Callable[[int], str],
) -> list[str]:
    lo, hi = math.log10(xs[0]), math.log10(xs[-1])
    span = W - LEFT - RIGHT

    def x(v: float) -> float:
        return x0 + LEFT + (math.log10(v) - lo) / (hi - lo) * span

    out = [
        f'<text x="{x0 + W / 2:.0f}" y="18" text-anchor="middle" font-weight="bold">{title}</text>'
    ]
    for ms in (1, 10, 100, 1000):
        y = _y(ms)
        out.append(
            f'<line x1="{x0 + LEFT}" y1="{y:.1f}" x2="{x0 + W - RIGHT}" y2="{y:.1f}"'
            ' stroke="#ddd"/>'
        )
        out.append(f'<text x="{x0 + LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{ms:g} ms</text>')
    base = H - BOTTOM
    for v in xs:
        out.append(f'<line x1="{x(v):.1f}" y1="{TOP}" x2="{x(v):.1f}" y2="{base}" stroke="#eee"/>')
        out.append(f'<text x="{x(v):.1f}" y="{base + 16}" text-anchor="middle">{fmt_x(v)}</text>')
    out.append(
        f'<text x="{x0 + LEFT + span / 2:.0f}" y="{H - 8}" text-anchor="middle">{xlabel}</text>'
    )
    out.append(
        f'<rect x="{x0 + LEFT}" y="{TOP}" width="{span}" height="{base - TOP}" fill="none"'
        ' stroke="#888"/>'
    )
    for key, colour, _ in SERIES:
        pts = " ".join(f"{x(v):.1f},{_y(r[key]):.1f}" for v, r in zip(xs, rows, strict=True))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for v, r in zip(xs, rows, strict=True):
            cx, cy = x(v), _y(r[key])
            out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{colour}"/>')
            out.append(
                f'<text x="{cx:.1f}" y="{cy - 7:.1f}" text-anchor="middle" fill="{colour}">'
                f"{r[key]:.0f}</text>"
                if r[key] >= 10
                else f'<text x="{cx:.1f}" y="{cy - 7:.1f}" text-anchor="middle"'
                f' fill="{colour}">{r[key]:.1f}</text>'
            )
    return out


def svg(results: dict[str, list[dict[str, float]]], note: str) -> str:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H + 24}"'
        f' viewBox="0 0 {2 * W} {H + 24}" font-family="sans-serif" font-size="11">',
        f'<rect width="{2 * W}" height="{H + 24}" fill="white"/>',
    ]
    parts += _panel(
        0,
        f"reserve against nodes ({PER_NODE} reservations per node)",
        "nodes x 8 GPUs (log scale)",
        list(NODES),
        results["nodes"],
        lambda v: f"{v:,}",
    )
    parts += _panel(
        W,
        f"reserve against bookings ({BIG_NODES:,} nodes)",
        "reservations (log scale)",
        list(BOOKINGS),
        results["bookings"],
        lambda v: f"{v // 1000}k",
    )
    lx = 16
    for _, colour, label in SERIES:
        parts.append(
            f'<line x1="{lx}" y1="{H + 12}" x2="{lx + 18}" y2="{H + 12}" stroke="{colour}"'
            ' stroke-width="2"/>'
        )
        parts.append(f'<text x="{lx + 22}" y="{H + 16}">{label}</text>')
        lx += 120
    parts.append(f'<text x="{2 * W - 8}" y="{H + 16}" text-anchor="end" fill="#555">{note}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "bc-bench"))
    ap.add_argument("--svg", type=Path, default=HERE.parent / "docs" / "growth.svg")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--builder",
        choices=sorted(run.BUILDERS),
        default="direct",
        help="direct (default: seconds per pool) or simulate (minutes per pool, as run.py's)",
    )
    opts = ap.parse_args()
    repeat = max(5, opts.repeat)
    started = time.perf_counter()
    workdir = Path(opts.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    run.compile_package()
    series = points()
    paths = {
        pt: ledger(workdir, *pt, opts.seed, opts.builder) for pts in series.values() for pt in pts
    }
    jobs: dict[str, run.Job] = {
        f"{n}/{r}": run.commands(p)["reserve --json"] for (n, r), p in paths.items()
    }
    processes = run.interleaved(jobs, repeat)
    inside = run.in_process_reserves(paths, repeat)
    measured = {
        pt: {
            "process": processes[f"{pt[0]}/{pt[1]}"].ms,
            "process_cpu": processes[f"{pt[0]}/{pt[1]}"].cpu_ms,
            "in_process": inside[pt][0],
            "in_process_cpu": inside[pt][1],
        }
        for pt in paths
    }
    results = {k: [measured[pt] for pt in pts] for k, pts in series.items()}

    print(f"\n## Growth of `reserve --json` (medians of {repeat})\n")
    print(
        "| nodes | reservations | process ms | process CPU ms | in-process ms | in-process CPU ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for pts in series.values():
        for n, r in pts:
            m = measured[(n, r)]
            print(
                f"| {n:,} | {r:,} | {m['process']:.0f} | {m['process_cpu']:.0f} |"
                f" {m['in_process']:.1f} | {m['in_process_cpu']:.1f} |"
            )
    for k, pts in series.items():
        first, last = measured[pts[0]], measured[pts[-1]]
        print(
            f"\nagainst {k}, first -> last point: "
            + ", ".join(f"{m} x{last[m] / first[m]:.2f}" for m in first)
        )
    note = f"medians of {repeat}; {os.cpu_count()} CPUs, shared"
    opts.svg.parent.mkdir(parents=True, exist_ok=True)
    opts.svg.write_text(svg(results, note))
    print(f"\nwrote {opts.svg}; total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
