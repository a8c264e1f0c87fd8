"""Four Sparks on a switch, in the lab: four OpenSSH hosts (127.0.0.2-.5).

Each layout that needs more than two nodes launches from the CLI, answers a
chat, shows in `status --json` with its nodes, and stops leaving nothing on
any host; a worker that never joins, and a node that cannot be reached,
fail the launch with the node named and leave nothing behind.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.lab import Lab, sshd_available
from tests.e2e.test_lab_launch import MODEL, RECIPE, chat, router_key, sparktop

pytestmark = [pytest.mark.lab, pytest.mark.slow]

NODES = ["spark-a", "spark-b", "spark-c", "spark-d"]
LAUNCH_TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def lab4(tmp_path_factory):
    if not sshd_available():
        pytest.fail("the lab needs OpenSSH's sshd: run the tests with scripts/test, which installs it "
                    "(or apt-get install openssh-server)")
    lab = Lab(tmp_path_factory.mktemp("lab4"), size=4).start()
    yield lab
    lab.stop()
    if LAUNCH_TIMES:
        print("\nfour-node launch times: " + ", ".join(f"{k} {v:.1f} s" for k, v in LAUNCH_TIMES.items()))


def nothing_left(lab):
    for host in lab.hosts:
        assert lab.containers(host) == [], host.name
        assert lab.gpu_processes(host) == [], host.name
        assert lab.sh(host, "ray status").returncode != 0, host.name  # no Ray left behind either


# layout, the engines it serves (URL -> kind, nodes), the GPU processes on each host
CASES = [
    ("tp=4,ray", {"http://127.0.0.2:8000": ("vllm", NODES)},
     ["VLLM::EngineCore", "ray::RayWorkerWrapper", "ray::RayWorkerWrapper", "ray::RayWorkerWrapper"]),
    ("tp=2,pp=2", {"http://127.0.0.2:8000": ("vllm", NODES)},
     ["VLLM::EngineCore", "VLLM::Worker_PP0_TP1", "VLLM::Worker_PP1_TP0", "VLLM::Worker_PP1_TP1"]),
    ("2x tp=2,least-busy", {"http://127.0.0.2:4000": ("router", ["spark-a"]),
                            "http://127.0.0.2:8000": ("vllm", ["spark-a", "spark-b"]),
                            "http://127.0.0.4:8000": ("vllm", ["spark-c", "spark-d"])},
     ["VLLM::EngineCore", "VLLM::Worker_TP1", "VLLM::EngineCore", "VLLM::Worker_TP1"]),
    ("4x solo,shuffle", {"http://127.0.0.2:4000": ("router", ["spark-a"]),
                         **{f"http://127.0.0.{i + 2}:8000": ("vllm", [n]) for i, n in enumerate(NODES)}},
     ["VLLM::EngineCore"] * 4),
]


@pytest.mark.parametrize(("layout", "engines", "processes"), CASES, ids=[c[0] for c in CASES])
def test_a_four_node_layout_launches_serves_shows_and_stops(lab4, layout, engines, processes):
    """Four sshd nodes, one multi-node launch through each, status and stop: 30-60 s a layout on two cores,
    most of it the twin's start-up of four engine processes and the SSH round trips a real launch makes."""
    lab = lab4
    inventory = lab.inventory()
    lab.put_weights(MODEL)
    began = time.monotonic()
    launched = sparktop(lab, "launch", RECIPE, "--layout", layout, "--inventory", str(inventory), "--yes",
                        "--timeout", "180", timeout=400)
    LAUNCH_TIMES[layout] = time.monotonic() - began
    try:
        assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
        assert "ready in" in launched.stdout
        router = next((url for url, (kind, _) in engines.items() if kind == "router"), None)
        api = router or next(iter(engines))
        answer = chat(api, router_key(lab) if router else None)
        assert answer["usage"]["completion_tokens"] == 8

        status = json.loads(sparktop(lab, "status", "--inventory", str(inventory), "--json").stdout)
        seen = {e["url"]: e for e in status["engines"]}
        for url, (kind, nodes) in engines.items():
            assert seen[url]["state"] == "ready", (url, seen[url])
            assert (seen[url]["kind"], seen[url]["topology"]) == (kind, layout)
            if kind == "vllm":
                assert seen[url]["nodes"] == nodes, (url, seen[url]["nodes"])
        [launch] = status["launches"]
        assert (launch["topology"], launch["status"], launch["nodes"]) == (layout, "ready", NODES)
        assert [sorted(lab.gpu_processes(h)) for h in lab.hosts] == [[p] for p in processes]
    finally:
        stopped = sparktop(lab, "stop", "--inventory", str(inventory), "--all")
    assert stopped.returncode == 0, stopped.stderr
    nothing_left(lab)


def test_a_worker_that_never_joins_fails_the_launch_with_its_node_named(lab4):
    lab = lab4
    inventory = lab.inventory()
    lab.put_weights(MODEL)
    with lab.workers_crash(lab.hosts[3]):  # spark-d's worker dies as soon as it starts
        r = sparktop(lab, "launch", RECIPE, "--layout", "tp=4", "--inventory", str(inventory), "--yes",
                     "--timeout", "60", timeout=300)
    assert r.returncode != 0
    assert "launch failed: spark-d" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert "removed" in r.stdout  # what had started on the other three was torn down
    nothing_left(lab)


