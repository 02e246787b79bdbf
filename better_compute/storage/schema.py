"""Tables and indexes, as an append-only list of numbered migrations.

Never edit a migration that has shipped: add a new one. `PRAGMA user_version` records how many ran.
Times are epoch ms; JSON columns hold small, sorted documents.
"""

from __future__ import annotations

from typing import NamedTuple

MIGRATION_1 = """
-- Key/value facts about this database: its id (seeds ids and the topN pick) and id counters.
CREATE TABLE meta (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
-- Engine settings (PRODUCT.md §10); absent keys take their defaults.
CREATE TABLE config (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE pools (
  id TEXT PRIMARY KEY,              -- pool_…
  name TEXT NOT NULL UNIQUE,
  labels TEXT NOT NULL DEFAULT '{}', -- JSON object
  auto_bind INTEGER,                -- NULL: follow binding.autoBind; 0/1 overrides it
  seq INTEGER NOT NULL              -- creation order
);
CREATE TABLE nodes (
  name TEXT PRIMARY KEY,            -- the node id users type
  pool_id TEXT NOT NULL REFERENCES pools(id),
  labels TEXT NOT NULL DEFAULT '{}', -- operator labels; fabric.domain is derived, not stored
  schedulable INTEGER NOT NULL DEFAULT 1,
  cordon_reason TEXT,
  reachable INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX nodes_pool ON nodes(pool_id, name);
-- One row per GPU atom of a node.
CREATE TABLE atoms (
  node_id TEXT NOT NULL REFERENCES nodes(name),
  idx INTEGER NOT NULL,
  class TEXT NOT NULL DEFAULT 'gpu',
  model TEXT NOT NULL,
  nvlink_group INTEGER NOT NULL DEFAULT 0,
  fabric_cluster TEXT,
  fabric_clique INTEGER,
  healthy INTEGER NOT NULL DEFAULT 1,
  health_reason TEXT,               -- e.g. xid-79 when quarantined
  PRIMARY KEY (node_id, idx)
);
-- Maintenance windows: node cordon --from --until.
CREATE TABLE maintenance (
  id INTEGER PRIMARY KEY,
  node_id TEXT NOT NULL REFERENCES nodes(name),
  start INTEGER NOT NULL,
  end INTEGER NOT NULL,
  reason TEXT
);
CREATE INDEX maintenance_node ON maintenance(node_id, end);
CREATE TABLE tenants (
  id TEXT PRIMARY KEY,
  seq INTEGER NOT NULL
);
-- A cap on GPUs held at once; pool_id '' means across every pool.
CREATE TABLE quotas (
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  pool_id TEXT NOT NULL,
  gpus INTEGER NOT NULL,
  PRIMARY KEY (tenant_id, pool_id)
);
CREATE TABLE reservations (
  id TEXT PRIMARY KEY,              -- rsv_…
  seq INTEGER NOT NULL UNIQUE,      -- creation order: "oldest first"
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  pool_id TEXT NOT NULL REFERENCES pools(id),
  principal TEXT NOT NULL,
  state TEXT NOT NULL,              -- pending|placed|binding|active|released
  gpus INTEGER,                     -- per node; NULL for a node lease without --gpus
  models TEXT NOT NULL DEFAULT '[]',-- accepted models, JSON list
  topology TEXT,
  gang_size INTEGER,
  topology_key TEXT,
  spot INTEGER NOT NULL DEFAULT 0,
  binding TEXT NOT NULL DEFAULT 'device',
  duration_ms INTEGER NOT NULL,
  start INTEGER,                    -- requested start; NULL = now
  during_start INTEGER,             -- the booked window; NULL while pending
  during_end INTEGER,
  conditions TEXT NOT NULL DEFAULT '[]',
  quota_charge INTEGER NOT NULL,
  idempotency_key TEXT,
  params TEXT NOT NULL,             -- canonical request, compared on key reuse
  release_reason TEXT,
  created_at INTEGER NOT NULL,
  next_attempt_at INTEGER,
  series_id TEXT,
  lead_checked INTEGER NOT NULL DEFAULT 0,  -- BookingRepair ran at start - leadMs
  start_checked INTEGER NOT NULL DEFAULT 0, -- BookingRepair ran at start
  preempt_deadline INTEGER,         -- set on a spot victim cut back to this instant
  preempted_by TEXT,                -- the preempting reservation (shown to its own tenant only)
  UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX reservations_state ON reservations(state, seq);
CREATE INDEX reservations_tenant ON reservations(tenant_id, seq);
CREATE TABLE allocations (
  id TEXT PRIMARY KEY,              -- alc_…
  reservation_id TEXT NOT NULL REFERENCES reservations(id),
  node_id TEXT NOT NULL REFERENCES nodes(name),
  atoms TEXT NOT NULL,              -- JSON list of atom indexes
  bound INTEGER NOT NULL DEFAULT 0,
  released INTEGER NOT NULL DEFAULT 0 -- 1 once its bookings were given back (repair, requeue)
);
CREATE INDEX allocations_reservation ON allocations(reservation_id);
-- One atom held for [start, end) by one allocation. Released reservations keep their past
-- bookings (truncated at release) so the timeline shows history; future ones are deleted.
CREATE TABLE bookings (
  id INTEGER PRIMARY KEY,
  pool_id TEXT NOT NULL,
  node_id TEXT NOT NULL,
  atom INTEGER NOT NULL,
  allocation_id TEXT NOT NULL REFERENCES allocations(id),
  reservation_id TEXT NOT NULL,
  spot INTEGER NOT NULL DEFAULT 0,
  start INTEGER NOT NULL,
  end INTEGER NOT NULL
);
-- Overlap queries are "end > :from AND start < :to": scan by end, filter by start.
CREATE INDEX bookings_node ON bookings(node_id, end, start);
CREATE INDEX bookings_pool ON bookings(pool_id, end, start);
CREATE INDEX bookings_reservation ON bookings(reservation_id);
CREATE TABLE events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  type TEXT NOT NULL,
  at INTEGER NOT NULL,
  tenant_id TEXT,
  reservation_id TEXT,
  data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_reservation ON events(reservation_id, seq);
CREATE INDEX events_tenant ON events(tenant_id, seq);
CREATE TABLE meters (
  name TEXT PRIMARY KEY,
  seq INTEGER NOT NULL
);
-- Metered usage: one window per allocation from activation until release.
CREATE TABLE usage (
  id INTEGER PRIMARY KEY,
  meter TEXT NOT NULL,
  tenant_id TEXT NOT NULL,
  reservation_id TEXT NOT NULL,
  allocation_id TEXT NOT NULL,
  gpus INTEGER NOT NULL,
  start INTEGER NOT NULL,
  end INTEGER                        -- NULL while open
);
CREATE INDEX usage_tenant ON usage(tenant_id, start);
-- Who may reserve what for a tenant (PRODUCT.md §6).
CREATE TABLE policies (
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  principal TEXT NOT NULL,
  max_gpus INTEGER,
  spot_only INTEGER NOT NULL DEFAULT 0,
  deny INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant_id, principal)
);
"""

