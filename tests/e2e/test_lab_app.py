"""Every topology launched and stopped from the app, in the lab.

The app runs in this process with the lab's client HOME (its ssh config
and known_hosts), reaching the two test hosts over real OpenSSH; the
router topologies start the real LiteLLM proxy. Pilot presses the keys a
user would: `l`, the recipe, the topology from its drop-down, Enter; then
`x`, Enter, `y`.
"""

from __future__ import annotations

import asyncio
from functools import partial

import pytest
from textual.widgets import DataTable, Select

from sparktop.observe.poller import Poller
from sparktop.observe.targets import node_targets
from sparktop.settings import load_inventory
from sparktop.ui.app import SparktopApp
from sparktop.ui.launcher import ConfirmStop, ProgressScreen, StopScreen
from tests.e2e.test_lab_launch import MODEL, RECIPE, assert_nothing_left, chat, sparktop
from tests.helpers.pilot import open_launcher
from tests.helpers.pilot import until as _until

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# The articles' five, then two replicas behind HAProxy leastconn (the default router for replicas).
TOPOLOGIES = ["solo", "cluster-ray", "cluster-mp", "shuffle", "least-busy", "2x solo,leastconn"]


until = partial(_until, timeout=60.0, step=0.25)  # real OpenSSH and LiteLLM take their time


@pytest.fixture
def lab_home(lab, monkeypatch):
    env = lab.env()
    for key in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(key, env[key])
    return lab


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_launch_and_stop_every_topology_from_the_app(lab_home, topology):
    """Each topology launched and stopped by keys in the app over real SSH: a whole launch (and for the routers
    a real LiteLLM's start, some 20 s of its imports) per case."""
    lab = lab_home
    inventory = load_inventory(lab.inventory())
    lab.put_weights(MODEL)
    poller = Poller(node_targets(inventory), [], interval=0.5, default_port=inventory.defaults.port)

    async def start():
        await poller.start()
        return poller

    app = SparktopApp(start_source=start, inventory=inventory, launch_timeout=120)
    passed = False
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: len(app.state.nodes) == 2 and
                        all(n.state == "ok" for n in app.state.nodes.values()),
                        what=lambda: f"both nodes ok: {[(k, n.state) for k, n in app.state.nodes.items()]}")
            screen = await open_launcher(pilot, RECIPE)
            table = screen.query_one("#recipes", DataTable)

            # The topology, from its drop-down, by keyboard.
            select = screen.query_one("#topology", Select)
            offered = [value for _, value in select._options if value is not Select.NULL]
            assert offered == TOPOLOGIES
            await pilot.press("tab")
            assert app.focused is select
            await pilot.press("enter")
            await pilot.pause(0.2)
            for _ in range(offered.index(topology)):
                await pilot.press("down")
            await pilot.press("enter")
            await until(pilot, lambda: select.value == topology and screen.plan is not None
                        and screen.plan.topology == topology
                        and screen.preflight_for == screen.plan.render(), timeout=30,
                        what=lambda: f"{topology} chosen and preflighted (select {select.value}, plan "
                                     f"{screen.plan.topology if screen.plan else None})")
            assert screen.preflight.ok, screen.preflight.render()

            assert app.focused is table  # a choice made, the list has the focus: Enter launches
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ProgressScreen), what="Enter launches")
            run = app.screen.run
            await until(pilot, lambda: run.status != "running", timeout=120,
                        what=lambda: f"the launch finished ({[(s.title, s.status) for s in run.steps]})")
            assert run.status == "ready", (run.reason, run.lines)
            assert all(step.status == "done" for step in run.steps)

            api = run.plan.endpoints[-1]
            key = app.launcher.state.key(run.plan.launch_id) if api.api_key_env else None
            answer = await asyncio.to_thread(chat, api.url, key)
            assert answer["usage"]["completion_tokens"] == 8

            await pilot.press("escape")
            urls = {e.url for e in run.plan.endpoints}
            try:
                # Ready, and named by its container (its topology) within a node poll or two.
                await until(pilot, lambda: urls <= set(app.state.engines) and
                            all(app.state.engines[u].state == "ready" and app.state.engines[u].topology
                                for u in urls))
            except AssertionError:
                raise AssertionError({u: (e.state, e.reason, e.topology)
                                      for u, e in app.state.engines.items()}) from None
            assert {app.state.engines[u].topology for u in urls} == {topology}

            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, StopScreen), what="x opens the stop screen")
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ConfirmStop), what="Enter asks to confirm")
            await pilot.press("y")
            await until(pilot, lambda: app.launcher.active() == [], timeout=60, what="the launch stopped")
            await until(pilot, lambda: not (urls & set(app.state.engines)), timeout=30,
                        what=f"the monitor dropped {sorted(urls)}")
        passed = True
    finally:
        await poller.close()
        if not passed:  # what a failed case started must not fail the next one (port 8000 in use)
            await asyncio.to_thread(sparktop, lab, "stop", "--inventory", str(lab.inventory()), "--all")
    assert_nothing_left(lab)
