"""Who may create a workspace record, and whom a record names as its owners (I/O-free).

The rules (docs/authorization.md, "Workspace records"):

- A config names the workspace by its ``id``, else by its ``name`` (:func:`workspace_id_in`).
- A name in the grammar users create in (:func:`anyone_may_create`) is free for any registered
  user while it has no record and nobody is in it; ``switchboard token`` hands out no such name,
  so no token grants rights in one before its record exists. Any other name (an operator's) needs
  ``admin`` there: the hub cannot enumerate the tokens handed out for it, so a grant is the proof.
- At creation the caller is the only owner: others a record names are *invited*, which grants
  nothing, until each accepts (``create_workspace({"id": ws}, overwrite=True)`` by the invited user).
- Only an owner changes whom a record names; an admin by grant may rewrite the rest of a record,
  never its owners, and does not become one (a time-limited grant stays time-limited).
- The record keeps who is accountable for it (``created_by``, the root of the creator's token
  chain): the per-user quota counts that, not the minted id of each generated token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from switchboard.errors import PermissionDenied, ProtocolError
from switchboard.hub.identity.users import Permission, User, user_workspace

# Hypha's rule for names a user creates: lowercase letters, digits and hyphens, with a hyphen
# (so a created name never looks like a service or a built-in one).
_CREATED_NAME = re.compile(r"[a-z0-9][a-z0-9-]*-[a-z0-9-]*")
CREATED_NAME_RULE = "only lowercase letters, numbers and hyphens, with at least one hyphen (e.g. my-workspace)"


def workspace_id_in(config: dict[str, Any]) -> str:
    """The id a ``create_workspace`` config names: its ``id``, else (as Hypha) its ``name``, used as
    it is (not lowercased), so the name is held to every rule an id is."""
    named = config.get("id")
    if named is None:
        named = config.get("name")
    if not isinstance(named, str):
        raise ProtocolError("Workspace id must be provided: create_workspace expects a config with an 'id' or a 'name'")
    if not named:
        raise ProtocolError("Workspace name must not be empty.")
    return named


def anyone_may_create(workspace: str) -> bool:
    """Whether ``workspace`` is in the grammar any registered user creates records in."""
    return _CREATED_NAME.fullmatch(workspace) is not None and not workspace.startswith("ws-user-")


def check_may_create(user: User, workspace: str, have: Permission, *, new: bool = True) -> None:
    """Refuse (with the reason) a caller who may not create ``workspace``'s record whatever it holds;
    ``have``: the caller's permission there (a grant, the admin role, ownership of the record);
    ``new``: no record exists (else who may rewrite it is :func:`naming_after`'s to say)."""
    if user.is_anonymous:
        raise PermissionDenied("Only registered user can create workspace.")
    if workspace.startswith("ws-user-") and workspace != user_workspace(user.id):
        raise PermissionDenied(f"Workspace {workspace} is the personal workspace of another user")
    if new and have < Permission.ADMIN and workspace != user_workspace(user.id) and not anyone_may_create(workspace):
        raise ProtocolError(
            f"Invalid workspace name: {workspace}: a name you create has {CREATED_NAME_RULE}; "
            "any other name is an operator's, and creating its record needs admin there"
        )


def record_payer(record: dict[str, Any]) -> object:
    """Who a record is counted against: its ``created_by``, else (an older record) its first owner."""
    if "created_by" in record:
        return record["created_by"]
    owners = record.get("owners")
    return owners[0] if isinstance(owners, list) and owners else None


@dataclass(frozen=True)
class Naming:
    """Whom a record names: its owners (admins there) and those invited (nothing until they accept)."""

    owners: list[str]
    invited: list[str]
    accepting: bool = False  # the caller only accepts an invitation: nothing else in the record changes


def naming_after(user: User, named: list[str] | None, existing: dict[str, Any] | None, *, admin: bool) -> Naming:
    """Whom the record names after ``user`` creates or overwrites it naming ``named`` (``None``: not given);
    ``admin``: the caller holds admin there. Refuses who may not overwrite ``existing``."""
    if existing is None:
        entries = _unique(named or [])
        own = [o for o in entries if user.named_in([o])] or [user.id]
        return Naming(own, [o for o in entries if not user.named_in([o])])
    owners = _unique(_entries(existing.get("owners")))
    invited = _unique(_entries(existing.get("invited")))
    if user.named_in(owners):
        if named is None:
            return Naming(owners, invited)
        entries = _unique(named)
        kept = [o for o in owners if o in entries or user.named_in([o])]  # an owner never drops itself
        return Naming(kept, [o for o in entries if o not in kept])
    mine = [o for o in invited if user.named_in([o])]
    if mine:
        return Naming(owners + mine[:1], [o for o in invited if o not in mine], accepting=True)
    if not admin:
        raise PermissionDenied(f"Permission denied: user {user.id} cannot overwrite workspace {existing.get('id')}")
    if named is not None and set(named) != set(owners):
        raise PermissionDenied(
            f"Permission denied: only an owner changes the owners of workspace {existing.get('id')}; "
            "an admin may change the rest of its record"
        )
    return Naming(owners, invited)


def _entries(value: object) -> list[str]:
    return [o for o in value if isinstance(o, str)] if isinstance(value, list) else []


def _unique(entries: list[str]) -> list[str]:
    return list(dict.fromkeys(entries))
