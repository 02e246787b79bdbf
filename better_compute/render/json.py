"""The stable --json documents (PRODUCT.md §7). Key order is fixed here; output is byte-stable."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from json.encoder import encode_basestring
from typing import TYPE_CHECKING

from better_compute.model import Event, JsonValue, LedgerCopy, Node, NodePlan, Policy, Reservation

if TYPE_CHECKING:  # types only: rendering a reservation must not load every use case
    from better_compute.engine.search import Ask
    from better_compute.service.accounting import UsageWindow
    from better_compute.service.booking import Preview
    from better_compute.service.views import Assignment, Bucket, Rollup, Timeline

if TYPE_CHECKING:  # types only: the listing's rows
    from better_compute.storage.listing import ListedReservation

if TYPE_CHECKING:  # simulate's modules are imported only by the command that runs it
    from better_compute.service.simulate import Report


def dumps(doc: JsonValue) -> str:
    return json.dumps(doc, ensure_ascii=False)


def array(docs: Iterable[JsonValue]) -> str:
    """dumps(list(docs)), byte for byte, encoding each document as it comes (a long listing
    then never holds every document at once)."""
    return "[" + ", ".join(map(dumps, docs)) + "]"


def reservations(pages: Iterable[Sequence[Reservation | ListedReservation]]) -> list[str]:
    """`list --json`: dumps([reservation(r) for every r]) cut into one piece per page, to be
    written in order (byte for byte the whole document; joining them would hold it twice). Each
    reservation is encoded as it comes; a listed row (storage/listing.py) straight to its text."""
    return texts(", ".join(map(_text, page)) for page in pages if page)


def pieces(pages: Iterable[Iterable[JsonValue]]) -> list[str]:
    """dumps of every document of every page, as one array cut into a piece per page (see
    reservations): `events --json`."""
    return texts(", ".join(map(dumps, page)) for page in pages)


def texts(encoded: Iterable[str]) -> list[str]:
    """One JSON array from pages already encoded (each its documents joined by ", ")."""
    out, sep = ["["], ""
    for text in encoded:
        if text:
            out.append(sep + text)
            sep = ", "
    out.append("]")
    return out


def _text(r: Reservation | ListedReservation) -> str:
    return dumps(reservation(r)) if isinstance(r, Reservation) else listed(r)


_str = encode_basestring  # json.dumps of a str with ensure_ascii=False, in C


def _opt_str(v: str | None) -> str:
    return "null" if v is None else _str(v)


def _opt_int(v: int | None) -> str:
    return "null" if v is None else str(v)


def listed(r: ListedReservation) -> str:
    """dumps(reservation(rsv)) of the reservation a listed row is, byte for byte, written
    straight from the row's values (a listing has thousands; tests compare the two)."""
    models = r.models
    model = "null" if not models else _str(models[0]) if len(models) == 1 else dumps(list(models))
    gang = (
        f'{{"size": {r.gang_size}, "topologyKey": {_opt_str(r.topology_key)}}}'
        if r.gang_size
        else "null"
    )
    during = (
        "null"
        if r.during_start is None
        else f'{{"start": {r.during_start}, "end": {r.during_end}}}'
    )
    conditions = (
        dumps([{"type": c.type, "reason": c.reason, "message": c.message} for c in r.conditions])
        if r.conditions
        else "[]"
    )
    allocations = ", ".join(
        f'{{"id": {_str(i)}, "nodeId": {_str(n)}, "atoms": {atoms},'
        f' "bound": {"true" if bound else "false"}}}'
        for i, n, atoms, bound in r.allocations
    )
    labels = dumps(dict(r.labels)) if r.labels else "{}"
    return (
        f'{{"id": {_str(r.id)}, "tenantId": {_str(r.tenant_id)}, "poolId": {_str(r.pool_id)},'
        f' "state": {_str(r.state)}, "devices": [{{"class": "gpu", "count": {_opt_int(r.gpus)},'
        f' "model": {model}, "topology": {_opt_str(r.topology)}}}], "gang": {gang},'
        f' "spot": {"true" if r.spot else "false"}, "binding": {_str(r.binding)},'
        f' "durationMs": {r.duration_ms}, "start": {_opt_int(r.start)}, "during": {during},'
        f' "conditions": {conditions}, "allocations": [{allocations}],'
        f' "quotaCharge": {r.quota_charge}, "idempotencyKey": {_opt_str(r.idempotency_key)},'
        f' "releaseReason": {_opt_str(r.release_reason)}, "createdAt": {r.created_at},'
        f' "nextAttemptAt": {_opt_int(r.next_attempt_at)}, "name": {_opt_str(r.name)},'
        f' "labels": {labels}, "seriesId": {_opt_str(r.series_id)}}}'
    )


