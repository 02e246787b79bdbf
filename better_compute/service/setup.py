"""Setting up: the database, the inventory, pools, nodes, devices, tenants, quotas, settings."""

from __future__ import annotations

import codecs
import grp
import os
import re
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from better_compute.errors import Conflict, InvalidInput, NotFound
from better_compute.inventory import (
    MAX_INT,
    MODEL_RE,
    NAME_RE,
    Inventory,
    InventoryNode,
    InventoryPool,
    InventoryTenant,
    OpenbNodes,
    label_pairs,
    load_inventory_text,
    normal_model,
    nvlink_group_of,
    parse_openb_nodes,
)
from better_compute.model import (
    FABRIC_DOMAIN,
    Atom,
    JsonValue,
    Maintenance,
    Node,
    Principal,
    State,
    Window,
)
from better_compute.service import authz, backups, ticking
from better_compute.service.authz import require_admin
from better_compute.service.context import NO_NOW_ON_REAL_CLOCK, Ctx
from better_compute.service.finding import check_name
from better_compute.storage import bulk, fleet, ledger, repo
from better_compute.storage.conn import Ledger
from better_compute.storage.create import create_ledger
from better_compute.storage.db import is_postgres_url, principal_at
from better_compute.storage.repo import Conn
from better_compute.timeparse import iso

Labels = tuple[tuple[str, str], ...]


def init(
    path: str,
    now: int,
    force: bool,
    *,
    manual: bool,
    admin: str,
    group: str | None,
    fill: Inventory | None = None,
) -> tuple[Ledger, dict[str, int]]:
    """Create the ledger: on a manual clock when `init` was given --now, else on the real one;
    `admin` is its first admin. The file is private to its owner (0600), or shared read-write
    with one group: on SQLite the file's permissions are the security boundary.

    All of it (the clock, the admin, the `fill` inventory of `init --demo`) goes into the new file
    before it takes the ledger's name, so a kill or a full disk never leaves half a ledger.
    Returns the open ledger and what `fill` imported.
    """
    if group is not None and is_postgres_url(path):
        raise InvalidInput(
            "--group shares an SQLite file; on PostgreSQL the server decides who may connect:"
            " GRANT the role access instead (docs/postgres.md)"
        )
    gid = None if group is None else _group_id(group)
    counts: dict[str, int] = {}

    def build(db: Ledger) -> None:
        if gid is not None:
            os.chown(db.where, -1, gid)
        with db.write() as conn:
            ledger.start_ledger(conn, ledger.MANUAL if manual else ledger.REAL, now, admin)
        if fill is not None:
            who = Principal(admin, admin=True)
            counts.update(inventory_import(Ctx(db, now, who), fill))

    # The database id is derived from the creating instant alone: replaying `init --now T` and the
    # same commands anywhere gives identical ids, and copies of one database keep the same id.
    mode = 0o600 if gid is None else 0o660
    db = create_ledger(path, force=force, seed_text=str(now), mode=mode, fill=build)
    return db, counts


def init_admin(path: str, me: str, as_name: str | None, force: bool, manual: bool) -> str:
    """Who `init` makes the first admin: replacing a ledger is its admins' decision (without
    --force nothing is replaced: an existing ledger is a CONFLICT further on)."""
    me = authz.session_user(principal_at(path, me))  # on PostgreSQL, the session's role
    target = path if force else ""
    what = "replace the ledger (init --force)"
    pinned = None
    if manual:
        pinned = (
            f"{NO_NOW_ON_REAL_CLOCK}; to start a what-if ledger, `init --now` another --db, or"
            " remove this one first"
        )
    return backups.replacer(target, me, as_name, what, pinned_clock=pinned)


def _group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise InvalidInput(
            f"--group {name!r} is not a group on this host (see `getent group`)"
        ) from None


def parse_labels(pairs: Sequence[str], flag: str = "--label") -> Labels:
    """A pool's or node's `k=v` labels (inventory.label_pairs); fabric.domain is not one to set."""
    if any(pair.partition("=")[0] == FABRIC_DOMAIN for pair in pairs):
        raise InvalidInput(
            "fabric.domain is derived from the GPUs' fabric: set it with `node add --fabric` or"
            " a GPU's fabric in `inventory import`"
        )
    return label_pairs(pairs, flag, "rack=r1")


def _name(value: str, what: str) -> str:
    if not NAME_RE.fullmatch(value):
        raise InvalidInput(
            f"{what} {value!r} must be 1 to 63 letters, digits, '.', '_' or '-' starting with a"
            " letter or digit"
        )
    return value


# ---------------------------------------------------------------- pools


def _pool_name(name: str) -> str:
    """`--pool` takes an id or a name, so a name may not look like an id."""
    if name.startswith("pool_"):
        raise InvalidInput(f"pool name {name!r} may not start with pool_ (that is how ids look)")
    return _name(name, "pool name")


