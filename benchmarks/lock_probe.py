"""Run `better-compute ARGS...` and record how long it waited for, and held, SQLite's write lock.

    BC_LOCK_PROBE=/tmp/out.json python benchmarks/lock_probe.py --db X reserve ...

benchmarks/run.py starts 16 of these at once (issue 8 "Speed" item 5). The probe wraps the two
places where better_compute.storage.db.Database takes and gives back the write lock:

- `_begin("BEGIN IMMEDIATE")`: the time inside it is the wait for the write lock (SQLite's busy
  handler sleeping and retrying until the writer ahead commits, as the user experiences it);
- `_commit()`: the time from BEGIN IMMEDIATE returning to COMMIT returning is the hold.

It writes `{"waits_ms": [...], "holds_ms": [...], "run_ms": ...}` to $BC_LOCK_PROBE at exit, one
entry per write transaction (a `reserve` has one). Nothing in the product changes: the probe only
times the calls, then runs the real CLI entry point (better_compute.cli:main) with the same argv.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

from better_compute.storage import db as _db

_started = time.perf_counter()
_waits: list[float] = []
_holds: list[float] = []
_held_since: list[float] = []
_begin, _commit = _db.Database._begin, _db.Database._commit


def _timed_begin(self: _db.Database, statement: str) -> None:
    t0 = time.perf_counter()
    _begin(self, statement)
    if statement == "BEGIN IMMEDIATE":
        now = time.perf_counter()
        _waits.append((now - t0) * 1000)
        _held_since.append(now)


def _timed_commit(self: _db.Database) -> None:
    try:
        _commit(self)
    finally:
        if _held_since:
            _holds.append((time.perf_counter() - _held_since.pop()) * 1000)


def _report() -> None:
    out = os.environ.get("BC_LOCK_PROBE")
    if out:
        doc = {
            "waits_ms": _waits,
            "holds_ms": _holds,
            "run_ms": (time.perf_counter() - _started) * 1000,
        }
        with open(out, "w") as fh:
            json.dump(doc, fh)


_db.Database._begin = _timed_begin  # type: ignore[method-assign]
_db.Database._commit = _timed_commit  # type: ignore[method-assign]
atexit.register(_report)

if __name__ == "__main__":
    from better_compute.cli import main

    sys.argv = ["better-compute", *sys.argv[1:]]
    main()
