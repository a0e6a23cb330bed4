"""Run the code examples of a markdown page as a reader would: against a real hub.

Sybil finds the fenced blocks; this module says how each language runs:

- ``python``: in one namespace per page, so a later block uses what an earlier one made,
  in a process of the page's own (``python_examples.py``), with top-level ``await``;
- ``js``: each block as an ES module in Node, with the npm packages ``scripts/js-deps``
  installed (``hypha-rpc``, and ``ws`` as ``globalThis.WebSocket``, which Node 20 lacks);
- every other language (``sh``, ``text``, ...) is shown, not run.

The hub the examples name, ``http://127.0.0.1:9527``, is swapped for the test's hub: a
``switchboard serve`` process, as the reader's would be.
A block preceded by ``<!-- example: not run (REASON) -->`` is skipped; the test lists them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser

from switchboard.testing.wait import scaled, time_scale

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
DOCUMENTED_URL = "http://127.0.0.1:9527"
JS_MODULES = ROOT / ".cache" / "js" / "node_modules"
NOT_RUN = re.compile(r"<!-- example: not run \((?P<reason>[^)]+)\) -->\s*$")
BLOCK_SECONDS = 20.0


def shown(page: Path) -> str:
    """The page's path as the reader knows it: from the repository's root."""
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def fenced(page: Path, languages: tuple[str, ...] = ("python", "js")) -> list[tuple[int, str, str | None]]:
    """(line, language, reason not run or None) of every block of ``languages`` on the page."""
    lines = page.read_text().splitlines()
    found = []
    for number, line in enumerate(lines):
        language = line[3:].strip() if line.startswith("```") else ""
        if language in languages:
            before = next((lines[i] for i in range(number - 1, -1, -1) if lines[i].strip()), "")
            skip = NOT_RUN.search(before)
            found.append((number + 1, language, skip.group("reason") if skip else None))
    return found


class PageRun:
    """The examples of one page, in order, against ``hub``."""

    def __init__(self, page: Path, hub_url: str, workdir: Path) -> None:
        self.page = page
        self.hub_url = hub_url
        self.workdir = workdir
        self.skipped = {line for line, _, reason in fenced(page) if reason}
        self.ran: list[int] = []
        self.python_blocks: list[dict[str, str]] = []

    def code(self, example: Example) -> str:
        return str(example.parsed).replace(DOCUMENTED_URL, self.hub_url)

    def python(self, example: Example) -> None:
        """Kept for :meth:`run_python`: a page's Python blocks share one namespace and one process."""
        if self._skip(example):
            return
        self.python_blocks.append({"where": f"{shown(self.page)}:{example.line}", "code": self.code(example)})

    def run_python(self) -> None:
        if not self.python_blocks:
            return
        blocks = self.workdir / "python_blocks.json"
        blocks.write_text(json.dumps(self.python_blocks))
        done = subprocess.run(
            [sys.executable, str(HERE / "python_examples.py"), str(blocks), str(time_scale())],
            capture_output=True,
            text=True,
            timeout=scaled(BLOCK_SECONDS) * len(self.python_blocks),
            check=False,
        )
        assert done.returncode == 0, f"{shown(self.page)}: a Python example failed\n{done.stdout}\n{done.stderr}"
        ran = [line.removeprefix("RAN ") for line in done.stdout.splitlines() if line.startswith("RAN ")]
        assert ran == [block["where"] for block in self.python_blocks], done.stdout

    def js(self, example: Example) -> None:
        if self._skip(example):
            return
        module = self.workdir / f"example_{example.line}.mjs"
        module.write_text(self.code(example))
        done = subprocess.run(
            ["node", "--import", "./websocket.mjs", module.name],
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=scaled(BLOCK_SECONDS),
            check=False,
        )
        assert done.returncode == 0, (
            f"{shown(self.page)}:{example.line} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        )

    def _skip(self, example: Example) -> bool:
        if example.line in self.skipped:
            return True
        self.ran.append(example.line)
        return False


@contextlib.contextmanager
def node_workdir() -> Iterator[Path]:
    """A directory where ``import ... from "hypha-rpc"`` resolves, with a WebSocket for Node 20."""
    with tempfile.TemporaryDirectory(prefix="sb-docs-js-") as name:
        workdir = Path(name)
        os.symlink(JS_MODULES, workdir / "node_modules")
        (workdir / "websocket.mjs").write_text('import WebSocket from "ws";\nglobalThis.WebSocket ??= WebSocket;\n')
        yield workdir


def run_page(page: Path, hub_url: str) -> PageRun:
    """Run every python and js example of ``page`` against the hub at ``hub_url``."""
    with node_workdir() as workdir:
        run = PageRun(page, hub_url, workdir)
        parsers = [
            CodeBlockParser(language="python", evaluator=run.python),
            CodeBlockParser(language="js", evaluator=run.js),
        ]
        for example in Sybil(parsers=parsers).parse(page).examples():
            example.evaluate()
        run.run_python()
    return run
