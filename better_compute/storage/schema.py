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

MIGRATION_4 = """
-- Issue 8, reads at fleet scale.
-- Each GPU's latest booking end, kept by the triggers below on every write to bookings. pool
-- show's "reserved later" is then the GPUs whose latest booking ends after now, less those in
-- use now: a count over this table's index, not a walk over every future booking.
CREATE TABLE atom_bookings (
  pool_id TEXT NOT NULL,
  node_id TEXT NOT NULL,
  atom INTEGER NOT NULL,
  last_end INTEGER NOT NULL,
  PRIMARY KEY (pool_id, node_id, atom)
);
CREATE INDEX atom_bookings_end ON atom_bookings(pool_id, last_end);
INSERT INTO atom_bookings(pool_id, node_id, atom, last_end)
  SELECT pool_id, node_id, atom, MAX("end") FROM bookings GROUP BY pool_id, node_id, atom;
CREATE TRIGGER atom_bookings_insert AFTER INSERT ON bookings BEGIN
  INSERT INTO atom_bookings(pool_id, node_id, atom, last_end)
    VALUES (NEW.pool_id, NEW.node_id, NEW.atom, NEW."end")
    ON CONFLICT(pool_id, node_id, atom) DO UPDATE SET last_end = MAX(last_end, excluded.last_end);
END;
-- A booking cut short or deleted: its GPU's latest end is read again (the node's index, newest
-- end first, stops at the GPU's first row).
CREATE TRIGGER atom_bookings_update AFTER UPDATE OF pool_id, node_id, atom, "end" ON bookings
BEGIN
  UPDATE atom_bookings SET last_end = COALESCE((SELECT b."end" FROM bookings b
      WHERE b.node_id = OLD.node_id AND b.atom = OLD.atom AND b.pool_id = OLD.pool_id
      ORDER BY b."end" DESC LIMIT 1), 0)
    WHERE pool_id = OLD.pool_id AND node_id = OLD.node_id AND atom = OLD.atom;
  INSERT INTO atom_bookings(pool_id, node_id, atom, last_end)
    VALUES (NEW.pool_id, NEW.node_id, NEW.atom, NEW."end")
    ON CONFLICT(pool_id, node_id, atom) DO UPDATE SET last_end = MAX(last_end, excluded.last_end);
END;
CREATE TRIGGER atom_bookings_delete AFTER DELETE ON bookings BEGIN
  UPDATE atom_bookings SET last_end = COALESCE((SELECT b."end" FROM bookings b
      WHERE b.node_id = OLD.node_id AND b.atom = OLD.atom AND b.pool_id = OLD.pool_id
      ORDER BY b."end" DESC LIMIT 1), 0)
    WHERE pool_id = OLD.pool_id AND node_id = OLD.node_id AND atom = OLD.atom;
END;
-- What each tenant holds of its quota in each pool (the charges of its reservations not
-- released), kept by the triggers below, so the quota check reads one row per cap instead of
-- summing every live reservation of the tenant.
CREATE TABLE held_charges (
  tenant_id TEXT NOT NULL,
  pool_id TEXT NOT NULL,
  held INTEGER NOT NULL,
  PRIMARY KEY (tenant_id, pool_id)
);
INSERT INTO held_charges(tenant_id, pool_id, held)
  SELECT tenant_id, pool_id, SUM(quota_charge) FROM reservations WHERE state != 'released'
  GROUP BY tenant_id, pool_id;
CREATE TRIGGER held_charges_insert AFTER INSERT ON reservations
WHEN NEW.state != 'released' BEGIN
  INSERT INTO held_charges(tenant_id, pool_id, held)
    VALUES (NEW.tenant_id, NEW.pool_id, NEW.quota_charge)
    ON CONFLICT(tenant_id, pool_id) DO UPDATE SET held = held + excluded.held;
END;
CREATE TRIGGER held_charges_update_old AFTER UPDATE OF tenant_id, pool_id, state, quota_charge
ON reservations WHEN OLD.state != 'released' BEGIN
  UPDATE held_charges SET held = held - OLD.quota_charge
    WHERE tenant_id = OLD.tenant_id AND pool_id = OLD.pool_id;
END;
CREATE TRIGGER held_charges_update_new AFTER UPDATE OF tenant_id, pool_id, state, quota_charge
ON reservations WHEN NEW.state != 'released' BEGIN
  INSERT INTO held_charges(tenant_id, pool_id, held)
    VALUES (NEW.tenant_id, NEW.pool_id, NEW.quota_charge)
    ON CONFLICT(tenant_id, pool_id) DO UPDATE SET held = held + excluded.held;
END;
CREATE TRIGGER held_charges_delete AFTER DELETE ON reservations
WHEN OLD.state != 'released' BEGIN
  UPDATE held_charges SET held = held - OLD.quota_charge
    WHERE tenant_id = OLD.tenant_id AND pool_id = OLD.pool_id;
END;
"""

