"""The hub's own tokens whose signature and claims were already checked, with the user each stands for.

Many clients of one deployment connect with the same token (a service's
workers, a fleet started from one script): its HMAC and claims were checked
on every connect, about a twentieth of a connect's CPU. A token is kept only
once it passed every check, keyed by its exact text, so a token that differs
by one byte is checked afresh. What can change while it is kept is not
remembered: expiry is compared with the clock on every use (by the issuer),
and revocations are read from the stores on every admission, as before.
Pure and bounded: the least recently used token goes first.
"""

from __future__ import annotations

from collections import OrderedDict

from switchboard.hub.identity.users import User

# Tokens kept at most: a few thousand distinct tokens in use at once cover the deployments that
# share tokens; each entry holds a token (under a kilobyte) and its user, about 2 MB in all.
SIZE = 2048


class VerifiedTokens:
    """A bounded map from a verified token's text to its :class:`User`."""

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._users: OrderedDict[str, User] = OrderedDict()

    def get(self, token: str) -> User | None:
        user = self._users.get(token)
        if user is not None:
            self._users.move_to_end(token)
        return user

    def put(self, token: str, user: User) -> None:
        self._users[token] = user
        self._users.move_to_end(token)
        if len(self._users) > self.size:
            self._users.popitem(last=False)

    def __contains__(self, token: object) -> bool:
        return token in self._users

    def __len__(self) -> int:
        return len(self._users)
