"""`/metrics` over real HTTP: the server `sparktop collect --serve-metrics` starts (a task beside the
poller), scraped as Prometheus scrapes it (aiohttp's client, a bearer token where one is set), on a state
a recorded session filled and that goes on changing while it serves."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from sparktop.errors import SparktopError
from sparktop.history.exporter import MetricsServer, serve_metrics, start_metrics
from sparktop.observe.record import Recording
from sparktop.observe.state import ClusterState
from tests.conftest import free_port

RECORDING = Path(__file__).parent.parent / "fixtures" / "recording-engines-2.jsonl"
TOKEN = "a-token-of-the-right-length-0123"


@pytest.fixture
def state() -> ClusterState:
    state = ClusterState()
    for _, event in Recording.load(RECORDING).rows:
        state.apply(event)
    return state


@contextlib.asynccontextmanager
async def serving(state: ClusterState, token: str | None = None) -> AsyncIterator[MetricsServer]:
    """`serve_metrics` as `sparktop collect` runs it: a task, cancelled at the end."""
    ready: asyncio.Future[MetricsServer] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve_metrics(state, "127.0.0.1", free_port(), token, started=ready.set_result))
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # it failed to start: raise why
    try:
        yield ready.result()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"no {name}{labels}")


async def test_metrics_are_served_on_loopback_without_a_token_and_follow_the_state(state):
    async with serving(state) as server, aiohttp.ClientSession() as http:
        async with http.get(server.url) as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == CONTENT_TYPE_LATEST
            text = await r.text()
        mem = state.nodes["spark-a"].memory
        assert mem is not None
        assert sample(text, "sparktop_node_memory_available_bytes", node="spark-a") == mem.available
        assert sample(text, "sparktop_engine_kv_cache_usage_ratio",
                      engine="http://127.0.0.2:8000") == state.engines["http://127.0.0.2:8000"].kv_usage
        # The collector polls on in the same loop: the next scrape sees the next snapshot.
        later = copy.deepcopy(state.nodes["spark-a"])
        later.t += 1
        assert later.memory is not None
        later.memory.available -= 2**30
        state.apply(later)
        async with http.get(server.url) as r:
            again = await r.text()
        assert sample(again, "sparktop_node_memory_available_bytes", node="spark-a") == mem.available - 2**30
        # A scraper asking for OpenMetrics gets it.
        async with http.get(server.url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("application/openmetrics-text")
            assert (await r.text()).rstrip().endswith("# EOF")
    # Cancelled, it let go of its port.
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", server.port))


async def test_with_a_token_a_scrape_without_it_is_refused_and_a_bearer_token_is_let_in(state, caplog):
    async with serving(state, TOKEN) as server, aiohttp.ClientSession() as http:
        with caplog.at_level(logging.WARNING, logger="sparktop.history.exporter"):
            async with http.get(server.url) as r:
                assert r.status == 401
                assert r.headers["WWW-Authenticate"].startswith("Bearer")
                body = await r.text()
                assert "token" in body and "Bearer" in body and TOKEN not in body
            async with http.get(server.url, headers={"Authorization": "Bearer not-the-token"}) as r:
                assert r.status == 401
            async with http.get(server.url, params={"token": "a-wrong-guess"}) as r:
                assert r.status == 401
        # Refusals are logged by path: never a query, where a token may be.
        assert "refused GET /metrics" in caplog.text and "a-wrong-guess" not in caplog.text
        async with http.get(server.url, headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 200 and r.headers["Content-Type"] == CONTENT_TYPE_LATEST
            assert sample(await r.text(), "sparktop_node_up", node="spark-b") == 1
        async with http.get(server.url, params={"token": TOKEN}) as r:
            assert r.status == 200


async def test_an_address_other_machines_reach_is_refused_without_a_long_enough_token(state):
    with pytest.raises(SparktopError) as raised:
        await serve_metrics(state, "0.0.0.0", free_port(), None)
    message = str(raised.value)
    assert message.startswith("--serve-metrics 0.0.0.0: not a loopback address") and "SPARKTOP_METRICS_TOKEN" in message
    with pytest.raises(SparktopError, match="too few"):
        await serve_metrics(state, "0.0.0.0", free_port(), "short")


async def test_a_port_in_use_is_a_clear_error(state):
    first = await start_metrics(state, "127.0.0.1", free_port(), None)
    try:
        with pytest.raises(SparktopError, match=rf"--serve-metrics: cannot listen on 127.0.0.1:{first.port}"):
            await start_metrics(state, "127.0.0.1", first.port, None)
    finally:
        await first.close()
