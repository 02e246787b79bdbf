"""`backup PATH` and `restore PATH` (PRODUCT.md §4, issue 7).

- A backup taken while other processes write holds every reservation committed before it began
  (including those still in the WAL, which a plain copy of the file misses), is whole, and holds
  nothing that was never committed.
- backup refuses an existing file without --force, writes mode 0600, and reports what it copied.
- restore refuses a foreign file, a truncated or corrupt copy, a newer schema, a copy without a
  db_id or a readable clock, and a non-admin, each with the ledger untouched and no temp file
  left behind.
- restore killed with SIGKILL at random moments leaves the old ledger or the restored one, whole.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import Cli, init_db, invoke
from test_init_atomic import kill_after_files_change, spawn, state

from better_compute.storage.schema import SCHEMA_VERSION

pytestmark = pytest.mark.sqlite_only(
    reason="backup and restore copy SQLite files (PostgreSQL: pg_dump, migrate)"
)


def reserve(cli: Cli, key: str) -> str:
    doc = cli.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", key)
    return str(doc["id"])


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if "tmp" in p.name)


# ---------------------------------------------------------------- backup


@pytest.mark.sqlite_only(reason="temp files beside an SQLite file")
def test_a_killed_runs_temp_copies_go_at_the_next_backup_or_restore_even_refused(
    run: Cli, db_dir: Path
) -> None:
    """A backup or restore killed mid-copy leaves a whole ledger's copy in a temp file; the next
    one aimed at the same file removes it, even when it then refuses (no --force, a bad copy)."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    pid = int(dead.stdout)
    out = db_dir / "out.db"
    run.ok("backup", out)
    stale = [
        db_dir / f".out.db.bc-tmp-{pid}-0badf00d",
        db_dir / f".out.db.bc-tmp-{pid}-0badf00d-journal",
        db_dir / f".{run.db.name}.bc-tmp-{pid}-1badf00d",
    ]
    for path in stale:
        path.write_bytes(b"x" * 1024)
    run.fails(4, "backup", out)  # exists, no --force
    assert not stale[0].exists() and not stale[1].exists()
    run.fails(2, "restore", db_dir / "missing.db")
    assert leftovers(db_dir) == []


