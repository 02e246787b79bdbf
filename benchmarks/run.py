"""Issue 8's speed figures: one table, medians of whole `better-compute` processes.

Not part of the test suite. Run from the repository root. Building the pools through `simulate`
takes 20 to 50 minutes the first time (the big pool: about 20 minutes of CPU); `--workdir DIR`
keeps the databases for the next run, which then takes about a minute:

    python benchmarks/run.py [--repeat 5] [--workdir /tmp/bc-bench]

What it measures, each figure a median of `--repeat` runs (at least 5) in this one run:

- every command of issue 8 "Speed" item 2 on the big pool (4,000 nodes x 8 GPUs, ~200,000
  reservations past, current and future): its wall time, its ratio to `better-compute --version`,
  and its peak memory (max RSS) ratio to `--version`'s;
- growth (item 3): `reserve` at 4,000 nodes against 400 nodes with the same bookings per node, and
  at ~200,000 bookings against ~20,000 on 4,000 nodes, both as whole processes and in-process (the
  service call alone, without the interpreter's start-up, which hides growth);
- start-up (item 4): `--version` and `get --json` against a minimal Typer app with one command
  (benchmarks/minimal_typer.py) run by the same Python;
- tick and the write lock (item 5): `better-compute tick` with `--due` (1,000) placed reservations
  of the big pool starting at the same instant (a whole process on a fresh copy of that ledger
  each round, in the same interleaved rounds as item 2); and `--writers` (16) `reserve --json`
  processes started at once on the big pool, each through benchmarks/lock_probe.py, which times
  its wait inside BEGIN IMMEDIATE (SQLite's own busy wait for the write lock) and its hold to
  COMMIT: median and p99 over every process of every round, beside each process's wall time minus
  one uncontended `reserve`'s (which adds the CPU contention of 16 start-ups on this machine);
- replay (item 1): `simulate` of openb's default task list at `--compress 100` on openb's nodes,
  as a whole process on a fresh ledger, against benchmarks/baseline_replay.py's `replay` of the
  same tasks (the floor). `simulate` runs `--replay-repeat` times (default 5, the issue's median
  of at least 5; about 8 s each here; 0 skips it) and the baseline, under a second, `--repeat`
  times, the two alternating round by round after the baseline's warm-up.

The growth curves (item 3 as a chart in docs/) come from benchmarks/growth.py, which reuses this
script's pools through the same `--workdir`.

How the pools are built (`--builder`): by default `build_with_simulate` replays a generated month of
demand (benchmarks/month.py) through `simulate --until NOW`, so each pool is a ledger the real
engine made: released history, active work and calendar bookings ahead. `--builder direct`
writes rows straight into the tables through benchmarks/bench_reserve.py's Writer (shaped
exactly as repo.insert_* write them): much faster to build, but a shape no replay produced.
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import baseline_replay  # noqa: E402  (the floor for simulate: issue 8 item 1)
import bench_reserve as bench  # noqa: E402  (the pool builder and its Writer)
import pg_column  # noqa: E402  (issue 9: the PostgreSQL column)

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
    """The pool built by `simulate` replaying a generated month of demand (benchmarks/month.py):
    `init --now` 30 days before NOW, import the inventory (bench.inventory_doc: the nodes and ten
    tenants), write `pool.reservations` requests as JSON Lines, then `simulate --until NOW`, so
    the ledger is live at NOW with work active, bookings ahead and history behind. Every
    measurement below runs at NOW_TEXT and works unchanged on such a ledger. The replay is
    timed as a whole process (wall and CPU) and its report kept beside the ledger."""
    import month

    _scrub(path)
    exe = cli(path)[0]
    base = [exe, "--db", str(path)]
    inventory = path.with_suffix(".inventory.json")
    workload = path.with_suffix(".month.jsonl")
    inventory.write_text(json.dumps(bench.inventory_doc(pool.nodes)))
    workload.write_text(month.month(pool.reservations, seed))
    run_measured([*base, "--now", month.START_TEXT, "init"])
    run_measured([*base, "inventory", "import", str(inventory)])
    simulate = ["simulate", "--workload", str(workload), "--format", "jsonl"]
    sample, out = run_measured([*base, "--json", *simulate, "--until", NOW_TEXT])
    path.with_suffix(".report.json").write_text(out)
    report = json.loads(out)
    conn = sqlite3.connect(path)
    try:
        states = dict(conn.execute("SELECT state, COUNT(*) FROM reservations GROUP BY state"))
        rows, ahead = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(start > ?), 0) FROM bookings", (NOW,)
        ).fetchone()
    finally:
        conn.close()
    return (
        f"{pool.label}: {pool.nodes} nodes x 8 GPUs, {sum(states.values())} reservations"
        f" ({', '.join(f'{n} {s}' for s, n in sorted(states.items()))}), {rows} booking rows"
        f" ({ahead} starting after NOW); built by simulate of {report['requests']} requests"
        f" ({report['placedAtOnce']} placed at once, {report['placedAfterWaiting']} after"
        f" waiting, {report['neverPlaced']} never) in {sample.ms / 1000:.0f} s wall,"
        f" {sample.cpu_ms / 1000:.0f} s CPU, peak {sample.rss_kb / 1024:.0f} MiB"
    )


BUILDERS: dict[str, Callable[[Path, Pool, int], str]] = {
    "direct": build_direct,
    "simulate": build_with_simulate,
}


def migrated(path: Path) -> Path:
    """Bring a kept ledger to this code's schema (untimed): a ledger built by an older version
    migrates on its first open, which no timed run should pay. Then its free-GPU levels as of
    NOW, as cron's `tick` keeps them on a live ledger (storage/fitlevels.py): a ledger written
    directly, or copied afresh for each timed `tick`, would otherwise pay for every node."""
    from better_compute.storage import fitlevels
    from better_compute.storage.db import open_database

    db = open_database(str(path))
    try:
        with db.write() as conn:
            fitlevels.refresh_pools(conn, NOW)
    finally:
        db.close()
    return path


def compile_package() -> None:
    """Compile better_compute's modules once, as an installation does (pip byte-compiles what it
    installs). An editable install or a source tree otherwise compiles them on first run, or on
    every run where PYTHONDONTWRITEBYTECODE is set (as it is on the machine these figures come
    from): that would time the compiler on each start, which no installed copy pays. Python
    reads the cached bytecode whatever PYTHONDONTWRITEBYTECODE says."""
    import compileall

    import better_compute

    compileall.compile_dir(str(Path(better_compute.__file__).parent), quiet=1)


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
    cpu_ms: float = 0.0  # user + system CPU of the command (and of GNU time around it)


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
    return Sample(elapsed, rss, (usage.ru_utime + usage.ru_stime) * 1000), out


TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None
OUT_FILE = os.path.join(tempfile.gettempdir(), f"bc-bench-{os.getpid()}.out")
ERR_FILE = os.path.join(tempfile.gettempdir(), f"bc-bench-{os.getpid()}.err")
RSS_FILE = os.path.join(tempfile.gettempdir(), f"bc-bench-{os.getpid()}.rss")


@atexit.register
def _remove_scratch_files() -> None:
    for name in (OUT_FILE, ERR_FILE, RSS_FILE):
        Path(name).unlink(missing_ok=True)


@dataclass
class Figure:
    ms: float
    rss_kb: float
    cpu_ms: float = 0.0


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
        name: Figure(
            statistics.median(s.ms for s in got),
            statistics.median(s.rss_kb for s in got),
            statistics.median(s.cpu_ms for s in got),
        )
        for name, got in samples.items()
    }


def in_process_reserve_ms(path: Path, repeat: int) -> float:
    """`reserve --gpus 4 --for 8h` as a service call alone (cancelled after each run, untimed)."""
    return in_process_reserve(path, repeat)[0]


def in_process_reserve(path: Path, repeat: int) -> tuple[float, float]:
    """in_process_reserve_ms's median wall time, and its median CPU time (this process's own,
    which waiting for a CPU on a loaded machine does not inflate), in ms."""
    return in_process_reserves({path: path}, repeat)[path]


K = TypeVar("K", bound=Hashable)

#: In-process runs per round of `--repeat`: each is about 10 ms, so more of them cost nothing,
#: and a median of 5 calls of 5 ms moved by 30% from one call of the table to the next.
IN_PROCESS_ROUNDS = 3


def in_process_reserves(paths: Mapping[K, Path], repeat: int) -> dict[K, tuple[float, float]]:
    """in_process_reserve on each ledger, interleaved round by round (one untimed warm-up round,
    then IN_PROCESS_ROUNDS × `repeat`) as the processes are, so the machine's drift during the
    measurement falls on every ledger alike instead of on whichever came last."""
    from better_compute.service import booking
    from better_compute.service.context import open_ctx

    walls: dict[K, list[float]] = {key: [] for key in paths}
    cpus: dict[K, list[float]] = {key: [] for key in paths}
    for i in range(IN_PROCESS_ROUNDS * repeat + 1):
        for key, path in paths.items():
            ctx = open_ctx(str(path), NOW_TEXT, _me(), None)
            try:
                t0, c0 = time.perf_counter(), time.process_time()
                rsv = booking.reserve(ctx, bench.reserve_args())
                elapsed = (time.perf_counter() - t0) * 1000
                cpu = (time.process_time() - c0) * 1000
                booking.cancel(ctx, rsv.id)
            finally:
                ctx.db.close()
            if i:
                walls[key].append(elapsed)
                cpus[key].append(cpu)
    return {k: (statistics.median(walls[k]), statistics.median(cpus[k])) for k in paths}


def _me() -> str:
    from better_compute.identity import os_user

    return os_user()


# ---------------------------------------------------------------- the commands


def cli(path: Path | str) -> list[str]:
    exe = shutil.which("better-compute", path=str(Path(sys.executable).parent)) or shutil.which(
        "better-compute"
    )
    if exe is None:
        raise SystemExit("better-compute is not installed in this Python's environment")
    return [exe, "--db", str(path), "--now", NOW_TEXT]


def canceller(path: Path | str) -> Callable[[str], None]:
    """Cancel what a timed `reserve --json` created, so every run sees the same ledger."""

    def cancel(out: str) -> None:
        rsv_id = json.loads(out)["id"]
        run_measured([*cli(path), "--json", "cancel", rsv_id])

    return cancel


def commands(
    path: Path | str, rsv: str | None = None
) -> dict[str, tuple[list[str], Callable[[str], None] | None]]:
    """The timed commands on the ledger `path` (a file, or a PostgreSQL URL with `rsv` given)."""
    base = cli(path)
    rsv = rsv or first_reservation(Path(path))
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


# ---------------------------------------------------------------- issue 10: advice

#: Issue 10's limit: a 14-day `advice` on the big pool within this many `--version`s.
ADVICE_LIMIT = 3.0


def advice_jobs(path: Path) -> dict[str, Job]:
    """`advice` over a 14-day start range on the big pool: "64 GPUs for three days" as a gang of
    8 whole nodes (the seed's question), and one whole node for three days; a duration range."""
    base = cli(path)
    days = f"{NOW_TEXT}..2026-01-15T00:00:00Z"
    ask = [*base, "advice", "--start-range", days, "--json"]
    return {
        "advice: gang 8 x 8 GPUs, 3d, 14-day range": (
            [*ask, "--gpus", "8", "--gang", "8", "--duration", "3d", "--limit", "1"],
            None,
        ),
        "advice: 8 GPUs, 3d, 14-day range": (
            [*ask, "--gpus", "8", "--duration", "3d", "--limit", "1"],
            None,
        ),
        "advice: 4 GPUs, 1d..3d, 14-day range": (
            [*ask, "--gpus", "4", "--duration-range", "1d..3d", "--limit", "1"],
            None,
        ),
        "advice: 4 GPUs, 1d..3d, 14-day range, limit 5": (
            [*ask, "--gpus", "4", "--duration-range", "1d..3d", "--limit", "5"],
            None,
        ),
    }


def advice_section(big: Path, repeat: int) -> None:
    """One table: each advice job's median wall and CPU time against `--version`'s, interleaved
    (on a loaded machine, waiting for a CPU inflates wall time; CPU time is what the work costs)."""
    jobs = {"version": ([*cli(big)[:1], "--version"], None), **advice_jobs(big)}
    figures = interleaved(jobs, repeat)
    version = figures.pop("version")
    print(f"\n## advice (issue 10; limit {ADVICE_LIMIT:g}x `--version`, same rounds)\n")
    print("| command | ms | ratio to --version | CPU ms | CPU ratio | peak MiB | |")
    print("|---|---:|---:|---:|---:|---:|---|")
    print(
        f"| `--version` | {version.ms:.0f} | 1.00 | {version.cpu_ms:.0f} | 1.00 |"
        f" {version.rss_kb / 1024:.1f} | |"
    )
    for name, fig in figures.items():
        r, c = fig.ms / version.ms, fig.cpu_ms / max(version.cpu_ms, 1e-9)
        print(
            f"| `{name}` | {fig.ms:.0f} | {r:.2f} | {fig.cpu_ms:.0f} | {c:.2f} |"
            f" {fig.rss_kb / 1024:.1f} | {verdict(r, ADVICE_LIMIT)} (wall),"
            f" {verdict(c, ADVICE_LIMIT)} (CPU) |"
        )


# ---------------------------------------------------------------- item 5: tick, the write lock

TICK_AT = NOW + bench.MINUTE
TICK_AT_TEXT = "2026-01-01T00:01:00Z"


def add_due(path: Path, count: int, at: int, seed: int) -> int:
    """Add `count` placed reservations (1, 2 or 4 GPUs for 8 h, one per node, on GPUs free over the
    whole window) that all start at `at`, to the pool at `path`, rows shaped as bench.Writer writes
    them. Their lead repair is marked done (as the tick at `at` - repair.leadMs would have left
    them), so the tick at `at` does for each the start repair, the binding and the activation.

    `at` is one minute after NOW: in either builder's pool every start and end falls on a
    15-minute mark, so the tick at `at` has these `count` reservations to do and, at most,
    a retry of a request still waiting (tick_job counts only these `count`)."""
    import random

    rng = random.Random(seed)
    end = at + 8 * bench.HOUR
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        pool_id = str(conn.execute("SELECT id FROM pools WHERE name = 'h100'").fetchone()[0])
        busy: dict[str, set[int]] = {}
        for node, atom in conn.execute(
            "SELECT node_id, atom FROM bookings WHERE pool_id = ? AND end > ? AND start < ?",
            (pool_id, at, end),
        ):
            busy.setdefault(str(node), set()).add(int(atom))
        nodes = [str(r[0]) for r in conn.execute("SELECT name FROM nodes ORDER BY name")]
        rng.shuffle(nodes)
        conn.execute("BEGIN IMMEDIATE")
        w = bench.Writer(conn, pool_id)
        w.seq = int(conn.execute("SELECT MAX(seq) FROM reservations").fetchone()[0] or 0)
        first = w.seq + 1
        made = 0
        for node in nodes:
            free = [a for a in range(bench.GPUS_PER_NODE) if a not in busy.get(node, set())]
            gpus = min(rng.choice((1, 2, 4)), len(free))
            if gpus == 0:
                continue
            w.add(rng, node, free[:gpus], at, end, "placed", at)
            made += 1
            if made == count:
                break
        w.flush()
        conn.execute("UPDATE reservations SET lead_checked = 1 WHERE seq >= ?", (first,))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    if made < count:
        raise SystemExit(f"only {made} of {count} due reservations fit at {at}")
    return made


def _scrub(path: Path) -> None:
    for stale in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        stale.unlink(missing_ok=True)  # the benchmark's own scratch files


def _copy_ledger(src: Path, dest: Path) -> None:
    """A consistent copy through SQLite's backup API (the source may be in WAL mode)."""
    _scrub(dest)
    a, b = sqlite3.connect(src), sqlite3.connect(dest)
    try:
        a.backup(b)
    finally:
        a.close()
        b.close()


def tick_ledger(big: Path, workdir: Path, due: int, seed: int, rebuild: bool) -> Path:
    """The big pool plus `due` reservations starting at TICK_AT (kept in --workdir)."""
    base = workdir / f"{big.stem}-{due}due.db"
    if base.exists() and not rebuild:
        print(f"tick ledger: reusing {base}")
        return base
    t0 = time.perf_counter()
    _copy_ledger(big, base)
    try:
        add_due(base, due, TICK_AT, seed)
    except BaseException:
        _scrub(base)
        raise
    print(
        f"tick ledger: the big pool plus {due} placed reservations starting at {TICK_AT_TEXT},"
        f" built in {time.perf_counter() - t0:.1f} s"
    )
    return base


def tick_job(base: Path, scratch: Path, due: int) -> Job:
    """`better-compute tick` at TICK_AT on a fresh copy of the tick ledger each run: the copy is
    made after each run (untimed), and the run is checked to have activated all `due`."""
    exe = cli(base)[0]
    _copy_ledger(base, scratch)
    conn = sqlite3.connect(base)
    try:
        starting = {
            str(r[0])
            for r in conn.execute(
                "SELECT id FROM reservations WHERE state = 'placed' AND during_start = ?",
                (TICK_AT,),
            )
        }
    finally:
        conn.close()

    def check_and_restore(out: str) -> None:
        changes = json.loads(out)["changes"]
        active = sum(
            1
            for c in changes
            if c["type"] == "reservation.active" and c.get("reservationId") in starting
        )
        if active != due:
            raise SystemExit(f"tick activated {active} of the {due} reservations due")
        _copy_ledger(base, scratch)

    argv = [exe, "--db", str(scratch), "--now", TICK_AT_TEXT, "--json", "tick"]
    return argv, check_and_restore


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of them at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Burst:
    processes: int
    rounds: int
    waits_ms: list[float]  # each process's wait in BEGIN IMMEDIATE, every timed round
    holds_ms: list[float]  # each process's BEGIN IMMEDIATE -> COMMIT
    walls_ms: list[float]  # each contended process's wall time
    alone_ms: list[float]  # one uncontended run per round
    spans_ms: list[float]  # each round: first spawn to last exit


def lock_burst(path: Path, processes: int, repeat: int) -> Burst:
    """`processes` `reserve --json` processes started at once on the big pool, each run through
    benchmarks/lock_probe.py, which records the time each spent inside BEGIN IMMEDIATE (the wait
    for the write lock) and holding it. Each round first runs one probe-wrapped `reserve` alone
    (the uncontended wall time), then the burst; what they booked is cancelled (untimed)."""
    from better_compute.service import booking
    from better_compute.service.context import open_ctx

    scratch = Path(tempfile.mkdtemp(prefix="bc-burst-"))
    base = [sys.executable, str(HERE / "lock_probe.py"), "--db", str(path), "--now", NOW_TEXT]

    def argv(i: int) -> list[str]:
        return [*base, "reserve", "--tenant", f"t{i % 10}", "--gpus", "4", "--for", "8h", "--json"]

    def spawn(i: int) -> int:
        env = dict(os.environ, BC_LOCK_PROBE=str(scratch / f"{i}.json"))
        return os.posix_spawn(
            argv(i)[0],
            argv(i),
            env,
            file_actions=[
                (
                    os.POSIX_SPAWN_OPEN,
                    1,
                    str(scratch / f"{i}.out"),
                    os.O_WRONLY | os.O_CREAT,
                    0o600,
                ),
                (
                    os.POSIX_SPAWN_OPEN,
                    2,
                    str(scratch / f"{i}.err"),
                    os.O_WRONLY | os.O_CREAT,
                    0o600,
                ),
            ],
        )

    def collect(i: int) -> tuple[str, dict[str, list[float]]]:
        out = json.loads((scratch / f"{i}.out").read_text())
        probe = json.loads((scratch / f"{i}.json").read_text())
        for f in (f"{i}.out", f"{i}.err", f"{i}.json"):
            (scratch / f).unlink()
        return str(out["id"]), probe

    def wait(pids: dict[int, int]) -> dict[int, float]:
        ended: dict[int, float] = {}
        while pids:
            pid, status = os.wait()[:2]
            ended[pids.pop(pid)] = time.perf_counter()
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"a burst reserve failed: {list(scratch.glob('*.err'))}")
        return ended

    got = Burst(processes, repeat, [], [], [], [], [])
    try:
        for r in range(repeat + 1):
            made: list[str] = []
            t0 = time.perf_counter()
            ended = wait({spawn(processes): processes})
            alone = (ended[processes] - t0) * 1000
            rsv_id, _ = collect(processes)
            made.append(rsv_id)
            started: dict[int, float] = {}
            pids: dict[int, int] = {}
            for i in range(processes):
                started[i] = time.perf_counter()
                pids[spawn(i)] = i
            ended = wait(pids)
            for i in range(processes):
                rsv_id, probe = collect(i)
                made.append(rsv_id)
                if r:
                    got.waits_ms.extend(probe["waits_ms"])
                    got.holds_ms.extend(probe["holds_ms"])
                    got.walls_ms.append((ended[i] - started[i]) * 1000)
            if r:
                got.alone_ms.append(alone)
                got.spans_ms.append((max(ended.values()) - min(started.values())) * 1000)
            ctx = open_ctx(str(path), NOW_TEXT, _me(), None)
            try:
                for rsv_id in made:
                    booking.cancel(ctx, rsv_id)
            finally:
                ctx.db.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return got


