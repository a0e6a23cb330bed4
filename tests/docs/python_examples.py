"""Run a page's Python examples in order, in one namespace, as a reader's ``python -m asyncio`` would.

``python python_examples.py BLOCKS.json``: a list of ``{"where": "page.md:12", "code": "..."}``.
Top-level ``await`` works, on one event loop for the page; a block that calls ``asyncio.run``
itself runs as it is. Prints ``RAN page.md:12`` after each block; the first that raises
stops the run with its traceback and exit status 1. A process of its own, so that what
the examples start (clients, threads, event loops) ends with it and never touches the tests'.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import sys
import traceback

BLOCK_SECONDS = 20.0


def main(blocks_file: str, scale: float) -> int:
    with open(blocks_file) as file:
        blocks = json.load(file)
    namespace: dict[str, object] = {"__name__": "__main__"}
    loop = asyncio.new_event_loop()
    try:
        for block in blocks:
            compiled = compile(block["code"], block["where"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            try:
                result = eval(compiled, namespace)  # the docs' own example, run as its reader would
                if inspect.iscoroutine(result):
                    loop.run_until_complete(asyncio.wait_for(result, BLOCK_SECONDS * scale))
            except BaseException:
                print(f"FAILED {block['where']}\n{traceback.format_exc()}", flush=True)
                return 1
            print(f"RAN {block['where']}", flush=True)
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
