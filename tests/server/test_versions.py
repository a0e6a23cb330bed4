"""The server refuses to start on a uvicorn or websockets it was not tested with, and says why."""

from __future__ import annotations

import pytest

from switchboard.errors import UnsupportedServer
from switchboard.server.app import create_app
from switchboard.server.process import versions
from switchboard.server.runner import HubServer, uvicorn_config
from switchboard.testing.hub import settings_for_tests


def test_the_installed_versions_are_the_tested_ones() -> None:
    versions.check()  # the pins of pyproject.toml


@pytest.mark.parametrize(
    "installed",
    [
        {"uvicorn": "0.55.0", "websockets": "17.4"},
        {"uvicorn": "0.53.2", "websockets": "17.4"},
        {"uvicorn": "0.54.0", "websockets": "18.0"},
        {"uvicorn": "1.0.0rc1", "websockets": "17.4"},
    ],
)
def test_an_untested_release_is_refused_with_what_to_install(installed: dict[str, str]) -> None:
    with pytest.raises(UnsupportedServer) as refused:
        versions.check(installed)
    message = str(refused.value)
    name = next(n for n, v in installed.items() if v != {"uvicorn": "0.54.0", "websockets": "17.4"}[n])
    assert f"{name} {installed[name]} is not a version Switchboard was tested with" in message
    assert "pip install" in message


def test_patch_releases_of_a_tested_line_are_accepted() -> None:
    versions.check({"uvicorn": "0.54.3", "websockets": "17.9.1"})


def test_the_server_checks_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "installed", lambda: {"uvicorn": "0.99.0", "websockets": "17.4"})
    settings = settings_for_tests()
    app = create_app(settings)
    with pytest.raises(UnsupportedServer, match="uvicorn 0.99.0"):
        HubServer(uvicorn_config(app, settings), app.state.switchboard)
