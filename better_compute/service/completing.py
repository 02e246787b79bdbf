"""What shell completion offers for a value (issue 12): pools, nodes, tenants the principal may
act for, and the principal's own reservation ids. Loaded only while a shell asks for completions
(cli/completion_commands.py): a normal run never imports it."""

from __future__ import annotations

from better_compute.service import authz
from better_compute.service.context import open_ctx
from better_compute.storage import completing as store
from better_compute.storage import repo

KINDS = ("pool", "node", "tenant", "rsv")


def candidates(kind: str, db: str, me: str, as_name: str | None) -> list[str]:
    """Values of one kind from the ledger at `db`, as the principal may see them."""
    ctx = open_ctx(db, None, me, as_name)
    try:
        with ctx.db.read() as conn:
            if kind == "pool":
                return store.pool_names(conn)
            if kind == "node":
                return store.node_names(conn)
            if kind == "tenant":
                seen = authz.visible_tenants(conn, ctx.who)
                return sorted(seen) if seen is not None else repo.tenant_ids(conn)
            if kind == "rsv":
                seen = authz.visible_tenants(conn, ctx.who)
                return store.own_reservation_ids(conn, ctx.principal, seen)
            raise ValueError(f"no completion for {kind!r}")
    finally:
        ctx.db.close()
