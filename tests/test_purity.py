"""The engine and the lifecycle are pure, and the clock is read in one place only.

ARCHITECTURE.md "Rules worth keeping" 1 and PRODUCT.md §2: `engine/` and `lifecycle/` take `now`
and data as values (no I/O, no clock, no global random, no storage or service layer), and nothing
but `better_compute/clock.py` reads the system clock.
"""

from __future__ import annotations

import ast
import io
import itertools
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "better_compute"
PURE_DIRS = ("engine", "lifecycle")

FORBIDDEN_MODULES = (
    "sqlite3",
    "sqlite_utils",
    "rich",
    "typer",
    "click",
    "time",
    "random",
    "secrets",
    "os",
    "pathlib",
    "shutil",
    "io",
    "socket",
    "subprocess",
    "threading",
    "urllib",
    "http",
    "better_compute.storage",
    "better_compute.service",
    "better_compute.cli",
    "better_compute.clock",
    "better_compute.render",
)
#: Dotted call suffixes that read the clock or touch files.
FORBIDDEN_CALLS = (
    "datetime.now",
    "datetime.utcnow",
    "datetime.today",
    "date.today",
    "time.time",
    "time.time_ns",
    "time.monotonic",
    "time.perf_counter",
)
FORBIDDEN_NAMES = ("open", "__import__", "input", "print")
CLOCK_TEXT = ("time.time", "datetime.now", "time_ns", "utcnow", "date.today", "monotonic")


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(current: str, is_package: bool, module: str | None, level: int) -> str:
    """The absolute module of `from <level dots><module> import …` inside `current`."""
    if level == 0:
        return module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _forbidden_module(name: str) -> str | None:
    for bad in FORBIDDEN_MODULES:
        if name == bad or name.startswith(bad + "."):
            return bad
    return None


def impurities(source: str, module: str, is_package: bool = False) -> list[str]:
    """Every forbidden import or call in one file, as `line: what` strings."""
    found: list[str] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _forbidden_module(alias.name):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.module, node.level)
            for alias in node.names:
                for name in (base, f"{base}.{alias.name}"):
                    if _forbidden_module(name):
                        found.append(f"{node.lineno}: from {base} import {alias.name}")
                        break
        elif isinstance(node, ast.Call):
            dotted = _dotted(node.func)
            if dotted is None:
                continue
            if dotted in FORBIDDEN_NAMES:
                found.append(f"{node.lineno}: call {dotted}(")
            for bad in FORBIDDEN_CALLS:
                if dotted == bad or dotted.endswith("." + bad):
                    found.append(f"{node.lineno}: call {dotted}(")
            if dotted in ("importlib.import_module", "import_module"):
                found.append(f"{node.lineno}: call {dotted}(")
    return found


def _pure_files() -> list[Path]:
    files = sorted(p for d in PURE_DIRS for p in (PACKAGE / d).rglob("*.py"))
    assert files, f"no Python files under {PACKAGE}/{{{','.join(PURE_DIRS)}}}"
    return files


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_engine_and_lifecycle_are_pure(path: Path) -> None:
    found = impurities(path.read_text(), _module_of(path), path.name == "__init__.py")
    assert not found, f"{path.relative_to(PACKAGE.parent)} is not pure:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import sqlite3",
        "import os.path",
        "from time import monotonic",
        "import random as r",
        "from pathlib import Path",
        "from better_compute.storage import repo",
        "from better_compute import service",
        "from ..storage.db import open_database",
        "from .. import cli",
        "import better_compute.service.booking",
        "import subprocess",
        "import socket",
        "import typer",
        "from rich.console import Console",
        "import sqlite_utils",
        "from datetime import datetime\nx = datetime.now()",
        "import datetime\nx = datetime.datetime.utcnow()",
        "from datetime import date\nx = date.today()",
        "x = time.time()",
        "f = open('x')",
    ],
)
def test_the_checker_catches_impurity(source: str) -> None:
    """The walker is not vacuous: every forbidden form in a pure module is reported."""
    assert impurities(source, "better_compute.engine.place"), source


def test_the_checker_allows_pure_code() -> None:
    source = (
        "from __future__ import annotations\n"
        "from collections.abc import Sequence\n"
        "from dataclasses import replace\n"
        "from better_compute.model import Window\n"
        "from .atoms import pick_atoms\n"
        "def f(now: int) -> int:\n    return now + 1\n"
    )
    assert impurities(source, "better_compute.engine.place") == []


def _code_text(source: str) -> str:
    """The source without comments and string literals (docstrings may talk about the clock)."""
    kept = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            continue
        kept.append(tok.string)
    return " ".join(kept).replace(" . ", ".")


