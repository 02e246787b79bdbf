"""Frozen values shared by every layer. The engine and lifecycle see only these types.

Times are epoch milliseconds (int); durations are milliseconds (int).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

_V = TypeVar("_V")
_FIELDS: dict[type, frozenset[str]] = {}


def evolve(value: _V, **changes: Any) -> _V:
    """`dataclasses.replace` for a dataclass whose `__init__` only assigns its fields: a copy of
    the instance's attributes with `changes` set, without calling `__init__` again. A replay
    moves reservations some 60,000 times, and on Reservation's 30 fields replace costs 5.5 µs
    where this costs 0.9. A name that is not a field raises TypeError, as replace does; a class
    with `__post_init__` or `__slots__` is refused, since copying attributes would skip or miss
    what its `__init__` does. (mypy checks replace's values against the fields, not these:
    tests/test_model.py holds evolve equal to replace.)"""
    cls = type(value)
    names = _FIELDS.get(cls)
    if names is None:
        if hasattr(cls, "__post_init__") or not hasattr(value, "__dict__"):
            raise TypeError(f"evolve cannot copy a {cls.__name__}: use dataclasses.replace")
        names = _FIELDS[cls] = frozenset(f.name for f in fields(value))  # type: ignore[arg-type]
    if not names.issuperset(changes):
        raise TypeError(f"{cls.__name__} has no field {', '.join(sorted(set(changes) - names))}")
    copy: _V = object.__new__(cls)
    copy.__dict__.update(value.__dict__, **changes)
    return copy


JsonScalar = str | int | float | bool | None
JsonValue = JsonScalar | list["JsonValue"] | dict[str, "JsonValue"]

FABRIC_DOMAIN = "fabric.domain"
#: A name people type for a pool, a node, a tenant: one word of at most 63 characters.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
NVLINK_ALL = "nvlink-all"


class State(StrEnum):
    PENDING = "pending"
    PLACED = "placed"
    BINDING = "binding"
    ACTIVE = "active"
    RELEASED = "released"


#: States whose bookings hold atoms ("live" reservations).
LIVE_STATES = (State.PLACED, State.BINDING, State.ACTIVE)


class ReleaseReason(StrEnum):
    EXPIRED = "expired"
    RELEASED = "released"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    TIMEOUT = "timeout"  # waited pending.maxWaitMs without being placed


class Binding(StrEnum):
    DEVICE = "device"
    NODE = "node"


@dataclass(frozen=True)
class Window:
    """A half-open interval [start, end) in epoch ms."""

    start: int
    end: int

    def overlaps(self, other: Window) -> bool:
        return self.start < other.end and other.start < self.end

    @property
    def duration(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Atom:
    """One whole GPU of a node."""

    index: int
    model: str
    nvlink_group: int = 0
    fabric_cluster: str | None = None
    fabric_clique: int | None = None
    healthy: bool = True
    health_reason: str | None = None


@dataclass(frozen=True)
class Node:
    name: str
    pool_id: str
    atoms: tuple[Atom, ...]
    labels: tuple[tuple[str, str], ...] = ()
    schedulable: bool = True
    reachable: bool = True
    cordon_reason: str | None = None

    def label(self, key: str) -> str | None:
        """A label value; `fabric.domain` is derived from the GPUs when all of them agree."""
        if key == FABRIC_DOMAIN:
            return fabric_domain(self.atoms)
        return label_value(self.labels, key)

    def all_labels(self) -> tuple[tuple[str, str], ...]:
        derived = fabric_domain(self.atoms)
        extra = ((FABRIC_DOMAIN, derived),) if derived is not None else ()
        return tuple(sorted(self.labels + extra))


def label_value(labels: tuple[tuple[str, str], ...], key: str) -> str | None:
    """An operator label's value (Node.label without the derived fabric.domain)."""
    for k, v in labels:
        if k == key:
            return v
    return None


def fabric_domain(atoms: tuple[Atom, ...]) -> str | None:
    return fabric_domain_of({(a.fabric_cluster, a.fabric_clique) for a in atoms})


def fabric_domain_of(keys: set[tuple[str | None, int | None]]) -> str | None:
    """The fabric.domain of GPUs with these distinct (fabric cluster, clique) pairs: defined
    when they all share one, both parts set."""
    if len(keys) != 1:
        return None
    cluster, clique = next(iter(keys))
    if cluster is None or clique is None:
        return None
    return f"{cluster}.{clique}"


@dataclass(frozen=True)
class Maintenance:
    """A node blocked for a window (node cordon --from --until)."""

    id: int
    node_id: str
    window: Window
    reason: str | None = None


@dataclass(frozen=True)
class Request:
    """What placement is asked for: one node's share, optionally times a gang."""

    window: Window
    gpus: int | None  # per node; None only for a node lease without --gpus
    models: tuple[str, ...] = ()  # accepted models; empty = any
    topology: str | None = None  # "nvlink-all" or None
    gang_size: int | None = None
    topology_key: str | None = None
    spot: bool = False
    node_lease: bool = False
    #: A node lease takes no node with more GPUs than this: what it was admitted for per member
    #: (quota and policy judged it at the pool's largest node then). None: any size.
    lease_most: int | None = None


