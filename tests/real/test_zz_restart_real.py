"""The event log on a real vLLM: killed and started again on the same port,
the engine is down, then back, then restarted (its counters' creation time
moved), in that order. Runs last in this package (it restarts the shared
server, which takes a minute on two cores)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest

from sparktop.observe.poller import EngineTarget, Poller
from sparktop.observe.snapshot import EngineSnapshot, Notice
from sparktop.observe.state import ClusterState
from tests.helpers import real_vllm

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]


async def test_a_real_engine_killed_and_started_again_is_down_back_restarted(vllm_server):
    """The real vLLM killed and started again: one more start-up of 20-40 s on two cores."""
    if vllm_server.proc is None:
        pytest.fail("this test restarts the server: run it on one the tests started, not SPARKTOP_TEST_VLLM's")
    poller = Poller([], [EngineTarget(vllm_server.url)], interval=0.5, down_after=5, default_port=None)
    state = ClusterState()
    await poller.start()

    async def until(check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async def consume():
            async for event in poller.events():
                state.apply(event)
                if check(event):
                    return
        await asyncio.wait_for(consume(), max(0.1, deadline - time.monotonic()))

    try:
        await until(lambda e: isinstance(e, EngineSnapshot) and e.state == "ready" and e.started_at, 30)
        before = state.engines[vllm_server.url].started_at
        with contextlib.suppress(ProcessLookupError):
            os.killpg(vllm_server.proc.pid, signal.SIGKILL)
        vllm_server.proc.wait(30)
        await until(lambda e: isinstance(e, Notice) and e.kind == "down", 20)
        port = int(vllm_server.url.rsplit(":", 1)[1])
        again = await asyncio.to_thread(real_vllm.start, vllm_server.model.parent, port=port)
        vllm_server.proc, vllm_server.log = again.proc, again.log  # the fixture stops this one at the end
        await until(lambda e: isinstance(e, Notice) and e.kind == "restarted", 60)
    finally:
        await poller.close()
    log = state.log(vllm_server.url)
    assert [n.kind for n in log] == ["down", "back", "restarted"], [n.text for n in log]
    assert state.engines[vllm_server.url].started_at > before
