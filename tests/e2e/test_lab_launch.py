"""Launch every topology in the lab from the CLI, use it, watch it, stop it.

Two test hosts with real OpenSSH servers on 127.0.0.2 and 127.0.0.3, the
twin's stand-ins on their PATH, a real LiteLLM proxy for the router
topologies (see lab.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.lab, pytest.mark.slow]

RECIPE = "llama-3.1-8b"
MODEL = "nvidia/Llama-3.1-8B-Instruct-FP8"


def sparktop(lab, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "sparktop", *args], capture_output=True, text=True,
                          env=lab.env(), timeout=timeout)


def router_key(lab) -> str | None:
    keys = Path(lab.env()["XDG_STATE_HOME"]) / "sparktop" / "launches" / "keys"
    found = sorted(keys.glob("*.key"), key=lambda p: p.stat().st_mtime)
    return found[-1].read_text().strip() if found else None


def chat(url: str, key: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(url + "/v1/chat/completions", headers=headers, timeout=60, json={
        "model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Say hi from the lab"}],
        "max_tokens": 8, "ignore_eos": True})
    r.raise_for_status()
    return r.json()


def assert_nothing_left(lab):
    for host in lab.hosts:
        assert lab.containers(host) == [], host.name
        assert lab.gpu_processes(host) == [], host.name
        ray = lab.sh(host, "ray status")
        assert ray.returncode != 0  # no Ray left behind either


@pytest.mark.parametrize("topology, api, engines", [
    ("solo", "http://127.0.0.2:8000", {"http://127.0.0.2:8000": "vllm"}),
    ("cluster-mp", "http://127.0.0.2:8000", {"http://127.0.0.2:8000": "vllm"}),
    ("cluster-ray", "http://127.0.0.2:8000", {"http://127.0.0.2:8000": "vllm"}),
    ("shuffle", "http://127.0.0.2:4000", {"http://127.0.0.2:4000": "router", "http://127.0.0.2:8000": "vllm",
                                          "http://127.0.0.3:8000": "vllm"}),
    ("least-busy", "http://127.0.0.2:4000", {"http://127.0.0.2:4000": "router", "http://127.0.0.2:8000": "vllm",
                                             "http://127.0.0.3:8000": "vllm"}),
])
def test_launch_use_watch_and_stop(lab, topology, api, engines):
    """One launch per topology over real SSH, used, watched and stopped; the routers start a real LiteLLM
    (some 20 s of its imports on two cores), which is most of the time."""
    inventory = lab.inventory()
    lab.put_weights(MODEL)
    began = time.time()  # the launch record's clock (epoch seconds), read around the launch and the status
    launched = sparktop(lab, "launch", RECIPE, "-t", topology, "--inventory", str(inventory), "--yes",
                        "--timeout", "120")
    try:
        assert launched.returncode == 0, launched.stdout + launched.stderr
        assert "ready in" in launched.stdout
        key = router_key(lab) if topology in ("shuffle", "least-busy") else None
        answer = chat(api, key)
        assert answer["usage"]["completion_tokens"] == 8

        status = json.loads(sparktop(lab, "status", "--inventory", str(inventory), "--json").stdout)
        watched = time.time() - began
        seen = {e["url"]: e for e in status["engines"]}
        for url, kind in engines.items():
            assert seen[url]["state"] == "ready", (url, seen[url])
            assert seen[url]["kind"] == kind and seen[url]["topology"] == topology
            assert seen[url]["model"] == "llama-3.1-8b"
        [launch] = status["launches"]
        assert (launch["recipe"], launch["topology"], launch["status"], launch["containers"]) == \
            (RECIPE, topology, "ready", "running")
        assert launch["nodes"] == (["spark-a"] if topology == "solo" else ["spark-a", "spark-b"])
        # Counted from when the launch began, which is inside this test's own stopwatch (rounded to the second).
        assert 0 <= launch["uptime_s"] <= watched + 0.5, (launch["uptime_s"], watched)
        if topology.startswith("cluster"):
            worker = "VLLM::Worker_TP1" if topology == "cluster-mp" else "ray::RayWorkerWrapper"
            assert lab.gpu_processes(lab.hosts[1]) == [worker]
    finally:
        stopped = sparktop(lab, "stop", "--inventory", str(inventory), "--all")
    assert stopped.returncode == 0, stopped.stderr
    assert_nothing_left(lab)


def test_a_recipe_that_does_not_fit_fails_in_preflight(lab):
    inventory = lab.inventory()
    r = sparktop(lab, "launch", "llama-3.1-70b", "-t", "solo", "--inventory", str(inventory), "--yes",
                 "--set", "gpu_memory_utilization=0.5")
    assert r.returncode != 0
    assert "preflight failed on spark-a: fit: weights (67.7 GiB on this node) do not fit" in r.stderr
    assert "Traceback" not in r.stderr
    assert_nothing_left(lab)


def test_a_worker_that_never_comes_up_fails_the_launch_and_tears_down(lab):
    inventory = lab.inventory()
    lab.put_weights(MODEL)
    with lab.workers_crash(lab.hosts[1]):
        r = sparktop(lab, "launch", RECIPE, "-t", "cluster-mp", "--inventory", str(inventory), "--yes",
                     "--timeout", "60")
    assert r.returncode != 0
    assert "launch failed" in r.stderr
    assert "removed" in r.stdout  # what was started was torn down
    assert_nothing_left(lab)


def test_dry_run_prints_the_plan_without_touching_the_nodes(lab):
    inventory = lab.inventory()
    r = sparktop(lab, "launch", RECIPE, "-t", "shuffle", "--inventory", str(inventory), "--dry-run")
    assert r.returncode == 0
    assert "routing_strategy: simple-shuffle" in r.stdout and "LITELLM_LOCAL_MODEL_COST_MAP=True" in r.stdout
    assert_nothing_left(lab)


def test_a_small_model_runs_next_to_a_big_one_and_each_stops_alone(lab):
    """gpt-oss-120b at 0.65 on port 8000 and Nemotron Nano on 8002, on one node."""
    inventory = lab.inventory()
    lab.put_weights("openai/gpt-oss-120b")
    lab.put_weights("nvidia/NVIDIA-Nemotron-Nano-9B-v2-NVFP4")
    big = sparktop(lab, "launch", "gpt-oss-120b", "-t", "solo", "--inventory", str(inventory), "--yes",
                   "--set", "gpu_memory_utilization=0.65", "--timeout", "120")
    try:
        assert big.returncode == 0, big.stdout + big.stderr
        small = sparktop(lab, "launch", "nemotron-nano-9b-v2", "-t", "solo", "--inventory", str(inventory), "--yes",
                         "--timeout", "120")
        assert small.returncode == 0, small.stdout + small.stderr
        # Preflight saw the first launch and let the second run beside it.
        assert "already running: gpt-oss-120b-solo" in small.stdout
        assert "[ok  ] spark-a    ports     8002 free" in small.stdout

        status = json.loads(sparktop(lab, "status", "--inventory", str(inventory), "--json").stdout)
        engines = {e["url"]: e for e in status["engines"]}
        assert engines["http://127.0.0.2:8000"]["model"] == "gpt-oss-120b"
        assert engines["http://127.0.0.2:8002"]["model"] == "nemotron-nano-9b"
        assert all(e["state"] == "ready" for e in engines.values())
        launches = {row["recipe"]: row["id"] for row in status["launches"]}
        assert set(launches) == {"gpt-oss-120b", "nemotron-nano-9b-v2"}
        [node_a] = [n for n in status["nodes"] if n["name"] == "spark-a"]
        assert node_a["memory_gib"]["available"] > 4  # both shares fit with room left

        # Stopping with two launches running needs a name (or --all).
        ambiguous = sparktop(lab, "stop", "--inventory", str(inventory))
        assert ambiguous.returncode != 0 and "2 launches are running" in ambiguous.stderr
        stopped = sparktop(lab, "stop", launches["nemotron-nano-9b-v2"], "--inventory", str(inventory))
        assert stopped.returncode == 0, stopped.stderr
        assert lab.containers(lab.hosts[0]) == [f"sparktop-{launches['gpt-oss-120b']}-vllm"]
        r = httpx.post("http://127.0.0.2:8000/v1/chat/completions", timeout=60, json={
            "model": "gpt-oss-120b", "messages": [{"role": "user", "content": "still here?"}], "max_tokens": 4})
        assert r.status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get("http://127.0.0.2:8002/health", timeout=5)
    finally:
        sparktop(lab, "stop", "--inventory", str(inventory), "--all")
    assert_nothing_left(lab)
