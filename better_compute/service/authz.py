"""Who may do what (PRODUCT.md §6), as one set of rules rather than checks in every command.

A principal is resolved once per command: the operating-system user (identity.py), or with `--as`
the principal an admin acts as. It may act for a tenant when it is an admin, when the tenant has no
policies, or when a policy names it. Another tenant's reservations are NOT_FOUND, never FORBIDDEN:
a refusal would confirm that the id exists.
"""

from __future__ import annotations

from collections.abc import Callable

from better_compute.errors import Forbidden, InvalidInput, NotFound
from better_compute.model import SYSTEM, Principal
from better_compute.storage import ledger
from better_compute.storage.repo import Conn

#: The longest principal name (a user name, a role, a service account's id).
MAX_PRINCIPAL = 256


def principal_name(name: str, where: str) -> str:
    """A principal is a user (or role) name as the system spells it: no padding that would make
    ' root' a second root, and never `system`, which names the lifecycle's own work in events."""
    if len(name) > MAX_PRINCIPAL:
        raise InvalidInput(
            f"{where}: a principal has at most {MAX_PRINCIPAL} characters, got {len(name)}"
        )
    if not name or name != name.strip() or not name.isprintable():
        raise InvalidInput(
            f"{where}: {name[:40]!r} is not a principal; give a user name: printable text,"
            " without spaces around it"
        )
    if name == SYSTEM:
        raise InvalidInput(f"{where}: {SYSTEM!r} names the lifecycle's own work, not a principal")
    return name


def session_user(me: str) -> str:
    """The user running the command (on PostgreSQL, the session's role), who may be anyone but
    `system`: events name the lifecycle's own work so, and a user of that name would pass for it
    (`--as system`, `admin add system` and `policy set --principal system` are refused too)."""
    if me == SYSTEM:
        raise Forbidden(
            f"the user {SYSTEM!r} may not act: events name the lifecycle's own work (tick, repair)"
            f" {SYSTEM!r}, so this user's actions could not be told from it; run better-compute"
            " as another user (on PostgreSQL, log in as another role)"
        )
    return me


def resolve(conn: Conn, me: str, as_name: str | None, owner: Callable[[], str]) -> Principal:
    """The principal of this command. `--as` is believed only from an admin.

    A ledger from before the admin list (no admins recorded) is administered by its file's owner,
    who could rewrite the file anyway.
    """
    admins = set(ledger.admins(conn)) or {owner()}  # the file's owner: read only when needed
    if as_name is not None:
        principal_name(as_name, "--as")
    if as_name is None or as_name == me:
        return Principal(me, me in admins)
    if me not in admins:
        raise Forbidden(
            f"only an admin may act as another principal (--as / BETTER_COMPUTE_PRINCIPAL);"
            f" you are {me!r}: leave --as out to act as yourself"
        )
    return Principal(as_name, as_name in admins, acting_admin=me)


#: What only an admin may do, by the words its refusal uses (fleet and rule changes, §6).
ADMIN_ONLY = frozenset(
    {
        "add or remove admins",
        "list admins",
        "create pools",
        "change pool settings",
        "add nodes",
        "change nodes",
        "change device health",
        "create tenants",
        "set quotas",
        "set policies",
        "delete policies",
        "change settings",
        "create meters",
        "import an inventory",
        "replace the ledger (init --force)",
        "restore a ledger",
        "tick ahead of the real clock (tick --until)",
        "simulate a workload",
        "add a webhook for every tenant",
        "migrate the ledger",
    }
)


def require_admin(who: Principal, what: str) -> None:
    if what not in ADMIN_ONLY:  # a new admin-only action is named in the table first
        raise AssertionError(f"{what!r} is not in authz.ADMIN_ONLY")
    if not who.admin:
        raise Forbidden(
            f"only an admin may {what}; you are {who.name!r} (an admin can run `admin add`)"
        )


def may_act_for(conn: Conn, who: Principal, tenant: str) -> bool:
    return who.admin or ledger.acts_for(conn, who.name, tenant)


def require_tenant(conn: Conn, who: Principal, tenant: str) -> None:
    """For a tenant named on the command line: FORBIDDEN when the principal may not act for it."""
    if not may_act_for(conn, who, tenant):
        raise Forbidden(
            f"{who.name!r} may not act for tenant {tenant!r}: no policy of it names you"
            " without --deny (an admin can run `policy set`)"
        )


def visible_tenants(conn: Conn, who: Principal) -> list[str] | None:
    """The tenants whose reservations this principal sees; None means every tenant."""
    return None if who.admin else ledger.tenants_for(conn, who.name)


def require_visible(conn: Conn, who: Principal, rsv_id: str, tenant: str) -> None:
    """Another tenant's reservation does not exist, as far as this principal can tell."""
    if not may_act_for(conn, who, tenant):
        raise NotFound(f"no reservation {rsv_id!r}; `list` shows the reservations")