MIGRATION_5 = """
-- Issue 8, replay: what is due next.
-- A tick, and simulate asking when the next one is due, look for the live reservations whose
-- end, preemption deadline or start has come (or comes next), and the pending ones whose retry
-- is due. With (state, instant) the answer is a seek per state, not a walk over every live
-- reservation: on a busy ledger there are thousands, and simulate asks after every request.
CREATE INDEX reservations_ends ON reservations(state, during_end);
CREATE INDEX reservations_deadlines ON reservations(state, preempt_deadline);
CREATE INDEX reservations_starts ON reservations(state, during_start);
CREATE INDEX reservations_retries ON reservations(state, next_attempt_at);
-- Closing a reservation's usage finds its open windows without reading every usage row.
CREATE INDEX usage_open ON usage(reservation_id) WHERE "end" IS NULL;
"""

MIGRATION_6 = """
-- Signed webhooks (PRODUCT.md §4 Running): where a tenant's events are POSTed.
CREATE TABLE webhooks (
  id TEXT PRIMARY KEY,              -- whk_…
  seq BIGINT NOT NULL UNIQUE,      -- creation order
  tenant_id TEXT NOT NULL,          -- the tenant whose events it receives, or '*' for every event
  url TEXT NOT NULL,                -- http or https, no credentials in it
  events TEXT NOT NULL DEFAULT '[]',-- JSON list of event types or 'ns.*' patterns; [] = all
  secret TEXT NOT NULL,             -- the HMAC key; shown once, then only its fingerprint
  created_at BIGINT NOT NULL,
  created_by TEXT NOT NULL,
  cursor BIGINT NOT NULL           -- the last event seq already queued for it
);
-- One event to deliver to one webhook. Per webhook, the lowest queued seq goes first.
CREATE TABLE deliveries (
  id TEXT PRIMARY KEY,              -- dlv_…
  webhook_id TEXT NOT NULL REFERENCES webhooks(id),
  event_seq BIGINT NOT NULL,
  state TEXT NOT NULL,              -- queued|delivered|dead
  attempts BIGINT NOT NULL DEFAULT 0,
  queued_at BIGINT NOT NULL,       -- ledger instant its retry period began
  next_at BIGINT NOT NULL,         -- ledger instant its next attempt is due
  claim TEXT,                       -- the tick sending it now
  claim_until BIGINT,              -- real-clock epoch ms at which that claim lapses
  UNIQUE (webhook_id, event_seq)
);
CREATE INDEX deliveries_queue ON deliveries(webhook_id, state, event_seq);
CREATE INDEX deliveries_state ON deliveries(state, webhook_id);
-- Every attempt of a delivery, with the receiver's status code or the error.
CREATE TABLE delivery_attempts (
  delivery_id TEXT NOT NULL REFERENCES deliveries(id),
  n BIGINT NOT NULL,               -- 1, 2, … per delivery
  at BIGINT NOT NULL,              -- ledger instant of the attempt
  status BIGINT,                   -- HTTP status; NULL when there was no answer
  error TEXT,                       -- why it failed; NULL on a 2xx
  PRIMARY KEY (delivery_id, n)
);
-- Notices given once per reservation (reservation.starting, reservation.expiring).
CREATE TABLE notices (
  reservation_id TEXT NOT NULL,
  type TEXT NOT NULL,
  PRIMARY KEY (reservation_id, type)
);
"""

MIGRATION_7 = """
-- Issue 10: calendar policies per pool (PRODUCT.md §5.6). NULL means no limit; durations in ms.
CREATE TABLE calendar_policies (
  pool_id TEXT PRIMARY KEY REFERENCES pools(id),
  min_duration_ms BIGINT,
  max_duration_ms BIGINT,
  min_lead_ms BIGINT,              -- a calendar request starts at least this long after now
  max_horizon_ms BIGINT,           -- ... and ends at most this long after now
  sizes TEXT NOT NULL DEFAULT '[]', -- allowed total GPUs of a request, JSON list; [] = any
  no_changes BIGINT NOT NULL DEFAULT 0 -- `--commit`: placed calendar reservations are final
);
-- Calendar reservations placed under a `--commit` policy: no cancel, extend or early release.
-- Recorded at admission, so a policy set later does not bind what was booked before it.
CREATE TABLE calendar_commitments (
  reservation_id TEXT PRIMARY KEY REFERENCES reservations(id),
  pool_id TEXT NOT NULL
);
-- advice tries windows at booking ends (bookings_window serves those) and stretches them up to
-- booking starts: this index reads a pool's starts in a range.
CREATE INDEX bookings_starts ON bookings(pool_id, start);
-- cancel --series: a series' occurrences.
CREATE INDEX reservations_series ON reservations(series_id, seq);
"""