#: A booking's spot flag as planning reads it (storage/repo.PREEMPTIBLE): regular work, spot
#: work, or spot work already under a preemption notice.
REGULAR, SPOT, UNDER_NOTICE = 0, 1, 2


def frees(spot: int, live: bool, start: int, window: Window) -> bool:
    """Whether preempting may free a booking for `window`: a live spot reservation's; one under
    notice only where the booking starts after the window's start, which is never before now:
    it has not started, so it would lose a booking it has not begun (a requeue, as
    service/preemption._give_notice decides from the same start). One that starts at the
    window's start may have started already (a zero notice: the window starts now), and
    cutting it back sooner than the deadline it was told would break that notice (a review:
    after `capacity.spotNoticeMs` was lowered, a victim told "by 00:10" was cut back to 00:01
    by a second preemption)."""
    return live and (spot == SPOT or (spot == UNDER_NOTICE and start > window.start))


@dataclass(frozen=True)
class NodeSnapshot:
    """One node as the engine sees it for one window.

    `busy` holds every atom booked by someone in the window; `spot_holders` says, for atoms booked
    only by live spot reservations, which reservations hold them (used by preemption).
    `blocked` is the reason (a maintenance window) the node can't be used in the window, if any.
    """

    node: Node
    busy: frozenset[int] = frozenset()
    spot_holders: tuple[tuple[int, tuple[str, ...]], ...] = ()
    blocked: str | None = None


@dataclass(frozen=True)
class NodePlan:
    node_id: str
    atoms: tuple[int, ...]
    score: int


@dataclass(frozen=True)
class Plan:
    """A placement: one member per node (a gang has several). `victims` only for preemption."""

    members: tuple[NodePlan, ...]
    score: int
    group: str | None = None
    victims: tuple[str, ...] = ()


@dataclass(frozen=True)
class NoFit:
    reason: str


@dataclass(frozen=True)
class Condition:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Allocation:
    id: str
    reservation_id: str
    node_id: str
    atoms: tuple[int, ...]
    bound: bool = False


@dataclass(frozen=True)
class Reservation:
    id: str
    seq: int
    tenant_id: str
    pool_id: str
    state: State
    gpus: int | None
    models: tuple[str, ...]
    topology: str | None
    gang_size: int | None
    topology_key: str | None
    spot: bool
    binding: Binding
    duration_ms: int
    start: int | None
    during: Window | None
    conditions: tuple[Condition, ...]
    quota_charge: int
    idempotency_key: str | None
    release_reason: ReleaseReason | None
    created_at: int
    next_attempt_at: int | None
    principal: str = "admin"
    series_id: str | None = None
    lead_checked: bool = False
    start_checked: bool = False
    preempt_deadline: int | None = None
    preempted_by: str | None = None
    allocations: tuple[Allocation, ...] = field(default=())
    #: What people find it by (issue 12): a free-text name and key=value labels.
    name: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    #: A placed node lease being moved by BookingRepair, which has set its allocations aside:
    #: the largest node it held (lease_most). Never stored.
    lease_cap: int | None = None

    @property
    def node_lease(self) -> bool:
        return self.binding == Binding.NODE

    def lease_most(self) -> int | None:
        """The most GPUs a node this lease takes may have, so it never holds more than quota
        and policy admitted: the largest node it holds once placed (a gang may span sizes),
        else its charge per member, the pool's largest node at admission. None: not a lease,
        or a draft not charged yet (advice)."""
        if not self.node_lease:
            return None
        if self.lease_cap is not None:
            return self.lease_cap
        if self.allocations:
            return max(len(a.atoms) for a in self.allocations)
        return self.quota_charge // (self.gang_size or 1) if self.quota_charge > 0 else None

    def request(self, window: Window) -> Request:
        return Request(
            window=window,
            gpus=self.gpus,
            models=self.models,
            topology=self.topology,
            gang_size=self.gang_size,
            topology_key=self.topology_key,
            spot=self.spot,
            node_lease=self.node_lease,
            lease_most=self.lease_most(),
        )


@dataclass(frozen=True)
class Event:
    seq: int
    type: str
    at: int
    tenant_id: str | None
    reservation_id: str | None
    data: dict[str, JsonValue]
    #: Who caused it: a principal, or `system` for the lifecycle's own work (PRODUCT.md §7).
    actor: str = "system"
    #: The admin behind `--as` when an admin acted as someone.
    acting_admin: str | None = None


SYSTEM = "system"

#: Every type of event the log holds (PRODUCT.md §8): what `webhook add --events` may name, so a
#: misspelt type is refused rather than a webhook that never fires. tests/test_user_text.py
#: fails when the code writes a type this list lacks.
EVENT_TYPES = frozenset(
    {
        "admin.added",
        "admin.removed",
        "config.set",
        "device.quarantined",
        "device.restored",
        "inventory.imported",
        "meter.created",
        "node.added",
        "node.cordoned",
        "node.labelled",
        "node.maintenance",
        "node.reachable",
        "node.uncordoned",
        "node.unreachable",
        "policy.deleted",
        "policy.set",
        "pool.created",
        "pool.policy.cleared",
        "pool.policy.set",
        "pool.updated",
        "quota.set",
        "reservation.active",
        "reservation.binding",
        "reservation.created",
        "reservation.expiring",
        "reservation.extended",
        "reservation.pending",
        "reservation.placed",
        "reservation.preempted",
        "reservation.preempting",
        "reservation.released",
        "reservation.repaired",
        "reservation.starting",
        "reservation.updated",
        "tenant.created",
        "webhook.added",
        "webhook.deleted",
    }
)