def pool_create(ctx: Ctx, name: str, labels: Labels) -> str:
    require_admin(ctx.who, "create pools")
    _pool_name(name)
    with ctx.write() as conn:
        if repo.pool_name_taken(conn, name):
            raise Conflict(f"pool {name!r} already exists")
        return _new_pool(ctx, conn, name, labels)


def _new_pool(ctx: Ctx, conn: Conn, name: str, labels: Labels) -> str:
    """A pool, logged as `pool.created` (by `pool create` and by an import that names it)."""
    pool_id = repo.insert_pool(conn, name, labels)
    ctx.event("pool.created", None, None, {"poolId": pool_id, "name": name})
    return pool_id


def pool_set_auto_bind(ctx: Ctx, ref: str, auto_bind: bool | None) -> None:
    require_admin(ctx.who, "change pool settings")
    with ctx.write() as conn:
        pool = repo.find_pool(conn, ref)
        stored = pool["auto_bind"]
        if (None if stored is None else bool(stored)) == auto_bind:
            return  # already so: nothing is written, no event (README, design notes)
        repo.set_pool_auto_bind(conn, pool["id"], auto_bind)
        ctx.event(
            "pool.updated",
            None,
            None,
            {"poolId": pool["id"], "autoBind": auto_bind, "by": ctx.principal},
        )


# ---------------------------------------------------------------- nodes


def _atoms(node: InventoryNode) -> list[Atom]:
    return [
        Atom(
            index=i,
            model=node.model,
            nvlink_group=nvlink_group_of(i, node.gpus, node.nvlink_groups),
            fabric_cluster=node.fabric_cluster,
            fabric_clique=node.fabric_clique,
        )
        for i in range(node.gpus)
    ]


def parse_fabric(text: str | None) -> tuple[str | None, int | None]:
    if text is None:
        return None, None
    cluster, sep, clique = text.rpartition(".")
    if not sep or not cluster or not _digits(clique) or int(clique) > MAX_INT:
        raise InvalidInput(
            f"--fabric {text!r} must look like CLUSTER.CLIQUE with a clique from 0 to {MAX_INT},"
            " such as c1.3"
        )
    return _name(cluster, "fabric cluster"), int(clique)


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '²' and other scripts' digits."""
    return text.isascii() and text.isdigit() and len(text) <= 100


def node_spec(
    name: str, gpus: int, model: str, labels: Labels, nvlink_groups: int, fabric: str | None
) -> InventoryNode:
    _name(name, "node name")
    if not 1 <= gpus <= 64:
        raise InvalidInput(f"--gpus must be from 1 to 64, got {gpus}")
    model = normal_model(model)
    if not MODEL_RE.fullmatch(model):
        raise InvalidInput(f"--model {model!r} must be letters, digits, '.', '_' or '-'")
    if nvlink_groups < 1 or gpus % nvlink_groups:
        raise InvalidInput(f"--nvlink-groups must divide --gpus {gpus} evenly, got {nvlink_groups}")
    cluster, clique = parse_fabric(fabric)
    return InventoryNode(name, labels, gpus, model, nvlink_groups, cluster, clique)


def node_add(ctx: Ctx, pool_ref: str | None, spec: InventoryNode) -> None:
    require_admin(ctx.who, "add nodes")
    with ctx.write() as conn:
        pool = repo.find_pool(conn, pool_ref)
        if repo.node_pool_id(conn, spec.name) is not None:
            raise Conflict(f"node {spec.name!r} already exists; `node show {spec.name}`")
        existing = bulk.same_but_case(conn, [spec.name]).get(spec.name)
        if existing is not None:
            raise Conflict(
                f"node {existing!r} exists, and node names are host names, which do not differ"
                f" by case alone; `node show {existing}`"
            )
        repo.insert_node(conn, spec.name, pool["id"], spec.labels, _atoms(spec))
        ctx.event("node.added", None, None, {"nodeId": spec.name, "poolId": pool["id"]})


def node_list(ctx: Ctx, pool_ref: str | None) -> list[Node]:
    with ctx.db.read() as conn:
        pool_id = repo.find_pool(conn, pool_ref)["id"] if pool_ref is not None else None
        windows = repo.maintenance_covering(conn, ctx.now)
        return [_as_scheduled(n, windows.get(n.name)) for n in repo.load_nodes(conn, pool_id)]


def _as_scheduled(node: Node, window: Maintenance | None) -> Node:
    """The node as the scheduler treats it now: in a maintenance `window` (a cordon with a start
    and an end, PRODUCT.md §4), not schedulable, with the window's reason when it has no cordon
    of its own. A review found such a node listed `ok` and `schedulable: true` while `pool show`
    and `preview` left it out. Only what node list and show print: the stored flag, and so an
    inventory export, are unchanged."""
    if window is None or not node.schedulable:
        return node
    return replace(node, schedulable=False, cordon_reason=window.reason)


