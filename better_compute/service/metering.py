"""Usage windows: one per allocation, from activation until release (PRODUCT.md §8)."""

from __future__ import annotations

from better_compute.model import Reservation
from better_compute.storage.repo import Conn


def meter_name(model: str, spot: bool) -> str:
    return f"gpu.{model}.spot.hours" if spot else f"gpu.{model}.hours"


def open_windows(conn: Conn, rsv: Reservation, at: int) -> None:
    for alloc in rsv.allocations:
        row = conn.execute(
            "SELECT model FROM atoms WHERE node_id = ? ORDER BY idx LIMIT 1", (alloc.node_id,)
        ).fetchone()
        conn.execute(
            "INSERT INTO usage(meter, tenant_id, reservation_id, allocation_id, gpus, start)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                meter_name(str(row[0]), rsv.spot),
                rsv.tenant_id,
                rsv.id,
                alloc.id,
                len(alloc.atoms),
                at,
            ),
        )


def close_windows(conn: Conn, rsv_id: str, at: int) -> None:
    """Close every open window of a reservation at `at` (never before the window opened)."""
    conn.execute(
        "UPDATE usage SET end = MAX(start, ?) WHERE reservation_id = ? AND end IS NULL",
        (at, rsv_id),
    )
