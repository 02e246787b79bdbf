"""Issue 8's speed figures: one table, medians of whole `better-compute` processes.

Not part of the test suite. Run from the repository root (takes a few minutes, most of it building
the big pool once; `--workdir DIR` keeps the databases for the next run):

    python benchmarks/run.py [--repeat 5] [--workdir /tmp/bc-bench]

What it measures, each figure a median of `--repeat` runs (at least 5) in this one run:

- every command of issue 8 "Speed" item 2 on the big pool (4,000 nodes x 8 GPUs, ~200,000
  reservations past, current and future): its wall time, its ratio to `better-compute --version`,
  and its peak memory (max RSS) ratio to `--version`'s;
- growth (item 3): `reserve` at 4,000 nodes against 400 nodes with the same bookings per node, and
  at ~200,000 bookings against ~20,000 on 4,000 nodes, both as whole processes and in-process (the
  service call alone, without the interpreter's start-up, which hides growth);
- start-up (item 4): `--version` and `get --json` against a minimal Typer app with one command
  (benchmarks/minimal_typer.py) run by the same Python.

How the pools are built: `build_pool` below. Today it writes rows straight into the tables through
benchmarks/bench_reserve.py's Writer (shaped exactly as repo.insert_* write them). Issue 8 wants
the 200,000 bookings built by `simulate` replaying a generated month of jsonl demand: when the
`simulate` command exists, implement `build_with_simulate` (the hook is marked HOOK) and pass
`--builder simulate`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_reserve as bench  # noqa: E402  (the pool builder and its Writer)

NOW = bench.NOW
NOW_TEXT = "2026-01-01T00:00:00Z"
DAY = bench.DAY


# ---------------------------------------------------------------- building pools


@dataclass(frozen=True)
class Pool:
    label: str
    nodes: int
    reservations: int  # the target: past, current and future reservations ("bookings")


def _future_for(nodes: int, reservations: int) -> int:
    """bench.populate makes ~2.1 active reservations per node, `future` calendar ones and
    future/4 released ones: the `future` that makes about `reservations` in all."""
    active = round(2.13 * nodes)
    return max(0, round((reservations - active) / 1.25))


def build_direct(path: Path, pool: Pool, seed: int) -> str:
    db, counts, seconds = bench.build(
        str(path), pool.nodes, _future_for(pool.nodes, pool.reservations), seed
    )
    db.close()
    total = counts.active + counts.future + counts.history
    return (
        f"{pool.label}: {pool.nodes} nodes x 8 GPUs, {total} reservations ({counts.active} active,"
        f" {counts.future} future, {counts.history} past), {counts.booking_rows} booking rows;"
        f" built directly in {seconds:.1f} s"
    )


def build_with_simulate(path: Path, pool: Pool, seed: int) -> str:
    """HOOK (issue 8 item 2): build the pool with `simulate` on a generated month of demand.

    Once `better-compute simulate` exists: `init --now`, import the inventory (bench.inventory_doc),
    write a jsonl month (`{at, tenant, gpus, duration, start?}` per line, sized so about
    `pool.reservations` reservations result), then `simulate --workload month.jsonl --format jsonl
    --until <NOW_TEXT>` so the ledger is live at NOW with work active, bookings ahead and history
    behind. Every measurement below runs at NOW_TEXT and works unchanged on such a ledger; `get`
    needs any reservation id (see `first_reservation`)."""
    raise SystemExit("--builder simulate: `simulate` is not built yet; use --builder direct")


BUILDERS: dict[str, Callable[[Path, Pool, int], str]] = {
    "direct": build_direct,
    "simulate": build_with_simulate,
}


def first_reservation(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("SELECT id FROM reservations ORDER BY seq LIMIT 1").fetchone()[0])
    finally:
        conn.close()


# ---------------------------------------------------------------- measuring processes


@dataclass
class Sample:
    ms: float
    rss_kb: int


def run_measured(argv: Sequence[str]) -> tuple[Sample, str]:
    """One run: wall time, and the command's own peak RSS (KiB) as GNU time reports it.

    The RSS is read through /usr/bin/time because a child forked from this (large) process
    inherits its high-water mark; time's own process is tiny. Both figures include time's
    fork and exec (about 1 ms), for every command alike.
    """
    wrapped = [TIME, "-f", "%M", "-o", RSS_FILE, *argv] if TIME else list(argv)
    t0 = time.perf_counter()
    pid = os.posix_spawn(
        wrapped[0],
        wrapped,
        dict(os.environ),
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 1, OUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
            (os.POSIX_SPAWN_OPEN, 2, ERR_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
        ],
    )
    _, status, usage = os.wait4(pid, 0)
    elapsed = (time.perf_counter() - t0) * 1000
    code = os.waitstatus_to_exitcode(status)
    out = Path(OUT_FILE).read_text()
    if code != 0:
        err = Path(ERR_FILE).read_text()
        raise SystemExit(f"{' '.join(argv)} failed ({code}): {err[:500]}")
    rss = int(Path(RSS_FILE).read_text().split()[-1]) if TIME else int(usage.ru_maxrss)
    return Sample(elapsed, rss), out


TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None
OUT_FILE = os.path.join(tempfile.gettempdir(), f"bc-bench-{os.getpid()}.out")
ERR_FILE = os.path.join(tempfile.gettempdir(), f"bc-bench-{os.getpid()}.err")
RSS_FILE = os.path.join(tempfile.gettempdir(), f"bc-bench-{os.getpid()}.rss")


@dataclass
class Figure:
    ms: float
    rss_kb: float


Job = tuple[Sequence[str], Callable[[str], None] | None]


def interleaved(jobs: dict[str, Job], repeat: int) -> dict[str, Figure]:
    """Median wall time and peak RSS of each job over `repeat` rounds after one warm-up round;
    every round runs each job once, so a change of load on the machine hits all of them alike
    (the figures are ratios between jobs)."""
    samples: dict[str, list[Sample]] = {name: [] for name in jobs}
    for i in range(repeat + 1):
        for name, (argv, after) in jobs.items():
            sample, out = run_measured(argv)
            if after is not None:
                after(out)
            if i:
                samples[name].append(sample)
    return {
        name: Figure(statistics.median(s.ms for s in got), statistics.median(s.rss_kb for s in got))
        for name, got in samples.items()
    }


def in_process_reserve_ms(path: Path, repeat: int) -> float:
    """`reserve --gpus 4 --for 8h` as a service call alone (cancelled after each run, untimed)."""
    from better_compute.service import booking
    from better_compute.service.context import open_ctx

    samples = []
    for i in range(repeat + 1):
        ctx = open_ctx(str(path), NOW_TEXT, _me(), None)
        try:
            t0 = time.perf_counter()
            rsv = booking.reserve(ctx, bench.reserve_args())
            elapsed = (time.perf_counter() - t0) * 1000
            booking.cancel(ctx, rsv.id)
        finally:
            ctx.db.close()
        if i:
            samples.append(elapsed)
    return statistics.median(samples)


def _me() -> str:
    from better_compute.identity import os_user

    return os_user()


# ---------------------------------------------------------------- the commands


def cli(path: Path) -> list[str]:
    exe = shutil.which("better-compute", path=str(Path(sys.executable).parent)) or shutil.which(
        "better-compute"
    )
    if exe is None:
        raise SystemExit("better-compute is not installed in this Python's environment")
    return [exe, "--db", str(path), "--now", NOW_TEXT]


def canceller(path: Path) -> Callable[[str], None]:
    """Cancel what a timed `reserve --json` created, so every run sees the same ledger."""

    def cancel(out: str) -> None:
        rsv_id = json.loads(out)["id"]
        run_measured([*cli(path), "--json", "cancel", rsv_id])

    return cancel


def commands(path: Path) -> dict[str, tuple[list[str], Callable[[str], None] | None]]:
    base = cli(path)
    rsv = first_reservation(path)
    week = NOW + 7 * DAY
    return {
        "reserve --json": (
            [*base, "reserve", "--tenant", "t0", "--gpus", "4", "--for", "8h", "--json"],
            canceller(path),
        ),
        "preview --json": (
            [*base, "preview", "--tenant", "t0", "--gpus", "4", "--for", "8h", "--json"],
            None,
        ),
        "get --json": ([*base, "get", rsv, "--json"], None),
        "pool show --json": ([*base, "pool", "show", "h100", "--json"], None),
        "list --state active --json": ([*base, "list", "--state", "active", "--json"], None),
        "timeline --json (7 d, 30 min)": (
            [*base, "timeline", "--from", str(NOW), "--to", str(week), "--step", "30", "--json"],
            None,
        ),
    }


# ---------------------------------------------------------------- the table


def verdict(ratio: float, limit: float) -> str:
    return "ok" if ratio <= limit else f"over {limit:g}x"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per figure (at least 5)")
    ap.add_argument("--nodes", type=int, default=4000)
    ap.add_argument("--small-nodes", type=int, default=400)
    ap.add_argument("--bookings", type=int, default=200_000, help="reservations on the big pool")
    ap.add_argument("--small-bookings", type=int, default=20_000)
    ap.add_argument("--builder", choices=sorted(BUILDERS), default="direct")
    ap.add_argument("--workdir", help="keep (and reuse) the databases here")
    ap.add_argument("--rebuild", action="store_true", help="rebuild databases found in --workdir")
    ap.add_argument("--seed", type=int, default=7)
    opts = ap.parse_args()
    repeat = max(5, opts.repeat)

    started = time.perf_counter()
    workdir = Path(opts.workdir or tempfile.mkdtemp(prefix="bc-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"# benchmarks/run.py: {os.cpu_count()} CPU(s), Python {platform.python_version()},"
        f" SQLite {sqlite3.sqlite_version}, {platform.platform()}"
    )
    print(f"# load average before the run: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"# medians of {repeat} runs after one warm-up each\n")

    pools = {
        "big": Pool("big", opts.nodes, opts.bookings),
        # The same bookings per node as the big pool.
        "few-nodes": Pool(
            "few-nodes", opts.small_nodes, opts.bookings * opts.small_nodes // opts.nodes
        ),
        "few-bookings": Pool("few-bookings", opts.nodes, opts.small_bookings),
    }
    paths: dict[str, Path] = {}
    for key, pool in pools.items():
        path = workdir / f"{pool.nodes}n-{pool.reservations}r-{opts.builder}.db"
        if path.exists() and not opts.rebuild:
            print(f"{pool.label}: reusing {path}")
        else:
            for stale in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                stale.unlink(missing_ok=True)  # the benchmark's own scratch files
            print(BUILDERS[opts.builder](path, pool, opts.seed))
        paths[key] = path
    print()

    big = paths["big"]
    python = sys.executable
    jobs: dict[str, Job] = {
        "minimal": ([python, str(HERE / "minimal_typer.py")], None),
        "version": ([*cli(big)[:1], "--version"], None),
        **commands(big),
    }
    figures = interleaved(jobs, repeat)
    floor, version = figures.pop("minimal"), figures.pop("version")
    rows: list[tuple[str, Figure]] = list(figures.items())

    print(
        "## One command at fleet scale"
        f" ({opts.nodes} nodes, ~{opts.bookings:,} reservations; limits 2x time, 1.5x memory)\n"
    )
    # `--version` answers before Typer coerces any parameter, so it skips the pydantic adapters
    # every command with a parameter pays; the minimal Typer app pays them: both columns shown.
    print(
        "| command | ms | ratio to --version | ratio to minimal app | peak MiB | memory ratio"
        " to --version | memory ratio to minimal app | |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, fig in [("--version", version), ("minimal Typer app", floor), *rows]:
        t, m = fig.ms / version.ms, fig.rss_kb / version.rss_kb
        tf, mf = fig.ms / floor.ms, fig.rss_kb / floor.rss_kb
        ok = "ok" if t <= 2 and m <= 1.5 else "OVER"
        print(
            f"| `{name}` | {fig.ms:.0f} | {t:.2f} | {tf:.2f} | {fig.rss_kb / 1024:.1f} | {m:.2f} |"
            f" {mf:.2f} | {ok} |"
        )

    print("\n## Growth of `reserve --json` (limits 1.5x for nodes, 1.3x for bookings)\n")
    keys = ("big", "few-nodes", "few-bookings")
    reserve_jobs: dict[str, Job] = {k: commands(paths[k])["reserve --json"] for k in keys}
    processes = interleaved(reserve_jobs, repeat)
    grow = {k: (processes[k].ms, in_process_reserve_ms(paths[k], repeat)) for k in keys}
    print("| comparison | process ms | ratio | in-process ms | ratio | |")
    print("|---|---:|---:|---:|---:|---|")
    for label, small, limit in (
        (f"{opts.small_nodes} -> {opts.nodes} nodes (same bookings per node)", "few-nodes", 1.5),
        (
            f"{opts.small_bookings:,} -> {opts.bookings:,} reservations ({opts.nodes} nodes)",
            "few-bookings",
            1.3,
        ),
    ):
        (bp, bi), (sp, si) = grow["big"], grow[small]
        print(
            f"| {label} | {sp:.0f} -> {bp:.0f} | {bp / sp:.2f} | {si:.1f} -> {bi:.1f} |"
            f" {bi / si:.2f} | {verdict(bp / sp, limit)} (process) |"
        )

    print("\n## Start-up (limit 1.25x a minimal Typer app run by the same Python)\n")
    get_fig = dict(rows)["get --json"]
    print("| command | ms | ratio to minimal Typer app | |")
    print("|---|---:|---:|---|")
    print(f"| minimal Typer app (benchmarks/minimal_typer.py) | {floor.ms:.0f} | 1.00 | |")
    for name, fig in (("`--version`", version), ("`get --json` (big pool)", get_fig)):
        r = fig.ms / floor.ms
        print(f"| {name} | {fig.ms:.0f} | {r:.2f} | {verdict(r, 1.25)} |")

    for f in (OUT_FILE, ERR_FILE, RSS_FILE):
        Path(f).unlink(missing_ok=True)
    if not opts.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\ntotal benchmark time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
