"""What every use case runs with: the open database, the instant, who is acting, the settings."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from better_compute.model import JsonValue, Settings
from better_compute.storage import repo
from better_compute.storage.db import Database, open_database


@dataclass
class Ctx:
    db: Database
    now: int
    principal: str = "admin"

    @cached_property
    def settings(self) -> Settings:
        if self.db.conn.in_transaction:  # first read inside a write (tick --until's per-step Ctx)
            return repo.load_settings(self.db.conn)
        with self.db.read() as conn:
            return repo.load_settings(conn)

    def event(
        self,
        type_: str,
        tenant: str | None,
        rsv_id: str | None,
        data: dict[str, JsonValue],
        at: int | None = None,
    ) -> None:
        repo.append_event(self.db.conn, type_, self.now if at is None else at, tenant, rsv_id, data)

    def seed(self, *parts: object) -> int:
        """The topN pick's seed: from the database and the request, never the process."""
        text = ":".join([repo.db_id(self.db.conn), *map(str, parts)])
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8])


def open_ctx(path: str, now: int, principal: str) -> Ctx:
    db = open_database(path)
    ctx = Ctx(db, now, principal)
    db.set_busy_timeout(ctx.settings.busy_timeout_ms)
    return ctx
