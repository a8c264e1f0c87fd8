"""Waiting in async tests for what should happen, instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(predicate: Callable[[], object], timeout: float = 15.0, step: float = 0.05,
                     what: str = "condition") -> None:
    """Return as soon as `predicate()` is true; fail after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met within {timeout:g}s")
        await asyncio.sleep(step)
