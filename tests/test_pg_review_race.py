"""Review of the PostgreSQL backend, item 1: two processes giving a ledger to one new SQLite file.

Two `migrate --to FILE` (or two `init`, or `restore`) to one new file both used to succeed: the
second silently replaced the first's finished, possibly already used, ledger. Now whoever places
second gets CONFLICT and the first one's ledger (with what it wrote since) stays. The race is made
deterministic here: the other process's ledger appears while ours is being built.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import NOW, Cli

from better_compute.errors import Conflict
from better_compute.storage import copy, create
from better_compute.storage.db import Database

pytestmark = pytest.mark.sqlite_only(reason="races two processes placing one new SQLite file")

ENTRY = [sys.executable, "-c", "from better_compute.cli import main; main()"]


def _winner(target: Path) -> Database:
    """The other process: it places its ledger at `target` first and writes to it at once (the
    write stays in its -wal, which the loser must not remove)."""
    db = create.create_database(str(target), force=False, seed_text="winner")
    with db.write() as conn:
        conn.execute("INSERT INTO meta(key, value) VALUES ('probe', 'winner wrote this')")
    return db


def _check_winner_intact(target: Path, winner: Database) -> None:
    fresh = sqlite3.connect(target)
    try:
        rows = dict(fresh.execute("SELECT key, value FROM meta").fetchall())
    finally:
        fresh.close()
    assert rows["db_id"] == create.ledger_id("winner")
    assert rows["probe"] == "winner wrote this"
    winner.close()
    assert [p.name for p in target.parent.iterdir() if ".bc-tmp-" in p.name] == []


@pytest.mark.parametrize("start", ["missing", "empty"])
def test_second_init_of_one_new_file_is_a_conflict(db_dir: Path, start: str) -> None:
    target = db_dir / "race.db"
    if start == "empty":
        target.touch()
    made: list[Database] = []

    def fill(db: Any) -> None:  # the other `init` finishes while this one builds
        made.append(_winner(target))

    with pytest.raises(Conflict, match="another process placed a file there"):
        create.create_database(str(target), force=False, seed_text="loser", fill=fill)
    _check_winner_intact(target, made[0])


def test_second_migrate_to_one_new_file_is_a_conflict(
    run: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = db_dir / "race.db"
    made: list[Database] = []
    load = copy._load

    def racing_load(conn: Any, *rest: Any) -> Any:  # the other `migrate` finishes meanwhile
        made.append(_winner(target))
        return load(conn, *rest)

    monkeypatch.setattr(copy, "_load", racing_load)
    error = run.fails(4, "migrate", "--to", target)
    assert error["code"] == "CONFLICT" and "another process" in error["message"]
    _check_winner_intact(target, made[0])


def test_concurrent_inits_of_one_new_file_have_one_winner(db_dir: Path) -> None:
    """The real race, as the reviewer ran it: several `init --demo` at once on one new file."""
    target = db_dir / "ri.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    procs = [
        subprocess.Popen(
            [*ENTRY, "--db", str(target), "--now", NOW, "--json", "init", "--demo"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(6)
    ]
    results = [(p.wait(60), *p.communicate()) for p in procs]
    codes = sorted(code for code, _out, _err in results)
    assert codes == [0, 4, 4, 4, 4, 4], results
    for code, out, err in results:
        if code == 4:
            assert out == "" and json.loads(err)["error"]["code"] == "CONFLICT"
    assert Cli(target).ok("pool", "list")


def test_a_folder_locked_by_someone_else_does_not_hang_init(db_dir: Path) -> None:
    """Crash review: a cron job wrapped in `flock DIR better-compute … init` held the folder's
    flock itself, and init waited for it for ever. It waits a moment, then goes unlocked."""
    import fcntl
    import time

    from better_compute.storage import files

    fd = os.open(db_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        began = time.monotonic()
        done = subprocess.run(
            [*ENTRY, "--db", str(db_dir / "x.db"), "--now", NOW, "init"],
            capture_output=True,
            timeout=60,
            check=False,
        )
        took = time.monotonic() - began
    finally:
        os.close(fd)
    assert done.returncode == 0, done.stderr
    assert files.FOLDER_LOCK_WAIT_S <= took < files.FOLDER_LOCK_WAIT_S + 30
    assert Cli(db_dir / "x.db").ok("pool", "list") == []