@dataclass(frozen=True)
class NodeDetail:
    node: Node
    pool_name: str
    maintenance: tuple[Maintenance, ...]
    desired: tuple[object, ...]


def node_show(ctx: Ctx, name: str) -> NodeDetail:
    from better_compute.service.views import desired_state

    with ctx.db.read() as conn:
        node = repo.get_node(conn, name)
        seen = authz.visible_tenants(conn, ctx.who)  # other tenants' assignments stay private
        desired = [
            a for a in desired_state(conn, name, ctx.now) if seen is None or a.tenant_id in seen
        ]
        current = repo.maintenance_covering(conn, ctx.now, name).get(name)
        return NodeDetail(
            _as_scheduled(node, current),
            repo.pool_name(conn, node.pool_id),
            tuple(repo.maintenance_for_node(conn, name, ctx.now)),
            tuple(desired),
        )


@dataclass(frozen=True)
class Changed:
    """A node after a change asked of it. `changed` False: it already was so, and nothing was
    written; no event either, so no log line or webhook tells of a change that did not happen
    (as `kubectl cordon` of a cordoned node says so and changes nothing)."""

    node: Node
    changed: bool
    #: Maintenance windows the change lifted (uncordon lifts them all).
    lifted: int = 0


def node_label(ctx: Ctx, name: str, pairs: Sequence[str]) -> Changed:
    """Set labels (k=v) or remove them (k-), as kubectl label does."""
    require_admin(ctx.who, "change nodes")
    with ctx.write() as conn:
        node = repo.get_node(conn, name)
        labels = dict(node.labels)
        removals = [p for p in pairs if p.endswith("-") and "=" not in p]
        removed = {p[:-1] for p in removals}
        if "" in removed:
            raise InvalidInput("label removal needs a key, such as rack-")
        added = parse_labels([p for p in pairs if p not in removals], "label")
        both = sorted(removed & {key for key, _ in added})
        if both:
            raise InvalidInput(f"label {both[0]!r} is both set and removed; give each key once")
        for key in removed:
            labels.pop(key, None)
        labels.update(added)
        if sorted(labels.items()) == sorted(node.labels):
            return Changed(node, False)
        split = gang_split(conn, node, labels)
        if split is not None:
            raise Conflict(
                f"cannot change label {split[1]!r} of {name}: gang {split[0]} was placed on one"
                f" {split[1]} value and would be split; release or cancel it first"
            )
        repo.set_node_labels(conn, name, sorted(labels.items()))
        ctx.event(
            "node.labelled", None, None, {"nodeId": name, "labels": dict(sorted(labels.items()))}
        )
        return Changed(repo.get_node(conn, name), True)


def node_flag(ctx: Ctx, name: str, event: str, reason: str | None, **columns: object) -> Changed:
    """Cordon, mark (un)reachable: one column change and an event with who and why. `columns`
    name Node's fields (schedulable, reachable, cordon_reason)."""
    check_name(reason, "--reason")
    require_admin(ctx.who, "change nodes")
    with ctx.write() as conn:
        node = repo.get_node(conn, name)
        if all(getattr(node, column) == value for column, value in columns.items()):
            return Changed(node, False)
        repo.update_node(conn, name, **columns)
        data: dict[str, JsonValue] = {"nodeId": name, "by": ctx.principal}
        if reason is not None:
            data["reason"] = reason
        ctx.event(event, None, None, data)
        return Changed(repo.get_node(conn, name), True)


@dataclass(frozen=True)
class MaintenanceAdded:
    """A maintenance window, and what its repair did to the placed bookings it overlapped:
    `moved` were placed again elsewhere for the same window, `waiting` found no node and are
    pending (BookingRepairFailed), retried as any pending request, and `kept` stay where they
    are (BookingRepair leaves a spot reservation under notice, and a lease that has begun).
    `running`: reservations that have begun on the node and overlap the window; nothing moves
    them, so the admin is told they run into it."""

    maintenance: Maintenance
    moved: tuple[str, ...]
    waiting: tuple[str, ...]
    kept: tuple[str, ...]
    running: tuple[str, ...]


