"""``--static-mounts``: directories served as static files, as Hypha's option.

``PATH:DIR`` (comma-separated for several; Hypha's ``<mountpath>:<localdir>``)
serves the files under ``DIR`` at ``/PATH/...``, and ``DIR/index.html`` at
``/PATH/``. ``PATH`` is one top-level segment that no route of the hub's own
uses; the hub's routes are matched first, so a workspace's
``/PATH/services/...`` and ``/PATH/info`` still reach the workspace.

Nothing outside ``DIR`` is served: Starlette's ``StaticFiles`` resolves every
requested path, symbolic links included, and refuses (404) one that ends
outside the directory (``..``, ``%2e%2e``, a link to ``/etc``).
"""

from __future__ import annotations

import os

from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from switchboard.config import parse_static_mounts
from switchboard.errors import ConfigError


def routes(spec: str) -> list[Mount]:
    """A route per mount; :class:`ConfigError` if a directory does not exist."""
    found = []
    for mount in parse_static_mounts(spec):
        if not os.path.isdir(mount.directory):
            raise ConfigError(f"static mount {mount.path}: {mount.directory!r} is not a directory")
        files = StaticFiles(directory=mount.directory, html=True)  # follow_symlink=False: links stay inside
        found.append(Mount(mount.path, app=files, name=f"static-mount{mount.path}"))
    return found
