"""Finding reservations (issue 12): names and labels given at `reserve`, and `list`'s filters.

A name is free text for people (`pretrain run 7`); labels are key=value pairs for scripts
(`team=vision`). Neither is part of placement; both are in the reservation's JSON and its
`reservation.created` event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from better_compute.errors import InvalidInput
from better_compute.inventory import label_pairs

MAX_NAME = 200
#: Keys are made by scripts from run ids, branches and job names: room for long ones.
MAX_KEY = 1000
#: ...in at most this many bytes of UTF-8: a key is in a unique index with its tenant, and
#: PostgreSQL refuses an index entry over 2,704 bytes (1,000 CJK characters are 3,000). The
#: same bound on both backends, so a key one takes the other takes too (migrate).
MAX_KEY_BYTES = 2000
SORTS = ("created", "start")

Labels = tuple[tuple[str, str], ...]


def check_name(
    name: str | None, flag: str = "--name", most: int = MAX_NAME, most_bytes: int | None = None
) -> str | None:
    """Printable text, 1 to `most` characters (and at most `most_bytes` bytes of UTF-8, when
    given): it is shown in tables and matched exactly. The rule of every free text a request
    or an operator gives: names, keys, reasons."""
    if name is None:
        return None
    if not name.strip() or len(name) > most or not name.isprintable():
        raise InvalidInput(
            f"{flag} must be 1 to {most} printable characters (no newlines or tabs),"
            f" got {name[:40]!r}"
        )
    size = len(name.encode("utf-8", "surrogatepass"))
    if most_bytes is not None and size > most_bytes:
        raise InvalidInput(
            f"{flag} must be at most {most_bytes} bytes in UTF-8 (about {most_bytes // 3}"
            f" characters of most non-Latin scripts), got {size}"
        )
    return name


def parse_labels(pairs: Sequence[str], flag: str = "--label") -> Labels:
    """A reservation's `k=v` labels (inventory.label_pairs)."""
    return label_pairs(pairs, flag, "team=vision")


@dataclass(frozen=True)
class Filters:
    """`list`'s flags, as typed (times are read against the ledger's now)."""

    tenant: str | None = None
    pool: str | None = None
    states: Sequence[str] = ()
    key: str | None = None
    name: str | None = None
    labels: Sequence[str] = ()
    since: str | None = None
    until: str | None = None
    sort: str = "created"