def node_maintenance(
    ctx: Ctx, name: str, window: Window | Callable[[int], Window], reason: str | None
) -> MaintenanceAdded:
    """A maintenance window on a node, and the bookings it overlaps repaired ahead of time.
    `window`, or how to find it from the instant the write acts at (read with its lock held,
    PRODUCT.md §2): `--from +1h` counts from there, not from when the command opened the ledger,
    since the lock may be seconds away and a manual clock may move meanwhile."""
    check_name(reason, "--reason")
    require_admin(ctx.who, "change nodes")
    at = window if callable(window) else lambda _: window
    _ahead(at(ctx.now), ctx.now)  # as the command opened the ledger: refused before the lock
    with ctx.write() as conn:
        window = _ahead(at(ctx.now), ctx.now)  # again at the instant read under the lock (§2)
        repo.get_node(conn, name)
        mid = repo.insert_maintenance(conn, name, window, reason)
        data: dict[str, JsonValue] = {
            "nodeId": name,
            "from": window.start,
            "until": window.end,
            "by": ctx.principal,
        }
        if reason is not None:
            data["reason"] = reason
        ctx.event("node.maintenance", None, None, data)
        # Bookings that overlap the window are repaired ahead of time, in the same transaction.
        outcome: dict[str, list[str]] = {"moved": [], "waiting": [], "kept": []}
        for rsv in repo.placed_on_node_during(conn, name, window):
            after = ticking.repair_one(ctx, rsv)
            if after.state != State.PLACED:
                outcome["waiting"].append(rsv.id)
            else:
                same = after.allocations == rsv.allocations
                outcome["kept" if same else "moved"].append(rsv.id)
        return MaintenanceAdded(
            Maintenance(mid, name, window, reason),
            moved=tuple(outcome["moved"]),
            waiting=tuple(outcome["waiting"]),
            kept=tuple(outcome["kept"]),
            running=tuple(repo.started_on_node_during(conn, name, window, ctx.now)),
        )


def _ahead(window: Window, now: int) -> Window:
    """A maintenance window that ends after it starts, and after `now`. Past at the instant a
    command opens the ledger, it is past under the lock too: time only moves on, and a relative
    window moves with it."""
    if window.end <= window.start:
        raise InvalidInput("--until must be after --from")
    if window.end <= now:
        raise InvalidInput(
            f"the window ends at {iso(window.end)}, which has passed (now {iso(now)});"
            " a maintenance window must end later"
        )
    return window


def node_uncordon(ctx: Ctx, name: str) -> Changed:
    """Uncordon lifts the cordon and every maintenance window of the node."""
    require_admin(ctx.who, "change nodes")
    with ctx.write() as conn:
        node = repo.get_node(conn, name)
        removed = repo.delete_maintenance(conn, name)
        if node.schedulable and node.cordon_reason is None and not removed:
            return Changed(node, False)
        repo.update_node(conn, name, schedulable=1, cordon_reason=None)
        ctx.event(
            "node.uncordoned",
            None,
            None,
            {"nodeId": name, "by": ctx.principal, "maintenanceRemoved": removed},
        )
        return Changed(repo.get_node(conn, name), True, removed)


def device_health(ctx: Ctx, ref: str, healthy: bool, reason: str | None) -> Changed:
    node_name, sep, index_text = ref.rpartition(":")
    if not sep or not _digits(index_text):
        raise InvalidInput(f"device {ref!r} must look like NODE:INDEX, such as node-01:3")
    index = int(index_text)
    if not healthy and (reason is None or not reason.strip()):
        raise InvalidInput("--reason must say why the GPU is quarantined, such as xid-79")
    check_name(reason, "--reason")
    require_admin(ctx.who, "change device health")
    with ctx.write() as conn:
        node = repo.get_node(conn, node_name)
        atom = next((a for a in node.atoms if a.index == index), None)
        if atom is None:
            raise NotFound(f"node {node_name} has GPUs 0 to {len(node.atoms) - 1}, not {index}")
        if atom.healthy == healthy and atom.health_reason == reason:
            return Changed(node, False)
        repo.set_atom_health(conn, node_name, index, healthy, reason)
        data: dict[str, JsonValue] = {"nodeId": node_name, "index": index, "by": ctx.principal}
        if reason is not None:
            data["reason"] = reason
        ctx.event("device.quarantined" if not healthy else "device.restored", None, None, data)
        return Changed(repo.get_node(conn, node_name), True)


# ---------------------------------------------------------------- tenants and quotas


def tenant_create(ctx: Ctx, tenant: str) -> None:
    require_admin(ctx.who, "create tenants")
    _name(tenant, "tenant id")
    with ctx.write() as conn:
        if repo.tenant_exists(conn, tenant):
            raise Conflict(f"tenant {tenant!r} already exists")
        _new_tenant(ctx, conn, tenant)


def _new_tenant(ctx: Ctx, conn: Conn, tenant: str) -> None:
    """A tenant, logged as `tenant.created` (by `tenant create` and by an import that names it)."""
    repo.insert_tenant(conn, tenant)
    ctx.event("tenant.created", tenant, None, {"tenantId": tenant})


def tenant_list(ctx: Ctx) -> list[str]:
    with ctx.db.read() as conn:
        return repo.tenant_ids(conn)


