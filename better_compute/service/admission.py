"""Admission: the draft a request is judged as, policies (§6) and quota (§6)."""

from __future__ import annotations

from dataclasses import dataclass

from better_compute.errors import Forbidden, QuotaExceeded
from better_compute.model import JsonValue, Principal, Reservation
from better_compute.storage import fleet, repo
from better_compute.storage.repo import Conn


@dataclass(frozen=True)
class Draft:
    """What policies see: the whole request, a gang counted as all of its GPUs."""

    tenant_id: str
    pool_id: str
    gpu_count: int
    gang_size: int
    spot: bool
    duration_ms: int
    start: int | None

    def as_json(self) -> dict[str, JsonValue]:
        return {
            "tenantId": self.tenant_id,
            "poolId": self.pool_id,
            "gpuCount": self.gpu_count,
            "gangSize": self.gang_size,
            "spot": self.spot,
            "durationMs": self.duration_ms,
            "start": self.start,
        }


def draft_of(rsv: Reservation) -> Draft:
    """A reservation's shape as a new request's draft: what `update` and `extend` are judged as,
    so that a change cannot get what the request itself would be refused."""
    return Draft(
        tenant_id=rsv.tenant_id,
        pool_id=rsv.pool_id,
        gpu_count=rsv.quota_charge,
        gang_size=rsv.gang_size or 1,
        spot=rsv.spot,
        duration_ms=rsv.duration_ms,
        start=rsv.start,
    )


def check_policy(conn: Conn, who: Principal, draft: Draft) -> None:
    """An admin is never refused; in a tenant with policies, a principal without one is."""
    if who.admin:
        return
    name = who.name
    rows = repo.policies(conn, draft.tenant_id)
    if not rows:
        return
    mine = next((r for r in rows if r.principal == name), None)
    whom = f"principal {name!r} in tenant {draft.tenant_id!r}"
    if mine is None:
        raise Forbidden(f"{whom} has no policy; ask an admin for `policy set`")
    if mine.deny:
        raise Forbidden(f"policy deny: {whom} may not reserve")
    if mine.spot_only and not draft.spot:
        raise Forbidden(f"policy spot-only: {whom} may reserve only with --spot")
    if mine.max_gpus is not None and draft.gpu_count > mine.max_gpus:
        raise Forbidden(
            f"policy max-gpus {mine.max_gpus}: {whom} may not reserve {draft.gpu_count} GPUs"
            + (f" (a gang of {draft.gang_size})" if draft.gang_size > 1 else "")
        )


def check_quota(conn: Conn, tenant: str, pool_id: str, pool_name: str, charge: int) -> None:
    """Every cap that applies (this pool's and the tenant-wide one) must hold the new charge."""
    for cap_pool, cap in repo.quota_caps(conn, tenant, pool_id):
        held = fleet.held_charge(conn, tenant, cap_pool)
        if held + charge > cap:
            where = f"pool {pool_name}" if cap_pool else "all pools"
            raise QuotaExceeded(
                f"tenant {tenant!r} holds {held} of its {cap}-GPU quota in {where};"
                f" this request needs {charge} more"
            )
