"""Issue 7: time that cannot be rewound, identity that is not a flag (PRODUCT.md §2, §3, §6, §7).

Each test reproduces a defect found under attack and fails on the code before the fix. Who runs a
command is the operating-system user; tests stand in another user by replacing
`identity.os_user`, and one test runs the real CLI as another uid when it can.
"""

from __future__ import annotations

import gc
import grp
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import DAY, HOUR, ME, NOW, NOW_MS, Cli, at, init_db

from better_compute import identity
from better_compute.cli import main
from better_compute.errors import Forbidden
from better_compute.model import Event
from better_compute.service import ticking
from better_compute.service.context import Ctx, open_ctx
from better_compute.storage.db import open_database

pytestmark = pytest.mark.sqlite_only(
    reason="file permissions, damaged files and restore are about the SQLite file"
)

ENTRY = [sys.executable, "-c", "from better_compute.cli import main; main()"]


def be(monkeypatch: pytest.MonkeyPatch, user: str) -> None:
    """From now on the process runs as `user`, as far as better-compute can tell."""
    monkeypatch.setattr(identity, "os_user", lambda: user)


def real_ledger(db_dir: Path) -> Cli:
    """A ledger on the real clock: one pool of two 8-GPU nodes, tenants acme and globex."""
    cli = Cli(db_dir / "real.db")
    cli.ok("init", now=None)
    cli.ok("pool", "create", "p", now=None)
    for node in ("n1", "n2"):
        cli.ok("node", "add", node, "--pool", "p", "--gpus", "8", "--model", "h100", now=None)
    for tenant in ("acme", "globex"):
        cli.ok("tenant", "create", tenant, now=None)
    return cli


def usage_hours(cli: Cli, **kw: Any) -> float:
    return round(sum(w["quantity"] for w in cli.ok("usage", **kw)), 6)


# ---------------------------------------------------------------- two clocks


def test_a_real_clock_ledger_refuses_now_on_every_write(db_dir: Path) -> None:
    cli = real_ledger(db_dir)
    rsv = cli.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "7d", now=None)
    cli.ok("meter", "create", "gpu.h100.hours", now=None)
    cli.ok("tick", now=None)
    for args in (
        ("tick",),
        ("release", rsv["id"]),
        ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h"),
        ("node", "cordon", "n2"),
    ):
        err = cli.fails(2, *args, now="+8d")
        assert "real clock" in err["message"] and "--now" in err["message"]
    # a stale BETTER_COMPUTE_NOW in a cron line is the same flag
    err = cli.fails(2, "tick", now=None, env={"BETTER_COMPUTE_NOW": "+8d"})
    assert err["code"] == "INVALID_INPUT"
    # nothing was released or billed ahead of time
    assert cli.ok("get", rsv["id"], now=None)["state"] == "active"
    assert usage_hours(cli, now=None) < 1
    # reads may still ask "as of" any time
    assert cli.ok("get", rsv["id"], now="+8d")["id"] == rsv["id"]
    cli.ok("timeline", "--step", "60", now="+8d")
    cli.ok("preview", "--tenant", "acme", "--gpus", "8", "--for", "1h", now="+8d")


def test_a_backdated_now_cannot_erase_history(run: Cli) -> None:
    run.ok("meter", "create", "gpu.h100.hours")
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1d")
    run.ok("tick")
    run.ok("tick", now=at(6 * HOUR))
    assert usage_hours(run, now=at(6 * HOUR)) == 48.0
    done = run.ok("release", rsv["id"], now=str(NOW_MS))  # "its start": the ledger is at +6h
    assert done["during"] == {"start": NOW_MS, "end": NOW_MS + 6 * HOUR}
    assert usage_hours(run, now=at(7 * HOUR)) == 48.0
    released = [e for e in run.ok("events") if e["type"] == "reservation.released"]
    assert released[-1]["at"] == NOW_MS + 6 * HOUR


def test_a_write_never_acts_before_the_latest_instant(run: Cli) -> None:
    run.ok("tick", now=at(2 * HOUR))
    late = run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", now=at(HOUR))
    assert late["createdAt"] == NOW_MS + 2 * HOUR
    ats = [e["at"] for e in run.ok("events")]
    assert ats == sorted(ats)


