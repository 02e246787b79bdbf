"""`events --follow`: JSON Lines, each event flushed as it is committed; Ctrl-C ends it cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import NOW_MS

from better_compute.demo import DEMO_INVENTORY
from better_compute.model import Event
from better_compute.service import booking, setup, views
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.storage import repo

NOW = 1_790_582_400_000
ENTRY = [sys.executable, "-c", "from better_compute.cli import main; main()"]


def _read_line(proc: subprocess.Popen[str], deadline: float) -> str:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            return line
    raise AssertionError("no event line in time")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_follow_prints_each_new_event_as_json_lines(tmp_path: Path) -> None:
    path = str(tmp_path / "f.db")
    db = setup.init(path, NOW, force=True, manual=True, admin="admin", group=None)[0]
    setup.inventory_import(Ctx(db, NOW), DEMO_INVENTORY)
    db.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    proc = subprocess.Popen(
        [
            *ENTRY,
            "--db",
            path,
            "--now",
            str(NOW),
            "--json",
            "events",
            "--follow",
            "--tenant",
            "acme",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # Ctrl-C reaches a command run in the foreground. A shell without job control starts
        # background work with SIGINT ignored, children inherit that, and Python then installs
        # no KeyboardInterrupt: restore the default, or the watch ignores the signal.
        preexec_fn=_default_sigint,
    )
    try:
        time.sleep(1.0)  # the watch is running and has printed acme's history
        from better_compute.storage.db import open_database

        db = open_database(path)
        rsv = booking.reserve(Ctx(db, NOW), ReserveArgs("acme", None, 2, 3_600_000, key="w"))
        booking.reserve(Ctx(db, NOW), ReserveArgs("globex", None, 2, 3_600_000, key="g"))
        db.close()
        deadline = time.monotonic() + 20
        first = json.loads(_read_line(proc, deadline))
        while first["type"] in ("tenant.created", "quota.set"):  # the import's, acme's history
            first = json.loads(_read_line(proc, deadline))
        second = json.loads(_read_line(proc, deadline))
        assert [first["type"], second["type"]] == ["reservation.created", "reservation.placed"]
        assert first["reservationId"] == rsv.id and second["seq"] > first["seq"]
    finally:
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert '"globex"' not in rest  # another tenant's events never reach a tenant-scoped watch
    assert "Traceback" not in err


def test_a_reader_that_goes_away_ends_the_watch_quietly(tmp_path: Path) -> None:
    """Newcomer review: `events --follow --json | head -3` ended with an INTERNAL error ("a bug;
    please report it") once head had its lines. A closed pipe now ends it as SIGPIPE would,
    status 141, with nothing on stderr."""
    path = str(tmp_path / "f.db")
    db = setup.init(path, NOW, force=True, manual=True, admin="admin", group=None)[0]
    setup.inventory_import(Ctx(db, NOW), DEMO_INVENTORY)
    db.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    argv = [*ENTRY, "--db", path, "--now", str(NOW), "--json", "events", "--follow"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        assert proc.stdout.readline()  # the log so far: the inventory's import
        proc.stdout.close()  # the reader goes away
        from better_compute.storage.db import open_database

        db = open_database(path)
        for key in ("a", "b"):  # new events: the watch writes, and finds no reader
            booking.reserve(Ctx(db, NOW), ReserveArgs("acme", None, 1, 3_600_000, key=key))
        db.close()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 141 and proc.stderr.read() == b""


def test_follow_hands_each_page_over_outside_any_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page at a time, each read in a transaction that ends before the page is handed over:
    a consumer that stops reading holds no snapshot open (it kept `init --force` waiting on
    PostgreSQL). Every event arrives once, in order, across page boundaries."""
    monkeypatch.setattr(repo, "EVENT_PAGE", 3)
    path = str(tmp_path / "pages.db")
    db = setup.init(path, NOW, force=True, manual=True, admin="admin", group=None)[0]
    ctx = Ctx(db, NOW)
    setup.inventory_import(ctx, DEMO_INVENTORY)
    for i in range(4):
        booking.reserve(Ctx(db, NOW), ReserveArgs("acme", None, 2, 3_600_000, key=f"k{i}"))
    with db.read() as conn:
        every = [e.seq for e in repo.events(conn, tenant=None, reservation=None, since=None)]
    assert len(every) >= 3 * repo.EVENT_PAGE
    seen: list[int] = []

    class Enough(Exception):
        pass

    def on_event(event: Event) -> None:
        assert not db.conn.in_transaction
        seen.append(event.seq)
        if len(seen) == len(every):
            raise Enough

    with pytest.raises(Enough):
        views.follow_events(ctx, None, None, None, on_event, poll_seconds=0)
    db.close()
    assert seen == every


def test_events_for_people_are_written_a_page_at_a_time() -> None:
    """`events | head` of a fleet's log (a million events) waited 25 s and 440 MB for its first
    line: every page was read and joined before anything was written. The lines of a page are
    out before the next page is read; a log with none says so."""
    from better_compute.render import human

    read: list[int] = []

    def pages() -> Iterator[list[Event]]:
        for seq in (1, 2):
            read.append(seq)
            yield [Event(seq, "reservation.created", NOW_MS, "acme", "rsv_a", {}, "root", None)]

    chunks = human.events(pages())
    first = next(chunks)
    assert read == [1] and first.startswith("2026-09-28T08:00:00Z  #1 reservation.created")
    assert first.endswith("\n") and first.count("\n") == 1
    assert [c.split()[1] for c in chunks] == ["#2"] and read == [1, 2]
    assert list(human.events(iter([[], []]))) == ["no events\n"]
