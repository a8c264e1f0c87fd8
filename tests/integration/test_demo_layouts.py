"""`sparktop demo --nodes N [--layout L]`: a twin cluster of N nodes on this
machine, with a solo engine on each or the model's recipe launched in a
layout through the real launcher (HAProxy, or LiteLLM where the layout names its strategy, in front of replicas),
left running with --no-wait and removed by --stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from sparktop.demo import launch_layout, start_demo_cluster, start_load, stop_everything
from sparktop.observe.poller import NodeTarget, Poller
from sparktop.observe.state import ClusterState
from sparktop.twin.cluster import loopback_aliases_work
from tests.helpers.wait import eventually

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not loopback_aliases_work(), reason="needs 127.0.0.2 to 127.0.0.5")]


@pytest.fixture
def lab_litellm(tmp_path, monkeypatch):
    """The lab's LiteLLM proxy on PATH, where the demo looks for it (installed on first use)."""
    from tests.e2e.lab import ensure_litellm

    bin_dir = tmp_path / "litellm-bin"
    bin_dir.mkdir()
    (bin_dir / "litellm").symlink_to(ensure_litellm())
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def state_home(tmp_path, monkeypatch):
    """The demo's nodes and launches under the test's own state directory."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def sparktop(*args: str, env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparktop", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def twin_processes(root) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(root) in line and "ps -eo" not in line]


def test_a_demo_of_four_nodes_runs_one_engine_on_each_and_stops(state_home):
    env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    started = sparktop("demo", "--nodes", "4", "--no-wait", "--speed", "4", env=env)
    assert started.returncode == 0, started.stderr
    urls = [line.split()[1].removesuffix("/v1") for line in started.stdout.splitlines()
            if line.startswith("  spark-")]
    try:
        assert urls == [f"http://127.0.0.{i}:8000" for i in range(2, 6)], started.stdout
        for url in urls:  # each answers a chat, as it would on a Spark
            r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
                "model": "gpt-oss-120b", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
    finally:
        stopped = sparktop("demo", "--stop", env=env)
    assert stopped.returncode == 0 and "4 containers removed" in stopped.stdout, stopped.stdout
    assert not twin_processes(state_home), twin_processes(state_home)


def test_a_bad_layout_for_the_demo_is_one_line(state_home):
    env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    result = sparktop("demo", "--nodes", "2", "--layout", "tp=4", "--no-wait", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "sparktop: gpt-oss-120b: tp=4 needs 4 nodes; the inventory has 2"


async def test_replicas_behind_the_router_serve_the_demo_load_and_the_monitor_sees_them(state_home, lab_litellm):
    """Two tp=2 replicas over four twin nodes behind a real LiteLLM (some 20 s of its imports on two cores),
    under the demo's load until the monitor has seen both serve it."""
    cluster, _ = await start_demo_cluster("gpt-oss-120b", speed=4, nodes=4, engines=False)
    said: list[str] = []
    launcher, plan = await launch_layout(cluster, "gpt-oss-120b", "2x tp=2,least-busy", say=said.append)
    load = None
    poller = Poller([NodeTarget(n.name, n.transport(), n.address) for n in cluster.nodes], interval=0.5,
                    default_port=None, router_key=lambda url: launcher.state.key(plan.launch_id))
    await poller.start()
    try:
        assert said and "ready in" in said[0] and "spark-a, spark-b, spark-c, spark-d" in said[0]
        router = next(e for e in plan.endpoints if e.kind == "router")
        load = start_load([router.url], low=2, high=2, key=launcher.state.key(plan.launch_id))
        state = ClusterState()
        deadline = time.monotonic() + 90
        async for event in poller.events():
            state.apply(event)
            heads = [e for e in state.engines.values() if e.kind == "vllm" and e.state == "ready"]
            if len(heads) == 2 and all(e.running for e in heads) or time.monotonic() > deadline:
                break
        # Both replicas serve the load sent to the router; each over its own two nodes.
        by_head = {e.node: state.engine_nodes(e) for e in state.engines.values() if e.kind == "vllm"}
        assert by_head == {"spark-a": ["spark-a", "spark-b"], "spark-c": ["spark-c", "spark-d"]}, \
            [(e.url, e.node, e.state, e.reason, e.container) for e in state.engines.values()]
        assert all(e.running for e in state.engines.values() if e.kind == "vllm"), state.engines
        summary = state.summary()
        assert summary.nodes == 4 and summary.engines_ready == 2
    finally:
        if load is not None:
            load.terminate()
            load.wait(10)
        await poller.close()
        await launcher.close()
        removed = await stop_everything(cluster)
    assert removed == 5  # two workers, two heads, the router
    # What the containers ran ends once they are removed; the load's clients and the router's proxy may take
    # a moment longer to go: waited for (the bug would be "never"), not slept past.
    await eventually(lambda: not twin_processes(state_home), timeout=30, what="the demo's processes gone")