MIGRATION_2 = """
-- Who caused each event (PRODUCT.md §7): the principal, or 'system' for what tick does; and the
-- admin behind an `--as`. Rows written before this migration get the best answer the log holds.
ALTER TABLE events ADD COLUMN actor TEXT NOT NULL DEFAULT 'system';
ALTER TABLE events ADD COLUMN acting_admin TEXT;
UPDATE events SET actor = COALESCE(
  (SELECT r.principal FROM reservations r WHERE r.id = events.reservation_id),
  'system') WHERE type = 'reservation.created';
UPDATE events SET actor = json_extract(data, '$.by')
  WHERE reservation_id IS NULL AND json_type(data, '$.by') = 'text';
-- Principals who may change the fleet and the rules, and act as others (--as).
CREATE TABLE admins (
  principal TEXT PRIMARY KEY,
  added_at INTEGER NOT NULL,
  added_by TEXT NOT NULL
);
-- The ledger's clock (PRODUCT.md §2): 'manual' when created under --now, else 'real'; and the
-- latest instant it has acted at, which no write may go behind. Older ledgers: the real clock.
INSERT OR IGNORE INTO meta(key, value) VALUES ('clock', 'real');
INSERT OR IGNORE INTO meta(key, value) SELECT 'last_at', COALESCE(MAX(at), 0) FROM events;
"""

