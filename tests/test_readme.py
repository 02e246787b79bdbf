"""The README's commands run, in order, as a new user would paste them (not the installs)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_script() -> str:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    runnable = [b for b in blocks if "pip install" not in b]
    return "set -euo pipefail\n" + "\n".join(runnable)


def test_readme_has_the_two_commands_first() -> None:
    first = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)[0]
    assert "better-compute demo" in first
    assert "python -m pytest" in first


@pytest.mark.skipif(shutil.which("better-compute") is None, reason="needs the installed command")
def test_readme_commands_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "250"  # wide enough that no message is wrapped
    result = subprocess.run(
        ["bash", "-c", readme_script()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "traceback" not in (result.stdout + result.stderr).lower()
    # The gang waited for the notebook, then placed on the four c1.1 nodes.
    assert "no gang of 4 nodes fits in one fabric.domain (at most 3 nodes fit together)" in (
        result.stdout
    )
    assert "reservation.repaired" in result.stdout
    # preview --start-range shows the window reserve --start-range then books: both read the
    # ledger at the same instant (a stale BETTER_COMPUTE_NOW would preview an earlier one).
    # (The tour's first preview fits too; one of those that fit is the range's.)
    shown = re.findall(r"fits for (\S+ → \S+)", result.stdout)
    assert any(re.search(r"window\s+" + re.escape(w), result.stdout) for w in shown), shown
    assert "FORBIDDEN" in result.stderr
