"""The monitor as a user drives it: Pilot presses the keys and the test reads
what the cards show. Backed by a two-node twin cluster under load."""

from __future__ import annotations

import io

import pytest

from sparktop.observe.poller import EngineTarget, Poller
from sparktop.twin.dialects.vllm_args import parse_serve_args
from sparktop.twin.server import TwinServer
from sparktop.ui.app import SparktopApp
from sparktop.ui.cards import EngineCard, NodeCard
from sparktop.ui.screens import DetailScreen, HelpScreen, MonitorScreen
from tests.conftest import free_port
from tests.helpers.cluster import load, poller_for, start_cluster
from tests.helpers.monitor_sim import PollCounter
from tests.helpers.pilot import until

pytestmark = pytest.mark.slow


def cards(app, cls) -> list:
    return list(app.screen.query(cls))


@pytest.fixture
async def cluster(tmp_path):
    c, urls = await start_cluster(tmp_path / "lab")
    c.urls = urls
    yield c
    await c.stop_all()


async def test_shows_both_nodes_memory_and_both_engines_kv_and_tokens(cluster):
    poller = poller_for(cluster)
    await poller.start()
    app = SparktopApp(poller)
    try:
        async with load(cluster.urls), app.run_test(size=(80, 24)) as pilot:
            def live():
                engines = cards(app, EngineCard)
                return (len(cards(app, NodeCard)) == 2 and len(engines) == 2
                        and all("gen " in c.text and " t/s" in c.text and "gen — t/s" not in c.text
                                and "gen 0.0 t/s" not in c.text for c in engines))
            await until(pilot, live, timeout=20)
            nodes = {c.key: c.text for c in cards(app, NodeCard)}
            engines = [c.text for c in cards(app, EngineCard)]
    finally:
        await poller.close()
    assert set(nodes) == {"spark-a", "spark-b"}
    for text in nodes.values():
        assert "/119.6G" in text and "● ok" in text  # GB10 unified memory, used/total
        assert "gpu" in text and "%" in text
    for text in engines:
        assert text.startswith("llama-3.1-8b · solo") and "● ready" in text
        assert "KV " in text and "%" in text


async def test_pause_and_interval_keys(cluster, monkeypatch):
    polls = PollCounter(monkeypatch)  # every node and engine poll started, and those under way
    poller = poller_for(cluster, interval=1.0)
    await poller.start()
    app = SparktopApp(poller)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: len(app.state.nodes) == 2)
            await pilot.press("p")
            assert poller.paused and "PAUSED" in app.status_text().plain
            # The polls under way when it was paused land; then none starts. Two intervals is when every
            # target's next poll was due: a poller that had not paused would have started them.
            await until(pilot, lambda: polls.in_flight == 0, what="the polls under way at the pause landing")
            started = polls.started
            await pilot.pause(2 * poller.interval)
            assert polls.started == started, f"{polls.started - started} polls started while paused"
            frozen = app.state.version
            await pilot.press("p")
            assert not poller.paused
            await until(pilot, lambda: polls.started > started and app.state.version > frozen,
                        what="polls again once resumed")
            await pilot.press("plus")
            assert poller.interval == 0.5 and "every 0.5s" in app.status_text().plain
            await pilot.press("minus")
            await pilot.press("minus")
            assert poller.interval == 2.0
    finally:
        await poller.close()


async def twin_on(port: int) -> TwinServer:
    server = TwinServer(parse_serve_args(["llama-3.1-8b", "--host", "127.0.0.1", "--port", str(port),
                                          "--startup-speed", "1e6", "--speed", "4"]), log=io.StringIO())
    await server.start()
    return server


async def test_a_killed_engine_shows_unreachable_and_returns_when_restarted():
    port = free_port()
    server = await twin_on(port)
    url = f"http://127.0.0.1:{port}"
    poller = Poller([], [EngineTarget(url)], interval=0.3, down_after=3.0, default_port=None)
    await poller.start()
    app = SparktopApp(poller)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            card = lambda: next(iter(cards(app, EngineCard)), None)  # noqa: E731
            await until(pilot, lambda: card() is not None and "● ready" in card().text)
            await server.stop()
            await until(pilot, lambda: "● unreachable" in card().text, timeout=30)
            assert "connection refused" in card().text
            assert app.is_running  # the app carries on
            server = await twin_on(port)
            await until(pilot, lambda: "● ready" in card().text, timeout=30)
    finally:
        await poller.close()
        await server.stop()


async def test_enter_opens_the_detail_charts_and_escape_returns(cluster):
    poller = poller_for(cluster)
    await poller.start()
    app = SparktopApp(poller)
    try:
        async with app.run_test(size=(100, 40)) as pilot:
            await until(pilot, lambda: len(cards(app, EngineCard)) == 2 and len(app.state.engine_history) == 2)
            engine = cards(app, EngineCard)[0]
            engine.focus()
            await pilot.press("enter")
            assert isinstance(app.screen, DetailScreen) and app.screen.key == engine.key

            def charts() -> str:
                return str(app.screen.query_one("#charts").content)

            await until(pilot, lambda: all(t in charts() for t in ("tokens/s", "KV cache", "latency")),
                        what=lambda: f"the detail charts drawn: {charts()!r}")
            await pilot.press("escape")
            assert isinstance(app.screen, MonitorScreen)
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            await pilot.press("l")  # an app with no nodes to launch on says so and stays
            await until(pilot, lambda: any("Launching needs live nodes" in n.message for n in app._notifications),
                        what="the notice that launching needs live nodes")
            assert isinstance(app.screen, MonitorScreen)
    finally:
        await poller.close()


async def test_a_crashed_engine_container_stays_on_screen_with_the_reason(cluster):
    a = cluster.nodes[0]
    poller = poller_for(cluster, interval=0.3)
    await poller.start()
    app = SparktopApp(poller)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: len(cards(app, EngineCard)) == 2)
            # Kill the engine process inside the container: the container exits.
            r = await a.transport().run("docker inspect --format '{{.State.Pid}}' sparktop-vllm")
            import os
            import signal
            os.killpg(int(r.stdout.strip()), signal.SIGKILL)
            key = f"http://{a.address}:{cluster.port_for(0, 8000)}"
            card = lambda: next(c for c in cards(app, EngineCard) if c.key == key)  # noqa: E731
            # Refused twice marks it at once; on a busy machine down_after (10 s) may come first.
            await until(pilot, lambda: "● unreachable" in card().text, timeout=20)
            # The container's state comes with the host poll that follows the refusal.
            await until(pilot, lambda: "exited" in card().text, timeout=10)
    finally:
        await poller.close()
