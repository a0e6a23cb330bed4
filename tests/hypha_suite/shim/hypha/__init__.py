"""A stand-in for the ``hypha`` package, for ``scripts/hypha-suite`` only.

Hypha's tests import a few of its server's names: the token helpers the
suite mints its users' tokens with (:mod:`hypha.core.auth`, minting the same
claims with Switchboard's own issuer), and some of Hypha's server classes the
tests of its internals use. Those are placeholders that refuse to be used,
so those tests fail saying why instead of the whole file failing to import.
"""

from __future__ import annotations

from typing import Any


class HyphaInternals(NotImplementedError):
    """A test used a part of Hypha's server code, which no hub provides."""


def internal(name: str) -> type:
    """A placeholder for Hypha's server class ``name``: importing it works, using it raises."""

    class Placeholder:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise HyphaInternals(f"{name} is Hypha's server code, not part of a hub (scripts/hypha-suite)")

        def __class_getitem__(cls, item: Any) -> Any:
            return cls

    Placeholder.__name__ = Placeholder.__qualname__ = name.rsplit(".", 1)[-1]
    return Placeholder