@pytest.mark.sqlite_only(reason="temp copies of a ledger file")
def test_tick_removes_a_killed_replaces_temp_copy_of_the_ledger(run: Cli, db_dir: Path) -> None:
    """A killed `init --force` or `restore` left its temp copy (and its -wal, -shm) beside the
    ledger through every command but the next replace (a review); cron's tick removes it. A
    live process's copy stays: its replace is still running."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    name = run.db.name
    stale = [
        db_dir / f".{name}.bc-tmp-{int(dead.stdout)}-2badf00d{s}" for s in ("", "-wal", "-shm")
    ]
    live = db_dir / f".{name}.bc-tmp-{os.getpid()}-3badf00d"
    for path in (*stale, live):
        path.write_bytes(b"x" * 1024)
    run.ok("list")
    assert all(path.exists() for path in stale)  # a read sweeps nothing
    run.ok("tick")
    assert [p for p in stale if p.exists()] == [] and live.exists()
    live.unlink()


def test_backup_reports_what_it_copied_and_refuses_to_overwrite(run: Cli, db_dir: Path) -> None:
    rid = reserve(run, "a")
    dest = db_dir / "copy.db"
    doc = run.ok("backup", dest)
    assert doc["path"] == str(dest)
    assert doc["bytes"] == dest.stat().st_size > 0
    assert doc["schemaVersion"] == SCHEMA_VERSION
    assert doc["reservations"] == 1 and doc["events"] >= 1
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    assert state(dest)[1] == [rid]
    assert not Path(str(dest) + "-wal").exists()  # standalone: no sidecar needed to read it

    before = dest.read_bytes()
    assert run.fails(4, "backup", dest)["code"] == "CONFLICT"
    assert dest.read_bytes() == before
    reserve(run, "b")
    assert run.ok("backup", dest, "--force")["reservations"] == 2
    assert run.fails(2, "backup", run.db, "--force")["code"] == "INVALID_INPUT"  # the ledger
    assert run.fails(2, "backup", db_dir / "no" / "dir.db")["code"] == "INVALID_INPUT"
    code, out, _ = run("backup", db_dir / "human.db", json=False)
    assert code == 0 and "2 reservations" in out
    assert leftovers(db_dir) == []


def _leave_a_wal(path: Path) -> None:
    """Commit a row into `path` through its WAL and die without checkpointing, as a process
    killed with -9 does: the row lives only in `path`-wal."""
    code = (
        "import os, sqlite3; c = sqlite3.connect(os.environ['DB'], isolation_level=None);"
        " c.execute('PRAGMA journal_mode = WAL'); c.execute('PRAGMA wal_autocheckpoint = 0');"
        " c.execute(\"INSERT INTO tenants(id, seq) VALUES ('stale', 999)\"); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "DB": str(path)}, check=True)
    assert Path(str(path) + "-wal").stat().st_size > 0


@pytest.mark.parametrize("how", ["replaced", "deleted"])
def test_a_backup_never_takes_on_a_wal_left_beside_its_name(
    run: Cli, db_dir: Path, how: str
) -> None:
    """A `-wal` left beside the backup's name (by the ledger there, killed mid-write, or by one
    deleted without its sidecars) was replayed onto the new copy by the next open: the copy read
    back as that old ledger, or as damaged, though `backup` had said what it wrote."""
    dest = db_dir / "copy.db"
    run.ok("backup", dest)
    _leave_a_wal(dest)
    assert "stale" in {t["id"] for t in Cli(dest).ok("tenant", "list")}
    if how == "deleted":
        dest.unlink()  # its -wal and -shm stay behind
        run.ok("backup", dest)
    else:
        run.ok("backup", dest, "--force")
    assert not Path(str(dest) + "-wal").exists()
    tenants = {t["id"] for t in Cli(dest).ok("tenant", "list")}
    assert tenants == {t["id"] for t in run.ok("tenant", "list")} and "stale" not in tenants
    assert leftovers(db_dir) == []


@pytest.mark.parametrize("old", ["damaged", "newer", "being read"])
def test_backup_force_replaces_whatever_backup_is_there_at_once(
    run: Cli, db_dir: Path, old: str
) -> None:
    """`--force` replaces a damaged backup, one a newer version wrote, and one a reader has
    open, at once: a backup is not a ledger to lock writers out of first."""
    dest = db_dir / "old.db"
    run.ok("backup", dest)
    reader = None
    if old == "damaged":
        with dest.open("r+b") as f:
            f.truncate(8192)
    elif old == "newer":
        sqlite3.connect(dest, isolation_level=None).execute("PRAGMA user_version = 99")
    else:
        reader = sqlite3.connect(dest, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM events").fetchone()
    try:
        started = time.monotonic()
        assert run.ok("backup", dest, "--force")["reservations"] == 0
        assert time.monotonic() - started < 10  # not the busy timeout
    finally:
        if reader is not None:
            reader.close()
    assert {t["id"] for t in Cli(dest).ok("tenant", "list")} == {
        t["id"] for t in run.ok("tenant", "list")
    }


def test_backup_while_others_write_holds_every_committed_reservation(
    demo_db: Path, db_dir: Path
) -> None:
    # An idle connection keeps the WAL from being checkpointed when each writer closes the file,
    # as on a busy ledger: a copy of the main file alone would miss recent reservations.
    keeper = sqlite3.connect(demo_db)
    keeper.execute("SELECT COUNT(*) FROM meta").fetchone()
    finished: list[tuple[float, str]] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        for k in range(5):
            proc = spawn(
                demo_db, "reserve", "--tenant", "globex", "--gpus", "1", "--for", "1h",
                "--key", f"w{w}-{k}",
            )  # fmt: skip
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            with lock:
                finished.append((time.monotonic(), json.loads(out)["id"]))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    backups = []
    for n in range(3):
        time.sleep(0.6)
        started = time.monotonic()
        with lock:
            committed = {rid for when, rid in finished if when < started}
        proc = spawn(demo_db, "backup", str(db_dir / f"b{n}.db"))
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        backups.append((committed, db_dir / f"b{n}.db", json.loads(out)))
    for t in threads:
        t.join()
    keeper.close()

    everything = {rid for _, rid in finished}
    assert len(everything) == 20
    assert any(committed for committed, _, _ in backups), "no backup ran during the writes"
    for committed, path, doc in backups:
        _, ids, _ = state(path)  # integrity_check ok
        assert committed <= set(ids), f"{path.name} misses {sorted(committed - set(ids))}"
        assert set(ids) <= everything
        assert doc["reservations"] == len(ids)


# ---------------------------------------------------------------- restore


def test_restore_replaces_the_ledger_with_the_backup(run: Cli, db_dir: Path) -> None:
    kept = reserve(run, "kept")
    run.ok("backup", db_dir / "b.db")
    reserve(run, "later")
    mode = stat.S_IMODE(run.db.stat().st_mode)
    doc = run.ok("restore", db_dir / "b.db")
    assert doc["reservations"] == 1 and doc["from"] == str(db_dir / "b.db")
    assert [r["id"] for r in run.ok("list")] == [kept]
    assert stat.S_IMODE(run.db.stat().st_mode) == mode
    assert reserve(run, "after") not in (kept,)  # the restored ledger takes writes
    assert leftovers(db_dir) == []


def test_restore_of_a_missing_ledger_creates_it(run: Cli, db_dir: Path) -> None:
    rid = reserve(run, "k")
    run.ok("backup", db_dir / "b.db")
    fresh = Cli(db_dir / "fresh.db")
    assert fresh.ok("restore", db_dir / "b.db")["reservations"] == 1
    assert [r["id"] for r in fresh.ok("list")] == [rid]
    assert stat.S_IMODE((db_dir / "fresh.db").stat().st_mode) == 0o600


def _altered(good: Path, copy: Path, sql: str) -> Path:
    """A copy of the backup `good` with one statement run on it."""
    shutil.copyfile(good, copy)
    conn = sqlite3.connect(copy)
    conn.execute(sql)
    conn.commit()
    conn.close()
    return copy


def _bad_copies(good: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, a word its error message must contain)."""
    foreign = folder / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE t(x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.commit()
    conn.close()
    text = folder / "notes.txt"
    text.write_text("not a database\n" * 20)
    data = good.read_bytes()
    truncated = folder / "truncated.db"
    truncated.write_bytes(data[: len(data) // 2])
    corrupt = folder / "corrupt.db"
    page = 4096
    rng = random.Random(7)
    noise = bytes(rng.randrange(256) for _ in range(page * 6))
    corrupt.write_bytes(data[: page * 4] + noise + data[page * 10 :])
    newer = folder / "newer.db"
    shutil.copyfile(good, newer)
    conn = sqlite3.connect(newer)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    no_id = _altered(good, folder / "no-id.db", "DELETE FROM meta WHERE key = 'db_id'")
    odd_clock = _altered(
        good, folder / "odd.db", "UPDATE meta SET value = 'weird' WHERE key = 'clock'"
    )
    odd_last = _altered(
        good, folder / "last.db", "UPDATE meta SET value = 'x' WHERE key = 'last_at'"
    )
    no_clock = _altered(good, folder / "no-clock.db", "DELETE FROM meta WHERE key = 'clock'")
    # A view added for a report: every command refuses such a ledger, so restoring it would
    # lock everyone out, and restore itself could no longer replace it.
    view = "CREATE VIEW held AS SELECT tenant_id FROM reservations"
    own_schema = _altered(good, folder / "report.db", view)
    return {
        "foreign": (foreign, "not a better-compute"),
        "text": (text, "not an SQLite file"),
        "truncated": (truncated, "nothing was replaced"),
        "corrupt": (corrupt, "nothing was replaced"),
        "newer": (newer, "newer"),
        "no db_id": (no_id, "db_id"),
        # Every command reads the clock first: restored, a clock that cannot be read locked
        # everyone out, restore and init --force included; one left out made a what-if backup
        # a real-clock ledger at its own time.
        "odd clock": (odd_clock, "clock that cannot be read"),
        "odd last_at": (odd_last, "clock that cannot be read"),
        "no clock": (no_clock, "no clock in its meta table"),
        "own schema": (own_schema, "schema is not the one better-compute created"),
        "missing": (folder / "missing.db", "does not exist"),
        "folder": (folder, "not a regular file"),
    }


def test_restore_refuses_bad_copies_and_leaves_the_ledger_alone(run: Cli, db_dir: Path) -> None:
    reserve(run, "k")
    good = db_dir / "good.db"
    run.ok("backup", good)
    reserve(run, "after-backup")
    bad_folder = db_dir / "bad"
    bad_folder.mkdir()
    before = state(run.db)
    for name, (path, word) in _bad_copies(good, bad_folder).items():
        error = run.fails(2, "restore", path)
        assert error["code"] == "INVALID_INPUT", (name, error)
        assert word in error["message"], (name, error)
        assert state(run.db) == before, name
        assert leftovers(db_dir) == [], name
    assert len(run.ok("list")) == 2


def test_restore_by_a_non_admin_is_forbidden(run: Cli, db_dir: Path) -> None:
    reserve(run, "k")
    run.ok("backup", db_dir / "b.db")
    reserve(run, "later")
    before = state(run.db)
    error = run.fails(6, "--as", "mallory", "restore", db_dir / "b.db", now=None)
    assert error["code"] == "FORBIDDEN"
    assert state(run.db) == before
    assert Cli(db_dir / "new.db").fails(6, "--as", "mallory", "restore", db_dir / "b.db")
    assert not (db_dir / "new.db").exists()


def test_restore_onto_a_foreign_file_is_refused(run: Cli, db_dir: Path) -> None:
    run.ok("backup", db_dir / "b.db")
    notes = db_dir / "notes.txt"
    notes.write_text("mine\n" * 50)
    assert Cli(notes).fails(2, "restore", db_dir / "b.db")["code"] == "INVALID_INPUT"
    assert notes.read_text() == "mine\n" * 50


def test_restore_killed_at_random_moments_leaves_the_old_or_the_restored_ledger(
    db_dir: Path,
) -> None:
    pristine = init_db(db_dir / "pristine.db", "--demo")
    cli = Cli(pristine)
    for k in range(30):  # a bigger copy: more moments to be killed in
        reserve(cli, f"r{k}")
    backup = db_dir / "b.db"
    cli.ok("backup", backup)
    restored = state(backup)
    reserve(cli, "only-in-the-old")
    db = db_dir / "ledger.db"
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    outcomes = []
    for _ in range(10):
        for suffix in ("", "-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)
        shutil.copyfile(pristine, db)
        keeper = sqlite3.connect(db)  # keeps the next reservation in the WAL
        keeper.execute("SELECT COUNT(*) FROM meta").fetchone()
        reserve(Cli(db), "in-the-wal")
        old = state(db)
        proc = spawn(db, "restore", str(backup))
        delay = rng.uniform(0, 0.005)  # the whole job takes a few ms on /dev/shm
        kill_after_files_change(proc, db_dir, delay)
        keeper.close()
        got = state(db)
        where = f"seed {seed}, killed {delay:.3f}s into the work"
        assert got in (old, restored), f"neither the old nor the restored ledger ({where})"
        outcomes.append("old" if got == old else "restored")
        assert len(Cli(db).ok("list")) == len(got[1])
    print("outcomes:", outcomes, seed)


def test_restore_on_a_real_clock_ledger_refuses_now(db_dir: Path) -> None:
    """restore writes the ledger: a real-clock ledger refuses --now on it as on every write."""
    real = db_dir / "real.db"
    assert invoke(["--db", str(real), "init"]).exit_code == 0
    backup = db_dir / "real-backup.db"
    assert invoke(["--db", str(real), "backup", str(backup)]).exit_code == 0
    cli = Cli(real)
    error = cli.fails(2, "restore", backup, now="2020-01-01T00:00:00Z")
    assert "real clock" in error["message"]
    env = {"BETTER_COMPUTE_NOW": "2020-01-01T00:00:00Z"}
    assert cli("restore", backup, now=None, env=env)[0] == 2
    assert cli("restore", backup, now=None)[0] == 0


def test_a_what_if_backup_is_not_restored_over_a_real_clock_ledger(db_dir: Path) -> None:
    """A backup of an `init --now` ledger runs on a manual clock: restored over a real-clock
    ledger, that ledger's time stopped for good (its cron tick never released anything again),
    the very thing `init --force` refuses. Refused, the ledger untouched; over a manual-clock
    ledger, or a new path, it restores as before."""
    real = db_dir / "prod.db"
    assert invoke(["--db", str(real), "init"]).exit_code == 0
    what_if = db_dir / "what-if.db"
    assert invoke(["--db", str(what_if), "--now", "2026-01-01T00:00:00Z", "init"]).exit_code == 0
    backup = db_dir / "what-if-backup.db"
    assert invoke(["--db", str(what_if), "backup", str(backup)]).exit_code == 0
    prod = Cli(real)
    before = prod.ok("tick", now=None)["now"]
    error = prod.fails(2, "restore", backup, now=None)
    assert "manual clock" in error["message"] and "another --db" in error["message"]
    assert prod.ok("tick", now=None)["now"] >= before  # still the real clock
    assert Cli(db_dir / "fresh.db")("restore", backup, now=None)[0] == 0
    assert Cli(what_if)("restore", backup, now=None)[0] == 0
    real_backup = db_dir / "prod-backup.db"
    assert invoke(["--db", str(real), "backup", str(real_backup)]).exit_code == 0
    assert prod("restore", real_backup, now=None)[0] == 0


def test_a_ledger_that_cannot_be_opened_says_how_to_replace_it(db_dir: Path) -> None:
    cli = Cli(init_db(db_dir / "lab.db", "--demo"))
    good = db_dir / "good.bak"
    cli.ok("backup", good)
    conn = sqlite3.connect(cli.db)
    conn.execute("CREATE VIEW held AS SELECT 1")
    conn.commit()
    conn.close()
    for args in (("restore", good), ("init", "--force")):
        error = cli.fails(7, *args)
        assert "admins cannot be checked" in error["message"], error
        assert f"mv {cli.db} {cli.db}.damaged" in error["message"]
    cli.db.rename(Path(f"{cli.db}.damaged"))
    cli.ok("restore", good)
    assert cli.ok("tenant", "list")


@pytest.mark.parametrize(
    ("error", "code"),
    [(PermissionError(1, "Operation not permitted"), 6), (OSError(16, "Device busy"), 7)],
)
def test_a_refused_rename_keeps_the_old_ledger(
    db_dir: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, code: int
) -> None:
    """A rename the system refuses for who you are (a sticky folder, someone else's file) is
    FORBIDDEN; for anything else, UNAVAILABLE."""
    from better_compute.storage import replace

    cli = Cli(init_db(db_dir / "lab.db", "--demo"))
    good = db_dir / "good.bak"
    cli.ok("backup", good)
    cli.ok("tenant", "create", "later")

    def refuse(src: object, dst: object) -> None:
        raise error

    monkeypatch.setattr(replace.os, "replace", refuse)
    message = cli.fails(code, "restore", good)["message"]
    assert f"{error.strerror}; the old ledger is unchanged" in message
    monkeypatch.undo()
    assert "later" in [t["id"] for t in cli.ok("tenant", "list")]


def test_backup_says_the_db_id_for_people_too(db_dir: Path) -> None:
    cli = Cli(init_db(db_dir / "lab.db"))
    doc = cli.ok("backup", db_dir / "a.bak")
    text = " ".join(cli.ok("backup", db_dir / "b.bak", json=False).split())
    assert f"db id {doc['dbId']}" in text and "schema version" in text


@pytest.mark.sqlite_only(reason="names SQLite's files beside a ledger")
@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_a_ledger_is_never_made_where_sqlite_keeps_another_ledgers_files(
    run: Cli, db_dir: Path, suffix: str
) -> None:
    """restore, migrate --to, init and backup took `X.db-wal` (or -shm, -journal) as a file's
    name: SQLite then deleted or replayed it as X.db's own, and the ledger or backup made there
    was gone (migrate reported success). Refused everywhere, through a link too, and whether or
    not X.db exists yet (it may be made later: opening it deletes the file)."""
    backup = db_dir / "bk.db"
    run.ok("backup", backup)
    side = f"{run.db}{suffix}"
    link = db_dir / "link.db"
    link.symlink_to(db_dir / f"other.db{suffix}")
    before = run.ok("list")
    for cli, args in (
        (Cli(Path(side)), ("restore", backup)),
        (Cli(Path(side)), ("init",)),
        (Cli(Path(side)), ("list",)),
        (Cli(db_dir / f"team{suffix}"), ("init",)),
        (Cli(link), ("init",)),
        (run, ("migrate", "--to", side)),
        (run, ("backup", db_dir / f"later.db{suffix}")),
    ):
        error = cli.fails(2, *args, now=None)
        assert "the name SQLite gives the" in error["message"], args
    assert run.ok("list") == before
    for name in (f"team{suffix}", f"later.db{suffix}", f"other.db{suffix}"):
        assert not (db_dir / name).exists(), name
