"""Global options, environment variables, output, error format and exit codes (§2, §3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HOUR, ME, MIN, NOW, NOW_MS, Cli, at, invoke

# ---------------------------------------------------------------- --now


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-09-28T08:00:00Z", NOW_MS),
        ("2026-09-28T08:00:00", NOW_MS),  # no offset means UTC
        ("2026-09-28T10:00:00+02:00", NOW_MS),
        ("2026-09-28T08:00:00.250Z", NOW_MS + 250),
        (str(NOW_MS), NOW_MS),
        (str(NOW_MS + 1), NOW_MS + 1),
    ],
)
def test_now_absolute_forms(run: Cli, text: str, expected: int) -> None:
    assert run.ok("tick", now=text)["now"] == expected


@pytest.mark.parametrize(
    ("text", "offset"),
    [("now", 0), ("+2h", 2 * HOUR), ("+90m", 90 * MIN), ("+1d12h", 36 * HOUR), ("-30m", -30 * MIN)],
)
def test_now_relative_forms_count_from_a_manual_ledgers_own_time(
    run: Cli, text: str, offset: int
) -> None:
    # The ledger was made at NOW under a pinned clock; a write never acts earlier than it.
    assert run.ok("tick", now=text)["now"] == NOW_MS + max(0, offset)


@pytest.mark.parametrize(
    ("text", "offset"),
    [("now", 0), ("+2h", 2 * HOUR), ("+1d12h", 36 * HOUR), ("-30m", -30 * MIN)],
)
def test_on_a_real_clock_reads_ask_relative_to_the_clock(
    db_dir: Path, text: str, offset: int
) -> None:
    cli = Cli(db_dir / "real.db")
    cli.ok("init", now=None)
    cli.ok("pool", "create", "p", now=None)
    before = time.time_ns() // 1_000_000
    got = cli.ok("timeline", "--step", "60", now=text)["buckets"]
    after = time.time_ns() // 1_000_000
    # --from defaults to the start of the hour that --now falls in
    hour = 3_600_000
    assert (before + offset) // hour * hour <= got[0]["start"] <= (after + offset) // hour * hour


def test_without_now_a_manual_ledger_stays_at_its_own_time(run: Cli) -> None:
    run.ok("tick", now=at(HOUR))
    assert run.ok("tick", now=None)["now"] == NOW_MS + HOUR


def test_without_now_a_real_ledger_uses_the_clock(db_dir: Path) -> None:
    cli = Cli(db_dir / "real.db")
    cli.ok("init", now=None)
    before = time.time_ns() // 1_000_000
    got = cli.ok("tick", now=None)["now"]
    assert before <= got <= time.time_ns() // 1_000_000


@pytest.mark.parametrize(
    "text", ["yesterday", "2026-13-01", "2026-02-30T00:00:00Z", "+2x", "", "1e9"]
)
def test_a_bad_now_is_invalid_input(run: Cli, text: str) -> None:
    err = run.fails(2, "list", now=text)
    assert err["code"] == "INVALID_INPUT"
    assert "TIME" in err["message"]


def test_now_is_used_for_what_is_written(run: Cli) -> None:
    rsv = run.ok(
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "1",
        "--for",
        "1h",
        "--key",
        "k",
        now="2026-09-28T09:30:00Z",
    )
    assert rsv["createdAt"] == NOW_MS + 90 * MIN
    assert rsv["during"]["start"] == NOW_MS + 90 * MIN
    events = run.ok("events", "--reservation", rsv["id"])
    assert {e["at"] for e in events} == {NOW_MS + 90 * MIN}


# ---------------------------------------------------------------- environment variables


def test_environment_variables_stand_in_for_the_global_options(demo_db: Path) -> None:
    env = {"BETTER_COMPUTE_DB": str(demo_db), "BETTER_COMPUTE_NOW": "2026-09-28T09:00:00Z"}
    result = invoke(
        ["--json", "reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--key", "k"],
        env=env,
    )
    assert result.exit_code == 0, result.stderr
    rsv = json.loads(result.stdout)
    assert rsv["createdAt"] == NOW_MS + HOUR
    # the flags win over the variables
    result = invoke(["--now", str(NOW_MS + 90 * MIN), "--json", "tick"], env=env)
    assert json.loads(result.stdout)["now"] == NOW_MS + 90 * MIN
    assert Cli(demo_db).ok("get", rsv["id"])["state"] == "active"


@pytest.mark.sqlite_only(reason="a missing ledger file")
def test_the_db_variable_is_used_and_a_missing_one_is_unavailable(db_dir: Path) -> None:
    env = {"BETTER_COMPUTE_DB": str(db_dir / "absent.db"), "BETTER_COMPUTE_NOW": str(NOW_MS)}
    result = invoke(["--json", "list"], env=env)
    assert result.exit_code == 7
    assert json.loads(result.stderr)["error"]["code"] == "UNAVAILABLE"
    assert str(db_dir / "absent.db") in result.stderr


def test_the_principal_variable_is_who_acts(run: Cli) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob", "--max-gpus", "2")
    reserve = ("reserve", "--tenant", "acme", "--gpus", "4", "--for", "1h", "--key", "k")
    as_bob = {"BETTER_COMPUTE_PRINCIPAL": "bob"}
    err = run.fails(6, *reserve, env=as_bob)
    assert err["code"] == "FORBIDDEN" and "bob" in err["message"]
    err = run.fails(6, *reserve, env={"BETTER_COMPUTE_PRINCIPAL": "carol"})
    assert "carol" in err["message"]
    assert run.ok("list") == []
    # --as wins over the variable; admin is never refused
    assert run.ok("--as", "admin", *reserve, env=as_bob)["state"] == "placed"
    small = run.ok(
        "reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--key", "s", env=as_bob
    )
    assert small["state"] == "placed"
    assert run.ok("events")[-1]["actor"] == "bob"
    assert run.ok("events")[-1]["actingAdmin"] == ME  # the admin behind the variable
    # the fleet and the rules that bind principals are an admin's to change
    err = run.fails(6, "node", "cordon", "west-07", "--reason", "psu", env=as_bob)
    assert "only an admin" in err["message"]
    err = run.fails(6, "config", "set", "placement.topN", "2", env=as_bob)
    assert "only an admin" in err["message"]
    err = run.fails(6, "policy", "set", "--tenant", "acme", "--principal", "bob", env=as_bob)
    assert "only an admin" in err["message"]


# ---------------------------------------------------------------- output discipline


JSON_COMMANDS: list[tuple[str, ...]] = [
    ("pool", "list"),
    ("pool", "show", "west"),
    ("node", "list"),
    ("node", "show", "west-01"),
    ("tenant", "list"),
    ("quota", "show", "--tenant", "acme"),
    ("config", "get"),
    ("list",),
    ("get", "{rsv}"),
    ("preview", "--tenant", "acme", "--gpus", "2", "--for", "1h"),
    ("events",),
    ("timeline",),
    ("tick",),
    ("inventory", "export"),
    ("usage",),
    ("meter", "list"),
    ("policy", "list"),
    ("repair",),
]


def test_json_gives_exactly_one_document_on_stdout(run: Cli) -> None:
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--key", "k")
    for args in JSON_COMMANDS:
        args = tuple(a.replace("{rsv}", rsv["id"]) for a in args)
        for argv in (
            ["--db", str(run.db), "--now", str(NOW_MS), "--json", *args],
            ["--db", str(run.db), "--now", str(NOW_MS), *args, "--json"],
        ):
            result = invoke(argv)
            assert result.exit_code == 0, (args, result.stderr)
            json.loads(result.stdout)  # one document: trailing data would raise
            assert result.stdout.count("\n") == 1, (args, result.stdout[:200])
            assert result.stderr == "", (args, result.stderr)


def test_list_like_answers_are_arrays(run: Cli) -> None:
    for args in (("list",), ("events",), ("pool", "list"), ("node", "list"), ("tenant", "list")):
        assert isinstance(run.ok(*args), list), args


def test_human_output_is_not_json_and_uses_iso_times(run: Cli) -> None:
    code, text, err = run(
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "2",
        "--for",
        "1h",
        "--key",
        "k",
        json=False,
        env={"COLUMNS": "200"},
    )
    assert code == 0 and err == ""
    assert "2026-09-28T08:00:00Z" in text
    assert not text.lstrip().startswith("{")


# ---------------------------------------------------------------- errors


def test_errors_are_one_line_on_stderr(run: Cli) -> None:
    code, out, err = run("get", "rsv_nope", json=False)
    assert code == 3
    assert out == ""
    assert err.startswith("error: NOT_FOUND: ") and "rsv_nope" in err
    assert err.count("\n") == 1


def test_json_errors_are_an_error_object_on_stderr(run: Cli) -> None:
    for flag_first in (True, False):
        argv = ["--db", str(run.db), "--now", str(NOW_MS)]
        argv += ["--json", "get", "rsv_nope"] if flag_first else ["get", "rsv_nope", "--json"]
        result = invoke(argv)
        assert result.exit_code == 3
        assert result.stdout == ""
        assert json.loads(result.stderr) == {
            "error": {"code": "NOT_FOUND", "message": json.loads(result.stderr)["error"]["message"]}
        }
        assert "rsv_nope" in json.loads(result.stderr)["error"]["message"]


def test_every_exit_code(run: Cli, db_dir: Path) -> None:
    reserve = ("reserve", "--tenant", "acme", "--for", "1h")
    run.ok(*reserve, "--gpus", "2", "--key", "k")
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob", "--deny")
    cases: list[tuple[int, str, tuple[str, ...], dict[str, str]]] = [
        (2, "INVALID_INPUT", (*reserve, "--gpus", "0", "--key", "x"), {}),
        (3, "NOT_FOUND", ("get", "rsv_nope"), {}),
        (4, "CONFLICT", (*reserve, "--gpus", "3", "--key", "k"), {}),
        (
            5,
            "QUOTA_EXCEEDED",
            ("reserve", "--tenant", "globex", "--for", "1h", "--gpus", "8", "--gang", "5"),
            {},
        ),
        (
            6,
            "FORBIDDEN",
            (*reserve, "--gpus", "1", "--key", "b"),
            {"BETTER_COMPUTE_PRINCIPAL": "bob"},
        ),
    ]
    for code, name, args, env in cases:
        assert run.fails(code, *args, env=env)["code"] == name
    assert Cli(db_dir / "none.db").fails(7, "list")["code"] == "UNAVAILABLE"


def test_usage_errors_exit_2(run: Cli) -> None:
    for args in (
        ("reserve", "--tenant", "acme"),  # --for missing
        ("reserve", "--tenant", "acme", "--gpus", "many", "--for", "1h"),
        ("list", "--bogus"),
        ("no-such-command",),
        ("get",),
        ("timeline", "--step", "ten"),
    ):
        code, out, err = run(*args)
        assert code == 2, args
        assert out == "", args
        assert err, args


@pytest.mark.parametrize(
    "args",
    [
        ("reserve", "--tenant", "acme", "--gpus", "99999999999999999999999", "--for", "1h"),
        ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "99999999999999999999w"),
        ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--start", "9" * 80),
        ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--start", "99999-01-01"),
        ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--start", "+9999999999w"),
        ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "   "),
        ("reserve", "--tenant", "", "--gpus", "1", "--for", "1h"),
        ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--model", ","),
        ("extend", "rsv_x", "--by", "1h1h"),
        ("get", "'; DROP TABLE reservations; --"),
        ("pool", "create", "ü" * 70),
        ("node", "add", "n9", "--pool", "west", "--gpus", "8", "--model", "H 100"),
        ("node", "label", "west-01", "=x"),
        ("device", "quarantine", "west-01:99", "--reason", "x"),
        ("device", "quarantine", "west-01", "--reason", "x"),
        ("tick", "--until", "+1h", "--step", "1ms"),
        ("timeline", "--step", "99999999999999999999"),
        ("events", "--since", "-5"),
        ("events", "--since", "99999999999999999999"),
        ("events", "--since", "-99999999999999999999"),
        ("policy", "set", "--tenant", "acme", "--principal", "z", "--max-gpus", "9" * 20),
        ("quota", "set", "--tenant", "acme", "--gpus", "99999999999999999999"),
        ("config", "set", "placement.topN", "99999999999999999999999"),
        ("node", "cordon", "west-01", "--from", "+2h", "--until", "+1h"),
        ("usage", "--from", "garbage"),
    ],
)
def test_bad_input_never_shows_a_traceback_or_an_internal_error(
    run: Cli, args: tuple[str, ...]
) -> None:
    code, out, err = run(*args)
    assert code in (0, 2, 3, 4), (code, err)
    if code:
        assert out == ""
        assert "INTERNAL" not in err, err
    assert "Traceback" not in err


@pytest.mark.sqlite_only(reason="a folder as the ledger file")
def test_a_directory_as_the_database_is_refused(db_dir: Path) -> None:
    err = Cli(db_dir).fails(2, "list")
    assert err["code"] == "INVALID_INPUT"
    assert Cli(db_dir / "no" / "such" / "dir.db").fails(2, "init")["code"] == "INVALID_INPUT"


@pytest.mark.sqlite_only(reason="an empty ledger file")
def test_an_empty_file_is_not_initialised(db_dir: Path) -> None:
    empty = db_dir / "empty.db"
    empty.write_bytes(b"")
    assert Cli(empty).fails(7, "list")["code"] == "UNAVAILABLE"
    assert Cli(empty).ok("init")["db"] == str(empty)
    assert Cli(empty).ok("list") == []


def test_config_set_a_negative_value_says_what_is_allowed(run: Cli) -> None:
    """`-1` used to read as an unknown option: "No such option: -1", naming no range."""
    error = run.fails(2, "config", "set", "placement.topN", "-1")
    assert error["message"] == "placement.topN must be an integer from 1 to 1000, got '-1'"
    error = run.fails(2, "config", "set", "capacity.spotNoticeMs", "-5")
    assert "from 0 to" in error["message"] and "'-5'" in error["message"]


def test_a_principal_too_long_is_refused_for_its_length(run: Cli) -> None:
    error = run.fails(2, "--as", "x" * 300, "list")
    assert error["message"] == "--as: a principal has at most 256 characters, got 300"
    error = run.fails(2, "admin", "add", "x" * 257)
    assert "at most 256 characters, got 257" in error["message"]


def test_cancel_of_a_released_reservation_points_nowhere(run: Cli) -> None:
    """It said "use `release` once it has started", a verb refused for it too."""
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")["id"]
    run.ok("cancel", rsv)
    error = run.fails(4, "cancel", rsv)
    assert "it is released" in error["message"] and "release" not in error["message"].split(")")[-1]
    placed = run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")["id"]
    run.ok("tick")
    assert "use `release`" in run.fails(4, "cancel", placed)["message"]  # active: the hint helps


@pytest.mark.sqlite_only(reason="runs the real entry point on the ledger file")
def test_an_option_of_one_value_given_twice_is_refused(run: Cli) -> None:
    """Click kept the last: `--tenant acme … --tenant globex` booked for globex without a word.
    The check runs in the real entry point (cli.main), before Typer parses: a subprocess."""
    entry = [sys.executable, "-c", "from better_compute.cli import main; main()"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    base = [*entry, "--db", str(run.db), "--now", NOW, "--json"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], capture_output=True, text=True, env=env)

    before = run.ok("events")
    got = cli("reserve", "--tenant", "acme", "--tenant", "globex", "--gpus", "1", "--for", "1h")
    assert got.returncode == 2 and got.stdout == ""
    message = json.loads(got.stderr)["error"]["message"]
    assert message.startswith("--tenant is given twice ('acme' and 'globex')")
    assert "--as is given twice" in cli("--as", "alice", "--as", "bob", "list").stderr
    assert cli("reserve", "--tenant", "acme", "--gpus", "1", "--for=1h", "--for=2h").returncode == 2
    assert run.ok("events") == before
    # Repeatable options, flags given twice, and a value that looks like an option are fine.
    ok = cli("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--label", "a=b",
             "--label", "c=d", "--name", "--tenant")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["name"] == "--tenant"
    assert cli("--json", "list").returncode == 0


def test_an_os_error_that_is_no_refusal_is_still_internal(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a path too long (INVALID_INPUT) and a full disk (UNAVAILABLE) are the system's
    refusals; any other OSError is a bug of ours, reported on one line, never a traceback."""
    import errno

    from better_compute.service import setup

    def broken(*_: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(setup, "tenant_list", broken)
    err = run.fails(1, "tenant", "list")
    assert err["code"] == "INTERNAL" and "a bug; please report it" in err["message"]