MIGRATION_8 = """
-- Issue 12. Finding a reservation: a free-text
-- name and key=value labels. `labels` is the JSON object a reservation is read with; the
-- reservation_labels rows are the same pairs, for portable indexed filtering (`list --label`).
ALTER TABLE reservations ADD COLUMN name TEXT;
ALTER TABLE reservations ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
CREATE INDEX reservations_name ON reservations(name, tenant_id);
CREATE TABLE reservation_labels (
  reservation_id TEXT NOT NULL REFERENCES reservations(id),
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  PRIMARY KEY (reservation_id, key)
);
CREATE INDEX reservation_labels_pair ON reservation_labels(key, value, reservation_id);
-- Budgets in GPU-hours over a rolling period, beside the GPUs-at-once cap of `quotas`; pool_id ''
-- means across every pool. Stored in GPU-milliseconds so sums stay exact integers.
CREATE TABLE budgets (
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  pool_id TEXT NOT NULL,
  gpu_ms BIGINT NOT NULL,
  period_ms BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, pool_id)
);
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


MIGRATION_9 = """
-- On the 'last_at' row: how many write transactions have committed. PostgreSQL's write lock is
-- that row, and taking it adds one (storage/postgres.py), so a connection that finds the count
-- moved since its own last commit knows another one wrote: what SQLite's PRAGMA data_version
-- says. simulate keeps its fleet in memory by it. On SQLite it stays 0.
ALTER TABLE meta ADD COLUMN writes BIGINT NOT NULL DEFAULT 0;
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


MIGRATION_4_POSTGRES = """
CREATE TABLE atom_bookings (
  pool_id TEXT NOT NULL,
  node_id TEXT NOT NULL,
  atom BIGINT NOT NULL,
  last_end BIGINT NOT NULL,
  PRIMARY KEY (pool_id, node_id, atom)
);
CREATE INDEX atom_bookings_end ON atom_bookings(pool_id, last_end);
INSERT INTO atom_bookings(pool_id, node_id, atom, last_end)
  SELECT pool_id, node_id, atom, MAX("end") FROM bookings GROUP BY pool_id, node_id, atom;
CREATE FUNCTION atom_bookings_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    UPDATE atom_bookings SET last_end = COALESCE((SELECT b."end" FROM bookings b
        WHERE b.node_id = OLD.node_id AND b.atom = OLD.atom AND b.pool_id = OLD.pool_id
        ORDER BY b."end" DESC LIMIT 1), 0)
      WHERE pool_id = OLD.pool_id AND node_id = OLD.node_id AND atom = OLD.atom;
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') THEN
    INSERT INTO atom_bookings(pool_id, node_id, atom, last_end)
      VALUES (NEW.pool_id, NEW.node_id, NEW.atom, NEW."end")
      ON CONFLICT (pool_id, node_id, atom)
      DO UPDATE SET last_end = GREATEST(atom_bookings.last_end, excluded.last_end);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER atom_bookings_insert AFTER INSERT ON bookings
  FOR EACH ROW EXECUTE FUNCTION atom_bookings_keep();
CREATE TRIGGER atom_bookings_update AFTER UPDATE OF pool_id, node_id, atom, "end" ON bookings
  FOR EACH ROW EXECUTE FUNCTION atom_bookings_keep();
CREATE TRIGGER atom_bookings_delete AFTER DELETE ON bookings
  FOR EACH ROW EXECUTE FUNCTION atom_bookings_keep();
CREATE TABLE held_charges (
  tenant_id TEXT NOT NULL,
  pool_id TEXT NOT NULL,
  held BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, pool_id)
);
INSERT INTO held_charges(tenant_id, pool_id, held)
  SELECT tenant_id, pool_id, SUM(quota_charge) FROM reservations WHERE state != 'released'
  GROUP BY tenant_id, pool_id;
CREATE FUNCTION held_charges_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.state != 'released' THEN
    UPDATE held_charges SET held = held - OLD.quota_charge
      WHERE tenant_id = OLD.tenant_id AND pool_id = OLD.pool_id;
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.state != 'released' THEN
    INSERT INTO held_charges(tenant_id, pool_id, held)
      VALUES (NEW.tenant_id, NEW.pool_id, NEW.quota_charge)
      ON CONFLICT (tenant_id, pool_id) DO UPDATE SET held = held_charges.held + excluded.held;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER held_charges_insert AFTER INSERT ON reservations
  FOR EACH ROW EXECUTE FUNCTION held_charges_keep();
CREATE TRIGGER held_charges_update AFTER UPDATE OF tenant_id, pool_id, state, quota_charge
  ON reservations FOR EACH ROW EXECUTE FUNCTION held_charges_keep();
CREATE TRIGGER held_charges_delete AFTER DELETE ON reservations
  FOR EACH ROW EXECUTE FUNCTION held_charges_keep();
"""