def quota_set(ctx: Ctx, tenant: str, pool_ref: str | None, gpus: int) -> None:
    require_admin(ctx.who, "set quotas")
    if not 0 <= gpus <= MAX_INT:
        raise InvalidInput(f"--gpus must be from 0 to {MAX_INT}, got {gpus}")
    with ctx.write() as conn:
        repo.require_tenant(conn, tenant)
        pool_id = repo.find_pool(conn, pool_ref)["id"] if pool_ref is not None else ""
        if (pool_id, gpus) in repo.quotas(conn, tenant):
            return  # already so: nothing is written, no event (README, design notes)
        _set_quota(ctx, conn, tenant, pool_id, gpus)


def _set_quota(ctx: Ctx, conn: Conn, tenant: str, pool_id: str, gpus: int) -> None:
    """A GPUs cap (pool '' for every pool), logged as `quota.set` with its actor."""
    repo.set_quota(conn, tenant, pool_id, gpus)
    ctx.event(
        "quota.set", tenant, None, {"poolId": pool_id or None, "gpus": gpus, "by": ctx.principal}
    )


@dataclass(frozen=True)
class QuotaLine:
    pool_id: str | None
    pool_name: str | None
    gpus: int
    held: int


def quota_show(ctx: Ctx, tenant: str) -> list[QuotaLine]:
    with ctx.db.read() as conn:
        repo.require_tenant(conn, tenant)
        authz.require_tenant(conn, ctx.who, tenant)
        lines = []
        for pool_id, cap in repo.quotas(conn, tenant):
            name = None
            if pool_id:
                name = repo.pool_name(conn, pool_id)
            held = fleet.held_charge(conn, tenant, pool_id)
            lines.append(QuotaLine(pool_id or None, name, cap, held))
        return lines


# ---------------------------------------------------------------- settings

BOOL_KEYS = {"binding.autoBind"}
DAY_MS = 86_400_000
#: (least, most) for each integer setting: the most keeps every derived instant printable.
RANGES = {
    "capacity.spotNoticeMs": (0, 7 * DAY_MS),
    "placement.topN": (1, 1000),
    "placement.maxAttempts": (1, 100),
    "pending.retryMs": (1000, DAY_MS),
    "pending.maxWaitMs": (60_000, 366 * DAY_MS),
    "repair.leadMs": (0, 30 * DAY_MS),
    "timeline.maxBuckets": (1, 100_000),
    "db.busyTimeoutMs": (0, 3_600_000),
    "inventory.maxBytes": (1024, 2**34),
    "notice.expiringMs": (0, 30 * DAY_MS),
    "webhook.timeoutMs": (100, 60_000),
    "webhook.retryForMs": (0, 30 * DAY_MS),
    "webhook.tickBudgetMs": (0, 600_000),
}


def config_get(ctx: Ctx, key: str | None) -> dict[str, JsonValue]:
    with ctx.db.read() as conn:
        settings = repo.load_settings(conn)
    values: dict[str, JsonValue] = {
        k: getattr(settings, field) for k, field in sorted(repo.SETTING_KEYS.items())
    }
    if key is None:
        return values
    if key not in values:
        raise InvalidInput(f"no setting {key!r}; settings: {', '.join(values)}")
    return {key: values[key]}


def config_set(ctx: Ctx, key: str, value: str) -> dict[str, JsonValue]:
    require_admin(ctx.who, "change settings")
    if key not in repo.SETTING_KEYS:
        raise InvalidInput(f"no setting {key!r}; settings: {', '.join(sorted(repo.SETTING_KEYS))}")
    if key in BOOL_KEYS:
        if value not in ("true", "false"):
            raise InvalidInput(f"{key} must be true or false, got {value!r}")
    else:
        least, most = RANGES[key]
        if not (value.isascii() and value.isdigit() and len(value) <= 18) or not (
            least <= int(value) <= most
        ):
            raise InvalidInput(f"{key} must be an integer from {least} to {most}, got {value!r}")
    stored = value if key in BOOL_KEYS else str(int(value))
    with ctx.write() as conn:
        if repo.config_value(conn, key) != stored:  # the same value again: no change, no event
            repo.set_config(conn, key, stored)
            ctx.event("config.set", None, None, {"key": key, "value": value, "by": ctx.principal})
    return config_get(ctx_fresh(ctx), key)


def ctx_fresh(ctx: Ctx) -> Ctx:
    return Ctx(ctx.db, ctx.now, ctx.who)


# ---------------------------------------------------------------- inventory


def read_inventory(ctx: Ctx, file: str) -> Inventory:
    """Read and parse an inventory JSON file (or - for stdin)."""
    return load_inventory_text(read_text(ctx, file, "inventory"))


