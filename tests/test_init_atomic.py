"""`init` and `init --force` replace the ledger atomically (issue 7).

- `init --force --demo` killed with SIGKILL at random moments leaves a ledger that opens, passes
  `integrity_check`, and is either the old one with every reservation (including those still in
  its WAL) or the new one with the whole demo inventory: never half-built, never mixed.
- Under `ulimit -f` (the disk fills part-way), `init --force --demo` fails cleanly and the old
  ledger is untouched.
- Writers that opened the ledger and wait on its write lock while `init --force` replaces it exit
  7 (UNAVAILABLE), print nothing, and write nothing anywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import NOW, Cli, at, init_db

pytestmark = pytest.mark.sqlite_only(
    reason="kills and fills the disk under the swap of a new SQLite file"
)

OLD_NOW = NOW
NEW_NOW = at(3_600_000)
ENTRY = [sys.executable, "-c", "from better_compute.cli import main; main()"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env["COLUMNS"] = "100"
    return env


def spawn(db: Path, *args: str, now: str = OLD_NOW, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*ENTRY, "--db", str(db), "--now", now, "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        **kwargs,  # type: ignore[call-overload]
    )


def state(db: Path) -> tuple[str, list[str], int]:
    """(db_id, reservation ids, node count) after checking the file is whole."""
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        db_id = conn.execute("SELECT value FROM meta WHERE key = 'db_id'").fetchone()[0]
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM reservations"))
        nodes = conn.execute("SELECT COUNT(*) FROM nodes").fetchone()[0]
        return db_id, ids, nodes
    finally:
        conn.close()


def db_id_for(folder: Path, now: str) -> str:
    """The db_id `init --now` gives: it depends on the instant alone."""
    return state(init_db(folder / f"probe-{now}.db", now=now))[0]


def listing(folder: Path) -> dict[str, int]:
    out = {}
    for entry in os.scandir(folder):
        with contextlib.suppress(OSError):
            out[entry.name] = entry.inode()
    return out


def kill_after_files_change(proc: subprocess.Popen[str], folder: Path, delay: float) -> None:
    """SIGKILL `proc` `delay` seconds after it first creates, removes or replaces a file in
    `folder`: the moment its work on the files begins (start-up before it is most of a run and
    varies more than the work itself takes)."""
    before = listing(folder)
    deadline = time.monotonic() + 30
    while listing(folder) == before and proc.poll() is None:
        assert time.monotonic() < deadline, "the command never touched the folder"
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)


def old_ledger(pristine: Path, db: Path) -> tuple[sqlite3.Connection, list[str]]:
    """A copy of `pristine` plus two reservations that stay in its WAL: the returned connection
    keeps the WAL from being checkpointed when the CLI closes the file."""
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    shutil.copyfile(pristine, db)
    keeper = sqlite3.connect(db)
    keeper.execute("SELECT COUNT(*) FROM meta").fetchone()
    cli = Cli(db)
    for key in ("wal-1", "wal-2"):
        cli.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", key)
    assert Path(str(db) + "-wal").stat().st_size > 0
    return keeper, state(db)[1]


def test_init_force_killed_at_random_moments_leaves_the_old_or_the_new_ledger(
    db_dir: Path,
) -> None:
    pristine = init_db(db_dir / "pristine.db", "--demo")
    Cli(pristine).ok("reserve", "--tenant", "globex", "--gpus", "8", "--for", "2h", "--key", "p")
    old_id, new_id = state(pristine)[0], db_id_for(db_dir, NEW_NOW)
    db = db_dir / "ledger.db"

    keeper, _ = old_ledger(pristine, db)
    done = spawn(db, "init", "--force", "--demo", now=NEW_NOW)
    assert done.wait(timeout=60) == 0, done.communicate()
    keeper.close()
    assert state(db) == (new_id, [], 7)

    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    outcomes = []
    for _ in range(10):
        keeper, expected = old_ledger(pristine, db)
        proc = spawn(db, "init", "--force", "--demo", now=NEW_NOW)
        delay = rng.uniform(0, 0.008)  # the whole job takes about 10 ms on /dev/shm
        kill_after_files_change(proc, db_dir, delay)
        keeper.close()
        got = state(db)
        where = f"seed {seed}, killed {delay:.3f}s into the work"
        if got[0] == old_id:
            assert got == (old_id, expected, 7), f"the old ledger lost rows ({where})"
            outcomes.append("old")
        else:
            assert got == (new_id, [], 7), f"neither the old nor the whole new ledger ({where})"
            outcomes.append("new")
        assert len(Cli(db).ok("list")) == len(got[1])  # and the CLI opens it
    print("outcomes:", outcomes, seed)


def _limit(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG


def test_a_full_disk_during_init_force_leaves_the_old_ledger_intact(db_dir: Path) -> None:
    db = init_db(db_dir / "ledger.db")
    cli = Cli(db)
    cli.ok("pool", "create", "p")
    cli.ok("node", "add", "n1", "--pool", "p", "--gpus", "8", "--model", "h100")
    cli.ok("tenant", "create", "acme")
    cli.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--key", "k")
    before = state(db)
    limit = 100 * 1024
    assert init_db(db_dir / "demo.db", "--demo").stat().st_size > limit  # the limit bites
    (db_dir / "demo.db").unlink()

    proc = spawn(db, "init", "--force", "--demo", now=NEW_NOW, preexec_fn=lambda: _limit(limit))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err
    assert out == ""
    assert json.loads(err)["error"]["code"] == "UNAVAILABLE"
    assert "untouched" in err
    assert state(db) == before
    assert len(cli.ok("list")) == 1
    assert sorted(p.name for p in db_dir.iterdir() if "tmp" in p.name) == []


def _lock_is_held(db: Path) -> bool:
    probe = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:
        return True
    finally:
        if probe.in_transaction:
            probe.execute("ROLLBACK")
        probe.close()
    return False


def _has_open(pid: int, path: Path) -> bool:
    """Whether process `pid` has SQLite's connection to `path` open (Linux /proc): two
    descriptors, since the header was read through one of its own before connecting."""
    target = os.path.realpath(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    count = 0
    for fd in fds:
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/{pid}/fd/{fd}") == target
    return count >= 2


def test_writers_waiting_while_init_force_replaces_the_file_exit_unavailable(
    db_dir: Path,
) -> None:
    db = init_db(db_dir / "ledger.db", "--demo")
    cli = Cli(db)
    # A reader on an older snapshot keeps `init --force` from finishing its checkpoint, so it
    # holds the write lock (with the old file still in place) for as long as the reader reads.
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM nodes").fetchone()
    cli.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "before")

    init = spawn(db, "init", "--force", now=NEW_NOW)
    deadline = time.monotonic() + 30
    while not _lock_is_held(db):
        assert init.poll() is None, init.communicate()
        assert time.monotonic() < deadline, "init --force never took the write lock"
        time.sleep(0.05)
    writers = [
        spawn(db, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", f"w{i}")
        for i in range(4)
    ]
    # they open the old file and queue on its write lock (however slow their start-up is)
    for writer in writers:
        while not _has_open(writer.pid, db):
            assert writer.poll() is None, writer.communicate()
            assert time.monotonic() < deadline + 30, "a writer never opened the ledger"
            time.sleep(0.05)
    time.sleep(0.5)  # from open to the lock wait is a few statements
    assert init.poll() is None and all(w.poll() is None for w in writers)
    reader.execute("COMMIT")
    reader.close()

    out, err = init.communicate(timeout=60)
    assert init.returncode == 0, err
    for writer in writers:
        out, err = writer.communicate(timeout=60)
        assert writer.returncode == 7, f"a waiting writer exited {writer.returncode}: {out}{err}"
        assert out == "", "a writer reported something written"
        error = json.loads(err)["error"]
        assert error["code"] == "UNAVAILABLE" and "replaced" in error["message"], error
    assert state(db) == (db_id_for(db_dir, NEW_NOW), [], 0)
    assert cli.ok("list") == []


@pytest.mark.sqlite_only(reason="builds an SQLite file beside the ledger")
def test_a_failed_build_says_whether_there_was_an_old_ledger(db_dir: Path) -> None:
    """A full disk while a new ledger is built: 'the old one is untouched' only when there is
    one (init of a new ledger said it too); the temp file is gone either way."""
    from better_compute.errors import Unavailable
    from better_compute.storage import replace

    def full(db: object) -> None:
        raise OSError(28, "No space left on device")

    target = db_dir / "new.db"
    with pytest.raises(Unavailable) as new:
        replace.build_temp(target, 0o600, full)
    assert new.value.message.endswith("nothing was written") and not target.exists()
    target.write_bytes(b"old")
    with pytest.raises(Unavailable) as old:
        replace.build_temp(target, 0o600, full)
    assert old.value.message.endswith("the old one is untouched")
    assert sorted(p.name for p in db_dir.iterdir()) == ["new.db"]
