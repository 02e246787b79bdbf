"""`better-compute demo`: the guided tour runs every scenario and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from better_compute.cli.tour import TOUR


def _demo(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env["COLUMNS"] = "120"
    env["TMPDIR"] = str(cwd)
    command = [sys.executable, "-c", "from better_compute.cli import main; main()", "demo", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    return tmp_path


def test_the_tour_shows_every_scenario_and_leaves_nothing(scratch: Path) -> None:
    result = _demo(cwd=scratch)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert result.stderr == ""  # no step failed
    for title, _, _ in TOUR:
        assert title in out
    assert "fits in one fabric.domain" in out or "no gang of" in out  # the gang preview
    assert "by preempting 1 spot reservation" in out
    # globex's own log shows the notice but never who (another tenant) preempted it
    globex_log = out.split("events --tenant globex")[1].split("$ better-compute")[0]
    assert "reservation.preempting" in globex_log and '"by": "rsv_' not in globex_log
    assert "pending" in out and "reservation.placed" in out  # the waiting job placed by tick
    assert "reservation.repaired" in out
    assert "dead-letter" in out or "gpu.h100.spot.hours" in out
    assert "peak" in out  # the timeline chart
    assert list(scratch.iterdir()) == []  # the temporary database is gone


def test_keep_writes_the_demo_database_where_asked(scratch: Path) -> None:
    kept = scratch / "kept.db"
    result = _demo("--keep", str(kept), cwd=scratch)
    assert result.returncode == 0, result.stderr
    assert kept.exists()
    listing = subprocess.run(
        [
            sys.executable,
            "-c",
            "from better_compute.cli import main; main()",
            "--db",
            str(kept),
            "--json",
            "list",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listing.returncode == 0 and '"idempotencyKey": "weekly-eval"' in listing.stdout