MIGRATION_3 = """
-- Issue 8: a command costs what its answer costs, not what the fleet holds.
-- The longest booking of each pool, kept by the triggers below on every write to bookings, so an
-- overlap query "end > :from AND start < :to" also bounds its index range by
-- "end < :to + longest" instead of walking every booking that ends after the window opens.
-- It only ever grows (a booking cut short leaves it as it was): an upper bound is all it must be.
CREATE TABLE booking_bounds (
  pool_id TEXT PRIMARY KEY,
  longest INTEGER NOT NULL
);
INSERT INTO booking_bounds(pool_id, longest)
  SELECT pool_id, MAX(end - start) FROM bookings GROUP BY pool_id;
CREATE TRIGGER bookings_bound_insert AFTER INSERT ON bookings BEGIN
  INSERT INTO booking_bounds(pool_id, longest) VALUES (NEW.pool_id, NEW.end - NEW.start)
    ON CONFLICT(pool_id) DO UPDATE SET longest = MAX(longest, excluded.longest);
END;
CREATE TRIGGER bookings_bound_update AFTER UPDATE OF pool_id, start, end ON bookings BEGIN
  INSERT INTO booking_bounds(pool_id, longest) VALUES (NEW.pool_id, NEW.end - NEW.start)
    ON CONFLICT(pool_id) DO UPDATE SET longest = MAX(longest, excluded.longest);
END;
-- The overlap queries read only these indexes: which atom of which node is held, by whom, over
-- when. They replace bookings_pool and bookings_node, their prefixes.
DROP INDEX bookings_pool;
DROP INDEX bookings_node;
CREATE INDEX bookings_window ON bookings(pool_id, end, start, node_id, atom, reservation_id, spot);
CREATE INDEX bookings_node_window
  ON bookings(node_id, end, start, atom, reservation_id, spot, pool_id);
-- A tenant's held quota sums live reservations without reading the rows.
CREATE INDEX reservations_charge ON reservations(tenant_id, state, pool_id, quota_charge);
"""

# ---------------------------------------------------------------- PostgreSQL texts
# The same tables for PostgreSQL (the comments above say what each column means): times are
# BIGINT (epoch ms passes 32 bits), rowid keys are identity columns, "end" is quoted (reserved).

