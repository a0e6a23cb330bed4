"""Who pays for the data a workspace keeps (environment, service types, event log, bookmarks), decided
without I/O.

A workspace's data is charged to the principal accountable for the workspace:
a record's owners, an operator's or an owner's grant, or for a personal
workspace ``ws-user-<id>`` the account ``<id>`` itself. Two kinds of personal
workspace have nobody to charge, since making another costs nothing: the one
of an identity a generated token stands for (a new user id per token) keeps
no data at all, and an anonymous user's keeps data only while a client of it
is connected (the hub frees it when the last one leaves).
"""

from __future__ import annotations

from switchboard.errors import PermissionDenied
from switchboard.hub.identity.users import ANONYMOUS_PREFIX, User, user_workspace

# An anonymous user's workspace, kept only while a client of it is connected, holds a sixteenth of
# what another may in each value (environment 1 KiB, service type 4 KiB, log entry 1 KiB: about
# 2.5 MiB in all at most), so a crowd of anonymous connections holds little of the hub's ceiling.
ANONYMOUS_SHARE = 16

_PERSONAL = user_workspace("")
_ANONYMOUS = user_workspace(ANONYMOUS_PREFIX)


def refusal_to_store(user: User, workspace: str) -> str | None:
    """Why ``user`` may not add data to ``workspace`` (its right to write there checked apart), or ``None``.

    A personal workspace keeps only the data of the account it belongs to and of
    the tokens that account made (the root of their chain); the hub's admin role
    writes anywhere.
    """
    if not workspace.startswith(_PERSONAL) or "admin" in user.roles:
        return None
    if workspace == user_workspace(user.parent or user.id):
        return None
    return (
        f"Workspace {workspace} keeps no data: it is the personal workspace of a generated token's identity, "
        "which nobody is charged for; write in the workspace the token was made for"
    )


def may_store(user: User, workspace: str) -> None:
    """:class:`PermissionDenied` with :func:`refusal_to_store`'s reason, if it has one."""
    refusal = refusal_to_store(user, workspace)
    if refusal is not None:
        raise PermissionDenied(refusal)


def lasts_only_while_connected(workspace: str) -> bool:
    """Whether ``workspace``'s data is freed when its last client leaves: an anonymous user's."""
    return workspace.startswith(_ANONYMOUS)


def value_limit(workspace: str, limit: int) -> int:
    """The most bytes one value may have in ``workspace``, where others may have ``limit``."""
    return limit // ANONYMOUS_SHARE if lasts_only_while_connected(workspace) else limit