def _clock_readers(source: str) -> list[str]:
    found = [text for text in CLOCK_TEXT if text in _code_text(source)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module in ("time", "datetime"):
            for alias in node.names:
                if alias.name in ("time", "time_ns", "monotonic", "perf_counter", "clock_gettime"):
                    found.append(f"from {node.module} import {alias.name}")
        if isinstance(node, ast.Attribute) and node.attr in ("now", "utcnow", "today", "time_ns"):
            base = _dotted(node.value)
            if base is not None and base.split(".")[-1] in ("datetime", "date", "time"):
                found.append(f"{base}.{node.attr}")
    return sorted(set(found))


def test_only_clock_module_reads_the_clock() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "clock.py":
            continue
        found = _clock_readers(path.read_text())
        if found:
            offenders[str(path.relative_to(PACKAGE.parent))] = found
    assert not offenders, f"the system clock is read outside better_compute/clock.py: {offenders}"


def test_clock_module_is_the_reader() -> None:
    """The check above would pass vacuously if the clock were read nowhere; it is read here."""
    assert _clock_readers((PACKAGE / "clock.py").read_text())


def test_the_clock_grep_sees_through_spacing() -> None:
    assert _clock_readers("import time\nx = time . time_ns()")
    assert _clock_readers("from datetime import datetime as d\nx = datetime.now()")
    assert not _clock_readers('"""Nothing calls datetime.now() here."""\n# nor time.time()\n')


# ---------------------------------------------------------------- no import cycles


def _modules() -> dict[str, Path]:
    return {_module_of(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(source: str, module: str, is_package: bool, known: set[str]) -> dict[str, int]:
    """Modules of ours that `module` imports, anywhere in it (a function-level import too) -> line.

    `from X import n` imports X and, when n is a submodule, X.n as well. A module's own ancestor
    packages are left out: Python imports them before the module anyway, so naming them (as
    cli/backup_commands.py does to order the commands) adds no dependency.
    """
    parts = module.split(".")
    ancestors = {".".join(parts[:i]) for i in range(1, len(parts))}
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.module, node.level)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for target in targets:
            if target in known and target != module and target not in ancestors:
                found.setdefault(target, node.lineno)
    return found


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """Module -> {imported module of ours -> line}, from (source, is_package) per module."""
    known = set(sources)
    return {m: imported_modules(src, m, pkg, known) for m, (src, pkg) in sorted(sources.items())}


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle per back edge found by a depth-first walk, as [a, b, ..., a]; [] when acyclic."""
    cycles: list[list[str]] = []
    state: dict[str, str] = {}  # "open" while on the walk's path, "done" once fully explored
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, {})):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return cycles


def test_no_import_cycles() -> None:
    """No module of better_compute imports itself back through others, lazily or not.

    A function-level import counts: it only postpones the cycle to the first call, and it hides
    which module belongs below which. There are no exceptions; when two modules need each other,
    what both need moves into a module below them (engine/fit.py under place.py and gang.py,
    storage/create.py beside db.py).
    """
    modules = _modules()
    graph = import_graph({m: (p.read_text(), p.name == "__init__.py") for m, p in modules.items()})
    described = [
        " -> ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle))
        + f" -> {cycle[-1]}"
        for cycle in import_cycles(graph)
    ]
    assert not described, "import cycles:\n" + "\n".join(described)


def test_the_cycle_check_sees_lazy_and_relative_imports() -> None:
    """The check is not vacuous: a cycle closed by a function-level or relative import is found."""
    sources = {
        "better_compute.engine": ("", True),
        "better_compute.engine.a": ("from better_compute.engine.b import f\n", False),
        "better_compute.engine.b": ("def f():\n    from . import a\n    return a\n", False),
        "better_compute.engine.c": ("import better_compute.engine.a\n", False),
    }
    graph = import_graph(sources)
    assert graph["better_compute.engine.b"] == {"better_compute.engine.a": 2}
    assert import_cycles(graph) == [
        ["better_compute.engine.a", "better_compute.engine.b", "better_compute.engine.a"]
    ]
    del sources["better_compute.engine.b"]
    assert import_cycles(import_graph(sources)) == []


# ---------------------------------------------------------------- storage owns the SQL

#: Layers that reach the database only through better_compute/storage (repo.py, ledger.py).
NO_SQL_DIRS = ("service", "cli", "render", "engine", "lifecycle")
SQL_CALLS = ("execute", "executemany", "executescript")


def sql_calls(source: str) -> list[str]:
    """Every `<anything>.execute(` (or executemany, executescript) call, as `line: call`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SQL_CALLS
        ):
            found.append(f"{node.lineno}: {_dotted(node.func) or node.func.attr}(")
    return found


def _no_sql_files() -> list[Path]:
    files = sorted(p for d in NO_SQL_DIRS for p in (PACKAGE / d).rglob("*.py"))
    assert files, f"no Python files under {PACKAGE}/{{{','.join(NO_SQL_DIRS)}}}"
    return files


@pytest.mark.parametrize("path", _no_sql_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_storage_runs_sql(path: Path) -> None:
    """Use cases, commands, output and the engine call named storage functions, never SQL.

    No module is exempt: when a use case needs a new query, it becomes a repo.py function.
    """
    found = sql_calls(path.read_text())
    assert not found, f"{path.relative_to(PACKAGE.parent)} runs SQL itself:\n" + "\n".join(found)


def test_the_sql_check_catches_execute() -> None:
    assert sql_calls("conn.execute('SELECT 1')")
    assert sql_calls("x = ctx.db.conn.execute('SELECT 1').fetchone()")
    assert sql_calls("cur.executemany('INSERT', rows)")
    assert sql_calls("def f(c):\n    return c().executescript('x')")
    assert not sql_calls("repo.insert_meter(conn, name)\n# conn.execute( in a comment\n")
