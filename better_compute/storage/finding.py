"""SQL for a reservation's name and labels (issue 12). `list`'s filters on them, and on the
window, are storage/listing.py's."""

from __future__ import annotations

import json
from collections.abc import Sequence

from better_compute.storage.repo import Conn


def set_tags(conn: Conn, rsv_id: str, name: str | None, labels: Sequence[tuple[str, str]]) -> None:
    """Store a new reservation's name and labels (once, at creation)."""
    conn.execute(
        "UPDATE reservations SET name = ?, labels = ? WHERE id = ?",
        (name, json.dumps(dict(sorted(labels)), sort_keys=True), rsv_id),
    )
    conn.executemany(
        "INSERT INTO reservation_labels(reservation_id, key, value) VALUES (?, ?, ?)",
        [(rsv_id, k, v) for k, v in sorted(labels)],
    )
