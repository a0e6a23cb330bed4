"""The reference pages name everything the code has: every HTTP route, metric, flag and variable."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from click.testing import CliRunner
from starlette.routing import Route, WebSocketRoute

from switchboard.backends.redis.cluster_status import ShardCollector
from switchboard.cli import main
from switchboard.server.app import build_hub, create_app
from switchboard.testing.hub import settings_for_tests

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


def documented(page: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", (REFERENCE / page).read_text()))


def test_every_http_route_is_in_the_http_reference() -> None:
    settings = settings_for_tests()
    app = create_app(settings, build_hub(settings))
    paths = {
        re.sub(r"\{(\w+):path\}", r"{\1}", route.path)
        for route in app.routes
        if isinstance(route, Route | WebSocketRoute)
    }
    assert paths - documented("http.md") == set()


def test_every_metric_is_in_the_metrics_reference() -> None:
    source = "\n".join(path.read_text() for path in (ROOT / "src").rglob("*.py"))
    context_vars = set(re.findall(r'ContextVar\[[^\]]*\]\s*=\s*ContextVar\(\s*"(switchboard_\w+)"', source))
    context_vars |= set(re.findall(r'ContextVar\(\s*"(switchboard_\w+)"', source))
    names = set(re.findall(r'"(switchboard_\w+)"', source)) - context_vars
    bus = SimpleNamespace(shard_report=lambda: [], replica_id="r", refreshes=0)
    names |= {family.name for family in ShardCollector(bus).collect()}  # type: ignore[arg-type]
    assert len(names) > 40
    assert names - documented("metrics.md") == set()


def test_every_flag_and_variable_is_in_the_settings_reference() -> None:
    page = (REFERENCE / "settings.md").read_text()
    help_text = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200).output
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", help_text)) - {"--help"}
    variables = set(re.findall(r"SWITCHBOARD_[A-Z_]+", "\n".join(p.read_text() for p in (ROOT / "src").rglob("*.py"))))
    assert len(flags) > 40
    assert {f for f in flags if f not in page} == set()
    assert {v for v in variables if v not in page} == set()