#: Issue 8 item 3 (growth3): each node's GPU count and healthy GPU count, on its own row, so the
#: placement shortlist (storage/fitting.py) sizes a pool's nodes from one covering index instead of
#: reading every GPU row of the pool. Kept exactly by triggers on atoms in the writing transaction:
#: each recounts the node's (at most a few dozen) GPU rows, so a copy that writes the node rows
#: with their counts and then their GPUs (migrate --to) ends with the same counts.
MIGRATION_10_SIZES = """
ALTER TABLE nodes ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN healthy_gpus INTEGER NOT NULL DEFAULT 0;
UPDATE nodes SET gpus = (SELECT COUNT(*) FROM atoms a WHERE a.node_id = nodes.name),
  healthy_gpus = (SELECT COUNT(*) FROM atoms a WHERE a.node_id = nodes.name AND a.healthy != 0);
CREATE INDEX nodes_fit ON nodes(pool_id, name, schedulable, reachable, gpus, healthy_gpus);
"""

MIGRATION_10 = Dialects(
    MIGRATION_10_SIZES
    + """
CREATE TRIGGER node_gpus_insert AFTER INSERT ON atoms BEGIN
  UPDATE nodes SET gpus = (SELECT COUNT(*) FROM atoms a WHERE a.node_id = NEW.node_id),
    healthy_gpus = (SELECT COUNT(*) FROM atoms a WHERE a.node_id = NEW.node_id AND a.healthy != 0)
    WHERE name = NEW.node_id;
END;
CREATE TRIGGER node_gpus_update AFTER UPDATE OF node_id, healthy ON atoms BEGIN
  UPDATE nodes SET gpus = (SELECT COUNT(*) FROM atoms a WHERE a.node_id = nodes.name),
    healthy_gpus = (SELECT COUNT(*) FROM atoms a WHERE a.node_id = nodes.name AND a.healthy != 0)
    WHERE name IN (OLD.node_id, NEW.node_id);
END;
CREATE TRIGGER node_gpus_delete AFTER DELETE ON atoms BEGIN
  UPDATE nodes SET gpus = (SELECT COUNT(*) FROM atoms a WHERE a.node_id = OLD.node_id),
    healthy_gpus = (SELECT COUNT(*) FROM atoms a WHERE a.node_id = OLD.node_id AND a.healthy != 0)
    WHERE name = OLD.node_id;
END;
""",
    MIGRATION_10_SIZES
    + """
CREATE FUNCTION node_gpus_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE nodes SET gpus = (SELECT COUNT(*) FROM atoms a WHERE a.node_id = nodes.name),
    healthy_gpus = (SELECT COUNT(*) FROM atoms a WHERE a.node_id = nodes.name AND a.healthy != 0)
    WHERE name IN (CASE WHEN TG_OP = 'INSERT' THEN NEW.node_id ELSE OLD.node_id END,
                   CASE WHEN TG_OP = 'DELETE' THEN OLD.node_id ELSE NEW.node_id END);
  RETURN NULL;
END $$;
CREATE TRIGGER node_gpus_insert AFTER INSERT ON atoms
  FOR EACH ROW EXECUTE FUNCTION node_gpus_keep();
CREATE TRIGGER node_gpus_update AFTER UPDATE OF node_id, healthy ON atoms
  FOR EACH ROW EXECUTE FUNCTION node_gpus_keep();
CREATE TRIGGER node_gpus_delete AFTER DELETE ON atoms
  FOR EACH ROW EXECUTE FUNCTION node_gpus_keep();
""",
)


MIGRATION_11 = """
-- Issue 8, replay: a released reservation leaves the indexes of what is due. A release used to
-- move its row within each of them (out of its live state, into 'released'), so every release
-- wrote four index pages more, and the indexes grew with the ledger's whole history while every
-- tick and every `simulate` step seeks only live and pending rows. Their queries say
-- `state <> 'released'` too, which is how SQLite (and PostgreSQL) know the index serves them.
DROP INDEX reservations_ends;
DROP INDEX reservations_deadlines;
DROP INDEX reservations_starts;
DROP INDEX reservations_retries;
CREATE INDEX reservations_ends ON reservations(state, during_end) WHERE state <> 'released';
CREATE INDEX reservations_deadlines ON reservations(state, preempt_deadline)
  WHERE state <> 'released';
CREATE INDEX reservations_starts ON reservations(state, during_start) WHERE state <> 'released';
CREATE INDEX reservations_retries ON reservations(state, next_attempt_at)
  WHERE state <> 'released';
"""


