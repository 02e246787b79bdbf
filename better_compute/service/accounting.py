"""Meters, usage windows and principals' policies (PRODUCT.md §6, §8)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from better_compute.errors import Conflict, InvalidInput, NotFound
from better_compute.inventory import MAX_INT
from better_compute.service import authz
from better_compute.service.authz import require_admin
from better_compute.service.context import Ctx
from better_compute.storage import repo

HOUR_MS = 3_600_000
METER_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")


def meter_create(ctx: Ctx, name: str) -> None:
    require_admin(ctx.who, "create meters")
    if not METER_RE.fullmatch(name):
        raise InvalidInput(
            f"meter {name!r} must be lowercase letters, digits, '.', '_' or '-',"
            " like gpu.h100.hours"
        )
    with ctx.write() as conn:
        if conn.execute("SELECT 1 FROM meters WHERE name = ?", (name,)).fetchone():
            raise Conflict(f"meter {name!r} already exists")
        conn.execute(
            "INSERT INTO meters(name, seq) VALUES (?, ?)", (name, repo.next_seq(conn, "meters"))
        )
        ctx.event("meter.created", None, None, {"meter": name, "by": ctx.principal})


def meter_list(ctx: Ctx) -> list[str]:
    with ctx.db.read() as conn:
        return [str(r[0]) for r in conn.execute("SELECT name FROM meters ORDER BY name")]


@dataclass(frozen=True)
class UsageWindow:
    meter: str
    tenant_id: str
    reservation_id: str
    allocation_id: str
    node_id: str
    gpus: int
    start: int
    end: int | None
    quantity: float  # GPU-hours, counted up to now for an open window


def usage(
    ctx: Ctx, tenant: str | None, start: int | None, end: int | None, dead_letter: bool
) -> list[UsageWindow]:
    """Windows overlapping [start, end), each counted only inside it; dead letters: no meter."""
    if start is not None and end is not None and end <= start:
        raise InvalidInput("--to must be after --from")
    with ctx.db.read() as conn:
        if tenant is not None:
            repo.require_tenant(conn, tenant)
            authz.require_tenant(conn, ctx.who, tenant)
        seen = authz.visible_tenants(conn, ctx.who)
        # The reservation's end caps an open window: a tick may not have closed it yet.
        sql = "SELECT u.*, r.during_end, a.node_id FROM usage u"
        sql += " JOIN reservations r ON r.id = u.reservation_id"
        sql += " JOIN allocations a ON a.id = u.allocation_id"
        sql += " WHERE "
        sql += "NOT EXISTS" if dead_letter else "EXISTS"
        sql += " (SELECT 1 FROM meters m WHERE m.name = u.meter)"
        args: list[object] = []
        if tenant is not None:
            sql += " AND u.tenant_id = ?"
            args.append(tenant)
        elif seen is not None:
            sql += f" AND u.tenant_id IN ({','.join('?' * len(seen))})"
            args.extend(seen)
        if end is not None:
            sql += " AND u.start < ?"
            args.append(end)
        if start is not None:
            sql += " AND (u.end IS NULL OR u.end > ?)"
            args.append(start)
        rows = conn.execute(sql + " ORDER BY u.start, u.id", args).fetchall()
    windows = []
    for r in rows:
        lo = max(r["start"], start) if start is not None else r["start"]
        open_until = max(r["start"], min(ctx.now, r["during_end"] or ctx.now))
        hi_raw = r["end"] if r["end"] is not None else open_until
        hi = min(hi_raw, end) if end is not None else hi_raw
        quantity = round(r["gpus"] * max(0, hi - lo) / HOUR_MS, 6)
        windows.append(
            UsageWindow(
                r["meter"],
                r["tenant_id"],
                r["reservation_id"],
                r["allocation_id"],
                r["node_id"],
                r["gpus"],
                lo,
                r["end"] if r["end"] is None or end is None else min(r["end"], end),
                quantity,
            )
        )
    return windows


@dataclass(frozen=True)
class Policy:
    tenant_id: str
    principal: str
    max_gpus: int | None
    spot_only: bool
    deny: bool


def policy_set(
    ctx: Ctx, tenant: str, principal: str, max_gpus: int | None, spot_only: bool, deny: bool
) -> Policy:
    require_admin(ctx.who, "set policies")
    if max_gpus is not None and not 0 <= max_gpus <= MAX_INT:
        raise InvalidInput(f"--max-gpus must be from 0 to {MAX_INT}, got {max_gpus}")
    if not principal.strip():
        raise InvalidInput("--principal must not be empty")
    with ctx.write() as conn:
        repo.require_tenant(conn, tenant)
        conn.execute(
            "INSERT OR REPLACE INTO policies(tenant_id, principal, max_gpus, spot_only, deny)"
            " VALUES (?, ?, ?, ?, ?)",
            (tenant, principal, max_gpus, int(spot_only), int(deny)),
        )
        ctx.event(
            "policy.set",
            tenant,
            None,
            {
                "principal": principal,
                "maxGpus": max_gpus,
                "spotOnly": spot_only,
                "deny": deny,
                "by": ctx.principal,
            },
        )
    return Policy(tenant, principal, max_gpus, spot_only, deny)


def policy_list(ctx: Ctx, tenant: str | None) -> list[Policy]:
    with ctx.db.read() as conn:
        sql, args = "SELECT * FROM policies", []  # type: str, list[object]
        if tenant is not None:
            repo.require_tenant(conn, tenant)
            sql += " WHERE tenant_id = ?"
            args.append(tenant)
        rows = conn.execute(sql + " ORDER BY tenant_id, principal", args)
        return [
            Policy(
                r["tenant_id"], r["principal"], r["max_gpus"], bool(r["spot_only"]), bool(r["deny"])
            )
            for r in rows
        ]


def policy_delete(ctx: Ctx, tenant: str, principal: str) -> None:
    require_admin(ctx.who, "delete policies")
    with ctx.write() as conn:
        gone = conn.execute(
            "DELETE FROM policies WHERE tenant_id = ? AND principal = ?", (tenant, principal)
        ).rowcount
        if not gone:
            raise NotFound(f"no policy for principal {principal!r} in tenant {tenant!r}")
        ctx.event("policy.deleted", tenant, None, {"principal": principal, "by": ctx.principal})
