"""A replay's connection writes without waiting for the disk, and leaves its ledger on disk
(storage/db.Database.replaying, issue 8: `simulate`).

Inside, commits do not sync (`synchronous = OFF`); on the way out, whatever happened inside, the
WAL is emptied into the file and the connection syncs as before. A process killed inside loses
nothing it committed: the operating system holds the pages (tests/test_simulate.py kills one)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pgtest
import pytest

from better_compute.service import setup, ticking
from better_compute.service.context import Ctx
from better_compute.storage import db as db_module
from better_compute.storage.db import Database, open_ledger

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _settings(conn: sqlite3.Connection) -> list[int]:
    names = ("synchronous", "wal_autocheckpoint", "temp_store", "cache_size")
    return [int(conn.execute(f"PRAGMA {name}").fetchone()[0]) for name in names]


def _new_ledger(path: Path) -> Database:
    """A new manual-clock ledger at `path` (replacing any there), open."""
    db = setup.init(str(path), T0, force=True, manual=True, admin="admin", group=None)[0]
    assert isinstance(db, Database)
    return db


def _wal(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


@pytest.mark.sqlite_only(reason="SQLite's synchronous setting and WAL file")
@pytest.mark.parametrize("fails", [False, True])
def test_replaying_writes_unsynced_and_leaves_the_ledger_checkpointed(
    tmp_path: Path, fails: bool
) -> None:
    path = tmp_path / "replay.db"
    db = _new_ledger(path)
    other = sqlite3.connect(path)  # keeps the WAL from being removed when `db` closes
    try:
        before = _settings(db.conn)
        assert before[0] != 0
        expected = pytest.raises(RuntimeError) if fails else contextlib.nullcontext()
        with expected, db.replaying():
            assert _settings(db.conn) == [0, 10000, 2, -65536]
            for n in range(50):
                with db.write() as conn:
                    conn.execute("INSERT INTO meta(key, value) VALUES (?, ?)", (f"test:{n}", n))
            assert _wal(path).stat().st_size > 0  # the commits are in the WAL
            if fails:
                raise RuntimeError("the replay failed")
        assert _settings(db.conn) == before
        assert _wal(path).stat().st_size == 0  # all of it checkpointed into the file
        rows = other.execute("SELECT COUNT(*) FROM meta WHERE key LIKE 'test:%'").fetchone()
        assert rows[0] == 50
    finally:
        other.close()
        db.close()


def _write(db: object, first: int, count: int) -> None:
    for n in range(first, first + count):
        with db.write() as conn:  # type: ignore[attr-defined]
            conn.execute("INSERT INTO meta(key, value) VALUES (?, ?)", (f"test:{n}", n))


@pytest.mark.sqlite_only(reason="SQLite's WAL file, through a symlink")
def test_a_reader_does_not_hold_up_the_end_and_what_it_keeps_is_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader inside a transaction when the replay ends keeps the checkpoint from emptying the
    WAL: the end does not wait for it (for the whole busy timeout, every writer held off), and
    syncs the WAL that stays, which SQLite keeps beside the file a symlinked path names."""
    real = tmp_path / "real" / "replay.db"
    real.parent.mkdir()
    db = _new_ledger(real)
    db.close()
    link = tmp_path / "link.db"
    link.symlink_to(real)
    db = open_ledger(str(link))
    db.set_busy_timeout(5000)
    reader = sqlite3.connect(real)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    try:
        with db.replaying():
            _write(db, 0, 20)
            reader.execute("BEGIN")
            reader.execute("SELECT COUNT(*) FROM meta").fetchone()  # a snapshot, held open
            _write(db, 20, 20)
            began = time.monotonic()
        assert time.monotonic() - began < 2  # not the 5 s busy timeout
        assert _wal(real).stat().st_size > 0  # the reader kept some of it
        assert str(_wal(real)) in synced and str(real) in synced
        assert int(db.conn.execute("PRAGMA busy_timeout").fetchone()[0]) == 5000
    finally:
        reader.close()
        db.close()


@pytest.mark.sqlite_only(reason="SQLite's settings")
def test_a_failed_replay_reports_its_own_error_when_the_end_fails_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "replay.db"
    db = _new_ledger(path)
    before = _settings(db.conn)

    def broken(self: object) -> None:
        raise OSError("the disk is full")

    monkeypatch.setattr(type(db), "_to_disk", broken)
    try:
        with pytest.raises(RuntimeError, match="the replay failed"), db.replaying():
            raise RuntimeError("the replay failed")
        assert _settings(db.conn) == before
        with pytest.raises(OSError, match="the disk is full"), db.replaying():
            pass  # a replay that went well: the end's own error is the one to report
        assert _settings(db.conn) == before
    finally:
        db.close()


@pytest.mark.postgres_only
def test_replaying_on_postgres_restores_synchronous_commit(db_dir: Path) -> None:
    where = pgtest.ledger(str(db_dir / "replay.db"))
    db = setup.init(where, T0, force=True, manual=True, admin="admin", group=None)[0]
    try:
        show = "SHOW synchronous_commit"
        before = db.conn.raw.execute(show).fetchone()[0]  # type: ignore[attr-defined]
        with db.replaying():
            assert db.conn.raw.execute(show).fetchone()[0] == "off"  # type: ignore[attr-defined]
        assert db.conn.raw.execute(show).fetchone()[0] == before  # type: ignore[attr-defined]
    finally:
        db.close()


# ---------------------------------------------------------------- other writers meanwhile


def _waiting(path: Path) -> Path:
    return path.with_name(path.name + "-waiting")


