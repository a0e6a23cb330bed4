"""The protocol's async tests run their event loop in asyncio's debug mode (tests/support/debug_loop.py)."""

from support.debug_loop import asyncio_debug, debug_loop

__all__ = ["asyncio_debug", "debug_loop"]
