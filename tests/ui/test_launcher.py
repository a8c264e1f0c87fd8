"""The launcher as a user drives it, on two simulated Sparks: `l`, pick a
recipe, read the plan and preflight, Enter, watch it start, see the engine
in the monitor, `x` to stop it. Also what must not launch, and a launch
that fails at startup."""

from __future__ import annotations

import os
from functools import partial

import httpx
import pytest
from textual.widgets import DataTable, Input, Static

from sparktop.launch.state import api_key_for
from sparktop.observe.poller import NodeTarget, Poller
from sparktop.twin.cluster import loopback_aliases_work
from sparktop.ui.app import SparktopApp
from sparktop.ui.launcher import ConfirmStop, LaunchScreen, ProgressScreen, StopScreen
from sparktop.ui.screens import MonitorScreen
from tests.conftest import free_port
from tests.helpers.pilot import open_launcher
from tests.helpers.pilot import until as _until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not loopback_aliases_work(), reason="needs 127.0.0.2 and 127.0.0.3")]



until = partial(_until, timeout=30.0)  # launches take longer than a repaint


def app_for(cluster) -> tuple[SparktopApp, Poller]:
    poller = Poller([NodeTarget(n.name, n.transport(), n.address) for n in cluster.nodes], interval=0.5,
                    default_port=None, router_key=api_key_for)

    async def start():
        await poller.start()
        return poller

    return SparktopApp(start_source=start, inventory=cluster.inventory(), launch_timeout=60), poller


async def type_into(pilot, screen, widget_id: str, text: str) -> None:
    screen.query_one(f"#{widget_id}", Input).focus()
    await pilot.press(*list(text))
    screen.query_one("#recipes", DataTable).focus()


def preflight_done(screen) -> bool:
    return screen.plan is not None and screen.preflight_for == screen.plan.render()


def notes(app) -> list[str]:
    return [f"{n.title}: {n.message}" for n in app._notifications]


def containers(cluster, node: int = 0) -> list[str]:
    import subprocess

    env = {**os.environ, **cluster.nodes[node].env}
    out = subprocess.run(["sh", "-c", "docker ps -a --format '{{.Names}}'"], capture_output=True, text=True,
                         env=env).stdout
    return [line for line in out.splitlines() if line]


async def test_launch_watch_and_stop_from_the_app(cluster):
    app, poller = app_for(cluster)
    port = free_port("127.0.0.2")
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: len(app.state.nodes) == 2)
        screen = await open_launcher(pilot, "llama-3.1-8b")
        await type_into(pilot, screen, "port", str(port))
        await until(pilot, lambda: preflight_done(screen))

        # The plan on screen is the one that will run; preflight passed on the node it runs on.
        plan_text = str(screen.query_one("#plan", Static).content)
        assert f"--port {port}" in plan_text and "docker run -d --name sparktop-llama-3.1-8b-solo-" in plan_text
        assert screen.preflight.ok
        assert {c.name for c in screen.preflight.checks} >= {"reachable", "memory", "fit", "image", "ports"}

        await pilot.press("enter")  # on the recipe list: launch what the plan shows
        await until(pilot, lambda: isinstance(app.screen, ProgressScreen))
        progress = app.screen
        await until(pilot, lambda: progress.run.status != "running", timeout=60)
        assert progress.run.status == "ready", progress.run.reason
        await pilot.pause(0.5)
        outcome = str(progress.query_one("#outcome", Static).content)
        assert "ready in" in outcome and f"http://127.0.0.2:{port}/v1" in outcome
        steps = str(progress.query_one("#steps", Static).content)
        assert "✓ 1. start vLLM (llama-3.1-8b, TP=1) on spark-a" in steps and "vllm: ready" in steps
        assert progress.query_one("#log").lines  # the container log streamed in

        answer = httpx.post(f"http://127.0.0.2:{port}/v1/chat/completions", timeout=30, json={
            "model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert answer.status_code == 200

        await pilot.press("escape")
        assert isinstance(app.screen, MonitorScreen)
        url = f"http://127.0.0.2:{port}"
        await until(pilot, lambda: url in app.state.engines and app.state.engines[url].state == "ready")
        assert app.state.engines[url].topology == "solo"

        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, StopScreen))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmStop))
        await pilot.press("y")
        await until(pilot, lambda: any(n.startswith("Stop: stopped llama-3.1-8b-solo-") for n in notes(app)))
        assert containers(cluster) == []
        await until(pilot, lambda: url not in app.state.engines)
        assert app.launcher.active() == []
    await poller.close()