@pytest.mark.sqlite_only(reason="SQLite's write lock and the file beside the ledger")
def test_a_waiting_writer_says_so_and_a_replay_stands_aside_until_it_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "replay.db"
    replay = _new_ledger(path)
    writer = open_ledger(str(path))
    try:
        with replay.replaying():
            started = time.monotonic()
            replay.let_writers_in()  # nobody has said anything: no pause
            assert time.monotonic() - started < 0.05
            # Another holds the lock; the writer waits, and says so after a wait step.
            held = threading.Event()
            holder = threading.Thread(target=_hold_then_commit, args=(str(path), 0.3, held))
            holder.start()
            assert held.wait(30)
            started = time.monotonic()
            with writer.write() as conn:
                waited = time.monotonic() - started
                conn.execute("INSERT INTO meta(key, value) VALUES ('test:writer', '1')")
            holder.join()
            assert 0.1 < waited < 5, waited
            assert _waiting(path).exists()
            # The replay sees the new word and stands aside until a commit moves data_version:
            # here nobody commits, so it gives up after STAND_ASIDE_S ...
            started = time.monotonic()
            replay.let_writers_in()
            assert 0.2 < time.monotonic() - started < 2
            # ... and the same word does not stop it twice.
            started = time.monotonic()
            replay.let_writers_in()
            assert time.monotonic() - started < 0.05
            # A new word, and a writer committing 100 ms later: the replay goes on once it has
            # (given all the time it may need here, so that only the commit can end the wait).
            monkeypatch.setattr(db_module, "STAND_ASIDE_S", 10.0)
            marker = _waiting(path)
            later_ns = marker.stat().st_mtime_ns + 1_000_000_000  # whatever the clock's grain
            os.utime(marker, ns=(later_ns, later_ns))  # what a writer that waits again does
            later = threading.Timer(0.1, _commit_one, args=(str(path),))
            later.start()
            started = time.monotonic()
            replay.let_writers_in()
            stood = time.monotonic() - started
            later.join()
            assert 0.08 < stood < 5, stood
            seen = replay.conn.execute("SELECT value FROM meta WHERE key = 'test:later'")
            assert seen.fetchone() is not None
    finally:
        writer.close()
        replay.close()


def _hold_then_commit(path: str, seconds: float, held: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    held.set()
    conn.execute("INSERT INTO meta(key, value) VALUES ('test:holder', '1')")
    time.sleep(seconds)
    conn.execute("COMMIT")
    conn.close()


def _commit_one(path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO meta(key, value) VALUES ('test:later', '1')")
    conn.close()


@pytest.mark.sqlite_only(reason="the file beside an SQLite ledger")
def test_the_waiting_file_is_touched_only_as_a_regular_file_of_the_ledgers_kind(
    tmp_path: Path,
) -> None:
    """Anyone who may write the ledger's folder may have put something at `<ledger>-waiting`:
    a writer never follows a symlink there (it would chmod or create another file), never
    blocks on a FIFO, and a marker it makes takes the ledger's mode bits."""
    path = tmp_path / "l.db"
    db = _new_ledger(path)
    marker = _waiting(path)
    try:
        victim = tmp_path / "victim"
        victim.write_text("x")
        victim.chmod(0o600)
        before = victim.stat()
        marker.symlink_to(victim)
        db._say_waiting()
        after = victim.stat()
        assert (after.st_mode, after.st_mtime_ns) == (before.st_mode, before.st_mtime_ns)
        marker.unlink()
        marker.symlink_to(tmp_path / "nowhere")
        db._say_waiting()
        assert not (tmp_path / "nowhere").exists()
        marker.unlink()
        os.mkfifo(marker)
        touch = threading.Thread(target=db._say_waiting, daemon=True)
        touch.start()
        touch.join(10)
        assert not touch.is_alive(), "a writer blocked opening a FIFO"
        marker.unlink()
        path.chmod(0o640)
        db._say_waiting()
        assert marker.stat().st_mode & 0o777 == 0o640
    finally:
        db.close()


@pytest.mark.sqlite_only(reason="the file beside an SQLite ledger")
def test_a_replaced_ledger_starts_without_a_waiting_file(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    db = _new_ledger(path)
    db._say_waiting()
    db.close()
    assert _waiting(path).exists()
    _new_ledger(path).close()
    assert not _waiting(path).exists()


@pytest.mark.sqlite_only(reason="the file beside an SQLite ledger")
def test_tick_until_stands_aside_between_ticks_but_not_for_its_own_or_an_old_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tick --until` commits tick after tick, as a replay commits request after request: a
    writer's word said during the run makes it stand aside; a word said before the run began,
    or by its own connection (its own tick waited for the lock), does not."""
    monkeypatch.setattr(db_module, "STAND_ASIDE_S", 3.0)  # far above 61 ticks' own time
    path = tmp_path / "l.db"
    db = _new_ledger(path)
    marker = _waiting(path)
    hour = 3_600_000

    def run(first: int, said: Callable[[], None]) -> float:
        """Seconds for 61 ticks over the hour from `first`, `said` run after the tenth."""
        started = time.monotonic()
        ticking.tick_until(
            Ctx(db, first), first + hour, 60_000, lambda done, _: said() if done == 10 else None
        )
        return time.monotonic() - started

    def another_says_so() -> None:  # what a writer that waits does, whatever the clock's grain
        later_ns = marker.stat().st_mtime_ns + 1_000_000_000
        os.utime(marker, ns=(later_ns, later_ns))

    try:
        marker.touch()
        assert run(T0, lambda: None) < 1.5  # a word from before the run
        another_says_so()  # between two runs on one connection: before the next one too
        assert run(T0 + hour, db._say_waiting) < 1.5  # and its own word
        assert 2.4 < run(T0 + 2 * hour, another_says_so) < 6  # nobody commits: the whole wait
    finally:
        db.close()
