"""Tests on simulated time: an in-process twin and the client that measures
it share one virtual-time event loop (`looptime`), and both read that loop's
clock (`sparktop.clock.loop_clock`). A step the twin's model says takes
42.6 ms takes 42.6 ms of the loop's time and none of this machine's, the
sweep stamps every chunk on the same clock, and so every figure is what the
model computes, exactly, however busy the machine is.

Mark the test `@simulated` and start the twin inside the test body:
looptime compacts time only while the test itself runs, not its fixtures.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator

import pytest

from sparktop.clock import Clock, loop_clock
from sparktop.twin.dialects.vllm_args import parse_serve_args
from sparktop.twin.server import TwinServer

simulated = pytest.mark.looptime


def sim_clock() -> Clock:
    """The running loop's clock; the test must be marked `@simulated`."""
    loop = asyncio.get_running_loop()
    assert getattr(loop, "looptime_on", False), "mark the test @simulated: its loop is not on virtual time"
    return loop_clock(loop)


@contextlib.asynccontextmanager
async def sim_twin(model: str = "gpt-oss-120b", *flags: str, speed: float = 1.0,
                   clock: Clock | None = None, environ: dict[str, str] | None = None) -> AsyncIterator[TwinServer]:
    """A started in-process twin serving `model` on the loop's virtual clock
    (start-up takes no simulated time worth waiting for); stopped after."""
    args = parse_serve_args([model, "--host", "127.0.0.1", "--port", "0", "--speed", str(speed),
                             "--startup-speed", "1e6", *flags])
    # environ: what its container would set (twin/containers.py: SPARKTOP_TWIN_IMAGE, SPARKTOP_TWIN_LABELS)
    server = TwinServer(args, log=io.StringIO(), clock=clock or sim_clock(), environ=environ or {})
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
