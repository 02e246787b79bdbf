"""Creating a fresh ledger file (init, init --force): built aside, then swapped in whole.

Kept apart from db.py because it builds on replace.py, which builds on db.Database: in db.py it
would make an import cycle.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from better_compute.errors import Conflict, InvalidInput
from better_compute.storage import files, replace
from better_compute.storage.conn import Commits, Ledger
from better_compute.storage.db import (
    Database,
    _configure,
    _header_kind,
    _migrate,
    _require_path,
    is_postgres_url,
    open_database,
    postgres,
)
from better_compute.storage.schema import APPLICATION_ID


def create_ledger(
    path: str,
    *,
    force: bool,
    seed_text: str,
    mode: int = 0o600,
    fill: Callable[[Any], None] | None = None,
) -> Ledger:
    """`init`: a new SQLite file (create_database), or a new ledger in a PostgreSQL database."""
    if is_postgres_url(path):
        return postgres().create_database(  # type: ignore[no-any-return]
            path.strip(), force=force, db_id=ledger_id(seed_text), fill=fill
        )
    return create_database(path, force=force, seed_text=seed_text, mode=mode, fill=fill)


def ledger_id(seed_text: str) -> str:
    """The database id seeds ids and the topN pick: copies of one database replay identically."""
    return hashlib.sha256(seed_text.encode()).hexdigest()[:16]


def create_database(
    path: str,
    *,
    force: bool,
    seed_text: str,
    mode: int = 0o600,
    fill: Callable[[Database], None] | None = None,
) -> Database:
    """Create a fresh database (file mode `mode`) and return it open. An existing one needs
    --force; a foreign file is never replaced. `fill` adds content (the demo inventory) before the
    new file takes the name, so a crash never leaves a half-filled ledger (see storage/replace.py).
    """
    _require_path(path)
    kind = _header_kind(Path(path))
    if kind == "foreign":
        raise InvalidInput(
            f"{path!r} exists and is not a better-compute database; not replacing it"
        )
    if kind == "ours" and not force:
        raise Conflict(
            f"{path!r} already holds a better-compute database; add --force to replace it"
        )
    target = files.real_target(path)
    if not target.parent.is_dir():
        raise InvalidInput(f"cannot create {path!r}: folder {str(target.parent)!r} does not exist")

    def build(db: Database) -> None:
        db.conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        _configure(db)
        _migrate(db)
        db_id = ledger_id(seed_text)
        with db.write():
            db.conn.execute("INSERT INTO meta(key, value) VALUES ('db_id', ?)", (db_id,))
        if fill is not None:
            fill(db)

    made = Commits.made
    with files.stopped_by_sigterm():
        try:
            temp = replace.build_temp(target, mode, build)
        except BaseException:  # its commits were to a file that never took the name: none stands
            Commits.made = made  # (cli/app.handled would say "some changes were committed")
            raise
        replace.swap_in(target, temp, replacing=kind == "ours")
    return open_database(path)
