"""Usage windows: one per allocation, from activation until release (PRODUCT.md §8)."""

from __future__ import annotations

from better_compute.model import Reservation
from better_compute.storage import repo
from better_compute.storage.repo import Conn


def meter_name(model: str, spot: bool) -> str:
    return f"gpu.{model}.spot.hours" if spot else f"gpu.{model}.hours"


def open_windows(conn: Conn, rsv: Reservation, at: int) -> None:
    for alloc in rsv.allocations:
        meter = meter_name(repo.first_model(conn, alloc.node_id), rsv.spot)
        repo.open_usage(conn, meter, rsv, alloc, at)


def close_windows(conn: Conn, rsv_id: str, at: int) -> None:
    """Close every open window of a reservation at `at` (never before the window opened)."""
    repo.close_usage(conn, rsv_id, at)
