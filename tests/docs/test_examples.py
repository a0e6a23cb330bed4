"""Every code example of README.md and docs/ runs, against a real hub, as a reader would run it.

Python and JavaScript examples run (``doc_examples.py`` says how); shell blocks are shown, not
run: they start servers, build images or need a cluster. One ``switchboard serve``
process serves every page.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_examples import JS_MODULES, PAGES, ROOT, fenced, run_page

from switchboard.testing.replica import ReplicaProcess

SHOWN_NOT_RUN = {"sh", "text", "json", "yaml"}
WITH_EXAMPLES = [page for page in PAGES if fenced(page)]


@pytest.fixture(scope="module")
def hub_url() -> Iterator[str]:
    """One ``switchboard serve`` for every page, killed at the end: its drain is not what these test."""
    hub = ReplicaProcess(replica_id="docs").start()
    try:
        yield hub.url
    finally:
        hub.kill()


def _need_node(page: Path) -> None:
    if any(language == "js" for _, language, _ in fenced(page)) and (
        shutil.which("node") is None or not (JS_MODULES / "hypha-rpc").exists()
    ):
        message = "JavaScript examples need node and .cache/js: run scripts/js-deps"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.mark.parametrize("page", WITH_EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_and_javascript_example_runs_against_a_hub(page: Path, hub_url: str) -> None:
    _need_node(page)
    run = run_page(page, hub_url)
    expected = [line for line, _, reason in fenced(page) if reason is None]
    assert run.ran == expected, "every example not marked 'not run' ran, in order"


def test_every_code_block_names_a_language_the_suite_runs_or_only_shows() -> None:
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```") and line.strip() != "```":
                language = line[3:].strip()
                assert language in SHOWN_NOT_RUN | {"python", "js"}, (
                    f"{page.relative_to(ROOT)}:{number}: ```{language} would be neither run nor known"
                )


def test_examples_not_run_say_why_and_are_few() -> None:
    skipped = [(page, line, reason) for page in PAGES for line, _, reason in fenced(page) if reason]
    assert all(len(reason) > 10 for _, _, reason in skipped)
    assert len(skipped) <= 1, skipped


@pytest.mark.parametrize(
    ("language", "broken"),
    [
        (
            "python",
            'from hypha_rpc import connect_to_server\n\nserver = await connect_to_server({"server_url": "http://127.0.0.1:9527"})\nawait server.get_service("no-such-service")\n',
        ),
        (
            "js",
            'import { hyphaWebsocketClient } from "hypha-rpc";\n\nconst server = await hyphaWebsocketClient.connectToServer({ server_url: "http://127.0.0.1:9527" });\nawait server.getService("no-such-service");\n',
        ),
    ],
)
def test_a_broken_example_fails_the_test(tmp_path: Path, hub_url: str, language: str, broken: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\n```{language}\n{broken}```\n")
    _need_node(page)
    with pytest.raises(Exception, match="no-such-service|exited"):
        run_page(page, hub_url)