async def test_bad_overrides_and_failed_preflight_do_not_launch(cluster):
    app, poller = app_for(cluster)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: len(app.state.nodes) == 2)
        screen = await open_launcher(pilot, "llama-3.1-8b")
        await type_into(pilot, screen, "gpu_memory_utilization", "1.7")
        await until(pilot, lambda: screen.error is not None)
        assert "gpu_memory_utilization must be between 0 and 1, got 1.7" in str(
            screen.query_one("#plan", Static).content)
        await pilot.press("enter")
        assert isinstance(app.screen, LaunchScreen) and app.launcher.run is None
        assert any("cannot launch" in n and "between 0 and 1" in n for n in notes(app))

        # A 70B model in 0.5 of a Spark: the weights do not fit, preflight says so, nothing starts.
        screen.query_one("#gpu_memory_utilization", Input).value = ""
        table = screen.query_one("#recipes", DataTable)
        rows = [row.key.value for row in table.ordered_rows]
        table.move_cursor(row=rows.index("llama-3.1-70b"))
        await until(pilot, lambda: screen.recipe.id == "llama-3.1-70b")
        await type_into(pilot, screen, "gpu_memory_utilization", "0.5")
        await until(pilot, lambda: preflight_done(screen) and screen.plan.flags.get("gpu_memory_utilization") == 0.5)
        assert not screen.preflight.ok
        fit = [c for c in screen.preflight.checks if c.name == "fit"][0]
        assert fit.status == "fail" and "do not fit" in fit.message
        assert "[FAIL]" in str(screen.query_one("#preflight", Static).content)
        await pilot.press("enter")
        assert isinstance(app.screen, LaunchScreen) and app.launcher.run is None
        assert any(n.startswith("preflight failed: spark-a: fit:") for n in notes(app))
    await poller.close()
    assert containers(cluster) == []


async def test_a_launch_that_fails_at_startup_shows_why_and_leaves_nothing(cluster):
    app, poller = app_for(cluster)
    port = free_port("127.0.0.2")
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: len(app.state.nodes) == 2)
        screen = await open_launcher(pilot, "llama-3.1-8b")
        await type_into(pilot, screen, "port", str(port))
        await type_into(pilot, screen, "gpu_memory_utilization", "0.8")
        await until(pilot, lambda: preflight_done(screen) and screen.plan.flags.get("gpu_memory_utilization") == 0.8)
        assert screen.preflight.ok
        # Between the check and the launch, something else takes 60 GiB of spark-a's memory.
        cluster.nodes[0].host.register(os.getpid(), "python3", 60 * 1024)
        try:
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ProgressScreen))
            progress = app.screen
            await until(pilot, lambda: progress.run.status != "running" and progress.run.removed is not None,
                        timeout=60)
            await pilot.pause(0.5)
        finally:
            cluster.nodes[0].host.unregister(os.getpid())
        assert progress.run.status == "failed"
        outcome = str(progress.query_one("#outcome", Static).content)
        assert "launch failed:" in outcome and "exited with code 1" in outcome
        assert "Free memory on device" in outcome  # vLLM's own words, from the container log
        assert "removed 1 container(s) on spark-a" in outcome
        assert containers(cluster) == []

        # Back on the monitor the status line keeps the failure until it has been seen; it has.
        await pilot.press("escape")
        assert "launch failed" not in app.status_text().plain
        await pilot.press("l")  # the next `l` opens the launcher, not the old failure
        await until(pilot, lambda: isinstance(app.screen, LaunchScreen))
    await poller.close()
