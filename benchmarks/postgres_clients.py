"""N `reserve` processes at once on one PostgreSQL ledger: exits, wall times, double bookings.

Not part of the test suite (tests/test_postgres_concurrency.py asserts the same facts). Needs a
server; the ledger goes into a fresh schema of the database the URL names:

    python benchmarks/postgres_clients.py postgresql://me@127.0.0.1/db [--clients 16 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter

import psycopg

ENTRY = [sys.executable, "-c", "from better_compute.cli import main; main()"]
NOW = "2026-09-28T08:00:00Z"


def request(i: int) -> list[str]:
    tenant = ("acme", "globex")[i % 2]
    return [
        ["--tenant", tenant, "--gpus", "4", "--for", "2h"],
        ["--tenant", tenant, "--gpus", "8", "--gang", "2", "--for", "1h"],
        ["--tenant", tenant, "--gpus", "2", "--spot", "--for", "3h"],
        ["--tenant", tenant, "--gpus", "6", "--for", "90m"],
    ][i % 4]


def one_round(base: str, clients: int) -> None:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base else "?"
    url = f"{base}{sep}options=-csearch_path%3D{schema}"
    subprocess.run(
        [*ENTRY, "--db", url, "--now", NOW, "init", "--demo"], check=True, capture_output=True
    )
    started = time.perf_counter()
    procs = [
        (
            time.perf_counter(),
            subprocess.Popen(
                [*ENTRY, "--db", url, "--json", "reserve", *request(i)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for i in range(clients)
    ]
    exits: Counter[str] = Counter()
    walls = []
    for t0, proc in procs:
        out, err = proc.communicate()
        walls.append(time.perf_counter() - t0)
        code = proc.returncode
        what = json.loads(out)["state"] if code == 0 else json.loads(err)["error"]["code"]
        exits[f"{code} {what}"] += 1
    total = time.perf_counter() - started
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT COUNT(*) FROM bookings a JOIN bookings b ON a.node_id = b.node_id"
            ' AND a.atom = b.atom AND a.id < b.id AND a."end" > b.start AND b."end" > a.start'
        ).fetchone()
        doubles = found[0] if found is not None else 0
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    print(
        f"| {clients} | {total:.1f} | {statistics.median(walls):.2f} | {max(walls):.2f} |"
        f" {', '.join(f'{k}: {v}' for k, v in sorted(exits.items()))} | {doubles} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    opts = parser.parse_args()
    print("| clients | all done s | median process s | slowest s | exits | double-booked |")
    print("|---:|---:|---:|---:|---|---:|")
    for n in opts.clients:
        one_round(opts.url, n)


if __name__ == "__main__":
    main()