MIGRATION_12_INDEXES = """
-- Issue 8, replay: fewer index pages per write transaction. A row whose values fail a partial
-- index's WHERE has no entry in it, so writing the row never touches that index. Most
-- reservations have no name, no series, no preemption deadline and no retry due: their entries
-- in those four indexes were NULL keys that every insert wrote and every state change moved.
-- Every query these indexes serve compares the column (`name = ?`, `series_id = ?`,
-- `preempt_deadline <= ?`, `next_attempt_at > ?`), which implies `IS NOT NULL` to SQLite and
-- PostgreSQL alike, so each still uses its index.
DROP INDEX reservations_name;
CREATE INDEX reservations_name ON reservations(name, tenant_id) WHERE name IS NOT NULL;
DROP INDEX reservations_series;
CREATE INDEX reservations_series ON reservations(series_id, seq) WHERE series_id IS NOT NULL;
DROP INDEX reservations_deadlines;
CREATE INDEX reservations_deadlines ON reservations(state, preempt_deadline)
  WHERE state <> 'released' AND preempt_deadline IS NOT NULL;
DROP INDEX reservations_retries;
CREATE INDEX reservations_retries ON reservations(state, next_attempt_at)
  WHERE state <> 'released' AND next_attempt_at IS NOT NULL;
-- What a tenant holds is summed over live reservations only (`state <> 'released'` in every
-- query it serves): a release now drops the row's entry instead of moving it into a section
-- that only grows with the ledger's history.
DROP INDEX reservations_charge;
CREATE INDEX reservations_charge ON reservations(tenant_id, state, pool_id, quota_charge)
  WHERE state <> 'released';
-- The same for the state index: every read of it asks for live states (and says
-- `state <> 'released'`); `list --state released` reads the ledger in seq order instead, which
-- is how it answers anyway (nearly every row of an old ledger is released).
DROP INDEX reservations_state;
CREATE INDEX reservations_state ON reservations(state, seq) WHERE state <> 'released';
"""

#: The quota summary's update triggers (migration 4) fired on every state change and wrote the
#: same total back (the old charge taken off, the same charge added): now only when the held
#: amount changes, i.e. the reservation is released or revived, or its tenant, pool or charge
#: changes. A summary that was already right stays right: the skipped pair summed to zero.
MIGRATION_12 = Dialects(
    MIGRATION_12_INDEXES
    + """
DROP TRIGGER held_charges_update_old;
DROP TRIGGER held_charges_update_new;
CREATE TRIGGER held_charges_update_old AFTER UPDATE OF tenant_id, pool_id, state, quota_charge
ON reservations WHEN OLD.state != 'released' AND (NEW.state = 'released'
  OR NEW.tenant_id IS NOT OLD.tenant_id OR NEW.pool_id IS NOT OLD.pool_id
  OR NEW.quota_charge IS NOT OLD.quota_charge) BEGIN
  UPDATE held_charges SET held = held - OLD.quota_charge
    WHERE tenant_id = OLD.tenant_id AND pool_id = OLD.pool_id;
END;
CREATE TRIGGER held_charges_update_new AFTER UPDATE OF tenant_id, pool_id, state, quota_charge
ON reservations WHEN NEW.state != 'released' AND (OLD.state = 'released'
  OR NEW.tenant_id IS NOT OLD.tenant_id OR NEW.pool_id IS NOT OLD.pool_id
  OR NEW.quota_charge IS NOT OLD.quota_charge) BEGIN
  INSERT INTO held_charges(tenant_id, pool_id, held)
    VALUES (NEW.tenant_id, NEW.pool_id, NEW.quota_charge)
    ON CONFLICT(tenant_id, pool_id) DO UPDATE SET held = held + excluded.held;
END;
""",
    MIGRATION_12_INDEXES
    + """
CREATE OR REPLACE FUNCTION held_charges_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE' AND OLD.state != 'released' AND NEW.state != 'released'
     AND NEW.tenant_id = OLD.tenant_id AND NEW.pool_id = OLD.pool_id
     AND NEW.quota_charge = OLD.quota_charge THEN
    RETURN NULL;  -- the same charge taken off and added back
  END IF;
  IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.state != 'released' THEN
    UPDATE held_charges SET held = held - OLD.quota_charge
      WHERE tenant_id = OLD.tenant_id AND pool_id = OLD.pool_id;
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.state != 'released' THEN
    INSERT INTO held_charges(tenant_id, pool_id, held)
      VALUES (NEW.tenant_id, NEW.pool_id, NEW.quota_charge)
      ON CONFLICT (tenant_id, pool_id) DO UPDATE SET held = held_charges.held + excluded.held;
  END IF;
  RETURN NULL;
END $$;
""",
)


MIGRATION_13 = """
-- Issue 8, GPU-hour budgets at fleet scale: each booking names its reservation's tenant, so a
-- budget's sum over a tenant's bookings is one range of this index. Through the reservations it
-- was a lookup per reservation of the tenant (0.2 s for 20,000 of them). A reservation's tenant
-- never changes, and every INSERT INTO bookings names it (repo.insert_allocation,
-- updating.rebook).
ALTER TABLE bookings ADD COLUMN tenant_id TEXT;
UPDATE bookings SET tenant_id = (SELECT r.tenant_id FROM reservations r
                                 WHERE r.id = bookings.reservation_id);
CREATE INDEX bookings_tenant ON bookings(tenant_id, "end", start, pool_id, reservation_id);
"""

