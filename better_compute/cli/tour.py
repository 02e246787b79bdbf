"""The guided tour (`better-compute demo`).

It drives the real CLI in-process against a fresh demo database at a fixed instant, so it shows
exactly what a user would see, and it runs the same every time.
"""

from __future__ import annotations

import contextlib
import shlex
import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.rule import Rule
from rich.text import Text

from better_compute.cli.app import app, me
from better_compute.demo import DEMO_NOW
from better_compute.errors import Conflict, InvalidInput
from better_compute.service import booking
from better_compute.service.context import open_ctx

#: (what it shows, instant, command line without the global options). `{KEY}` is replaced by the id
#: of the reservation reserved with that idempotency key, `{node:KEY}` by its first node.
TOUR: list[tuple[str, str, str]] = [
    ("The fleet: one pool, two NVLink fabric domains of 8-GPU nodes", "08:00", "node list"),
    (
        "Pick the best-scored placement every time, so the tour reads the same each run",
        "08:00",
        "config set placement.topN 1",
    ),
    (
        "Reserve 4 GPUs now for 2 hours",
        "08:00",
        "reserve --tenant acme --gpus 4 --for 2h --key notebook",
    ),
    (
        "A calendar window: 8 GPUs tomorrow at 08:00 for 12 hours, booked today",
        "08:00",
        "reserve --tenant acme --gpus 8 --for 12h --start 2026-09-29T08:00:00Z --key weekly-eval",
    ),
    (
        "A gang: 3 whole nodes on one fabric.domain for 3 days, all or nothing",
        "08:00",
        "reserve --tenant acme --gpus 8 --gang 3 --topology-key fabric.domain --for 3d"
        " --key pretrain",
    ),
    (
        "Spot work soaks up the idle GPUs (globex sweeps at the spot price)",
        "08:00",
        "reserve --tenant globex --gpus 8 --gang 3 --for 12h --spot --key sweep",
    ),
    (
        "Would a 2-node fine-tune fit? Not now, but it would after preempting spot work",
        "08:00",
        "preview --tenant acme --gpus 8 --gang 2 --topology-key fabric.domain --for 6h",
    ),
    (
        "So reserve it: placed from the deadline, after the spot job's 2-minute notice",
        "08:00",
        "reserve --tenant acme --gpus 8 --gang 2 --topology-key fabric.domain --for 6h"
        " --key finetune",
    ),
    (
        "The spot job keeps its GPUs until the deadline; globex is not told who preempted it",
        "08:00",
        "events --tenant globex",
    ),
    (
        "Nothing is free for another 8-GPU job right now: it waits, pending",
        "08:00",
        "reserve --tenant globex --gpus 8 --for 1h --key eval",
    ),
    (
        "Cron runs tick: the spot job ends at its deadline; the waiting jobs start",
        "08:03",
        "tick",
    ),
    (
        "A GPU under tomorrow's calendar booking fails with an XID error",
        "08:05",
        "device quarantine {node:weekly-eval}:5 --reason xid-79",
    ),
    (
        "BookingRepair moves the booking to a healthy node for the same window",
        "08:05",
        "repair",
    ),
    ("The calendar booking after its repair", "08:05", "get {weekly-eval}"),
    ("The pool now", "08:05", "pool show west"),
    ("The next 24 hours, hour by hour", "08:05", "timeline --step 60"),
    (
        "Usage windows, billed from activation; without a meter they are dead-lettered, not lost",
        "09:00",
        "usage --dead-letter",
    ),
]


def _resolve(db: Path, line: str) -> str:
    """Fill `{KEY}` and `{node:KEY}` from the demo database."""
    if "{" not in line:
        return line
    ctx = open_ctx(str(db), None, me(), None)
    try:
        for rsv in booking.list_reservations(ctx, None, None, []):
            if rsv.idempotency_key is None:
                continue
            line = line.replace(f"{{{rsv.idempotency_key}}}", rsv.id)
            if rsv.allocations:
                first = min(a.node_id for a in rsv.allocations)
                line = line.replace(f"{{node:{rsv.idempotency_key}}}", first)
    finally:
        ctx.db.close()
    return line


def _run(console: Console, db: Path, now: str, line: str) -> None:
    line = _resolve(db, line)
    # soft_wrap: a long command wraps where the terminal wraps it, never inside an argument.
    console.print(
        Text(f"$ better-compute --now {now} {line}", style="bold cyan"),
        highlight=False,
        soft_wrap=True,
    )
    argv = ["--db", str(db), "--now", now, *shlex.split(line)]
    command = typer.main.get_command(app)
    # A failing step prints its error like the shell would; the tour goes on.
    with contextlib.suppress(typer.Exit):
        command.main(args=argv, prog_name="better-compute", standalone_mode=False)


def run_tour(console: Console, keep: Path | None) -> None:
    """Run the tour on a fresh demo database: in a temporary folder unless `keep` names a file.

    A kept file must be new: the tour never replaces a database or any other file.
    """
    if keep is not None:
        if keep.is_file():
            raise Conflict(f"--keep {str(keep)!r} already exists; name a new file for the demo")
        if keep.exists() or keep.is_symlink():
            raise InvalidInput(f"--keep {str(keep)!r} is not a new file; name one for the demo")
        if not keep.parent.is_dir():
            raise InvalidInput(f"--keep {str(keep)!r}: folder {str(keep.parent)!r} does not exist")
    with tempfile.TemporaryDirectory(prefix="better-compute-demo-") as tmp:
        db = keep if keep is not None else Path(tmp) / "demo.db"
        _run(console, db, DEMO_NOW, "init --demo --force")
        for title, clock_time, line in TOUR:
            console.print()
            console.print(Rule(style="dim"), width=None if console.is_terminal else 80)
            console.print(Text(title, style="bold"))  # wraps at any width, unlike a rule title
            _run(console, db, f"2026-09-28T{clock_time}:00Z", line)
        console.print()
        if keep is not None:
            console.print(
                f"The demo database is kept at {keep}; try: better-compute --db {keep} list"
            )
        else:
            console.print(
                "Done: the demo database was temporary and is gone (keep one with --keep FILE)."
            )
