"""Commands with a progress bar, run where people see it: stderr on a terminal (a pty).

CliRunner's streams are never terminals, so only a real pty exercises the bar at all.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import NOW, init_db

import better_compute

pytestmark = pytest.mark.sqlite_only(
    reason="runs the CLI on a pty in a subprocess, on a ledger file"
)

ENTRY = [sys.executable, "-c", "from better_compute.cli import main; main()"]


def on_a_terminal(db: Path, *args: str) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pty; return its exit code and what it showed."""
    leader, follower = pty.openpty()
    env = {**os.environ, "BETTER_COMPUTE_DB": str(db), "COLUMNS": "100"}
    env.pop("BETTER_COMPUTE_NOW", None)
    proc = subprocess.Popen([*ENTRY, *args], stdout=follower, stderr=follower, env=env)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower closed: the process is done
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return proc.wait(timeout=120), shown.decode(errors="replace")


def test_tick_until_draws_its_bar_and_succeeds(db_dir: Path) -> None:
    db = init_db(db_dir / "t.db", "--demo")
    code, shown = on_a_terminal(db, "--now", NOW, "tick", "--until", "+2h", "--step", "1m")
    assert code == 0, shown
    assert "Traceback" not in shown and "error" not in shown.lower()


def test_inventory_import_on_a_terminal(db_dir: Path, tmp_path: Path) -> None:
    db = init_db(db_dir / "i.db")
    csv = tmp_path / "nodes.csv"
    csv.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"n{i},1000,1024,8,V100M16\n" for i in range(50))
    )
    code, shown = on_a_terminal(db, "inventory", "import", "--format", "openb-nodes", str(csv))
    assert code == 0, shown
    assert "50 nodes" in shown


def test_simulate_on_a_terminal(db_dir: Path, tmp_path: Path) -> None:
    db = init_db(db_dir / "s.db", "--demo")
    work = tmp_path / "w.jsonl"
    work.write_text(
        "".join(
            f'{{"at": "+{i}m", "tenant": "acme", "gpus": 2, "duration": "1h"}}\n' for i in range(5)
        )
    )
    code, shown = on_a_terminal(db, "simulate", "--workload", str(work), "--format", "jsonl")
    assert code == 0, shown
    assert "Traceback" not in shown and "placed at once" in shown


def test_a_folder_is_no_workload_or_node_list(db_dir: Path, tmp_path: Path) -> None:
    from conftest import Cli

    cli = Cli(init_db(db_dir / "f.db", "--demo"))
    for args in (
        ("simulate", "--workload", str(tmp_path)),
        ("simulate", "--workload", str(tmp_path), "--format", "jsonl"),
        ("inventory", "import", "--format", "openb-nodes", str(tmp_path)),
        ("inventory", "import", str(tmp_path)),
    ):
        assert "not a regular file" in cli.fails(2, *args)["message"]


def test_a_key_used_again_is_a_retry_not_demand(db_dir: Path, tmp_path: Path) -> None:
    from conftest import Cli

    cli = Cli(init_db(db_dir / "k.db", "--demo"))
    work = tmp_path / "k.jsonl"
    line = '{"at": "+0s", "tenant": "acme", "gpus": 2, "duration": "1h", "key": "k1"}\n'
    work.write_text(line + line)
    first = cli.ok("simulate", "--workload", str(work), "--format", "jsonl", now=None)
    assert (first["requests"], first["placedAtOnce"], first["neverPlaced"]) == (1, 1, 0)
    assert first["skipped"] == 1 and first["gpuHoursBooked"] == 2.0
    again = cli.ok("simulate", "--workload", str(work), "--format", "jsonl", now=None)
    assert (again["requests"], again["neverPlaced"], again["skipped"]) == (0, 0, 2)
    assert again["gpuHoursBooked"] == 0.0  # the first run's hours are not this run's


