"""The example scripts and inventory a user would copy run as they are."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "200"
    return subprocess.run(
        ["bash", str(EXAMPLES / script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


needs_cli = pytest.mark.skipif(shutil.which("better-compute") is None, reason="needs the CLI")


@needs_cli
def test_calendar_and_gang_example(tmp_path: Path) -> None:
    result = _run("calendar-and-gang.sh", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "reservation.repaired" in result.stdout
    assert '"from": ["west-0' in result.stdout  # the whole gang moved off the bad node


@needs_cli
def test_spot_sweep_example(tmp_path: Path) -> None:
    result = _run("spot-sweep.sh", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "by preempting 1 spot reservation" in result.stdout
    assert '"reason": "preempted"' in result.stdout
    assert "gpu.h100.spot.hours" in result.stdout and "gpu.h100.hours" in result.stdout


def test_the_example_inventory_parses() -> None:
    from better_compute.inventory import load_inventory_text

    inv = load_inventory_text((EXAMPLES / "inventory.json").read_text())
    assert [p.name for p in inv.pools] == ["east", "west"]
    assert sum(len(p.nodes) for p in inv.pools) == 9