MIGRATION_1_POSTGRES = """
CREATE TABLE meta (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE config (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE pools (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  labels TEXT NOT NULL DEFAULT '{}',
  auto_bind BIGINT,
  seq BIGINT NOT NULL
);
CREATE TABLE nodes (
  name TEXT PRIMARY KEY,
  pool_id TEXT NOT NULL REFERENCES pools(id),
  labels TEXT NOT NULL DEFAULT '{}',
  schedulable BIGINT NOT NULL DEFAULT 1,
  cordon_reason TEXT,
  reachable BIGINT NOT NULL DEFAULT 1
);
CREATE INDEX nodes_pool ON nodes(pool_id, name);
CREATE TABLE atoms (
  node_id TEXT NOT NULL REFERENCES nodes(name),
  idx BIGINT NOT NULL,
  class TEXT NOT NULL DEFAULT 'gpu',
  model TEXT NOT NULL,
  nvlink_group BIGINT NOT NULL DEFAULT 0,
  fabric_cluster TEXT,
  fabric_clique BIGINT,
  healthy BIGINT NOT NULL DEFAULT 1,
  health_reason TEXT,
  PRIMARY KEY (node_id, idx)
);
CREATE TABLE maintenance (
  id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  node_id TEXT NOT NULL REFERENCES nodes(name),
  start BIGINT NOT NULL,
  "end" BIGINT NOT NULL,
  reason TEXT
);
CREATE INDEX maintenance_node ON maintenance(node_id, "end");
CREATE TABLE tenants (
  id TEXT PRIMARY KEY,
  seq BIGINT NOT NULL
);
CREATE TABLE quotas (
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  pool_id TEXT NOT NULL,
  gpus BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, pool_id)
);
CREATE TABLE reservations (
  id TEXT PRIMARY KEY,
  seq BIGINT NOT NULL UNIQUE,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  pool_id TEXT NOT NULL REFERENCES pools(id),
  principal TEXT NOT NULL,
  state TEXT NOT NULL,
  gpus BIGINT,
  models TEXT NOT NULL DEFAULT '[]',
  topology TEXT,
  gang_size BIGINT,
  topology_key TEXT,
  spot BIGINT NOT NULL DEFAULT 0,
  binding TEXT NOT NULL DEFAULT 'device',
  duration_ms BIGINT NOT NULL,
  start BIGINT,
  during_start BIGINT,
  during_end BIGINT,
  conditions TEXT NOT NULL DEFAULT '[]',
  quota_charge BIGINT NOT NULL,
  idempotency_key TEXT,
  params TEXT NOT NULL,
  release_reason TEXT,
  created_at BIGINT NOT NULL,
  next_attempt_at BIGINT,
  series_id TEXT,
  lead_checked BIGINT NOT NULL DEFAULT 0,
  start_checked BIGINT NOT NULL DEFAULT 0,
  preempt_deadline BIGINT,
  preempted_by TEXT,
  UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX reservations_state ON reservations(state, seq);
CREATE INDEX reservations_tenant ON reservations(tenant_id, seq);
CREATE TABLE allocations (
  id TEXT PRIMARY KEY,
  reservation_id TEXT NOT NULL REFERENCES reservations(id),
  node_id TEXT NOT NULL REFERENCES nodes(name),
  atoms TEXT NOT NULL,
  bound BIGINT NOT NULL DEFAULT 0,
  released BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX allocations_reservation ON allocations(reservation_id);
CREATE TABLE bookings (
  id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  pool_id TEXT NOT NULL,
  node_id TEXT NOT NULL,
  atom BIGINT NOT NULL,
  allocation_id TEXT NOT NULL REFERENCES allocations(id),
  reservation_id TEXT NOT NULL,
  spot BIGINT NOT NULL DEFAULT 0,
  start BIGINT NOT NULL,
  "end" BIGINT NOT NULL
);
CREATE INDEX bookings_node ON bookings(node_id, "end", start);
CREATE INDEX bookings_pool ON bookings(pool_id, "end", start);
CREATE INDEX bookings_reservation ON bookings(reservation_id);
CREATE TABLE events (
  seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  type TEXT NOT NULL,
  at BIGINT NOT NULL,
  tenant_id TEXT,
  reservation_id TEXT,
  data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_reservation ON events(reservation_id, seq);
CREATE INDEX events_tenant ON events(tenant_id, seq);
CREATE TABLE meters (
  name TEXT PRIMARY KEY,
  seq BIGINT NOT NULL
);
CREATE TABLE usage (
  id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  meter TEXT NOT NULL,
  tenant_id TEXT NOT NULL,
  reservation_id TEXT NOT NULL,
  allocation_id TEXT NOT NULL,
  gpus BIGINT NOT NULL,
  start BIGINT NOT NULL,
  "end" BIGINT
);
CREATE INDEX usage_tenant ON usage(tenant_id, start);
CREATE TABLE policies (
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  principal TEXT NOT NULL,
  max_gpus BIGINT,
  spot_only BIGINT NOT NULL DEFAULT 0,
  deny BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant_id, principal)
);
"""

