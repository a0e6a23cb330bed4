"""The id grammar: what a client id, a workspace name or a service name may hold.

Ids travel into token scopes (space- and ``#``-separated), Redis keys and
channels (``sb:client:<ws>/<cid>``) and full service ids
(``<ws>/<cid>:<svc>@<app>``). A separator smuggled into one of them would
change what the string means to whoever splits it again, so every id a
client supplies is checked here before it goes anywhere.
"""

from __future__ import annotations

import re
from typing import TypeGuard

from switchboard.errors import ProtocolError

MAX_ID_LENGTH = 128
# letters, digits and '_', '-', '|', '.': no space, '/', ':', '@', '#', '*' or anything else
_ID = re.compile(r"[A-Za-z0-9_\-|.]{1,128}")
GRAMMAR = "letters, digits, '_', '-', '|' and '.', at most 128"

MANAGER_PREFIX = "manager-"  # the hub's manager is the client "manager-<server id>" in every workspace
CLIENT_CHANNEL = "sb:client:"  # + "<workspace>/<client id>": the channel of the replica holding the client


def manager_id(server_id: str) -> str:
    """The client id of the hub's manager, as clients see it: ``manager-<server id>``."""
    return MANAGER_PREFIX + server_id


def is_id(value: object) -> TypeGuard[str]:
    """Does ``value`` follow the grammar of client ids, workspaces and service names?"""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def check_id(value: object, what: str) -> str:
    """``value`` if it is a valid id, else a :class:`ProtocolError` naming ``what``."""
    if not is_id(value):
        shown = value[:64] if isinstance(value, str) else type(value).__name__
        raise ProtocolError(f"invalid {what} {shown!r}: use {GRAMMAR}")
    return value
