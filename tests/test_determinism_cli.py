"""PRODUCT.md §2: the same commands with the same --now values against copies of one database give
byte-identical --json output, ids included.

One demo database is created, then copied into two folders under the same file name. The same
sequence of real CLI processes (reserve now and later, gangs, spot, preview, a preempting gang,
tick, cordon, repair, extend, tick --until, cancel, release, events, timeline)
runs against each copy, both copies side by side, and every command's exit code, stdout and
stderr must be byte-identical. At the end the two database files hold the same rows.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

NOW_MS = 1_790_582_400_000  # 2026-09-28T08:00:00Z
MIN = 60_000
HOUR = 60 * MIN
DB = "bc.db"

Ids = dict[str, str]
#: (name, --now, argv after the global options, or a function of the ids seen so far)
Step = tuple[str, str, list[str] | Callable[[Ids], list[str]]]


def at(offset_ms: int) -> str:
    return str(NOW_MS + offset_ms)


def cmd(text: str) -> list[str]:
    return text.split()


STEPS: list[Step] = [
    (
        "notebook",
        at(0),
        ["reserve", "--tenant", "acme", "--gpus", "4", "--for", "2h", "--key", "nb"],
    ),
    (
        "pretrain",
        "2026-09-28T08:00:00Z",
        cmd(
            "reserve --tenant acme --gpus 8 --gang 3 --topology-key fabric.domain --for 1d"
            " --start +1h --key pretrain"
        ),
    ),
    (
        "spot",
        at(0),
        cmd(
            "reserve --tenant globex --gpus 8 --gang 2 --topology-key fabric.domain --for 6h --spot"
            " --key spotgang"
        ),
    ),
    (
        "preview",
        at(MIN),
        cmd("preview --tenant acme --gpus 8 --gang 3 --topology-key fabric.domain --for 1h"),
    ),
    (
        "biggang",
        at(MIN),
        cmd(
            "reserve --tenant acme --gpus 8 --gang 3 --topology-key fabric.domain --for 1h"
            " --key biggang"
        ),
    ),
    ("tick", at(MIN), ["tick"]),
    ("cordon", at(2 * MIN), ["node", "cordon", "west-03", "--reason", "disk"]),
    ("repair", at(2 * MIN), ["repair"]),
    ("extend", at(3 * MIN), lambda ids: ["extend", ids["notebook"], "--by", "1h"]),
    ("until", at(5 * MIN), ["tick", "--until", "+2h", "--step", "15m"]),
    ("cancel", at(2 * HOUR + 10 * MIN), lambda ids: ["cancel", ids["pretrain"]]),
    ("release", at(2 * HOUR + 10 * MIN), lambda ids: ["release", ids["notebook"]]),
    ("events", at(2 * HOUR + 10 * MIN), ["events"]),
    (
        "timeline",
        at(2 * HOUR + 10 * MIN),
        ["timeline", "--from", at(0), "--to", at(6 * HOUR), "--step", "30"],
    ),
]


def _cli() -> list[str]:
    exe = shutil.which("better-compute")
    if exe is not None:
        return [exe]
    return [sys.executable, "-c", "from better_compute.cli import main; main()"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env["COLUMNS"] = "100"
    return env


def _start(folder: Path, now: str, argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*_cli(), "--db", DB, "--now", now, "--json", *argv],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )


def _rows(path: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def test_cli_replays_byte_for_byte(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    made = subprocess.run(
        [*_cli(), "--db", DB, "--now", at(0), "--json", "init", "--demo"],
        cwd=first,
        capture_output=True,
        env=_env(),
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    for suffix in ("", "-wal", "-shm"):
        if (first / (DB + suffix)).exists():
            shutil.copy(first / (DB + suffix), second / (DB + suffix))

    ids: Ids = {}
    for name, now, argv in STEPS:
        args = argv(ids) if callable(argv) else argv
        procs = [_start(folder, now, args) for folder in (first, second)]
        (out_a, err_a), (out_b, err_b) = (p.communicate(timeout=120) for p in procs)
        code_a, code_b = (p.returncode for p in procs)
        where = f"step {name}: better-compute --now {now} --json {' '.join(args)}"
        assert b"Traceback" not in err_a, f"{where}\n{err_a.decode()}"
        assert code_a not in (1, 2, 3), f"{where} exit {code_a}: {err_a.decode()}"
        assert (code_a, out_a, err_a) == (code_b, out_b, err_b), (
            f"{where} differs between copies:\n{out_a.decode()}{err_a.decode()}\n---\n"
            f"{out_b.decode()}{err_b.decode()}"
        )
        if code_a == 0:
            doc = json.loads(out_a)  # exactly one JSON document on stdout
            if isinstance(doc, dict) and str(doc.get("id", "")).startswith("rsv_"):
                ids[name] = doc["id"]
        else:
            assert out_a == b"", f"{where}: stdout on an error"
    assert {"notebook", "pretrain", "spot", "biggang"} <= set(ids), ids
    assert _rows(first / DB) == _rows(second / DB)