def test_a_reader_that_goes_away_ends_human_output_as_sigpipe_would() -> None:
    """`demo | head -8` ended with exit 1 (rich's own answer to a closed pipe), which §3 keeps
    for bugs: it now ends as SIGPIPE would, 141, with nothing on stderr, as JSON output does.
    The tour prints line by line, so its next print after the reader left meets the pipe."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    proc = subprocess.Popen(
        [*ENTRY, "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()
    proc.stdout.close()  # the reader goes away
    assert proc.wait(timeout=120) == 141
    assert proc.stderr.read() == b""


def test_help_to_a_reader_that_goes_away_ends_as_sigpipe_would() -> None:
    """Typer prints help with a rich Console of its own: `--help | head -1` ended with exit 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env["COLUMNS"] = "80"
    proc = subprocess.Popen(
        [*ENTRY, "reserve", "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # gone before the help is written: its first write meets a closed pipe
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_output_larger_than_a_pipe_is_written_whole_or_ends_as_sigpipe_would(
    db_dir: Path, tmp_path: Path, unbuffered: str
) -> None:
    """Under PYTHONUNBUFFERED the text layer wrote to the pipe once and dropped what a partial
    write left: `events | head -c1` ended with status 0 and the rest of the log was lost
    (a fuzzer, 2026-12-01). Now all of it reaches a reader that reads all, and a reader that
    goes away ends the process as SIGPIPE would."""
    from conftest import Cli

    cli = Cli(init_db(db_dir / "big.db", "--demo"))
    work = tmp_path / "w.jsonl"
    work.write_text(
        "".join(
            f'{{"at": "+{k}m", "tenant": "acme", "gpus": 1, "duration": "30m"}}\n'
            for k in range(400)
        )
    )
    cli.ok("simulate", "--workload", str(work), "--format", "jsonl", now=None)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BETTER_COMPUTE_", "PYTHONU"))}
    env.update(BETTER_COMPUTE_DB=str(cli.db), PYTHONUNBUFFERED=unbuffered)
    whole = subprocess.run([*ENTRY, "events"], capture_output=True, env=env, check=True).stdout
    assert len(whole) > 4 * 65536 and whole.count(b"\n") > 1600
    proc = subprocess.Popen(
        [*ENTRY, "events"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(1) == whole[:1]
    proc.stdout.close()  # the reader goes away with the log far from written
    assert proc.wait(timeout=120) == 141
    assert proc.stderr.read() == b""


@pytest.mark.parametrize("columns", ["0", "3"])
def test_a_width_too_small_for_any_table_is_ignored(db_dir: Path, columns: str) -> None:
    """rich took COLUMNS=0 as the width: every table, and Typer's help, printed nothing, with
    status 0."""
    db = init_db(db_dir / "w.db", "--demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env.update(BETTER_COMPUTE_DB=str(db), COLUMNS=columns)
    shown = subprocess.run([*ENTRY, "node", "list"], capture_output=True, env=env, check=True)
    lines = shown.stdout.decode().splitlines()
    assert lines[0].split() == ["node", "gpus", "model", "labels", "state"]
    assert len(lines) == 8 and all(line.startswith("west-0") for line in lines[1:])
    shown = subprocess.run([*ENTRY, "--help"], capture_output=True, env=env, check=True)
    assert b"Usage: better-compute" in shown.stdout


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("unbuffered", ["1", ""])
@pytest.mark.parametrize("args", [["list"], ["list", "--json"], ["node", "list", "--json"]])
def test_output_to_a_full_disk_is_unavailable_on_one_line(
    db_dir: Path, unbuffered: str, args: list[str]
) -> None:
    """`list --json > /dev/full` ended with status 0 and nothing said (buffered), or with a
    traceback (unbuffered, once stdout was made buffered): UNAVAILABLE, one line on stderr."""
    db = init_db(db_dir / "f.db", "--demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BETTER_COMPUTE_", "PYTHONU"))}
    env.update(BETTER_COMPUTE_DB=str(db), PYTHONUNBUFFERED=unbuffered)
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([*ENTRY, *args], stdout=full, stderr=subprocess.PIPE, env=env)
    assert proc.returncode == 7, proc.stderr
    assert proc.stderr.count(b"\n") == 1 and b"No space left on device" in proc.stderr


@pytest.mark.parametrize("args", [["node", "list"], ["list", "--json"], ["tenant", "list"]])
def test_a_reader_gone_before_a_short_answer_ends_as_sigpipe_would(
    db_dir: Path, args: list[str]
) -> None:
    """Under PYTHONUNBUFFERED a short answer stayed buffered until exit, where a closed pipe
    printed 'Exception ignored … BrokenPipeError' and ended with status 120."""
    db = init_db(db_dir / "s.db", "--demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env.update(BETTER_COMPUTE_DB=str(db), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [*ENTRY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # gone before anything is written
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_closed_standard_output_is_refused_before_anything_is_done(
    db_dir: Path, json_flag: list[str]
) -> None:
    """Started with stdout closed (`>&-`), a command did its work and then failed to print it:
    INTERNAL after a `reserve` had committed. It is refused first: INVALID_INPUT, one line."""
    db = init_db(db_dir / "c.db", "--demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env.update(BETTER_COMPUTE_DB=str(db))
    ask = ["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h"]
    proc = subprocess.run(
        [*ENTRY, *json_flag, *ask],
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=lambda: os.close(1),
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count(b"\n") == 1 and b"standard output is closed" in proc.stderr
    listed = subprocess.run(
        [*ENTRY, "--json", "list"], capture_output=True, env=env, check=True, text=True
    )
    assert listed.stdout.strip() == "[]"  # nothing was reserved


def test_a_table_sent_to_a_pipe_keeps_its_cells_whole(db_dir: Path) -> None:
    """rich takes 80 columns for output to no terminal: `usage` and `list` cut a long tenant
    name to `a-very-long-t…` in a file or a pipe, and a long message broke across lines. Without
    COLUMNS a pipe now gets render.console.PIPED_WIDTH; COLUMNS still decides when given."""
    db = init_db(db_dir / "p.db", "--demo")
    tenant = "a-very-long-tenant-name-for-a-team-" + "x" * 20
    reserve = ["reserve", "--tenant", tenant, "--gpus", "2", "--for", "2h"]
    for args in (["tenant", "create", tenant], reserve):
        subprocess.run([*ENTRY, "--now", NOW, *args], capture_output=True, env=_env(db), check=True)
    piped = subprocess.run([*ENTRY, "--now", NOW, "list"], capture_output=True, env=_env(db))
    assert piped.returncode == 0, piped.stderr
    assert tenant in piped.stdout.decode()
    narrow = subprocess.run(
        [*ENTRY, "--now", NOW, "list"], capture_output=True, env=_env(db, COLUMNS="80")
    )
    assert tenant not in narrow.stdout.decode()
    assert max(len(line) for line in narrow.stdout.decode().splitlines()) <= 80


def _env(db: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env.update(BETTER_COMPUTE_DB=str(db), **extra)
    return env


def test_output_lost_after_a_committed_write_says_the_changes_stand(db_dir: Path) -> None:
    """`reserve > /dev/full` committed the reservation and then said only "could not write the
    output": a CI job that runs it again books twice. The one line now says it committed; a
    read that fails the same way says nothing of the kind."""
    db = init_db(db_dir / "w.db", "--demo")
    ask = ["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h"]
    with open("/dev/full", "wb") as full:
        wrote = subprocess.run([*ENTRY, *ask], stdout=full, stderr=subprocess.PIPE, env=_env(db))
        read = subprocess.run([*ENTRY, "list"], stdout=full, stderr=subprocess.PIPE, env=_env(db))
    assert wrote.returncode == read.returncode == 7, (wrote.stderr, read.stderr)
    assert wrote.stderr.count(b"\n") == 1 and b"were committed" in wrote.stderr
    assert b"committed" not in read.stderr
    listed = subprocess.run(
        [*ENTRY, "--json", "list"], capture_output=True, env=_env(db), check=True, text=True
    )
    assert len(json.loads(listed.stdout)) == 1  # it was booked, once


@pytest.mark.parametrize(
    "args", [["inventory", "import", "-"], ["simulate", "--workload", "-", "--format", "jsonl"]]
)
def test_a_closed_standard_input_is_bad_input_not_a_bug(db_dir: Path, args: list[str]) -> None:
    """`inventory import - <&-` was INTERNAL ('NoneType' object has no attribute 'buffer')."""
    db = init_db(db_dir / "i.db", "--demo")
    proc = subprocess.run(
        [*ENTRY, *args], capture_output=True, env=_env(db), preexec_fn=lambda: os.close(0)
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count(b"\n") == 1 and b"standard input is closed" in proc.stderr


@pytest.mark.parametrize("how", ["closed", "full"])
def test_an_error_with_nowhere_to_say_it_still_exits_with_its_code(db_dir: Path, how: str) -> None:
    """`get rsv_nope 2>&-` exited 1 (INTERNAL: writing the message failed), not 3 (NOT_FOUND)."""
    db = init_db(db_dir / "e.db", "--demo")
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [*ENTRY, "get", "rsv_nope"],
            stdout=subprocess.PIPE,
            stderr=full,
            env=_env(db),
            preexec_fn=(lambda: os.close(2)) if how == "closed" else None,
        )
    assert proc.returncode == 3


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_output_in_an_encoding_without_dashes_is_escaped_not_a_crash(
    db_dir: Path, encoding: str
) -> None:
    """PYTHONIOENCODING=latin-1: `list` was INTERNAL on the dash of its window column, and
    `--help` printed a traceback. What the encoding lacks is written as a JSON escape, so JSON
    stays valid and loses nothing."""
    db = init_db(db_dir / "enc.db", "--demo")
    env = _env(db, PYTHONIOENCODING=encoding)
    ask = ["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--name", "café ☕ 😀"]
    made = subprocess.run([*ENTRY, "--json", *ask], capture_output=True, env=env)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout.decode(encoding))["name"] == "café ☕ 😀"  # intact
    for args in (["list"], ["get", "--help"], ["events"]):
        proc = subprocess.run([*ENTRY, *args], capture_output=True, env=env)
        assert proc.returncode == 0 and proc.stderr == b"", (args, proc.stderr)
        assert b"\\u2013" in proc.stdout or args != ["list"]


def test_an_in_memory_database_is_refused_and_a_file_of_that_name_works(db_dir: Path) -> None:
    """`--db :memory:` left a file named ':memory:' that no command could open (each opened
    SQLite's in-memory database instead: UNAVAILABLE, 'could not switch to WAL mode')."""
    env = _env(db_dir / "unused.db", BETTER_COMPUTE_NOW=NOW)
    refused = subprocess.run(
        [*ENTRY, "--db", ":memory:", "init"], capture_output=True, env=env, cwd=db_dir
    )
    assert refused.returncode == 2 and b"in memory" in refused.stderr
    assert not (db_dir / ":memory:").exists()
    for args in (["init"], ["list"]):
        proc = subprocess.run(
            [*ENTRY, "--db", "./:memory:", *args], capture_output=True, env=env, cwd=db_dir
        )
        assert proc.returncode == 0, proc.stderr
    assert (db_dir / ":memory:").is_file()


def test_a_terminal_gone_after_a_committed_write_says_the_changes_stand(db_dir: Path) -> None:
    """An ssh session dropped as `reserve` printed (EIO on a pty whose other end is closed):
    INTERNAL, 'Exception ignored', exit 120, though the reservation was committed."""
    db = init_db(db_dir / "pty.db", "--demo")
    leader, follower = pty.openpty()
    ask = ["--json", "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h"]
    proc = subprocess.Popen([*ENTRY, *ask], stdout=follower, stderr=subprocess.PIPE, env=_env(db))
    os.close(follower)
    os.close(leader)
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 7, err
    assert err.count(b"\n") == 1 and b"were committed" in err
    listed = subprocess.run(
        [*ENTRY, "--json", "list"], capture_output=True, env=_env(db), check=True, text=True
    )
    assert len(json.loads(listed.stdout)) == 1


def test_a_standard_output_open_for_reading_is_refused_before_anything_is_done(
    db_dir: Path,
) -> None:
    """`reserve 1</dev/null` committed, then failed to print (EBADF): INTERNAL, exit 120."""
    db = init_db(db_dir / "ro.db", "--demo")
    ask = ["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h"]
    with open(os.devnull, "rb") as readable_only:
        proc = subprocess.run(
            [*ENTRY, *ask], stdout=readable_only, stderr=subprocess.PIPE, env=_env(db)
        )
    assert proc.returncode == 2 and b"not open for writing" in proc.stderr
    listed = subprocess.run(
        [*ENTRY, "--json", "list"], capture_output=True, env=_env(db), check=True, text=True
    )
    assert listed.stdout.strip() == "[]"


def test_a_standard_input_not_open_for_reading_is_bad_input(db_dir: Path) -> None:
    db = init_db(db_dir / "wo.db", "--demo")
    with open(os.devnull, "wb") as writable_only:
        proc = subprocess.run(
            [*ENTRY, "inventory", "import", "-"],
            stdin=writable_only,
            capture_output=True,
            env=_env(db),
        )
    assert proc.returncode == 2 and b"cannot be read" in proc.stderr


def test_python_dash_m_runs_the_command(db_dir: Path, tmp_path: Path) -> None:
    """`python -m better_compute` is the `better-compute` command (a virtualenv not activated):
    the same version, the same program name in its help and errors, the same exit codes."""
    env = _env(db_dir / "m.db")
    entry = [sys.executable, "-m", "better_compute"]
    done = subprocess.run([*entry, "--version"], capture_output=True, text=True, env=env)
    installed = version("better-compute")  # the metadata pyproject.toml gave the install
    assert (done.returncode, done.stdout) == (0, f"better-compute {installed}\n"), done
    assert installed == better_compute.__version__
    # A source tree whose version moved since the install (a bump not reinstalled, a checkout
    # run through PYTHONPATH) tells the version of the code it runs, not the metadata's.
    bare = tmp_path / "tree"
    shutil.copytree(
        Path(better_compute.__file__).parent,
        bare / "better_compute",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    init = bare / "better_compute" / "__init__.py"
    init.write_text(init.read_text().replace(f'"{installed}"', '"9.8.7"'))
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from better_compute.cli import main; sys.exit(main())",
         "--version"],
        capture_output=True, text=True, env={**env, "PYTHONPATH": str(bare)}, cwd=bare,
    )  # fmt: skip
    assert done.stdout == "better-compute 9.8.7\n", done
    done = subprocess.run([*entry, "nosuch"], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "see `better-compute --help`" in done.stderr, done
    done = subprocess.run([*entry, "--json", "pool", "list"], capture_output=True, env=env)
    assert done.returncode == 7 and b"run `better-compute init` first" in done.stderr, done


def test_version_to_a_reader_gone_or_a_full_disk_ends_as_every_command_does(
    db_dir: Path,
) -> None:
    """`--version | (exec 0<&-; …)` ended with status 120 and Python's 'Exception ignored …
    BrokenPipeError' (its line was written at exit); `> /dev/full` the same with ENOSPC."""
    env = _env(db_dir / "unused.db")
    proc = subprocess.Popen(
        [*ENTRY, "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    assert proc.wait(timeout=60) == 141 and proc.stderr.read() == b""
    with open("/dev/full", "wb") as full:
        done = subprocess.run([*ENTRY, "--version"], stdout=full, stderr=subprocess.PIPE, env=env)
    assert done.returncode == 7 and done.stderr.count(b"\n") == 1, done.stderr
    with open("/dev/full", "wb") as full:
        args = [*ENTRY, "--json", "--version"]
        done = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, env=env)
    assert done.returncode == 7
    assert json.loads(done.stderr)["error"]["code"] == "UNAVAILABLE"  # JSON, as --json asks
