"""The demo inventory and the guided tour (`better-compute demo`).

The tour drives the real CLI in-process against a fresh database at a fixed instant, so it shows
exactly what a user would see, and it runs the same every time.
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

import click
import typer
from rich.console import Console
from rich.rule import Rule

from better_compute.inventory import Inventory, parse_inventory

_H100 = {"count": 8, "model": "h100", "nvlinkGroups": 2}


def _node(name: str, rack: str, clique: int) -> dict[str, object]:
    return {
        "name": name,
        "labels": {"rack": rack},
        "gpus": {**_H100, "fabric": {"cluster": "c1", "clique": clique}},
    }


#: Two fabric domains (c1.1 with four nodes, c1.2 with three) of 8-GPU H100 nodes, two tenants.
DEMO_DOCUMENT: dict[str, object] = {
    "pools": [
        {
            "name": "west",
            "labels": {"region": "us-west"},
            "nodes": [_node(f"west-0{i}", "r1", 1) for i in range(1, 5)]
            + [_node(f"west-0{i}", "r2", 2) for i in range(5, 8)],
        }
    ],
    "tenants": [{"id": "acme", "quota": {"gpus": 64}}, {"id": "globex", "quota": {"gpus": 32}}],
}
DEMO_INVENTORY: Inventory = parse_inventory(DEMO_DOCUMENT)

DEMO_NOW = "2026-09-28T08:00:00Z"

#: (what it shows, command line without the global options, --now offset)
TOUR: list[tuple[str, str]] = [
    ("The fleet: one pool, two NVLink fabric domains of 8-GPU nodes", "node list"),
    ("Reserve 4 GPUs now for 2 hours", "reserve --tenant acme --gpus 4 --for 2h --key notebook"),
    (
        "A calendar window: 8 GPUs tomorrow at 08:00 for 12 hours",
        "reserve --tenant acme --gpus 8 --for 12h --start 2026-09-29T08:00:00Z --key weekly-eval",
    ),
    (
        "A gang: 3 whole nodes sharing one fabric.domain, for 3 days",
        "reserve --tenant acme --gpus 8 --gang 3 --topology-key fabric.domain --for 3d --key pretrain",
    ),
    (
        "Spot work soaks up idle GPUs (globex, 12h sweeps)",
        "reserve --tenant globex --gpus 8 --gang 3 --for 12h --spot --key sweep",
    ),
    ("Would a 2-node gang on one fabric fit now? (preview books nothing)",
     "preview --tenant acme --gpus 8 --gang 2 --topology-key fabric.domain --for 6h"),
    (
        "A regular request that only fits by preempting spot work: placed after a 2-minute notice",
        "reserve --tenant acme --gpus 8 --gang 2 --topology-key fabric.domain --for 6h --key finetune",
    ),
    ("tick moves reservations along: binding, active, billing", "tick"),
    ("A GPU under tomorrow's calendar booking fails with an XID error", "node list"),
    ("The pool now", "pool show west"),
    ("The next 24 hours of the pool, hour by hour", "timeline --step 60"),
    ("Every transition is in the append-only event log", "events --since 0"),
]


def _run(console: Console, db: Path, now: str, line: str) -> None:
    from better_compute.cli import app

    console.print(f"[bold cyan]$ better-compute --now {now} {line}[/]")
    argv = ["--db", str(db), "--now", now, *shlex.split(line)]
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="better-compute", standalone_mode=False)
    except click.exceptions.Exit:
        pass


def run_tour(console: Console, keep: Path | None) -> None:
    """Run the tour on a fresh demo database: in a temporary folder unless `keep` names a file."""
    with tempfile.TemporaryDirectory(prefix="better-compute-demo-") as tmp:
        db = keep if keep is not None else Path(tmp) / "demo.db"
        steps = tour_steps()
        _run(console, db, DEMO_NOW, "init --demo --force")
        for title, now, line in steps:
            console.print()
            console.print(Rule(title, align="left"))
            _run(console, db, now, line)
        console.print()
        if keep is not None:
            console.print(f"The demo database is kept at {keep}; try: better-compute --db {keep} list")
        else:
            console.print("Done; the demo database was temporary and is gone. Keep one with --keep FILE.")


def tour_steps() -> list[tuple[str, str, str]]:
    """Each step with the instant it runs at: most at DEMO_NOW, some later to show time passing."""
    later = "2026-09-28T08:03:00Z"
    steps: list[tuple[str, str, str]] = []
    for title, line in TOUR:
        steps.append((title, later if line.startswith(("tick", "pool", "timeline")) else DEMO_NOW, line))
    return steps