#: Joins a series' key and an occurrence's number (KEY#1); no new key a user gives contains it.
SERIES_MARK = "#"


@dataclass(frozen=True)
class Principal:
    """Who is acting: resolved once per command (service/authz.py)."""

    name: str
    admin: bool
    #: The admin behind `--as`, recorded on every event it causes; None when acting as oneself.
    acting_admin: str | None = None


@dataclass(frozen=True)
class Settings:
    """Engine settings (PRODUCT.md §10)."""

    spot_notice_ms: int = 120_000
    top_n: int = 3
    max_attempts: int = 3
    retry_ms: int = 30_000
    repair_lead_ms: int = 900_000
    timeline_max_buckets: int = 336
    auto_bind: bool = True
    busy_timeout_ms: int = 30_000
    pending_max_wait_ms: int = 604_800_000  # 7 days, then a pending reservation times out
    inventory_max_bytes: int = 268_435_456  # 256 MiB: the most `inventory import` reads
    notice_expiring_ms: int = 2_400_000  # reservation.expiring this long before the end
    webhook_timeout_ms: int = 5_000  # one POST's wait for an answer
    webhook_retry_for_ms: int = 86_400_000  # retries span this long, then dead-letter
    webhook_budget_ms: int = 10_000  # what one tick may spend delivering


@dataclass(frozen=True)
class LedgerCopy:
    """What a backup or restore copied."""

    path: str
    bytes: int
    schema_version: int
    db_id: str
    reservations: int
    events: int


@dataclass(frozen=True)
class CalendarPolicy:
    """A pool's limits on calendar requests (PRODUCT.md §5.6; the calendar-mode seed's limits).

    None means no limit. Durations and lead times are in ms; `sizes` are the allowed total GPU
    counts of one request (per-node GPUs times the gang size); `commit`: once placed, a calendar
    reservation can no longer be cancelled, extended, shortened or released early.
    """

    pool_id: str
    min_duration_ms: int | None = None
    max_duration_ms: int | None = None
    min_lead_ms: int | None = None
    max_horizon_ms: int | None = None
    sizes: tuple[int, ...] = ()
    commit: bool = False

    def limits(self) -> dict[str, JsonValue]:
        """The limits as JSON: `pool policy show` answers them, `pool.policy.set` records them."""
        return {
            "minDurationMs": self.min_duration_ms,
            "maxDurationMs": self.max_duration_ms,
            "minLeadMs": self.min_lead_ms,
            "maxHorizonMs": self.max_horizon_ms,
            "sizes": list(self.sizes),
            "commit": self.commit,
        }


@dataclass(frozen=True)
class Policy:
    """What one principal may reserve in one tenant (PRODUCT.md §6)."""

    tenant_id: str
    principal: str
    max_gpus: int | None
    spot_only: bool
    deny: bool


@dataclass(frozen=True)
class Webhook:
    """Where a tenant's events are POSTed, signed with `secret` (PRODUCT.md §4 Running)."""

    id: str
    tenant_id: str  # a tenant, or "*" for every event (admins only)
    url: str
    events: tuple[str, ...]  # types or "ns.*" patterns; empty means every type
    secret: str
    created_at: int
    created_by: str
    cursor: int  # the last event seq already queued for it
    #: Its creator may no longer see its events (service/fanout.receiving): it sends nothing.
    suspended: bool = False

    @property
    def fingerprint(self) -> str:
        """What is shown instead of the secret after `webhook add`: enough to tell two apart."""
        return "sha256:" + hashlib.sha256(self.secret.encode()).hexdigest()[:16]

    def wants(self, event: Event) -> bool:
        """Its tenant's events only ('*': all), of the types it asked for."""
        if self.tenant_id != "*" and event.tenant_id != self.tenant_id:
            return False
        return not self.events or any(
            t == event.type or (t.endswith(".*") and event.type.startswith(t[:-1]))
            for t in self.events
        )


@dataclass(frozen=True)
class DeliveryAttempt:
    n: int
    at: int
    status: int | None
    error: str | None


@dataclass(frozen=True)
class Delivery:
    """One event to one webhook, with every attempt so far."""

    id: str
    webhook_id: str
    event_seq: int
    state: str  # queued | delivered | dead
    attempts: int
    queued_at: int
    next_at: int
    event_type: str
    history: tuple[DeliveryAttempt, ...] = ()
    #: Queued behind the head of its webhook's queue: the head's event seq (only the head is
    #: ever sent, docs/webhooks.md "Order"); None for the head and for what is not queued.
    behind: int | None = None
