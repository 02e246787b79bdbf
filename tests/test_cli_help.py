"""Every command and subcommand is documented, and `--help` works on each of them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from conftest import invoke

from better_compute.cli import app


def walk(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from walk(sub, (*path, name))


ROOT = typer.main.get_command(app)
COMMANDS = list(walk(ROOT))
PATHS = [path for path, _ in COMMANDS]


def test_the_tree_has_the_core_commands() -> None:
    names = {" ".join(p) for p in PATHS}
    for expected in (
        "init",
        "demo",
        "inventory import",
        "inventory export",
        "pool create",
        "pool list",
        "pool show",
        "node add",
        "node list",
        "node show",
        "node label",
        "node report-bound",
        "tenant create",
        "tenant list",
        "quota set",
        "quota show",
        "config get",
        "config set",
        "reserve",
        "preview",
        "get",
        "list",
        "cancel",
        "extend",
        "release",
        "tick",
        "timeline",
        "events",
    ):
        assert expected in names, expected


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "root")
def test_every_command_has_help_text(path: tuple[str, ...]) -> None:
    command = dict(COMMANDS)[path]
    text = (command.help or command.short_help or "").strip()
    assert text, f"{' '.join(path) or 'the root'} has no help text"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "root")
def test_help_exits_0(path: tuple[str, ...]) -> None:
    result = invoke([*path, "--help"])
    assert result.exit_code == 0, result.stderr
    assert "Usage" in result.stdout
    first_line = (dict(COMMANDS)[path].help or "").strip().splitlines()[0]
    assert first_line[:30] in " ".join(result.stdout.split())


def test_groups_list_their_subcommands_in_help() -> None:
    for path, command in COMMANDS:
        subs = getattr(command, "commands", None)
        if not subs:
            continue
        out = invoke([*path, "--help"]).stdout
        for name in subs:
            assert name in out, (path, name)


def test_every_leaf_command_but_demo_takes_json() -> None:
    for path, command in COMMANDS:
        if getattr(command, "commands", None) is not None or path == ("demo",):
            continue
        opts = {o for p in command.params for o in getattr(p, "opts", [])}
        assert "--json" in opts, path


def test_no_arguments_shows_help() -> None:
    result = invoke([])
    assert result.exit_code in (0, 2)
    assert "Usage" in result.stdout + result.stderr


# ---------------------------------------------------------------- issue 12: help quality

LEAVES = [path for path, command in COMMANDS if getattr(command, "commands", None) is None]


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_command_shows_an_example_and_no_switch_placeholder(path: tuple[str, ...]) -> None:
    result = invoke([*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    assert "Example: " in result.stdout, f"{' '.join(path)} --help has no example"
    assert "<bool>" not in result.stdout
    assert "{" + path[-1] not in result.stdout.split("Usage:")[1].splitlines()[0]


def test_every_example_names_a_command_and_parses() -> None:
    """The examples are commands that exist, with flags that exist and values of the right type
    (parsed by the real command, never run)."""
    import shlex

    from better_compute.cli.examples import EXAMPLES

    leaves = {" ".join(p): c for p, c in COMMANDS if getattr(c, "commands", None) is None}
    assert set(leaves) <= set(EXAMPLES), set(leaves) - set(EXAMPLES)
    assert set(EXAMPLES) <= set(leaves), set(EXAMPLES) - set(leaves)
    for path, line in EXAMPLES.items():
        words = shlex.split(line.replace("$(", "(").split(" > ")[0], comments=True)
        start = words.index("better-compute") + 1
        words = words[start:]
        while words[0].startswith("--"):  # global options and their values
            words = words[2:]
        assert " ".join(words[: len(path.split())]) == path, line
        args = words[len(path.split()) :]
        leaves[path].make_context(path, args)  # raises on an unknown flag or a bad value