#: Migration 14: a process of a version before 13, still running when another one migrated the
#: ledger, writes bookings without their tenant, which a budget would then miss; the trigger
#: names it from the reservation (it never fires for a booking that names its tenant). The DROP
#: first: a ledger made between two commits of 2026-12-01 has the trigger under version 13.
MIGRATION_14 = Dialects(
    """
DROP TRIGGER IF EXISTS bookings_tenant_named;
CREATE TRIGGER bookings_tenant_named AFTER INSERT ON bookings WHEN NEW.tenant_id IS NULL BEGIN
  UPDATE bookings SET tenant_id = (SELECT r.tenant_id FROM reservations r
                                   WHERE r.id = NEW.reservation_id)
    WHERE id = NEW.id;
END;
""",
    """
DROP FUNCTION IF EXISTS bookings_tenant_named() CASCADE;
CREATE FUNCTION bookings_tenant_named() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.tenant_id := (SELECT r.tenant_id FROM reservations r WHERE r.id = NEW.reservation_id);
  RETURN NEW;
END $$;
CREATE TRIGGER bookings_tenant_named BEFORE INSERT ON bookings
  FOR EACH ROW WHEN (NEW.tenant_id IS NULL) EXECUTE FUNCTION bookings_tenant_named();
""",
)


#: Issue 8 item 3, growth with the fleet: each node's free-GPU levels, so a share's candidates
#: come from the few nodes at the level it would fill (storage/fitlevels.py) instead of a count
#: of every booking the window touches. A node's GPUs each have a next busy time t (the earliest
#: start of its bookings ending after the refresh instant t0; never: FIT_NEVER); sorted from the
#: latest, t_1 >= t_2 >= ..., a window [S, E) with t0 <= S < valid_until finds exactly f of them
#: free when t_(f+1) < E <= t_f: the level row (f, lo = t_(f+1), hi = t_f). valid_until is the
#: node's next booking start or end after t0: until then the same bookings decide. Any write to
#: a node's bookings or size makes it stale (valid_until 0, its levels gone) in the writing
#: transaction; placement's write path recomputes stale nodes (fitlevels.refresh), and stale
#: ones are counted from their bookings meanwhile, as are nodes with an unhealthy GPU (-1).
#: Derived rows: a copy may carry them or not.
MIGRATION_15_TABLES = """
CREATE TABLE fit_nodes (
  node_id TEXT PRIMARY KEY,
  pool_id TEXT NOT NULL,
  gpus BIGINT NOT NULL,
  t0 BIGINT NOT NULL,
  valid_until BIGINT NOT NULL
);
CREATE INDEX fit_nodes_stale ON fit_nodes(pool_id, valid_until);
CREATE INDEX fit_nodes_t0 ON fit_nodes(pool_id, t0);
CREATE INDEX fit_nodes_gpus ON fit_nodes(pool_id, gpus);
CREATE TABLE fit_levels (
  node_id TEXT NOT NULL,
  pool_id TEXT NOT NULL,
  free BIGINT NOT NULL,
  lo BIGINT NOT NULL,
  hi BIGINT NOT NULL,
  valid_until BIGINT NOT NULL,
  PRIMARY KEY (node_id, free)
);
CREATE INDEX fit_levels_scan ON fit_levels(pool_id, free, lo, node_id, hi, valid_until);
INSERT INTO fit_nodes(node_id, pool_id, gpus, t0, valid_until)
  SELECT name, pool_id, gpus, 0, 0 FROM nodes;
"""

