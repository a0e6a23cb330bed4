"""The README states what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from switchboard.config import settings_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_settings_table_matches_the_settings():
    text = README.read_text()
    table = re.search(r"<!-- settings-table:start -->\n(.*?)\n<!-- settings-table:end -->", text, re.S)
    assert table, "README lost its settings table markers"
    assert table.group(1) == settings_table(), "regenerate with: python -m switchboard.config"


def test_quick_start_is_exactly_two_commands():
    text = README.read_text()
    block = re.search(r"## Quick start\n\n```sh\n(.*?)```", text, re.S)
    assert block
    commands = [line for line in block.group(1).splitlines() if line.strip()]
    assert [c.split()[0] for c in commands] == ["scripts/serve", "scripts/test"]