def reservation(rsv: Reservation) -> dict[str, JsonValue]:
    model: JsonValue = None
    if len(rsv.models) == 1:
        model = rsv.models[0]
    elif rsv.models:
        model = list(rsv.models)
    doc: dict[str, JsonValue] = {
        "id": rsv.id,
        "tenantId": rsv.tenant_id,
        "poolId": rsv.pool_id,
        "state": rsv.state.value,
        "devices": [{"class": "gpu", "count": rsv.gpus, "model": model, "topology": rsv.topology}],
        "gang": (
            {"size": rsv.gang_size, "topologyKey": rsv.topology_key} if rsv.gang_size else None
        ),
        "spot": rsv.spot,
        "binding": rsv.binding.value,
        "durationMs": rsv.duration_ms,
        "start": rsv.start,
        "during": {"start": rsv.during.start, "end": rsv.during.end} if rsv.during else None,
        "conditions": [
            {"type": c.type, "reason": c.reason, "message": c.message} for c in rsv.conditions
        ],
        "allocations": [
            {"id": a.id, "nodeId": a.node_id, "atoms": list(a.atoms), "bound": a.bound}
            for a in rsv.allocations
        ],
        "quotaCharge": rsv.quota_charge,
        "idempotencyKey": rsv.idempotency_key,
        "releaseReason": rsv.release_reason.value if rsv.release_reason else None,
        "createdAt": rsv.created_at,
        "nextAttemptAt": rsv.next_attempt_at,
        "name": rsv.name,
        "labels": dict(rsv.labels),
        "seriesId": rsv.series_id,  # a recurring reservation's occurrences share it (issue 10)
    }
    return doc


def event(ev: Event) -> dict[str, JsonValue]:
    doc: dict[str, JsonValue] = {
        "seq": ev.seq,
        "type": ev.type,
        "at": ev.at,
        "tenantId": ev.tenant_id,
        "reservationId": ev.reservation_id,
        "actor": ev.actor,
        "data": ev.data,
    }
    if ev.acting_admin is not None:
        doc["actingAdmin"] = ev.acting_admin
    return doc


def candidate(plan: NodePlan) -> dict[str, JsonValue]:
    return {"node": plan.node_id, "score": plan.score, "atoms": list(plan.atoms)}


def preview(p: Preview) -> dict[str, JsonValue]:
    return {
        "fits": p.fits,
        "candidates": [candidate(c) for c in p.candidates],
        "reason": p.reason,
        "preemptible": (
            {"reservations": p.preemptible[0], "startsAt": p.preemptible[1]}
            if p.preemptible
            else None
        ),
        "window": {"start": p.window.start, "end": p.window.end},
        "search": None if p.searched is None else _searched(p.searched),
    }


def _searched(a: Ask) -> dict[str, JsonValue]:
    """What a `--start-range` preview searched: starts and lengths, after now and the policy."""
    return {
        "startRange": {"from": a.first, "to": a.last},
        "durationRange": {"min": a.min_ms, "max": a.max_ms},
    }


