"""The README and the settings reference state what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from switchboard.config import settings_table

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SETTINGS = ROOT / "docs" / "reference" / "settings.md"


def test_the_settings_reference_table_matches_the_settings():
    text = SETTINGS.read_text()
    table = re.search(r"<!-- settings-table:start -->\n(.*?)\n<!-- settings-table:end -->", text, re.S)
    assert table, "docs/reference/settings.md lost its settings table markers"
    assert table.group(1) == settings_table(), "regenerate with: python -m switchboard.config"


def test_quick_start_is_exactly_two_commands():
    text = README.read_text()
    block = re.search(r"## Quick start\n\n```sh\n(.*?)```", text, re.S)
    assert block
    commands = [line for line in block.group(1).splitlines() if line.strip()]
    assert [c.split()[0] for c in commands] == ["scripts/serve", "scripts/test"]