MIGRATION_15 = Dialects(
    """
-- Derived rows only: a ledger whose version was set back (tests do) builds them again.
DROP TRIGGER IF EXISTS fit_bookings_insert;
DROP TRIGGER IF EXISTS fit_bookings_update;
DROP TRIGGER IF EXISTS fit_bookings_delete;
DROP TRIGGER IF EXISTS fit_nodes_insert;
DROP TRIGGER IF EXISTS fit_nodes_update;
DROP TRIGGER IF EXISTS fit_nodes_delete;
DROP TABLE IF EXISTS fit_levels;
DROP TABLE IF EXISTS fit_nodes;
"""
    + MIGRATION_15_TABLES
    + """
CREATE TRIGGER fit_bookings_insert AFTER INSERT ON bookings BEGIN
  UPDATE fit_nodes SET valid_until = 0 WHERE node_id = NEW.node_id AND valid_until != 0;
  DELETE FROM fit_levels WHERE node_id = NEW.node_id;
END;
CREATE TRIGGER fit_bookings_update AFTER UPDATE OF node_id, atom, start, "end" ON bookings BEGIN
  UPDATE fit_nodes SET valid_until = 0
    WHERE node_id IN (OLD.node_id, NEW.node_id) AND valid_until != 0;
  DELETE FROM fit_levels WHERE node_id IN (OLD.node_id, NEW.node_id);
END;
CREATE TRIGGER fit_bookings_delete AFTER DELETE ON bookings BEGIN
  UPDATE fit_nodes SET valid_until = 0 WHERE node_id = OLD.node_id AND valid_until != 0;
  DELETE FROM fit_levels WHERE node_id = OLD.node_id;
END;
CREATE TRIGGER fit_nodes_insert AFTER INSERT ON nodes BEGIN
  INSERT INTO fit_nodes(node_id, pool_id, gpus, t0, valid_until)
    VALUES (NEW.name, NEW.pool_id, NEW.gpus, 0, 0)
    ON CONFLICT(node_id) DO UPDATE SET pool_id = excluded.pool_id, gpus = excluded.gpus, t0 = 0,
      valid_until = 0;
  DELETE FROM fit_levels WHERE node_id = NEW.name;
END;
CREATE TRIGGER fit_nodes_update AFTER UPDATE OF name, pool_id, gpus, healthy_gpus ON nodes BEGIN
  DELETE FROM fit_nodes WHERE node_id = OLD.name;
  DELETE FROM fit_levels WHERE node_id IN (OLD.name, NEW.name);
  INSERT INTO fit_nodes(node_id, pool_id, gpus, t0, valid_until)
    VALUES (NEW.name, NEW.pool_id, NEW.gpus, 0, 0)
    ON CONFLICT(node_id) DO UPDATE SET pool_id = excluded.pool_id, gpus = excluded.gpus, t0 = 0,
      valid_until = 0;
END;
CREATE TRIGGER fit_nodes_delete AFTER DELETE ON nodes BEGIN
  DELETE FROM fit_nodes WHERE node_id = OLD.name;
  DELETE FROM fit_levels WHERE node_id = OLD.name;
END;
""",
    """
DROP FUNCTION IF EXISTS fit_bookings_keep() CASCADE;
DROP FUNCTION IF EXISTS fit_nodes_keep() CASCADE;
DROP TABLE IF EXISTS fit_levels;
DROP TABLE IF EXISTS fit_nodes;
"""
    + MIGRATION_15_TABLES
    + """
CREATE FUNCTION fit_bookings_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    UPDATE fit_nodes SET valid_until = 0 WHERE node_id = OLD.node_id AND valid_until != 0;
    DELETE FROM fit_levels WHERE node_id = OLD.node_id;
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') THEN
    UPDATE fit_nodes SET valid_until = 0 WHERE node_id = NEW.node_id AND valid_until != 0;
    DELETE FROM fit_levels WHERE node_id = NEW.node_id;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER fit_bookings_insert AFTER INSERT ON bookings
  FOR EACH ROW EXECUTE FUNCTION fit_bookings_keep();
CREATE TRIGGER fit_bookings_update AFTER UPDATE OF node_id, atom, start, "end" ON bookings
  FOR EACH ROW EXECUTE FUNCTION fit_bookings_keep();
CREATE TRIGGER fit_bookings_delete AFTER DELETE ON bookings
  FOR EACH ROW EXECUTE FUNCTION fit_bookings_keep();
CREATE FUNCTION fit_nodes_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    DELETE FROM fit_nodes WHERE node_id = OLD.name;
    DELETE FROM fit_levels WHERE node_id = OLD.name;
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') THEN
    DELETE FROM fit_levels WHERE node_id = NEW.name;
    INSERT INTO fit_nodes(node_id, pool_id, gpus, t0, valid_until)
      VALUES (NEW.name, NEW.pool_id, NEW.gpus, 0, 0)
      ON CONFLICT (node_id) DO UPDATE SET pool_id = excluded.pool_id, gpus = excluded.gpus,
        t0 = 0, valid_until = 0;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER fit_nodes_insert AFTER INSERT ON nodes
  FOR EACH ROW EXECUTE FUNCTION fit_nodes_keep();
CREATE TRIGGER fit_nodes_update AFTER UPDATE OF name, pool_id, gpus, healthy_gpus ON nodes
  FOR EACH ROW EXECUTE FUNCTION fit_nodes_keep();
CREATE TRIGGER fit_nodes_delete AFTER DELETE ON nodes
  FOR EACH ROW EXECUTE FUNCTION fit_nodes_keep();
-- Every write to bookings writes these through the triggers, as the writing role: each role
-- (PUBLIC too) gets on them what it holds on bookings, so an upgrade locks nobody out.
DO $$
DECLARE
  held record;
BEGIN
  FOR held IN
    SELECT DISTINCT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
    WHERE c.oid = 'bookings'::regclass AND a.grantee <> c.relowner
      AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
  LOOP
    EXECUTE format('GRANT %s ON fit_nodes, fit_levels TO %s', held.privilege_type,
      CASE WHEN held.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(held.grantee)) END);
  END LOOP;
END $$;
""",
)