MIGRATION_2_POSTGRES = """
ALTER TABLE events ADD COLUMN actor TEXT NOT NULL DEFAULT 'system';
ALTER TABLE events ADD COLUMN acting_admin TEXT;
UPDATE events SET actor = COALESCE(
  (SELECT r.principal FROM reservations r WHERE r.id = events.reservation_id),
  'system') WHERE type = 'reservation.created';
UPDATE events SET actor = data::jsonb ->> 'by'
  WHERE reservation_id IS NULL AND jsonb_typeof(data::jsonb -> 'by') = 'string';
CREATE TABLE admins (
  principal TEXT PRIMARY KEY,
  added_at BIGINT NOT NULL,
  added_by TEXT NOT NULL
);
INSERT INTO meta(key, value) VALUES ('clock', 'real') ON CONFLICT DO NOTHING;
INSERT INTO meta(key, value) SELECT 'last_at', COALESCE(MAX(at), 0)::text FROM events
  ON CONFLICT DO NOTHING;
"""

MIGRATION_3_POSTGRES = """
CREATE TABLE booking_bounds (
  pool_id TEXT PRIMARY KEY,
  longest BIGINT NOT NULL
);
INSERT INTO booking_bounds(pool_id, longest)
  SELECT pool_id, MAX("end" - start) FROM bookings GROUP BY pool_id;
CREATE FUNCTION bookings_bound() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO booking_bounds(pool_id, longest) VALUES (NEW.pool_id, NEW."end" - NEW.start)
    ON CONFLICT (pool_id)
    DO UPDATE SET longest = GREATEST(booking_bounds.longest, excluded.longest);
  RETURN NULL;
END $$;
CREATE TRIGGER bookings_bound_insert AFTER INSERT ON bookings
  FOR EACH ROW EXECUTE FUNCTION bookings_bound();
CREATE TRIGGER bookings_bound_update AFTER UPDATE OF pool_id, start, "end" ON bookings
  FOR EACH ROW EXECUTE FUNCTION bookings_bound();
DROP INDEX bookings_pool;
DROP INDEX bookings_node;
CREATE INDEX bookings_window
  ON bookings(pool_id, "end", start, node_id, atom, reservation_id, spot);
CREATE INDEX bookings_node_window
  ON bookings(node_id, "end", start, atom, reservation_id, spot, pool_id);
CREATE INDEX reservations_charge ON reservations(tenant_id, state, pool_id, quota_charge);
"""


class Dialects(NamedTuple):
    """A migration whose SQL differs by backend. A plain string serves both."""

    sqlite: str
    postgresql: str


Migration = str | Dialects


def migration_text(migration: Migration, dialect: str) -> str:
    """The SQL of one migration for 'sqlite' or 'postgresql'."""
    if isinstance(migration, str):
        return migration
    return migration.sqlite if dialect == "sqlite" else migration.postgresql


#: Append-only. Index i holds the SQL that brings version i to i + 1 (SQLite's user_version;
#: meta 'schema_version' on PostgreSQL). New migrations: one portable string when the SQL is the
#: same on both, else Dialects(sqlite=..., postgresql=...).
MIGRATIONS: tuple[Migration, ...] = (
    Dialects(MIGRATION_1, MIGRATION_1_POSTGRES),
    Dialects(MIGRATION_2, MIGRATION_2_POSTGRES),
    Dialects(MIGRATION_3, MIGRATION_3_POSTGRES),
)

SCHEMA_VERSION = len(MIGRATIONS)

#: Written to the SQLite header (PRAGMA application_id) so foreign files are recognised unopened.
APPLICATION_ID = 0x42434D50  # "BCMP"

#: sha256 of the sorted (type, name, tbl_name, sql) rows of sqlite_master that MIGRATIONS make:
#: opening a ledger compares its schema with this instead of rebuilding every migration in memory
#: (storage/db.py). tests/test_speed.py fails with the new value whenever a migration is added.
SCHEMA_DIGEST = "99251b7600fca667790445e2702305ebcbea3f30d8dd3171bbe6b6978a0e3017"
