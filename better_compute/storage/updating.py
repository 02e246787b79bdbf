"""SQL for `update` (issue 12): a reservation's requested shape, and re-booking an allocation
in place so a member that stays on its node keeps its allocation id."""

from __future__ import annotations

import json
from collections.abc import Sequence

from better_compute.model import Reservation, Window
from better_compute.storage.repo import Conn


def set_shape(conn: Conn, rsv: Reservation) -> None:
    """The requested shape `update` changes; the rest is repo.save_reservation's."""
    conn.execute(
        "UPDATE reservations SET gpus = ?, start = ?, duration_ms = ? WHERE id = ?",
        (rsv.gpus, rsv.start, rsv.duration_ms, rsv.id),
    )


def rebook(
    conn: Conn,
    rsv: Reservation,
    allocation_id: str,
    node_id: str,
    atoms: Sequence[int],
    window: Window,
) -> None:
    """Replace one allocation's bookings with `atoms` over `window` (its node unchanged)."""
    conn.execute("DELETE FROM bookings WHERE allocation_id = ?", (allocation_id,))
    conn.execute(
        "UPDATE allocations SET atoms = ?, bound = 0 WHERE id = ?",
        (json.dumps(sorted(atoms)), allocation_id),
    )
    conn.executemany(
        "INSERT INTO bookings(pool_id, node_id, atom, allocation_id, reservation_id, tenant_id,"
        ' spot, start, "end") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)',
        [
            (
                rsv.pool_id,
                node_id,
                a,
                allocation_id,
                rsv.id,
                rsv.tenant_id,
                int(rsv.spot),
                window.start,
                window.end,
            )
            for a in sorted(atoms)
        ],
    )
