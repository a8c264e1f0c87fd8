"""The one way long-running core operations report progress.

A poll, a launch, a sweep and a study each run as a coroutine and hand
their progress out as an async iterator of small frozen dataclasses (one
`Union` per domain: `observe.snapshot.ObserveEvent`, `launch.events.
LaunchEvent`, `bench.events.SweepEvent`). The CLI prints them, the app
turns each into a Textual message in one adapter (`ui/bridge.py`), tests
collect them. Nothing here knows about screens.

`emitting(work)` is the plumbing they share: `work` gets an `emit`
function, runs as a task, and every event it emits comes out of the
iterator in order. When the work ends the iterator drains what is left and
ends too (re-raising the work's exception, if any); when the consumer
stops iterating (or is cancelled) the work is cancelled with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

E = TypeVar("E")
R = TypeVar("R")


class Outcome:
    """What the work returned, readable once the iterator has ended."""

    def __init__(self) -> None:
        self.value: object = None
        self.done = False


async def emitting(work: Callable[[Callable[[E], None]], Coroutine[Any, Any, R]],
                   outcome: Outcome | None = None) -> AsyncIterator[E]:
    queue: asyncio.Queue[E] = asyncio.Queue()
    runner: asyncio.Task[R] = asyncio.create_task(work(queue.put_nowait))
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, runner}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                yield getter.result()
                continue
            getter.cancel()
            while not queue.empty():
                yield queue.get_nowait()
            value = runner.result()  # re-raises the work's exception
            if outcome is not None:
                outcome.value, outcome.done = value, True
            return
    finally:
        if not runner.done():
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
