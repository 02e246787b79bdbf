"""Issue 9: the PostgreSQL column of benchmarks/run.py's first table.

`run.py --postgres URL` copies the big pool into a fresh schema of that database with
`better-compute migrate --to`, then times the same commands on it, interleaved with SQLite's runs so
a change of load hits both alike. The server should be on this machine (a throwaway one:
`.ci/postgres-server start DIR PORT`), or the figures measure the network too.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

PREFIX = "postgres: "
SCHEMA = "bench_big"


def _url(base: str) -> str:
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{SCHEMA}"


def copy(base: str, big: Path) -> str:
    """A fresh PostgreSQL copy of the big pool; returns its URL."""
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
    url = _url(base)
    started = time.perf_counter()
    entry = [sys.executable, "-c", "from better_compute.cli import main; main()"]
    subprocess.run([*entry, "--db", str(big), "migrate", "--to", url], check=True)
    print(f"postgres: copied {big.name} in {time.perf_counter() - started:.0f} s")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")
    return url


def jobs(base: str, big: Path, commands: Callable[..., Mapping[str, Any]]) -> dict[str, Any]:
    import psycopg

    url = copy(base, big)
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT id FROM reservations ORDER BY seq LIMIT 1").fetchone()
    assert row is not None, "the copied pool holds reservations"
    return {PREFIX + name: job for name, job in commands(url, row[0]).items()}


def table(sqlite: Mapping[str, Any], postgres: Mapping[str, Any]) -> None:
    print("\n## The same commands on SQLite and PostgreSQL (a server on this machine)\n")
    print("| command | SQLite ms | PostgreSQL ms | ratio | SQLite peak MiB | PostgreSQL peak MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, fig in postgres.items():
        plain = name[len(PREFIX) :]
        lite = sqlite[plain]
        print(
            f"| `{plain}` | {lite.ms:.0f} | {fig.ms:.0f} | {fig.ms / lite.ms:.2f} |"
            f" {lite.rss_kb / 1024:.1f} | {fig.rss_kb / 1024:.1f} |"
        )