# ---------------------------------------------------------------- item 1: replay against the floor


@dataclass
class Replay:
    runs: int
    process_s: list[float]  # the whole `simulate` process
    cpu_s: list[float]  # its user + system CPU
    wall_s: list[float]  # simulate's own wallSeconds
    rss_kb: list[int]
    report: dict[str, object]
    baseline_s: list[float]
    baseline: baseline_replay.Outcome
    baseline_cpu_s: list[float] = field(default_factory=list)
    baseline_process_s: list[float] = field(default_factory=list)  # its whole process


def replay(workdir: Path, data: Path, compress: str, runs: int, repeat: int) -> Replay:
    """`simulate --workload openb_pod_list_default.csv --format openb --compress K` on a fresh
    ledger of the openb nodes (init --now, inventory import: untimed), `runs` times; and
    benchmarks/baseline_replay.py's `replay` of the same tasks on the same nodes, `repeat` times
    after one warm-up (its `load`, untimed, before each: the replay consumes its nodes).

    The two alternate, a simulate then a floor, round after round, each a process of its own:
    this machine's speed drifts over minutes (the floor alone has measured 0.55 to 0.68 s
    within an hour), and a floor timed only after all the simulates compared two different
    machines."""
    tasks, nodes = data / "openb_pod_list_default.csv", data / "openb_node_list_gpu_node.csv"
    db = workdir / "replay.db"
    exe = cli(db)[0]
    got = Replay(runs, [], [], [], [], {}, [], baseline_replay.Outcome(0, 0, 0, 0))

    def one_simulate() -> None:
        _scrub(db)
        run_measured([exe, "--db", str(db), "--now", NOW_TEXT, "init"])
        run_measured(
            [exe, "--db", str(db), "inventory", "import", "--format", "openb-nodes", str(nodes)]
        )
        simulate = ["simulate", "--workload", str(tasks), "--format", "openb"]
        sample, out = run_measured(
            [exe, "--db", str(db), "--json", *simulate, "--compress", compress]
        )
        report = json.loads(out)
        got.process_s.append(sample.ms / 1000)
        got.cpu_s.append(sample.cpu_ms / 1000)
        got.wall_s.append(float(report["wallSeconds"]))
        got.rss_kb.append(sample.rss_kb)
        got.report = report

    def one_floor(timed: bool) -> None:
        """The floor in a fresh process, as simulate runs: in this one, after the other
        sections, its allocations met a heap of everything they left (one run's floor took
        0.97 s here against 0.55 to 0.67 s in a process of its own)."""
        floor = [sys.executable, str(Path(baseline_replay.__file__)), "--json"]
        floor += ["--compress", compress, "--tasks", str(tasks), "--nodes", str(nodes)]
        sample, out = run_measured(floor)
        doc = json.loads(out)
        if timed:
            got.baseline_process_s.append(sample.ms / 1000)
            got.baseline_cpu_s.append(float(doc.pop("cpu_seconds")))
            got.baseline = baseline_replay.Outcome(**doc)
            got.baseline_s.append(got.baseline.seconds)

    one_floor(timed=False)  # the warm-up
    for i in range(max(runs, repeat)):
        if i < runs:
            one_simulate()
        if i < repeat:
            one_floor(timed=True)
    _scrub(db)
    return got


