"""Meters, usage windows and principals' policies (PRODUCT.md §6, §8)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from better_compute.errors import Conflict, InvalidInput, NotFound
from better_compute.inventory import MAX_INT, normal_model
from better_compute.model import Policy
from better_compute.service import authz, fanout
from better_compute.service.authz import require_admin
from better_compute.service.context import Ctx
from better_compute.storage import repo
from better_compute.storage.conn import Row

HOUR_MS = 3_600_000
METER_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")


def meter_create(ctx: Ctx, name: str) -> str:
    """A meter named as usage names them (service/metering.meter_name). Its name is taken in
    lower case, as a model's is everywhere (inventory.normal_model): `gpu.V100M16.hours` is the
    meter that openb's V100M16 GPUs bill, gpu.v100m16.hours. Returns the name it was created as."""
    require_admin(ctx.who, "create meters")
    if not name.isascii() or not METER_RE.fullmatch(normal_model(name)):
        raise InvalidInput(
            f"meter {name!r} must be letters, digits, '.', '_' or '-' (up to 128, taken in"
            " lower case), like gpu.h100.hours"
        )
    name = normal_model(name)
    with ctx.write() as conn:
        if repo.meter_exists(conn, name):
            raise Conflict(f"meter {name!r} already exists")
        repo.insert_meter(conn, name)
        ctx.event("meter.created", None, None, {"meter": name, "by": ctx.principal})
    return name


def meter_list(ctx: Ctx) -> list[str]:
    with ctx.db.read() as conn:
        return repo.meter_names(conn)


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
        tenants = [tenant] if tenant is not None else seen
        rows = repo.usage_rows(conn, dead_letter=dead_letter, tenants=tenants, start=start, end=end)
    return [w for w in (_counted(r, start, end, ctx.now) for r in rows) if w is not None]


def _counted(r: Row, start: int | None, end: int | None, now: int) -> UsageWindow | None:
    """One window as of `now`, counted only inside [start, end); None when it began after now,
    or when a period was asked and the window holds nothing of it.

    As of an earlier `--now` (a read may ask any instant, PRODUCT.md §2), a window closed after
    it was still open then. An open window counts up to now, never past its reservation's end:
    a tick may not have closed it yet."""
    if r["start"] > now:
        return None
    closed = r["end"] is not None and r["end"] <= now
    lo = r["start"] if start is None else max(r["start"], start)
    hi = r["end"] if closed else max(r["start"], min(now, r["during_end"] or now))
    hi = hi if end is None else min(hi, end)
    if (start is not None or end is not None) and hi <= lo:
        return None
    # The row's [start, end) is what it counts: cut to --to, else the window's own end (None
    # while it is open, counted up to now).
    shown_end = end if end is not None and hi == end else r["end"] if closed else None
    return UsageWindow(
        r["meter"],
        r["tenant_id"],
        r["reservation_id"],
        r["allocation_id"],
        r["node_id"],
        r["gpus"],
        lo,
        shown_end,
        round(r["gpus"] * max(0, hi - lo) / HOUR_MS, 6),
    )


def policy_set(
    ctx: Ctx, tenant: str, principal: str, max_gpus: int | None, spot_only: bool, deny: bool
) -> Policy:
    require_admin(ctx.who, "set policies")
    if max_gpus is not None and not 0 <= max_gpus <= MAX_INT:
        raise InvalidInput(f"--max-gpus must be from 0 to {MAX_INT}, got {max_gpus}")
    authz.principal_name(principal, "--principal")
    with ctx.write() as conn:
        repo.require_tenant(conn, tenant)
        asked = Policy(tenant, principal, max_gpus, spot_only, deny)
        if asked in repo.policies(conn, tenant):
            return asked  # already so: nothing is written, no event (README, design notes)
        fanout.fan_out_in(ctx, conn, tick=False)
        repo.set_policy(conn, asked)
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
        if tenant is not None:
            repo.require_tenant(conn, tenant)
        return repo.policies(conn, tenant)


def policy_delete(ctx: Ctx, tenant: str, principal: str) -> None:
    require_admin(ctx.who, "delete policies")
    with ctx.write() as conn:
        fanout.fan_out_in(ctx, conn, tick=False)
        if not repo.delete_policy(conn, tenant, principal):
            raise NotFound(f"no policy for principal {principal!r} in tenant {tenant!r}")
        ctx.event("policy.deleted", tenant, None, {"principal": principal, "by": ctx.principal})
