"""Rights are checked again once the write lock is held (PRODUCT.md §3, §6): a command resolves
its principal before it waits for the lock, and an admin removed meanwhile must not act."""

from __future__ import annotations

import pgtest
import pytest
from conftest import NOW, Cli

from better_compute.errors import Forbidden
from better_compute.service import setup, ticking
from better_compute.service.context import open_ctx


def test_an_admin_removed_while_waiting_for_the_lock_writes_nothing(run: Cli) -> None:
    run.ok("admin", "add", "alice")
    alice = open_ctx(pgtest.ledger(str(run.db)), NOW, "alice", None)
    acting = open_ctx(pgtest.ledger(str(run.db)), NOW, "alice", "bob")  # alice's --as bob
    try:
        assert alice.who.admin and acting.who.acting_admin == "alice"
        run.ok("admin", "remove", "alice")  # committed while alice's commands were under way
        with pytest.raises(Forbidden, match="'alice' is no longer an admin"):
            setup.tenant_create(alice, "zz")
        with pytest.raises(Forbidden, match="'alice' is no longer an admin"):
            ticking.tick(acting)  # bob may tick, but only alice's word made this bob
    finally:
        alice.db.close()
        acting.db.close()
    assert {"id": "zz"} not in run.ok("tenant", "list")
    # an admin that stays one is not held back, and one added meanwhile needs no new look
    bob = open_ctx(pgtest.ledger(str(run.db)), NOW, "admin", None)
    try:
        run.ok("admin", "add", "carol")
        setup.tenant_create(bob, "yy")
    finally:
        bob.db.close()
    assert {"id": "yy"} in run.ok("tenant", "list")