def test_a_node_that_cannot_be_reached_fails_preflight_with_its_name(lab4):
    lab = lab4
    inventory = lab.inventory()
    # spark-d's ssh name now leads to a port nobody listens on.
    text = inventory.read_text().replace("host: lab-spark-d", "host: lab-spark-d-gone")
    gone = inventory.with_name("cluster-gone.yaml")
    gone.write_text(text)
    config = lab.ssh_dir / "config"
    config.write_text(config.read_text() + "\nHost lab-spark-d-gone\n  HostName 127.0.0.5\n  Port 1\n"
                      f"  IdentityFile {lab.key}\n")
    r = sparktop(lab, "launch", RECIPE, "--layout", "tp=4,ray", "--inventory", str(gone), "--yes",
                 "--timeout", "60", timeout=300)
    assert r.returncode != 0
    assert "spark-d" in r.stderr.splitlines()[-1], r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    nothing_left(lab)


async def test_two_engines_of_two_nodes_launched_from_the_app_choosing_four_nodes(lab4, monkeypatch):
    """`l`, the recipe, the layout from its drop-down, the four nodes in the
    node list (one taken out and put back), Enter; the cards; `x`, Enter, `y`."""
    import asyncio

    from textual.widgets import DataTable, Select, SelectionList

    from sparktop.observe.poller import Poller
    from sparktop.observe.targets import node_targets
    from sparktop.settings import load_inventory
    from sparktop.ui.app import SparktopApp
    from sparktop.ui.launcher import ConfirmStop, ProgressScreen, StopScreen
    from tests.helpers.pilot import open_launcher, until

    lab = lab4
    env = lab.env()
    for key in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(key, env[key])
    inventory = load_inventory(lab.inventory())
    lab.put_weights(MODEL)
    poller = Poller(node_targets(inventory), [], interval=0.5, default_port=inventory.defaults.port)

    async def start():
        await poller.start()
        return poller

    layout = "2x tp=2,leastconn"  # behind HAProxy, the default router the app offers
    app = SparktopApp(start_source=start, inventory=inventory, launch_timeout=180)
    passed = False
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: len(app.state.nodes) == 4 and
                        all(n.state == "ok" for n in app.state.nodes.values()), timeout=60)
            screen = await open_launcher(pilot, RECIPE)
            table = screen.query_one("#recipes", DataTable)
            select = screen.query_one("#topology", Select)
            offered = [value for _, value in select._options if value is not Select.NULL]
            assert offered[:5] == ["solo", "cluster-ray", "cluster-mp", "shuffle", "least-busy"]
            assert offered[5] == "2x solo,leastconn"  # two solo replicas behind HAProxy, after the five
            assert {"tp=4", "tp=4,ray", "tp=2,pp=2", layout, "4x solo,leastconn"} <= set(offered)
            select.value = layout
            # Every node is in; take spark-d out: the plan says what is missing; put it back.
            pick = screen.query_one("#pick-nodes", SelectionList)
            assert pick.display and sorted(pick.selected) == NODES
            pick.focus()
            pick.highlighted = 3  # spark-d
            await pilot.press("space")
            await until(pilot, lambda: screen.error is not None and "3 chosen" in screen.error)
            await pilot.press("space")
            await until(pilot, lambda: screen.plan is not None and screen.plan.topology == layout
                        and screen.preflight_for == screen.plan.render(), timeout=60)
            assert screen.plan.nodes == NODES
            assert screen.preflight.ok, screen.preflight.render()
            table.focus()
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ProgressScreen))
            run = app.screen.run
            await until(pilot, lambda: run.status != "running", timeout=240)
            assert run.status == "ready", (run.reason, run.lines)
            router = next(e for e in run.plan.endpoints if e.kind == "haproxy")
            answer = await asyncio.to_thread(chat, router.url, app.launcher.state.key(run.plan.launch_id))
            assert answer["usage"]["completion_tokens"] == 8

            await pilot.press("escape")
            engines = {e.url for e in run.plan.endpoints if e.kind == "vllm"}
            await until(pilot, lambda: engines <= set(app.state.engines) and all(
                app.state.engines[u].state == "ready" and app.state.engines[u].topology == layout for u in engines),
                timeout=60)
            spread = {u: app.state.engine_nodes(app.state.engines[u]) for u in engines}
            assert spread == {"http://127.0.0.2:8000": ["spark-a", "spark-b"],
                              "http://127.0.0.4:8000": ["spark-c", "spark-d"]}
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, StopScreen))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ConfirmStop))
            await pilot.press("y")
            await until(pilot, lambda: app.launcher.active() == [], timeout=90)
        passed = True
    finally:
        await poller.close()
        if not passed:
            await asyncio.to_thread(sparktop, lab, "stop", "--inventory", str(lab.inventory()), "--all")
    nothing_left(lab)