# ---------------------------------------------------------------- the table


def verdict(ratio: float, limit: float) -> str:
    return "ok" if ratio <= limit else f"over {limit:g}x"


def replay_section(workdir: Path, opts: argparse.Namespace, repeat: int) -> None:
    """Item 1: the openb replay by `simulate` against the floor, wall and CPU time."""
    print(
        f"\n## Replay (item 1; limit 15x): openb default at --compress {opts.compress},"
        f" simulate run {opts.replay_repeat} time(s), the baseline {repeat} times\n"
    )
    rp = replay(workdir, opts.openb, opts.compress, opts.replay_repeat, repeat)
    floor_s = statistics.median(rp.baseline_s)
    proc_s, wall_s = statistics.median(rp.process_s), statistics.median(rp.wall_s)
    cpu_s = statistics.median(rp.cpu_s)
    print("| replay | runs | seconds | ratio to baseline | |")
    print("|---|---:|---:|---:|---|")
    print(
        f"| `simulate --json` process (parse, replay, report) | {rp.runs} | {proc_s:.1f} |"
        f" {proc_s / floor_s:.1f} | {verdict(proc_s / floor_s, 15)};"
        f" peak {statistics.median(rp.rss_kb) / 1024:.0f} MiB |"
    )
    floor_cpu = statistics.median(rp.baseline_cpu_s)
    print(
        f"| ... its CPU time (user + system) | {rp.runs} | {cpu_s:.1f} |"
        f" {cpu_s / floor_cpu:.1f} | against the floor's CPU time ({floor_cpu:.3f} s) |"
    )
    print(
        f"| simulate's own `wallSeconds` | {rp.runs} | {wall_s:.1f} |"
        f" {wall_s / floor_s:.1f} | {verdict(wall_s / floor_s, 15)} |"
    )
    print(
        f"| benchmarks/baseline_replay.py `replay` (median) | {repeat} | {floor_s:.3f} |"
        " 1 | the floor |"
    )
    floor_proc = statistics.median(rp.baseline_process_s)
    print(
        f"| ... the floor's whole process (start-up, parse, replay) | {repeat} |"
        f" {floor_proc:.2f} | | `simulate` process to it: {proc_s / floor_proc:.1f}x"
        " (for information: the limit is judged on the rows above) |"
    )
    r, b = rp.report, rp.baseline
    print(
        f"\nsimulate: {r['requests']} requests, {r['placedAtOnce']} placed at once,"
        f" {r['placedAfterWaiting']} after waiting, {r['neverPlaced']} never,"
        f" {r['skipped']} skipped; baseline: {b.placed_at_once} at once,"
        f" {b.placed_after_waiting} after waiting, {b.never_placed} never"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per figure (at least 5)")
    ap.add_argument("--nodes", type=int, default=4000)
    ap.add_argument("--small-nodes", type=int, default=400)
    ap.add_argument("--bookings", type=int, default=200_000, help="reservations on the big pool")
    ap.add_argument("--small-bookings", type=int, default=20_000)
    ap.add_argument(
        "--builder",
        choices=sorted(BUILDERS),
        default="simulate",
        help="simulate: replay a generated month (minutes for the big pool); direct: write rows",
    )
    ap.add_argument("--workdir", help="keep (and reuse) the databases here")
    ap.add_argument("--rebuild", action="store_true", help="rebuild databases found in --workdir")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--advice-only", action="store_true", help="build or reuse the big pool, time only advice"
    )
    ap.add_argument(
        "--replay-only", action="store_true", help="time only the replay (item 1), no pools"
    )
    ap.add_argument("--due", type=int, default=1000, help="reservations due at once for tick")
    ap.add_argument("--writers", type=int, default=16, help="concurrent reserve processes")
    ap.add_argument(
        "--replay-repeat",
        type=int,
        default=5,
        help="full openb replays by simulate (the median of 5 by default; 0 skips it)",
    )
    ap.add_argument("--compress", default="100", help="the replay's --compress")
    ap.add_argument("--openb", type=Path, default=baseline_replay.DATA, help="openb data folder")
    ap.add_argument(
        "--postgres",
        metavar="URL",
        help="also time the commands on a PostgreSQL copy of the big pool (pg_column.py)",
    )
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
    print(f"# medians of {repeat} runs after one warm-up each")
    compile_package()
    print("# better_compute byte-compiled once before timing (compile_package)\n")

    if opts.replay_only:
        replay_section(workdir, opts, repeat)
        if not opts.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        return 0
    if opts.advice_only:
        big_pool = Pool("big", opts.nodes, opts.bookings)
        path = workdir / f"{big_pool.nodes}n-{big_pool.reservations}r-{opts.builder}.db"
        if not path.exists() or opts.rebuild:
            print(BUILDERS[opts.builder](path, big_pool, opts.seed))
        advice_section(path, repeat)
        return 0
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
            for scratch in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                scratch.unlink(missing_ok=True)  # the benchmark's own scratch files
            print(BUILDERS[opts.builder](path, pool, opts.seed))
        paths[key] = migrated(path)
    big = paths["big"]
    stale = opts.rebuild or (
        (workdir / f"{big.stem}-{opts.due}due.db").exists()
        and (workdir / f"{big.stem}-{opts.due}due.db").stat().st_mtime < big.stat().st_mtime
    )
    tick_base = migrated(tick_ledger(big, workdir, opts.due, opts.seed, stale))
    print()

    python = sys.executable
    jobs: dict[str, Job] = {
        "minimal": ([python, str(HERE / "minimal_typer.py")], None),
        "version": ([*cli(big)[:1], "--version"], None),
        **commands(big),
        "tick": tick_job(tick_base, workdir / "tick-run.db", opts.due),
    }
    if opts.postgres:  # the same commands on a PostgreSQL copy, interleaved with SQLite's
        jobs.update(pg_column.jobs(opts.postgres, big, commands))
    figures = interleaved(jobs, repeat)
    floor, version = figures.pop("minimal"), figures.pop("version")
    tick = figures.pop("tick")
    on_postgres = {k: figures.pop(k) for k in list(figures) if k.startswith(pg_column.PREFIX)}
    rows: list[tuple[str, Figure]] = list(figures.items())

    print(
        "## One command at fleet scale"
        f" ({opts.nodes} nodes, ~{opts.bookings:,} reservations; limits 2x time, 1.5x memory)\n"
    )
    # `--version` answers before Typer coerces any parameter, so it skips the pydantic adapters
    # every command with a parameter pays; the minimal Typer app pays them: both columns shown.
    # CPU (user + system) beside the wall time: on a shared machine under load a process waits
    # for a CPU for a while that has nothing to do with its own work; its CPU time does not.
    print(
        "| command | ms | ratio to --version | ratio to minimal app | CPU ms | CPU ratio to"
        " --version | peak MiB | memory ratio to --version | memory ratio to minimal app | |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, fig in [("--version", version), ("minimal Typer app", floor), *rows]:
        t, m = fig.ms / version.ms, fig.rss_kb / version.rss_kb
        tf, mf = fig.ms / floor.ms, fig.rss_kb / floor.rss_kb
        c = fig.cpu_ms / version.cpu_ms if version.cpu_ms else float("nan")
        ok = "ok" if t <= 2 and m <= 1.5 else "OVER"
        print(
            f"| `{name}` | {fig.ms:.0f} | {t:.2f} | {tf:.2f} | {fig.cpu_ms:.0f} | {c:.2f} |"
            f" {fig.rss_kb / 1024:.1f} | {m:.2f} | {mf:.2f} | {ok} |"
        )

    advice_section(big, repeat)
    if on_postgres:
        pg_column.table(figures, on_postgres)

    print("\n## Growth of `reserve --json` (limits 1.5x for nodes, 1.3x for bookings)\n")
    keys = ("big", "few-nodes", "few-bookings")
    reserve_jobs: dict[str, Job] = {k: commands(paths[k])["reserve --json"] for k in keys}
    processes = interleaved(reserve_jobs, repeat)
    inside = in_process_reserves({k: paths[k] for k in keys}, repeat)
    grow = {k: (processes[k].ms, inside[k][0]) for k in keys}
    print(
        "| comparison | process ms | ratio | in-process ms | ratio | in-process CPU ms | ratio | |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for label, small, limit in (
        (f"{opts.small_nodes} -> {opts.nodes} nodes (same bookings per node)", "few-nodes", 1.5),
        (
            f"{opts.small_bookings:,} -> {opts.bookings:,} reservations ({opts.nodes} nodes)",
            "few-bookings",
            1.3,
        ),
    ):
        (bp, bi), (sp, si) = grow["big"], grow[small]
        bc, sc = inside["big"][1], inside[small][1]
        print(
            f"| {label} | {sp:.0f} -> {bp:.0f} | {bp / sp:.2f} | {si:.1f} -> {bi:.1f} |"
            f" {bi / si:.2f} | {sc:.1f} -> {bc:.1f} | {bc / sc:.2f} |"
            f" {verdict(bp / sp, limit)} (process), {verdict(bc / sc, limit)} (in-process CPU) |"
        )

    print("\n## Start-up (limit 1.25x a minimal Typer app run by the same Python)\n")
    get_fig = dict(rows)["get --json"]
    print("| command | ms | ratio to minimal Typer app | |")
    print("|---|---:|---:|---|")
    print(f"| minimal Typer app (benchmarks/minimal_typer.py) | {floor.ms:.0f} | 1.00 | |")
    for name, fig in (("`--version`", version), ("`get --json` (big pool)", get_fig)):
        r = fig.ms / floor.ms
        print(f"| {name} | {fig.ms:.0f} | {r:.2f} | {verdict(r, 1.25)} |")

    print(
        f"\n## tick and the write lock (item 5; big pool, {opts.nodes} nodes,"
        f" ~{opts.bookings:,} reservations)\n"
    )
    burst = lock_burst(big, opts.writers, repeat)
    alone = statistics.median(burst.alone_ms)
    extra = [w - alone for w in burst.walls_ms]
    n = len(burst.waits_ms)
    print("| measure | ms | |")
    print("|---|---:|---|")
    print(
        f"| `tick` with {opts.due:,} reservations due at once (whole process, median of"
        f" {repeat}) | {tick.ms:.0f} | peak {tick.rss_kb / 1024:.1f} MiB |"
    )
    w = opts.writers
    print(
        f"| {w} concurrent `reserve --json`: wait for the write lock, median | "
        f"{statistics.median(burst.waits_ms):.0f} | in BEGIN IMMEDIATE, {n} waits"
        f" ({burst.rounds} bursts) |"
    )
    print(f"| ... p99 | {percentile(burst.waits_ms, 0.99):.0f} | max {max(burst.waits_ms):.0f} |")
    print(
        f"| ... write lock held per `reserve`, median / p99 |"
        f" {statistics.median(burst.holds_ms):.0f} / {percentile(burst.holds_ms, 0.99):.0f} |"
        " BEGIN IMMEDIATE to COMMIT |"
    )
    print(
        f"| ... wall time minus one uncontended `reserve` ({alone:.0f} ms), median / p99 |"
        f" {statistics.median(extra):.0f} / {percentile(extra, 0.99):.0f} |"
        f" includes CPU contention of {w} start-ups on the machine |"
    )
    print(
        f"| ... whole burst, first start to last exit (median of {burst.rounds}) |"
        f" {statistics.median(burst.spans_ms):.0f} | |"
    )

    if opts.replay_repeat > 0:
        replay_section(workdir, opts, repeat)

    for f in (OUT_FILE, ERR_FILE, RSS_FILE):
        Path(f).unlink(missing_ok=True)
    if not opts.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\ntotal benchmark time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
