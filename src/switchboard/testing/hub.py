"""An in-process hub for tests: settings that suit a test, and the server in the test's loop."""

from __future__ import annotations

import tempfile
from typing import Any

from switchboard.config import Settings
from switchboard.server.runner import RunningServer, running

TEST_SECRET = "test-secret-please-ignore-0123456789"


def settings_for_tests(**overrides: Any) -> Settings:
    """Loopback, a free port, a fixed token secret; any setting can be overridden.

    Without a secret the hub keeps one in a fresh temporary state directory,
    never in the user's own.
    """
    values: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "jwt_secret": TEST_SECRET}
    values.update(overrides)
    if not values["jwt_secret"] and not values.get("state_dir"):
        values["state_dir"] = tempfile.mkdtemp(prefix="sb-state-")
    return Settings(**values)


__all__ = ["TEST_SECRET", "RunningServer", "running", "settings_for_tests"]