#: PostgreSQL only: what the documented GRANTs let an ordinary role write with `psql` need not
#: include the event log (PRODUCT.md §8: never changed or deleted) nor the ledger's clock mode,
#: id and schema version, which only `init` and upgrades write, as the tables' owner (a review
#: changed `clock` to manual, and events' actors, as an ordinary role), nor set the ledger's
#: time back or past the end of time, or delete its row (a second review did, and writers then
#: took no lock; a third set it past 9999, a fourth its count of writes to the largest integer,
#: and every command stopped). The events trigger and the time row's hold for every role,
#: except that the owner may repair the time; `migrate` (the owner) turns them off while it
#: loads a copy, and only the owner may drop them. On SQLite whoever may write the file may
#: drop a trigger, so there it is a no-op (the version still counts).
MIGRATION_16 = Dialects(
    "SELECT 1;",
    """
CREATE OR REPLACE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'events are never changed or deleted' USING ERRCODE = 'insufficient_privilege';
END $$;
DROP TRIGGER IF EXISTS events_append_only ON events;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
  FOR EACH ROW EXECUTE FUNCTION events_append_only();
CREATE OR REPLACE FUNCTION meta_set_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW IS DISTINCT FROM OLD AND NOT pg_has_role(current_user,
      (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'MEMBER')
  THEN
    RAISE EXCEPTION 'the ledger''s % is its owner''s to change', OLD.key
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF TG_OP = 'DELETE' THEN
    RETURN OLD;
  END IF;
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS meta_set_once ON meta;
CREATE TRIGGER meta_set_once BEFORE UPDATE OR DELETE ON meta
  FOR EACH ROW WHEN (OLD.key IN ('clock', 'db_id', 'schema_version'))
  EXECUTE FUNCTION meta_set_once();
-- The clock row is the write lock every writer takes (storage/postgres.CLOCK_WRITE): gone, the
-- writers would serialise on nothing; its instant only moves forward (PRODUCT.md §2).
-- The tables' owner may repair it (an instant set past the end of time stops every command).
CREATE OR REPLACE FUNCTION meta_clock_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' OR NEW.key IS DISTINCT FROM OLD.key THEN
    RAISE EXCEPTION 'the ledger''s time row stays' USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'MEMBER')
  THEN
    RETURN NEW;
  END IF;
  -- The count of writes (what tells a reader another process committed) moves by one a write.
  IF NEW.writes IS DISTINCT FROM OLD.writes AND NEW.writes IS DISTINCT FROM OLD.writes + 1 THEN
    RAISE EXCEPTION 'the ledger''s count of writes moves by one a write'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF NEW.value IS NOT DISTINCT FROM OLD.value THEN
    RETURN NEW;
  END IF;
  -- Nested, not one OR: SQL does not promise to test the pattern before the cast.
  IF NEW.value ~ '^[0-9]{1,15}$' AND OLD.value ~ '^[0-9]{1,15}$' THEN
    IF NEW.value::bigint <= 253402300799999 AND NEW.value::bigint >= OLD.value::bigint THEN
      RETURN NEW;
    END IF;
  END IF;
  RAISE EXCEPTION 'the ledger''s time only moves forward, to the end of 9999 at most'
    USING ERRCODE = 'insufficient_privilege';
END $$;
DROP TRIGGER IF EXISTS meta_clock_forward ON meta;
CREATE TRIGGER meta_clock_forward BEFORE UPDATE OR DELETE ON meta
  FOR EACH ROW WHEN (OLD.key = 'last_at') EXECUTE FUNCTION meta_clock_forward();
""",
)


#: Append-only. Index i holds the SQL that brings version i to i + 1 (SQLite's user_version;
#: meta 'schema_version' on PostgreSQL). New migrations: one portable string when the SQL is the
#: same on both, else Dialects(sqlite=..., postgresql=...).
MIGRATIONS: tuple[Migration, ...] = (
    Dialects(MIGRATION_1, MIGRATION_1_POSTGRES),
    Dialects(MIGRATION_2, MIGRATION_2_POSTGRES),
    Dialects(MIGRATION_3, MIGRATION_3_POSTGRES),
    Dialects(MIGRATION_4, MIGRATION_4_POSTGRES),
    MIGRATION_5,
    MIGRATION_6,
    MIGRATION_7,
    MIGRATION_8,
    MIGRATION_9,
    MIGRATION_10,
    MIGRATION_11,
    MIGRATION_12,
    MIGRATION_13,
    MIGRATION_14,
    MIGRATION_15,
    MIGRATION_16,
)

SCHEMA_VERSION = len(MIGRATIONS)

#: Written to the SQLite header (PRAGMA application_id) so foreign files are recognised unopened.
APPLICATION_ID = 0x42434D50  # "BCMP"

#: sha256 of the sorted (type, name, tbl_name, sql) rows of sqlite_master that MIGRATIONS make:
#: opening a ledger compares its schema with this instead of rebuilding every migration in memory
#: (storage/db.py). tests/test_speed.py fails with the new value whenever a migration is added.
SCHEMA_DIGEST = "94286524eeb5bc0934671341eafc0da2236280802dc6587706e977ad0a53ec00"
