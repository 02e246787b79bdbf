"""Shell completion for bash, zsh and fish (issue 12), and that it costs normal runs nothing."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Cli
from test_speed import _loaded_after, small_ledger  # noqa: F401  (a fixture)

from better_compute.cli import main


def complete(db: Path, words: str, shell: str = "bash") -> list[str]:
    """What the installed script would get back for the command line `words` (cursor at end):
    the real entry point, in this process, with the variables the script sets."""
    env = {"BETTER_COMPUTE_DB": str(db), "_BETTER_COMPUTE_COMPLETE": f"complete_{shell}"}
    line = f"better-compute {words}"
    if shell == "bash":
        env |= {"COMP_WORDS": line, "COMP_CWORD": str(len(line.split(" ")) - 1)}
    else:
        env |= {"_TYPER_COMPLETE_ARGS": line, "_TYPER_COMPLETE_FISH_ACTION": "get-args"}
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.setattr(sys, "argv", ["better-compute"])
        mp.setattr(sys, "stdout", out)
        mp.setattr(sys, "stderr", err)
        with pytest.raises(SystemExit) as done:
            main()
    assert done.value.code == 0 and err.getvalue() == ""
    return out.getvalue().split()


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_script_for_each_shell(run: Cli, shell: str) -> None:
    code, text, err = run("completion", shell, json=False)
    assert code == 0 and err == ""
    assert "_BETTER_COMPUTE_COMPLETE" in text and "better-compute" in text
    assert run.ok("completion", shell) == {"shell": shell, "script": text.strip()}


def test_an_unknown_shell_is_refused(run: Cli) -> None:
    assert "bash, zsh, fish" in run.fails(2, "completion", "tcsh")["message"]


@pytest.mark.sqlite_only(reason="the shell's completion subprocess is given the ledger's file path")
def test_commands_flags_and_values_complete(run: Cli) -> None:
    mine = run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")
    theirs = run.ok("--as", "alice", "reserve", "--tenant", "globex", "--gpus", "1", "--for", "1h")
    gone = run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")
    run.ok("cancel", gone["id"])
    db = run.db
    assert complete(db, "ca") == ["cancel"]
    assert {"launch", "update", "completion"} <= set(complete(db, ""))
    assert complete(db, "reserve --topology") == ["--topology", "--topology-key"]
    assert complete(db, "quota set --gpu") == ["--gpus", "--gpu-hours"]
    assert complete(db, "reserve --tenant ") == ["acme", "globex"]
    assert complete(db, "list --pool ") == ["west"]
    assert complete(db, "launch x --node west-0") == [f"west-0{i}" for i in range(1, 8)]
    assert complete(db, "launch x --format ") == ["env", "hostfile", "torchrun", "json"]
    assert complete(db, "list --sort s") == ["start"]
    # your own live reservations only: not alice's, not a released one
    assert complete(db, "cancel ") == [mine["id"]]
    assert complete(db, "events --reservation rsv_") == [mine["id"]]
    assert theirs["id"] not in complete(db, "get ")
    assert complete(db, "node add ") == []  # a new node's name is yours to choose
    assert complete(db, "reserve --tenant ", "zsh")[0].startswith("_arguments")
    assert complete(db, "cancel ", "fish") == [mine["id"]]


@pytest.mark.sqlite_only(reason="the shell's completion subprocess is given the ledger's file path")
def test_ids_of_a_tenant_no_longer_visible_are_not_offered(run: Cli) -> None:
    """bob's reservation for globex is NOT_FOUND to bob once his policy there is gone; completion
    went on offering its id, confirming it exists."""
    run.ok("policy", "set", "--tenant", "globex", "--principal", "bob")
    theirs = run.ok("--as", "bob", "reserve", "--tenant", "globex", "--gpus", "1", "--for", "1h")
    as_bob = f"--as bob get {theirs['id'][:4]}"
    assert complete(run.db, as_bob) == [theirs["id"]]
    run.ok("policy", "set", "--tenant", "globex", "--principal", "carol")
    run.ok("policy", "delete", "--tenant", "globex", "--principal", "bob")
    assert run.fails(3, "--as", "bob", "get", theirs["id"])["code"] == "NOT_FOUND"
    assert complete(run.db, as_bob) == []


def test_a_missing_ledger_completes_commands_and_no_values(tmp_path: Path) -> None:
    assert complete(tmp_path / "none.db", "get ") == []
    assert complete(tmp_path / "none.db", "tic") == ["tick"]
    assert not (tmp_path / "none.db").exists()


def test_normal_runs_load_no_completion_code(small_ledger: Path, tmp_path: Path) -> None:  # noqa: F811
    # (typer itself imports its completion classes and shellingham whatever we do)
    completion = ("better_compute.cli.completion_commands", "better_compute.service.completing")
    for argv in (["--version"], ["--db", str(small_ledger), "list", "--json"]):
        loaded = _loaded_after(argv, tmp_path)
        assert not [m for m in loaded if m.startswith(completion)], argv


@pytest.mark.sqlite_only(reason="the shell's completion subprocess is given the ledger's file path")
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_bash_script_completes_in_bash(run: Cli) -> None:
    """End to end: bash sources the printed script and asks it, as a user's Tab would."""
    mine = run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")
    script = run("completion", "bash", json=False)[1]
    entry = Path(sys.executable).parent / "better-compute"
    if not entry.exists():
        pytest.skip("needs the installed command")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env["PATH"] = f"{entry.parent}{os.pathsep}{env.get('PATH', '')}"
    env["BETTER_COMPUTE_DB"] = str(run.db)
    ask = (
        script
        + "\nCOMP_WORDS=(better-compute cancel ''); COMP_CWORD=2"
        + '\n_better_compute_completion better-compute; echo "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", ask], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [mine["id"]]