def read_openb_nodes(ctx: Ctx, file: str, pool: str | None) -> OpenbNodes:
    """Read and parse an openb node list (CSV) as one pool, `openb` unless named. Like every
    --pool, an existing pool may be named by its id too (ids are never names: `pool_…`); an id
    that names no pool is NOT_FOUND, as for every other command. What the list does not say,
    inventory_import keeps (_keeping_what_is_omitted)."""
    text = read_text(ctx, file, "node list")
    name = "openb" if pool is None else pool
    if name.startswith("pool_"):
        with ctx.db.read() as conn:
            name = str(repo.find_pool(conn, name)["name"])
    return parse_openb_nodes(text, name)


def import_openb_nodes(
    ctx: Ctx, nodes: OpenbNodes, progress: Callable[[int, int], None] | None = None
) -> dict[str, int]:
    """inventory_import of an openb node list: a refusal names the node's row by its line."""
    try:
        return inventory_import(ctx, nodes.inventory, progress)
    except InvalidInput as exc:
        raise nodes.in_file_terms(exc) from None


def _keeping_what_is_omitted(conn: Conn, inv: Inventory) -> Inventory:
    """A file that leaves out a key of a pool or node that exists keeps what the ledger has
    (inventory.KEEP_POOL, KEEP_NODE): a partial file meant to add one node must not wipe the
    pool's labels or a node's fabric, and the openb list, which gives a node's GPU count and
    model only, leaves out all of them. NVLink groups are kept while the GPU count stays."""
    return replace(inv, pools=tuple(_kept_pool(conn, pool) for pool in inv.pools))


def _kept_pool(conn: Conn, pool: InventoryPool) -> InventoryPool:
    """The pool as the file gives it, with what it leaves out of the pool and of its nodes that
    exist taken from the ledger (one read of those nodes)."""
    pool_id = repo.pool_id_named(conn, pool.name)
    if pool_id is not None and "labels" in pool.omitted:
        pool = replace(pool, labels=repo.pool_labels(conn, repo.find_pool(conn, pool_id)))
    names = [n.name for n in pool.nodes if n.omitted]
    known = {n.name: _export_node(n) for n in repo.load_nodes_named(conn, names)}
    return replace(pool, nodes=tuple(_kept_node(n, known.get(n.name)) for n in pool.nodes))


def _kept_node(node: InventoryNode, was: InventoryNode | None) -> InventoryNode:
    """`node` with each key it left out taken from `was`, the node as the ledger has it."""
    if was is None:
        return node
    if "labels" in node.omitted:
        node = replace(node, labels=was.labels)
    if "fabric" in node.omitted:
        node = replace(node, fabric_cluster=was.fabric_cluster, fabric_clique=was.fabric_clique)
    if "nvlinkGroups" in node.omitted and was.gpus == node.gpus:
        node = replace(node, nvlink_groups=was.nvlink_groups)
    return node


def _read_stdin(limit: int, what: str) -> bytes:
    """Standard input, up to `limit` bytes: closed (`<&-`) or not readable (`0>/dev/null`), it
    is bad input, not a bug."""
    if sys.stdin is None:
        raise InvalidInput(f"{what} is '-' but standard input is closed; give a file, or pipe one")
    try:
        return sys.stdin.buffer.read(limit)
    except OSError as exc:
        raise InvalidInput(
            f"{what} is '-' but standard input cannot be read ({exc.strerror}); give a file,"
            " or pipe one"
        ) from None