def test_a_future_tick_on_a_manual_ledger_is_how_time_passes(run: Cli) -> None:
    run.ok("meter", "create", "gpu.h100.hours")
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--gang", "2", "--for", "7d")
    run.ok("tick")
    run.ok("tick", now=at(8 * DAY))
    done = run.ok("get", rsv["id"])
    assert done["state"] == "released" and done["releaseReason"] == "expired"
    assert done["during"]["end"] == NOW_MS + 7 * DAY
    # bookings do not outlive the reservation: the pool is wholly free again
    assert run.ok("pool", "show", "west", now=at(8 * DAY))["inUse"] == 0
    assert run.ok("pool", "show", "west")["inUse"] == 16  # as of the start it was held
    assert usage_hours(run, now=at(8 * DAY)) == 16 * 7 * 24


def test_tick_until_on_a_real_clock_is_an_admins_decision(
    db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = real_ledger(db_dir)
    be(monkeypatch, "mallory")
    err = cli.fails(6, "tick", "--until", "+1d", "--step", "1h", now=None)
    assert "only an admin" in err["message"]
    cli.ok("tick", now=None)  # plain tick stays open to anyone (cron)


def test_tick_until_on_a_real_clock_stops_once_its_admin_is_removed(
    db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step is a transaction of its own, and `admin remove` commits between two: the next
    step is the removed admin's no more (the lifecycle's own work skipped the check)."""
    cli = real_ledger(db_dir)
    cli.ok("admin", "add", "alice", now=None)
    ctx = open_ctx(str(cli.db), None, "alice", None)
    stepped: list[int] = []
    one_tick = ticking.tick

    def tick_then_remove(step: Ctx, **kw: Any) -> list[Event]:
        got = one_tick(step, **kw)
        if not stepped:
            cli.ok("admin", "remove", "alice", now=None)
        stepped.append(step.now)
        return got

    monkeypatch.setattr(ticking, "tick", tick_then_remove)
    try:
        with pytest.raises(Forbidden, match=r"the ticks up to .* were written, none after"):
            ticking.tick_until(ctx, ctx.now + 6 * HOUR, HOUR)
    finally:
        ctx.db.close()
    assert len(stepped) == 1
    last_at = sqlite3.connect(cli.db).execute("SELECT value FROM meta WHERE key = 'last_at'")
    assert int(last_at.fetchone()[0]) < stepped[0] + HOUR  # `admin remove`'s instant, no step


def test_now_counts_from_a_real_clock_ledgers_time_when_it_is_ahead(db_dir: Path) -> None:
    """After `tick --until`, a real-clock ledger is ahead of the clock: `now` and `+0s` mean
    the instant a command without --now reads at, not the clock's."""
    cli = real_ledger(db_dir)
    cli.ok("tick", "--until", "+6h", "--step", "1h", now=None)
    ask = ("preview", "--tenant", "acme", "--gpus", "1", "--for", "1h")
    plain = cli.ok(*ask, now=None)["window"]["start"]
    assert plain >= time.time_ns() // 1_000_000 + 5 * HOUR
    assert cli.ok(*ask, now="now")["window"]["start"] == plain
    assert cli.ok(*ask, now="+0s")["window"]["start"] == plain
    assert cli.ok(*ask, now="-1h")["window"]["start"] == plain - HOUR


def test_the_instant_is_read_once_the_write_lock_is_held(db_dir: Path) -> None:
    """A wait for the lock never comes out of a spot victim's notice."""
    cli = real_ledger(db_dir)
    cli.ok("config", "set", "capacity.spotNoticeMs", "30000", now=None)
    cli.ok("node", "cordon", "n2", now=None)
    spot = cli.ok("reserve", "--tenant", "globex", "--gpus", "8", "--for", "1h", "--spot", now=None)
    cli.ok("tick", now=None)
    holder = sqlite3.connect(str(cli.db), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    env = {**os.environ, "BETTER_COMPUTE_DB": str(cli.db)}
    env.pop("BETTER_COMPUTE_NOW", None)
    args = ["--json", "reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h"]
    proc = subprocess.Popen([*ENTRY, *args], env=env, stdout=subprocess.PIPE, text=True)
    time.sleep(2.0)
    released_at = time.time_ns() // 1_000_000
    holder.execute("COMMIT")
    holder.close()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    notices = [
        e
        for e in cli.ok("events", "--reservation", spot["id"], now=None)
        if e["type"] == "reservation.preempting"
    ]
    assert len(notices) == 1
    assert notices[0]["at"] >= released_at  # acted after the wait, not before it
    assert notices[0]["data"]["at"] - notices[0]["at"] == 30_000  # the whole notice


# ---------------------------------------------------------------- identity


def test_as_is_believed_only_from_an_admin(run: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "1h")
    be(monkeypatch, "mallory")
    for args in (
        ("release", rsv["id"]),
        ("list",),
        ("init", "--force"),
        ("admin", "add", "mallory"),
    ):
        err = run.fails(6, "--as", "admin", *args)
        assert "only an admin may act as another principal" in err["message"]
        assert "mallory" in err["message"]
    err = run.fails(6, "list", env={"BETTER_COMPUTE_PRINCIPAL": ME})
    assert err["code"] == "FORBIDDEN"
    assert run.ok("--as", "mallory", "list", now=None) is not None  # oneself is no claim
    be(monkeypatch, ME)
    assert run.ok("get", rsv["id"])["state"] == "placed"


@pytest.mark.parametrize(
    "args",
    [
        ("node", "cordon", "west-01"),
        ("node", "uncordon", "west-01"),
        ("node", "mark-unreachable", "west-01"),
        ("node", "label", "west-01", "rack=r9"),
        ("node", "cordon", "west-01", "--from", "+1h", "--until", "+2h"),
        ("node", "add", "west-99", "--pool", "west", "--gpus", "8", "--model", "h100"),
        ("device", "quarantine", "west-01:0", "--reason", "xid-79"),
        ("device", "restore", "west-01:0"),
        ("pool", "create", "east"),
        ("pool", "set", "west", "--auto-bind", "off"),
        ("tenant", "create", "initech"),
        ("quota", "set", "--tenant", "acme", "--gpus", "1000"),
        ("policy", "set", "--tenant", "acme", "--principal", "mallory"),
        ("config", "set", "placement.topN", "1"),
        ("meter", "create", "gpu.h100.hours"),
        ("admin", "add", "mallory"),
        ("init", "--force"),
    ],
)
def test_fleet_and_rule_changes_are_admin_only(
    run: Cli, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    before = run.ok("events")
    be(monkeypatch, "mallory")
    err = run.fails(6, *args)
    assert "only an admin" in err["message"] and "mallory" in err["message"]
    be(monkeypatch, ME)
    assert run.ok("events") == before  # nothing was written


def test_inventory_import_is_admin_only(
    run: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps({"pools": [], "tenants": [{"id": "acme", "quota": {"gpus": 999}}]}))
    be(monkeypatch, "mallory")
    assert run.fails(6, "inventory", "import", str(inv))["code"] == "FORBIDDEN"
    be(monkeypatch, ME)
    run.ok("inventory", "import", str(inv))
    last = run.ok("events")[-1]
    assert last["type"] == "inventory.imported" and last["actor"] == ME


def test_init_force_by_a_non_admin_leaves_the_ledger(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "1h")
    be(monkeypatch, "mallory")
    run.fails(6, "init", "--force")
    be(monkeypatch, ME)
    assert run.ok("get", rsv["id"])["id"] == rsv["id"]


def test_a_principal_acts_only_for_tenants_it_may(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """acme has policies naming alice; globex has none (open to anyone)."""
    run.ok("policy", "set", "--tenant", "acme", "--principal", "alice", "--max-gpus", "16")
    mine = run.ok("--as", "alice", "reserve", "--tenant", "acme", "--gpus", "4", "--for", "1d")
    theirs = run.ok("reserve", "--tenant", "globex", "--gpus", "4", "--for", "1d")
    run.ok("tick")
    run.ok("tick", now=at(HOUR))
    be(monkeypatch, "mallory")
    for verb in (("get",), ("cancel",), ("release",), ("extend", "--by", "1h")):
        err = run.fails(3, verb[0], mine["id"], *verb[1:], now=at(HOUR))
        assert err["code"] == "NOT_FOUND" and "acme" not in err["message"]
    assert run.fails(3, "repair", mine["id"])["code"] == "NOT_FOUND"
    assert run.fails(3, "events", "--reservation", mine["id"])["code"] == "NOT_FOUND"
    for args in (("list",), ("events",), ("usage",)):
        rows = run.ok(*args, now=at(HOUR))
        assert all(r.get("tenantId") in (None, "globex") for r in rows), rows
    assert mine["id"] not in json.dumps(run.ok("events"))
    assert {r["id"] for r in run.ok("list")} == {theirs["id"]}
    for args in (
        ("list", "--tenant", "acme"),
        ("events", "--tenant", "acme"),
        ("usage", "--tenant", "acme"),
        ("timeline", "--tenant", "acme"),
        ("quota", "show", "--tenant", "acme"),
    ):
        assert run.fails(6, *args)["code"] == "FORBIDDEN"
    # an open tenant is anyone's to act for
    assert run.ok("release", theirs["id"], now=at(HOUR))["state"] == "released"
    # alice, named by a policy, acts for acme
    be(monkeypatch, "alice")
    assert run.ok("extend", mine["id"], "--by", "1h", now=at(HOUR))["id"] == mine["id"]
    # a denied principal does not act for the tenant at all
    be(monkeypatch, ME)
    run.ok("policy", "set", "--tenant", "acme", "--principal", "alice", "--deny")
    be(monkeypatch, "alice")
    assert run.fails(3, "get", mine["id"])["code"] == "NOT_FOUND"
    refusal = run.fails(6, "list", "--tenant", "acme")["message"]  # said as it is: it is named
    assert "no policy of it names you without --deny" in refusal, refusal


def test_admins_are_managed_by_admins(run: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run.ok("admin", "list") == sorted(["admin", ME])
    assert run.ok("admin", "add", "ops") == sorted(["admin", ME, "ops"])
    assert run.fails(4, "admin", "add", "ops")["code"] == "CONFLICT"
    be(monkeypatch, "ops")
    run.ok("node", "cordon", "west-01")  # ops is an admin now
    assert run.ok("--as", "carol", "list") == []  # and may act as others
    be(monkeypatch, ME)
    run.ok("admin", "remove", "ops")
    be(monkeypatch, "ops")
    assert run.fails(6, "node", "uncordon", "west-01")["code"] == "FORBIDDEN"
    # Anyone may see who the admins are, as the log's admin.* events (fleet events) tell them.
    assert run.ok("admin", "list") == sorted(["admin", ME])
    assert run.fails(6, "admin", "add", "ops")["code"] == "FORBIDDEN"
    be(monkeypatch, ME)
    assert run.fails(3, "admin", "remove", "ops")["code"] == "NOT_FOUND"
    run.ok("admin", "remove", "admin")
    err = run.fails(4, "admin", "remove", ME)
    assert "last admin" in err["message"]
    types = [e["type"] for e in run.ok("events") if e["type"].startswith("admin.")]
    assert types == ["admin.added", "admin.added", "admin.removed", "admin.removed"]


def test_init_makes_its_user_the_first_admin_and_refuses_as(db_dir: Path) -> None:
    cli = Cli(db_dir / "new.db")
    err = cli.fails(6, "--as", "someone", "init")
    assert "first admin" in err["message"]
    assert not (db_dir / "new.db").exists()
    cli.ok("init")
    assert cli.ok("admin", "list") == [ME]


# ---------------------------------------------------------------- actor on events


def test_every_event_says_who_caused_it(run: Cli) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob", "--max-gpus", "64")
    run.ok("--as", "bob", "reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h")
    run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h")
    run.ok("--as", "bob", "tick")
    events = run.ok("events")
    created = [e for e in events if e["type"] == "reservation.created"]
    assert created[0]["actor"] == "bob" and created[0]["actingAdmin"] == ME
    assert created[1]["actor"] == ME and "actingAdmin" not in created[1]
    ticked = [e for e in events if e["type"] in ("reservation.binding", "reservation.active")]
    assert ticked and all(e["actor"] == "system" and "actingAdmin" not in e for e in ticked)
    policy = next(e for e in events if e["type"] == "policy.set")
    assert policy["actor"] == ME


def test_a_notice_to_another_tenant_names_neither_reservation_nor_actor(run: Cli) -> None:
    run.ok("config", "set", "capacity.spotNoticeMs", "60000")
    for node in ("west-02", "west-03", "west-04", "west-05", "west-06", "west-07"):
        run.ok("node", "cordon", node)
    spot = run.ok("reserve", "--tenant", "globex", "--gpus", "8", "--for", "2h", "--spot")
    run.ok("tick")
    run.ok("--as", "admin", "reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h")
    notice = [
        e
        for e in run.ok("events", "--reservation", spot["id"])
        if e["type"] == "reservation.preempting"
    ]
    assert len(notice) == 1 and notice[0]["actor"] == "system"
    assert "actingAdmin" not in notice[0] and "by" not in notice[0]["data"]


# ---------------------------------------------------------------- the file


def test_the_ledger_file_is_private_or_shared_with_one_group(db_dir: Path) -> None:
    private = Cli(db_dir / "private.db")
    private.ok("init")
    assert stat.S_IMODE(os.stat(private.db).st_mode) == 0o600
    group = Cli(db_dir / "team.db")
    gid = os.getgid()
    name = grp.getgrgid(gid).gr_name
    group.ok("init", "--group", name)
    info = os.stat(group.db)
    assert stat.S_IMODE(info.st_mode) == 0o660 and info.st_gid == gid
    err = Cli(db_dir / "bad.db").fails(2, "init", "--group", "no-such-group-xyz")
    assert "no-such-group-xyz" in err["message"]


def test_version(run: Cli) -> None:
    code, out, _ = run("--version", json=False, now=None)
    assert code == 0 and out.startswith("better-compute ") and out.count("\n") == 1


def _become(uid: int, groups: tuple[int, ...]) -> None:
    """This (forked) process as user `uid`, whose own group is `uid`, in `groups` besides."""
    os.setgroups(list(groups))
    os.setgid(uid)
    os.setuid(uid)


def _run_as(
    uid: int, args: list[str], env: dict[str, str], groups: tuple[int, ...] = ()
) -> tuple[int, str, str]:
    """Run the CLI in a forked child that has become `uid` (in `groups` too): the interpreter
    and the package are already loaded, so the child needs no access to where Python is
    installed."""
    outs = [os.pipe(), os.pipe()]
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            _become(uid, groups)
            os.dup2(outs[0][1], 1)
            os.dup2(outs[1][1], 2)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            os.environ.update(env)
            sys.argv = ["better-compute", *args]
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    texts = []
    for _, write_end in outs:
        os.close(write_end)
    for read_end, _ in outs:
        with open(read_end, closefd=True) as stream:
            texts.append(stream.read())
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), texts[0], texts[1]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a command as another user")
def test_another_os_user_is_who_it_is_and_may_read_a_readable_ledger(db_dir: Path) -> None:
    """The real thing: a process running as `nobody` is `nobody`, whatever $USER says, and a
    user who may only read the file can still run the reads."""
    folder = db_dir / "shared"
    folder.mkdir()
    db = init_db(folder / "team.db", "--demo")
    cli = Cli(db)
    rsv = cli.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h")
    cli.ok("tick")
    gc.collect()  # close this process's connections: SQLite removes -wal and -shm at the last
    for path in (db_dir, folder):
        os.chmod(path, 0o755)
    for path in folder.iterdir():
        os.chmod(path, 0o644)
    env = {"USER": ME, "LOGNAME": ME, "BETTER_COMPUTE_DB": str(db)}
    nobody = 65534

    code, out, err = _run_as(nobody, ["--json", "get", rsv["id"]], env)
    assert code == 0, err
    assert json.loads(out)["id"] == rsv["id"]
    code, out, err = _run_as(nobody, ["--json", "pool", "show", "west"], env)
    assert code == 0, err
    code, out, err = _run_as(nobody, ["--json", "--as", ME, "list"], env)
    assert code == 6 and "nobody" in err, err
    code, out, err = _run_as(nobody, ["--json", "node", "cordon", "west-01"], env)
    assert code == 6 and "nobody" in err, err  # refused by the rules before the file says no
    code, out, err = _run_as(nobody, ["--json", "tick"], env)  # open to anyone, but not the file
    assert code == 6 and "read-only for you" in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run commands as other users")
def test_a_team_ledger_stays_open_to_the_team_after_a_member_held_it(db_dir: Path) -> None:
    """SQLite makes `-wal` and `-shm` with its user's own group: while one member of a team
    ledger (`init --group`) held it open, and after that member's command was killed with
    them left behind, every other member's command failed "unable to open database file"
    (a review). They are made with the ledger's group now."""
    team, alice, bob = 54320, 54321, 54322
    folder = db_dir / "team"
    folder.mkdir()
    db = init_db(folder / "team.db", "--demo")
    Cli(db).ok("tick")  # loads what tick imports lazily: bob cannot read where Python lives
    gc.collect()  # close this process's connections: SQLite removes -wal and -shm at the last
    os.chmod(db_dir, 0o755)
    for path, mode in ((folder, 0o770), (db, 0o660)):  # what `init --group` and a team folder
        os.chown(path, 0, team)
        os.chmod(path, mode)
    assert sorted(p.name for p in folder.iterdir()) == ["team.db"]
    ready = os.pipe()
    pid = os.fork()
    if pid == 0:  # alice holds the ledger open until she is killed, as `timeout` or an OOM do
        try:
            _become(alice, (team,))
            ledger = open_database(str(db))
            ledger.conn.execute("SELECT COUNT(*) FROM reservations").fetchone()
            os.write(ready[1], b"1")
            time.sleep(60)
        finally:
            os._exit(1)
    os.close(ready[1])
    try:
        assert os.read(ready[0], 1) == b"1"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready[0])
    left = {p.name: os.stat(p) for p in folder.iterdir() if p.name != "team.db"}
    assert sorted(left) == ["team.db-shm", "team.db-wal"]
    env = {"USER": "bob", "LOGNAME": "bob", "BETTER_COMPUTE_DB": str(db)}
    code, _, err = _run_as(bob, ["--json", "--as", ME, "pool", "show", "west"], env, (team,))
    assert code == 6 and "uid-54322" in err, err  # bob is who he is (no name: his uid)
    for args in (["--json", "pool", "show", "west"], ["--json", "tick"]):  # a read, a write
        code, _, err = _run_as(bob, args, env, (team,))
        assert code == 0, err
    assert all(i.st_uid == alice and i.st_gid == team for i in left.values()), left


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/proc/locks").exists(), reason="root, and Linux's /proc/locks"
)
def test_a_team_member_keeps_sqlites_lock_on_shm_while_the_ledger_is_open(db_dir: Path) -> None:
    """Regrouping `-shm` by opening and closing it dropped every POSIX lock the process held on
    it, SQLite's too: the next member to open took the ledger for closed and reset `-shm` under
    the open connections (a review: bus errors and "locking protocol" among 100 reserves)."""
    team, alice = 54320, 54321
    folder = db_dir / "locks"
    folder.mkdir()
    db = init_db(folder / "team.db", "--demo")
    gc.collect()
    os.chmod(db_dir, 0o755)
    for path, mode in ((folder, 0o770), (db, 0o660)):
        os.chown(path, 0, team)
        os.chmod(path, mode)
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            _become(alice, (team,))
            ledger = open_database(str(db))
            ledger.conn.execute("SELECT COUNT(*) FROM reservations").fetchone()
            shm = os.stat(f"{db}-shm")
            held = [
                line.split()
                for line in Path("/proc/locks").read_text().splitlines()
                if f" {os.getpid()} " in line
            ]
            inodes = {int(fields[5].rsplit(":", 1)[1]) for fields in held}
            code = 0 if shm.st_ino in inodes else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # 1: no lock of the connection on -shm


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a command as another user")
def test_a_ledger_in_a_folder_closed_to_you_is_forbidden_not_a_bug(db_dir: Path) -> None:
    """Any command of a user who may not enter the ledger's folder was INTERNAL (a review)."""
    folder = db_dir / "closed"
    folder.mkdir()
    db = init_db(folder / "x.db")
    os.chmod(db_dir, 0o755)
    os.chmod(folder, 0o700)
    code, _, err = _run_as(65534, ["--json", "admin", "list"], {"BETTER_COMPUTE_DB": str(db)})
    assert code == 6 and "Permission denied" in json.loads(err)["error"]["message"], err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run commands as other users")
def test_init_force_refused_by_a_sticky_folder_is_forbidden(db_dir: Path) -> None:
    """An admin who may write a team ledger but not replace it (a sticky folder, someone
    else's file) got UNAVAILABLE, which says "locked, or try later": it is who they are."""
    team, alice = 54320, 54321
    folder = db_dir / "sticky"
    folder.mkdir()
    db = init_db(folder / "team.db", "--demo")
    Cli(db).ok("admin", "add", "uid-54321")  # alice has no name here: her uid is her name
    backup = db_dir / "bk.db"
    Cli(db).ok("backup", str(backup))
    gc.collect()
    os.chmod(backup, 0o644)
    os.chmod(db_dir, 0o755)
    os.chmod(folder, 0o1777)
    os.chown(db, 0, team)
    os.chmod(db, 0o660)
    held = open_database(str(db))  # a member's command holding it open: -wal and -shm are there
    try:
        held.conn.execute("SELECT COUNT(*) FROM reservations").fetchone()
        before = db.read_bytes()
        files = sorted(p.name for p in folder.iterdir())
        assert files == ["team.db", "team.db-shm", "team.db-wal"]
        env = {"BETTER_COMPUTE_DB": str(db)}
        for args in (["init", "--force"], ["restore", str(backup)]):
            code, _, err = _run_as(alice, ["--json", "--now", NOW, *args], env, (team,))
            assert code == 6, err
            message = json.loads(err)["error"]["message"]
            assert "sticky" in message and "another user's" in message, message
            # refused before anything was touched: the sidecars the open connection uses stay
            assert db.read_bytes() == before and sorted(p.name for p in folder.iterdir()) == files
    finally:
        held.close()
    # Her own ledger she may replace, though another member's `-waiting` word stays (it holds
    # nothing; removing it there is refused): that refusal was INTERNAL.
    gc.collect()
    os.chown(db, alice, team)
    (folder / "team.db-waiting").touch()
    code, _, err = _run_as(alice, ["--json", "--now", NOW, "init", "--force"], env, (team,))
    assert code == 0, err


# ---------------------------------------------------------------- migration


def test_a_version_1_ledger_with_rows_migrates_to_actors_admins_and_a_real_clock(
    db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger from before issue 7: actors come from the log, its file's owner is its admin."""
    from better_compute.storage.db import migration_script, sqlite_tools
    from better_compute.storage.schema import APPLICATION_ID

    path = db_dir / "v1.db"
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN")
    sqlite_tools(conn).executescript(migration_script(0))
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO meta(key, value) VALUES ('db_id', 'abc')")
    conn.execute("INSERT INTO tenants(id, seq) VALUES ('acme', 1)")
    conn.execute("INSERT INTO pools(id, name, seq) VALUES ('pool_x', 'p', 1)")
    conn.execute(
        "INSERT INTO reservations(id, seq, tenant_id, pool_id, principal, state, duration_ms,"
        " quota_charge, params, created_at) VALUES"
        " ('rsv_a', 1, 'acme', 'pool_x', 'carol', 'pending', 3600000, 1, '{}', ?)",
        (NOW_MS,),
    )
    conn.execute(
        "INSERT INTO events(type, at, tenant_id, reservation_id, data) VALUES"
        " ('quota.set', ?, 'acme', NULL, '{\"by\": \"admin\", \"gpus\": 4}'),"
        " ('reservation.created', ?, 'acme', 'rsv_a', '{}'),"
        " ('reservation.pending', ?, 'acme', 'rsv_a', '{}')",
        (NOW_MS, NOW_MS + 1, NOW_MS + 2),
    )
    conn.execute("COMMIT")
    conn.close()
    cli = Cli(path)
    events = cli.ok("events", now=None)
    assert [e["actor"] for e in events] == ["admin", "carol", "system"]
    # the real clock, at the latest instant the old log shows or later
    assert cli.fails(2, "tick")["code"] == "INVALID_INPUT"
    assert cli.ok("tick", now=None)["now"] >= NOW_MS + 2
    # its file's owner administers it until an admin is named
    assert cli.ok("admin", "list", now=None) == []
    be(monkeypatch, "mallory")
    assert cli.fails(6, "admin", "add", "mallory", now=None)["code"] == "FORBIDDEN"
    be(monkeypatch, ME)
    assert cli.ok("admin", "add", ME, now=None) == [ME]


def test_report_bound_of_another_tenants_reservation_is_not_found(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "alice")
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "1h")
    run.ok("pool", "set", "west", "--auto-bind", "off")
    run.ok("tick")
    node = rsv["allocations"][0]["nodeId"]
    be(monkeypatch, "mallory")
    assert run.fails(3, "node", "report-bound", node, rsv["id"])["code"] == "NOT_FOUND"
    be(monkeypatch, "alice")
    assert run.ok("node", "report-bound", node, rsv["id"])["state"] == "active"


def test_system_is_not_a_principal_name(run: Cli) -> None:
    assert run.fails(2, "admin", "add", "system")["code"] == "INVALID_INPUT"


@pytest.mark.sqlite_only(reason="an OS user; on PostgreSQL a role named system: test_postgres.py")
def test_a_user_named_system_may_not_act(
    run: Cli, monkeypatch: pytest.MonkeyPatch, db_dir: Path
) -> None:
    """Its events would read as the lifecycle's own work: refused before anything is read or
    written, as `--as system` is refused, and `init` makes no such admin."""
    before = run.ok("events")
    be(monkeypatch, "system")
    for args in (["reserve", "--tenant", "acme", "--gpus", 1, "--for", "1h"], ["list"], ["tick"]):
        err = run.fails(6, *args)
        assert err["code"] == "FORBIDDEN" and "'system' may not act" in err["message"], err
    assert Cli(db_dir / "sys.db").fails(6, "init")["code"] == "FORBIDDEN"
    assert not (db_dir / "sys.db").exists()
    be(monkeypatch, ME)
    assert run.ok("events") == before


# ---------------------------------------------------------------- found by the hostile review


def test_a_key_tells_a_stranger_nothing(run: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "alice")
    args = ("reserve", "--tenant", "acme", "--gpus", "8", "--for", "6h")
    mine = run.ok("--as", "alice", *args, "--key", "a1")
    be(monkeypatch, "mallory")
    for key_args in (("--key", "a1"), ("--gpus", "1", "--key", "a1"), ("--key", "unused")):
        err = run.fails(6, *args, *key_args)
        assert mine["id"] not in err["message"] and "no policy" in err["message"]


def test_tick_repair_and_node_show_tell_anyone_only_their_own_tenants(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "alice")
    hidden = run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1d")
    hidden_later = run.ok(
        "reserve", "--tenant", "acme", "--gpus", "8", "--for", "1h", "--start", "+1d"
    )
    open_one = run.ok("reserve", "--tenant", "globex", "--gpus", "2", "--for", "1d")
    be(monkeypatch, "mallory")
    shown = run.ok("tick")["changes"]
    assert {e["reservationId"] for e in shown} == {open_one["id"]}
    be(monkeypatch, ME)
    run.ok("node", "cordon", hidden_later["allocations"][0]["nodeId"])
    be(monkeypatch, "mallory")
    assert hidden_later["id"] not in json.dumps(run.ok("repair"))
    node = hidden["allocations"][0]["nodeId"]
    assert hidden["id"] not in json.dumps(run.ok("node", "show", node))
    be(monkeypatch, "alice")
    assert hidden["id"] in json.dumps(run.ok("node", "show", node))


def test_init_force_under_a_pinned_clock_cannot_freeze_a_real_ledger(db_dir: Path) -> None:
    cli = real_ledger(db_dir)
    err = cli.fails(2, "init", "--force", "--demo", now="2026-01-01T00:00:00Z")
    assert "real clock" in err["message"]
    assert cli.ok("tenant", "list", now=None) == [{"id": "acme"}, {"id": "globex"}]
    made = Cli(db_dir / "what-if.db").ok("init", now="2026-01-01T00:00:00Z")
    assert made["clock"] == "manual" and made["admin"] == ME
    assert cli.ok("init", "--force", now=None)["clock"] == "real"


@pytest.mark.parametrize(
    ("sql", "command"),
    [
        ("UPDATE meta SET value = '1e30' WHERE key = 'last_at'", ("list",)),
        ("UPDATE meta SET value = '' WHERE key = 'last_at'", ("tick",)),
        ("UPDATE meta SET value = '99999999999999999999999' WHERE key = 'last_at'", ("tick",)),
        (
            "INSERT OR REPLACE INTO meta(key, value) VALUES ('counter:rsv', 'zz')",
            ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h"),
        ),
        ("UPDATE usage SET start = 'q'", ("usage", "--dead-letter")),
    ],
)
def test_damaged_ledger_facts_are_unavailable_not_a_bug(
    run: Cli, sql: str, command: tuple[str, ...]
) -> None:
    run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")
    run.ok("tick")
    conn = sqlite3.connect(str(run.db), isolation_level=None)
    conn.execute(sql)
    conn.close()
    err = run.fails(7, *command, now=None)
    assert "damaged" in err["message"]


def test_restore_keeps_a_team_ledgers_group(db_dir: Path) -> None:
    other = next(g for g in grp.getgrall() if g.gr_gid != os.getgid())
    cli = Cli(db_dir / "team.db")
    cli.ok("init", "--group", other.gr_name)
    cli.ok("backup", str(db_dir / "bk.db"))
    cli.ok("restore", str(db_dir / "bk.db"))
    info = os.stat(cli.db)
    assert info.st_gid == other.gr_gid and stat.S_IMODE(info.st_mode) == 0o660


def test_restore_on_a_full_disk_is_unavailable_and_replaces_nothing(db_dir: Path) -> None:
    import resource
    import signal

    cli = Cli(init_db(db_dir / "full.db", "--demo"))
    rsv = cli.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")
    cli.ok("backup", str(db_dir / "bk.db"))

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    env = {**os.environ, "BETTER_COMPUTE_DB": str(cli.db)}
    done = subprocess.run(
        [*ENTRY, "--json", "restore", str(db_dir / "bk.db")],
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=small_files,
        check=False,
        timeout=60,
    )
    assert done.returncode == 7, done.stderr
    assert cli.ok("get", rsv["id"])["id"] == rsv["id"]


@pytest.mark.parametrize(
    "args",
    [
        ("admin", "add", " root"),
        ("admin", "add", "system"),
        ("--as", "system", "list"),
        ("--as", " admin", "list"),
        ("policy", "set", "--tenant", "acme", "--principal", "system"),
        ("policy", "set", "--tenant", "acme", "--principal", "bob "),
    ],
)
def test_principal_names_are_exact(run: Cli, args: tuple[str, ...]) -> None:
    assert run.fails(2, *args)["code"] == "INVALID_INPUT"


def test_an_impossible_gang_is_invalid_before_any_quota(run: Cli) -> None:
    err = run.fails(
        2, "reserve", "--tenant", "globex", "--gpus", "8", "--gang", "64", "--for", "1h"
    )
    assert "at most 7 nodes" in err["message"]