def pool(r: Rollup) -> dict[str, JsonValue]:
    return {
        "id": r.pool_id,
        "name": r.name,
        "allocatable": r.allocatable,
        "inUse": r.in_use,
        "reserved": r.reserved,
        "free": r.free,
        "labels": dict(r.labels),
        "nodes": r.nodes,
        "gpus": r.gpus,
    }


def node(n: Node) -> dict[str, JsonValue]:
    return {
        "name": n.name,
        "poolId": n.pool_id,
        "labels": dict(n.all_labels()),
        "schedulable": n.schedulable,
        "cordonReason": n.cordon_reason,
        "reachable": n.reachable,
        "gpus": [
            {
                "index": a.index,
                "model": a.model,
                "nvlinkGroup": a.nvlink_group,
                "fabric": (
                    {"cluster": a.fabric_cluster, "clique": a.fabric_clique}
                    if a.fabric_cluster is not None
                    else None
                ),
                "health": "healthy" if a.healthy else "quarantined",
                "healthReason": a.health_reason,
            }
            for a in n.atoms
        ],
    }


def assignment(a: Assignment) -> dict[str, JsonValue]:
    return {
        "reservationId": a.reservation_id,
        "tenantId": a.tenant_id,
        "allocationId": a.allocation_id,
        "atoms": list(a.atoms),
        "state": a.state,
        "start": a.start,
        "end": a.end,
        "bound": a.bound,
    }


def timeline(t: Timeline) -> dict[str, JsonValue]:
    return {
        "poolId": t.pool_id,
        "allocatable": t.allocatable,
        "buckets": [_bucket(b) for b in t.buckets],
    }


def _bucket(b: Bucket) -> dict[str, JsonValue]:
    """The seed's bucket; with `timeline --tenant`, also that tenant's own booked GPUs."""
    doc: dict[str, JsonValue] = {"start": b.start, "end": b.end, "booked": b.booked, "free": b.free}
    if b.tenant_booked is not None:
        doc["tenantBooked"] = b.tenant_booked
    return doc


def usage(u: UsageWindow) -> dict[str, JsonValue]:
    return {
        "meter": u.meter,
        "tenantId": u.tenant_id,
        "reservationId": u.reservation_id,
        "allocationId": u.allocation_id,
        "start": u.start,
        "end": u.end,
        "quantity": u.quantity,
    }


def policy(p: Policy) -> dict[str, JsonValue]:
    return {
        "tenantId": p.tenant_id,
        "principal": p.principal,
        "maxGpus": p.max_gpus,
        "spotOnly": p.spot_only,
        "deny": p.deny,
    }


def ledger_copy(c: LedgerCopy) -> dict[str, JsonValue]:
    return {
        "path": c.path,
        "bytes": c.bytes,
        "schemaVersion": c.schema_version,
        "dbId": c.db_id,
        "reservations": c.reservations,
        "events": c.events,
    }


def simulation(r: Report) -> dict[str, JsonValue]:
    """`simulate --json` (PRODUCT.md §7): only wallSeconds and requestsPerSecond depend on the
    machine."""
    return {
        "requests": r.requests,
        "placedAtOnce": r.placed_at_once,
        "placedAfterWaiting": r.placed_after_waiting,
        "neverPlaced": r.never_placed,
        "skipped": r.skipped,
        "preemptions": {"cutBack": r.cut_back, "requeued": r.requeued},
        "waitMs": {"mean": r.wait_mean_ms, "p95": r.wait_p95_ms},
        "gpuHoursBooked": r.gpu_hours_booked,
        "gpuHoursUsed": r.gpu_hours_used,
        "utilisation": [
            {"start": u.start, "end": u.end, "booked": u.booked, "allocatable": u.allocatable}
            for u in r.utilisation
        ],
        "wallSeconds": r.wall_seconds,
        "requestsPerSecond": r.requests_per_second,
    }