def read_text(ctx: Ctx, file: str, what: str) -> str:
    """Read a UTF-8 text file (or - for stdin), refusing what could never be one: a device,
    FIFO or folder (`/dev/zero` would be read forever), and more than inventory.maxBytes (at most
    that many bytes plus one are ever read)."""
    cap = ctx.settings.inventory_max_bytes
    raw = _read_stdin(cap + 1, what) if file == "-" else _read_regular(file, cap + 1, what)
    if len(raw) > cap:
        raise InvalidInput(
            f"{what} {file!r} is larger than {cap} bytes (the setting inventory.maxBytes);"
            " split it, or raise the limit with `config set inventory.maxBytes N`"
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        at = exc.start + (len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0)
        line = len(_LINE_ENDS.findall(raw, 0, at)) + 1  # as the workload's and CSV's lines count
        raise InvalidInput(
            f"line {line}: {what} {file!r} is not UTF-8 text (byte {at}); save it as UTF-8"
        ) from None


#: A line ends at CRLF, CR or LF, as workload.py and the csv module count lines.
_LINE_ENDS = re.compile(rb"\r\n|\r|\n")


def _read_regular(file: str, most: int, what: str) -> bytes:
    """At most `most` bytes of a regular file. O_NONBLOCK: opening a FIFO must not wait for a
    writer; the type is checked on the open descriptor, so a swapped path can't slip through."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InvalidInput(f"cannot read {file!r}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a folder itself
        os.close(fd)
        raise InvalidInput(
            f"{what} {file!r} is not a regular file (a device, FIFO or folder);"
            " give a file, or - for stdin"
        )
    with os.fdopen(fd, "rb") as handle:
        try:
            return handle.read(most)
        except OSError as exc:
            raise InvalidInput(f"cannot read {file!r}: {exc.strerror}") from None


#: Nodes looked up, and the new ones inserted, per step of an import (and per progress report).
IMPORT_STEP = 500


def inventory_import(
    ctx: Ctx, inv: Inventory, progress: Callable[[int, int], None] | None = None
) -> dict[str, int]:
    """Upsert the whole file in one transaction; never remove an atom that holds a live booking.

    Nodes go in steps of IMPORT_STEP: one query finds which exist, those are updated one by one
    (their live bookings are checked), the new ones are inserted in bulk (storage/bulk.py).
    `progress(done, total)` is told after each step, for a progress bar on large files.
    """
    require_admin(ctx.who, "import an inventory")
    counts = {"pools": 0, "nodes": 0, "tenants": 0}
    total = sum(len(p.nodes) for p in inv.pools)
    with ctx.write() as conn:
        inv = _keeping_what_is_omitted(conn, inv)
        _require_one_host_each(conn, inv)
        live = repo.live_since(conn, ctx.now)
        for pool in inv.pools:
            _pool_name(pool.name)
            found = repo.pool_id_named(conn, pool.name)
            if found is None:
                pool_id = _new_pool(ctx, conn, pool.name, pool.labels)
            else:
                pool_id = found
                repo.set_pool_labels(conn, pool_id, pool.labels)
            counts["pools"] += 1
            for first in range(0, len(pool.nodes), IMPORT_STEP):
                step = pool.nodes[first : first + IMPORT_STEP]
                _import_nodes(ctx, conn, pool_id, pool.name, step, live)
                counts["nodes"] += len(step)
                if progress is not None:
                    progress(counts["nodes"], total)
        for tenant in inv.tenants:  # few, and each a change to who may book: each logged
            known = repo.tenant_exists(conn, tenant.id)
            if not known:
                _new_tenant(ctx, conn, tenant.id)
            was = dict(repo.quotas(conn, tenant.id)).get("") if known else None
            if tenant.quota_gpus is not None and was != tenant.quota_gpus:
                _set_quota(ctx, conn, tenant.id, "", tenant.quota_gpus)
            elif tenant.no_cap_at and was is not None:
                raise InvalidInput(
                    f"{tenant.no_cap_at}: says no cap, but tenant {tenant.id!r} has a cap of"
                    f' {was} GPUs, which an import cannot remove; give {{"gpus": N}}, or'
                    " leave quota out to keep it"
                )
            counts["tenants"] += 1
        ctx.event("inventory.imported", None, None, {k: v for k, v in counts.items()})
    return counts


def _import_nodes(
    ctx: Ctx,
    conn: Conn,
    pool_id: str,
    pool_name: str,
    nodes: Sequence[InventoryNode],
    live: int,
) -> None:
    """Update the nodes that exist, then add the others in bulk (node names are unique in a
    parsed inventory, so none of them is added twice). `live`: repo.live_since."""
    known = bulk.node_pools(conn, [n.name for n in nodes])
    for node in nodes:
        if node.name in known:
            path = _path_in_file(pool_name, node)
            _update_node(conn, pool_id, known[node.name], node, path, live)
    fresh = [(n.name, n.labels, _atoms(n)) for n in nodes if n.name not in known]
    bulk.insert_nodes(ctx.db, pool_id, fresh)


def _path_in_file(pool_name: str, node: InventoryNode) -> str:
    """Where a refusal found against the ledger points: the node's JSON path in the file; an
    openb list's nodes have none, so they are named instead."""
    return node.at or f"pools[{pool_name}].nodes[{node.name}]"


def _require_one_host_each(conn: Conn, inv: Inventory) -> None:
    """A node the ledger does not have yet may not differ only in case from another node, in
    the ledger or in the file: node names are host names (README). Pairs a ledger already holds
    (made before this rule) stay importable, so a ledger's own export imports again."""
    path_of = {n.name: _path_in_file(p.name, n) for p in inv.pools for n in p.nodes}
    names = list(path_of)
    new = sorted(set(names) - set(bulk.node_pools(conn, names)))
    in_ledger = bulk.same_but_case(conn, new)
    folded: dict[str, list[str]] = {}
    for name in names:
        folded.setdefault(name.lower(), []).append(name)
    for name in new:
        if name in in_ledger:
            where = f"node {in_ledger[name]!r} exists"
        elif len(folded[name.lower()]) > 1:
            other = min(n for n in folded[name.lower()] if n != name)
            where = f"the file names {other!r} too"
        else:
            continue
        raise InvalidInput(
            f"{path_of[name]}.name: {where}; node names are host names,"
            " which do not differ by case alone"
        )


def _keep_what_bookings_rely_on(conn: Conn, node: InventoryNode, path: str) -> None:
    """A node with live bookings keeps its GPUs' model, NVLink groups and fabric, and every label
    a live gang on it was placed by: changing them would silently break those bookings."""
    current = repo.get_node(conn, node.name)
    wanted = {a.index: a for a in _atoms(node)}
    lease = repo.live_lease_on(conn, node.name) if len(wanted) != len(current.atoms) else None
    if lease is not None:  # a lease holds every GPU: one added would be booked by others
        raise InvalidInput(
            f"{path}.gpus.count: {node.name} is leased whole by {lease}; change its GPUs once"
            " that lease has ended"
        )
    for atom in current.atoms:
        new = wanted.get(atom.index)
        if new is None:
            continue
        if atom.model != new.model:
            raise InvalidInput(
                f"{path}.gpus.model: {node.name} holds live bookings on {atom.model}"
            )
        if atom.nvlink_group != new.nvlink_group:  # often a file that leaves the key out
            per = len(current.atoms) // len({a.nvlink_group for a in current.atoms})
            raise InvalidInput(
                f"{path}.gpus.nvlinkGroups: {node.name} holds live bookings and GPU {atom.index}"
                f" would leave its NVLink group; give nvlinkGroups with {per} GPUs a group, as"
                " now (left out, it is 1 group)"
            )
        if (atom.fabric_cluster, atom.fabric_clique) != (new.fabric_cluster, new.fabric_clique):
            raise InvalidInput(f"{path}.gpus.fabric: {node.name} holds live bookings")
    split = gang_split(conn, current, dict(node.labels))
    if split is not None:
        raise InvalidInput(f"{path}.labels.{split[1]}: a live gang on {node.name} was placed by it")


def gang_split(conn: Conn, node: Node, labels: dict[str, str]) -> tuple[str, str] | None:
    """(reservation, key) of a live gang on `node` whose topology key `labels` would give another
    value: its members share one value, so changing it on one member splits the gang. Only a
    label that changes can split one: a re-import that changes none reads no gangs (it read
    every live reservation once per node, minutes on a fleet)."""
    own = dict(node.labels)
    changed = {k for k in own.keys() | labels.keys() if own.get(k) != labels.get(k)}
    if not changed - {FABRIC_DOMAIN}:
        return None
    for rsv_id, key in repo.live_gang_keys(conn, node.name):
        if key != FABRIC_DOMAIN and node.label(key) != labels.get(key):
            return rsv_id, key
    return None


def _update_node(
    conn: Conn, pool_id: str, was_in: str, node: InventoryNode, path: str, since: int
) -> None:
    """An existing node takes the inventory's pool, labels and GPUs, unless live bookings rely
    on what would change (`since`: repo.live_since)."""
    live = repo.live_atoms(conn, node.name, since)
    if was_in != pool_id and live:
        raise InvalidInput(
            f"{path}.name: node {node.name} holds live bookings; it cannot change pool"
        )
    lost = sorted(i for i in live if i >= node.gpus)
    if lost:
        raise InvalidInput(
            f"{path}.gpus.count: GPUs {lost} of {node.name} hold live bookings; keep at least"
            f" {max(lost) + 1} GPUs"
        )
    if live:
        _keep_what_bookings_rely_on(conn, node, path)
    repo.move_node(conn, node.name, pool_id, node.labels, _atoms(node))


def inventory_export(ctx: Ctx) -> Inventory:
    """The fleet as an inventory file. Open to anyone, like `tenant list` and `node list`; a
    tenant's quota only where its reader may act for it, as `quota show` (§6)."""
    with ctx.db.read() as conn:
        seen = authz.visible_tenants(conn, ctx.who)
        pools = []
        for row in repo.pool_rows(conn):
            nodes = tuple(_export_node(n) for n in repo.load_nodes(conn, row["id"]))
            pools.append(InventoryPool(row["name"], repo.pool_labels(conn, row), nodes))
        tenants = []
        for tenant in repo.tenant_ids(conn):
            cap = (
                dict(repo.quotas(conn, tenant)).get("") if seen is None or tenant in seen else None
            )
            tenants.append(InventoryTenant(tenant, cap))
        return Inventory(tuple(pools), tuple(tenants))


def _export_node(node: Node) -> InventoryNode:
    first = node.atoms[0]
    same_fabric = len({(a.fabric_cluster, a.fabric_clique) for a in node.atoms}) == 1
    return InventoryNode(
        name=node.name,
        labels=node.labels,
        gpus=len(node.atoms),
        model=first.model,
        nvlink_groups=len({a.nvlink_group for a in node.atoms}),
        fabric_cluster=first.fabric_cluster if same_fabric else None,
        fabric_clique=first.fabric_clique if same_fabric else None,
    )