def test_a_layout_demo_left_running_is_stopped_with_its_router_key(state_home, lab_litellm):
    """`sparktop demo --layout "2x tp=2,least-busy"` over four twin nodes: two multi-node engines and a real LiteLLM
    start (some 20 s of LiteLLM's imports on two cores), then `stop` with its key."""
    env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    started = sparktop("demo", "--nodes", "4", "--layout", "2x tp=2,least-busy", "--no-wait", "--speed", "4",
                       env=env)
    try:
        assert started.returncode == 0, started.stderr
        lines = started.stdout.splitlines()
        assert any("2x-tp2-least-busy" in line and "ready in" in line for line in lines), started.stdout
        assert [line.split()[:2] for line in lines if line.startswith("  vllm") or line.startswith("  router")] == \
            [["vllm", "spark-a"], ["vllm", "spark-c"], ["router", "spark-a"]]
        keys = list((state_home / "sparktop/launches/keys").glob("*.key"))
        assert len(keys) == 1  # the router's master key, kept for the monitor
        key = keys[0].read_text().strip()
        assert key not in started.stdout + started.stderr  # and never printed
        r = httpx.get("http://127.0.0.2:4000/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "gpt-oss-120b"
    finally:
        stopped = sparktop("demo", "--stop", env=env)
    assert stopped.returncode == 0 and "5 containers removed" in stopped.stdout, stopped.stdout
    assert not list((state_home / "sparktop/launches/keys").glob("*.key"))
    records = [json.loads(p.read_text()) for p in (state_home / "sparktop/launches").glob("*.json")]
    assert [row["status"] for rec in records for row in rec["launches"]] == ["stopped"]
    assert not twin_processes(state_home), twin_processes(state_home)


@pytest.mark.parametrize("runtime, layout, engine, recipe", [
    ("sglang", "tp=2", "sglang", "gpt-oss-120b-sglang"),
    ("trtllm", "tp=2", "trtllm", "gpt-oss-120b-trtllm"),
    ("llama-cpp", "pp=2", "llama.cpp", "gpt-oss-120b-llama-cpp"),
])
def test_a_demo_of_another_runtime_launches_its_recipe_over_two_nodes(state_home, runtime, layout, engine, recipe):
    """`sparktop demo --runtime R --layout L`: the runtime's own recipe of the model, launched over both twin
    nodes by the real launcher (SGLang's --nnodes, TensorRT-LLM under mpirun, llama.cpp with an rpc-server on
    the second node), answers a chat, is recognised as that engine, and stops."""
    env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    started = sparktop("demo", "--runtime", runtime, "--layout", layout, "--no-wait", "--speed", "4", env=env,
                       timeout=300)
    try:
        assert started.returncode == 0, started.stderr
        assert any(recipe in line and "ready in" in line for line in started.stdout.splitlines()), started.stdout
        r = httpx.post("http://127.0.0.2:8000/v1/chat/completions", timeout=60, json={
            "model": "gpt-oss-120b", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8, r.text
        status = json.loads(sparktop("status", "--json", "--engine", "http://127.0.0.2:8000", env=env).stdout)
        (head,) = [e for e in status["engines"] if e["url"] == "http://127.0.0.2:8000"]
        assert (head["kind"], head["state"]) == (engine, "ready"), head
    finally:
        stopped = sparktop("demo", "--stop", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert not twin_processes(state_home), twin_processes(state_home)


def test_a_demo_of_two_solo_replicas_serves_behind_haproxy(state_home):
    """`sparktop demo --layout "2x solo"`: the default router, this machine's HAProxy (Debian's, which
    scripts/test installs), in front of two twin engines; its key is kept, checked, and never printed."""
    from tests.e2e.lab import HAPROXY

    if not os.path.exists(HAPROXY):
        pytest.fail("the demo's default router needs HAProxy: run the tests with scripts/test, which installs it "
                    "(or apt-get install haproxy)")
    env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    started = sparktop("demo", "--nodes", "2", "--layout", "2x solo", "--no-wait", "--speed", "4", env=env)
    try:
        assert started.returncode == 0, started.stderr
        lines = started.stdout.splitlines()
        assert any("2x-solo-leastconn" in line and "ready in" in line for line in lines), started.stdout
        [key_file] = list((state_home / "sparktop/launches/keys").glob("*.key"))
        key = key_file.read_text().strip()
        assert key not in started.stdout + started.stderr
        r = httpx.get("http://127.0.0.2:4000/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "gpt-oss-120b"
        assert r.headers["via"] == "1.1 haproxy"
        assert httpx.get("http://127.0.0.2:4000/v1/models", timeout=30).status_code == 401
    finally:
        stopped = sparktop("demo", "--stop", env=env)
    assert stopped.returncode == 0 and "3 containers removed" in stopped.stdout, stopped.stdout
