"""Who is running this process, as the operating system knows it (PRODUCT.md §3).

The principal is the name of the process's real uid, looked up in the password database. `$USER`
and `$LOGNAME` are never read: anyone can set them, and a name anyone can claim is no identity.
"""

from __future__ import annotations

import os
import pwd


def _name_of(uid: int) -> str:
    """The account name of `uid`; a uid with no entry (a bare container) is named by its number."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"


def os_user() -> str:
    """The real uid's name: what `id -un` prints, whatever the environment says."""
    return _name_of(os.getuid())


def owner_of(path: str) -> str:
    """Who owns a file: the admin of a ledger that predates the admin list (see service/authz)."""
    return _name_of(os.stat(path).st_uid)
