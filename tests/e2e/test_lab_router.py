"""Replicas behind the default router, in the lab: `2x solo` launched through sparktop's real launch path
puts the real HAProxy (Debian's, run by the twin's `docker` as the HAProxy image) in front of two twin vLLMs.

Lockstep bursts of c2, c4, c8 and c16 go through it and each backend's share is read from the twin engines'
own Prometheus counters (`vllm:request_success_total`): HAProxy's leastconn gives exactly c/2 each. A burst is
made lockstep by the twin itself, not by timing: both engines stall every stream after its first token, the
burst is sent, and only once every request of it is running somewhere are the streams let go. A wrong key gets
LiteLLM's 401 and reaches no backend; a replica stopped is taken out by the health check (the router's own
view, polled until it says DOWN), and the next burst all goes to the other. Counts and states, never times.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparktop.observe.engines.haproxy import parse
from tests.e2e.lab import HAPROXY
from tests.e2e.test_lab_launch import MODEL, RECIPE, assert_nothing_left, router_key, sparktop

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROUTER = "http://127.0.0.2:4000"
ENGINES = {"spark-a": "http://127.0.0.2:8000", "spark-b": "http://127.0.0.3:8000"}
LEVELS = (2, 4, 8, 16)
SPLITS: dict[int, dict[str, int]] = {}  # what was measured, printed at the end


def metric(url: str, name: str) -> float:
    """The sum of one series' samples at an engine's /metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def served() -> dict[str, float]:
    return {node: metric(url, "vllm:request_success_total") for node, url in ENGINES.items()}


def running() -> dict[str, float]:
    return {node: metric(url, "vllm:num_requests_running") for node, url in ENGINES.items()}


def stall(after: int | None, nodes=ENGINES) -> None:
    for node in nodes:
        r = httpx.post(ENGINES[node] + "/twin/stall", json={"after": after}, timeout=10)
        r.raise_for_status()


def until(condition, what: str, timeout: float = 60.0, every: float = 0.1):
    """Poll `condition` until it returns something true; fail naming `what` after `timeout` (a bound, not a
    measurement: nothing asserts how long it took)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


async def stream(client: httpx.AsyncClient, key: str, router: str = ROUTER) -> int:
    """One streamed chat through the router, read to its end; its status."""
    async with client.stream("POST", router + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                             json={"model": RECIPE, "messages": [{"role": "user", "content": "split me"}],
                                   "max_tokens": 4, "ignore_eos": True, "stream": True}) as r:
        async for _ in r.aiter_bytes():
            pass
        return r.status_code


async def burst(c: int, key: str, nodes=ENGINES, router: str = ROUTER) -> dict[str, int]:
    """c requests at once through the router, held by the engines' stall until all c run; each backend's
    requests served, from its own counter."""
    before = served()
    stall(1, nodes)
    try:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=c + 4)) as client:
            tasks = [asyncio.create_task(stream(client, key, router)) for _ in range(c)]
            await asyncio.to_thread(until, lambda: sum(running().values()) == c, f"{c} requests running")
            stall(None, nodes)
            statuses = await asyncio.gather(*tasks)
    finally:
        stall(None, nodes)
    assert statuses == [200] * c
    after = await asyncio.to_thread(until, lambda: (now := served()) and sum(now.values()) - sum(before.values())
                                    == c and now, f"{c} requests counted")
    return {node: int(after[node] - before[node]) for node in ENGINES}


def router_view(key: str, router: str = ROUTER) -> dict[str, str]:
    """Each backend's state as HAProxy's own exporter says it (read by sparktop's parser)."""
    r = httpx.get(router + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    r.raise_for_status()
    return {b.server: b.state for b in parse(r.text).backends}


async def test_two_solo_replicas_behind_haproxy_split_every_burst_exactly(lab):
    if not Path(HAPROXY).exists():
        pytest.fail("the router tests need HAProxy: run the tests with scripts/test, which installs it "
                    "(or apt-get install haproxy)")
    inventory = lab.inventory()
    lab.put_weights(MODEL)
    launched = sparktop(lab, "launch", RECIPE, "--layout", "2x solo", "--inventory", str(inventory), "--yes",
                        "--timeout", "180", timeout=400)
    try:
        assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
        assert "router: HAProxy 3.2.24 leastconn on spark-a, the default for replicas" in launched.stdout
        key = router_key(lab)
        assert key
        # The key is nowhere on a command line or in the config the node keeps; the env file is the owner's.
        [config] = list(lab.hosts[0].home.glob(".local/state/sparktop/launches/*/haproxy.cfg"))
        assert key not in config.read_text() and "balance leastconn" in config.read_text()
        listed = lab.sh(lab.hosts[0], "docker ps --no-trunc --format '{{.Command}} {{.Labels}}'")
        assert listed.returncode == 0 and "haproxy" in listed.stdout and key not in listed.stdout
        assert (config.parent / "router.env").stat().st_mode & 0o077 == 0
        assert config.stat().st_mode & 0o044 == 0o044  # no secret in it, and the image's haproxy user reads it

        assert until(lambda: router_view(key) == {"spark-a": "UP", "spark-b": "UP"}, "both backends UP")
        for c in LEVELS:
            SPLITS[c] = await burst(c, key)
            assert SPLITS[c] == {"spark-a": c // 2, "spark-b": c // 2}, (c, SPLITS[c])

        # The monitor knows it for what it is, with the key the launch kept.
        status = json.loads(sparktop(lab, "status", "--inventory", str(inventory), "--json").stdout)
        seen = {e["url"]: e for e in status["engines"]}
        assert (seen[ROUTER]["kind"], seen[ROUTER]["state"], seen[ROUTER]["topology"]) == \
            ("haproxy", "ready", "2x solo,leastconn"), seen[ROUTER]
        # ... read from its own exporter (so with the key): nothing in flight now, nothing queued.
        assert (seen[ROUTER]["running"], seen[ROUTER]["waiting"]) == (0, 0), seen[ROUTER]
        assert seen[ROUTER]["recognised"] == "Via: 1.1 haproxy header", seen[ROUTER]
        assert seen[ROUTER]["backends"] == {"spark-a": "UP", "spark-b": "UP"}, seen[ROUTER]

        # A wrong key, and none: LiteLLM's 401, and neither backend sees the request.
        before = served()
        for headers in ({"Authorization": "Bearer not-the-key"}, {"Authorization": f"Bearer {key[:-1]}"}, {}):
            r = httpx.post(ROUTER + "/v1/chat/completions", headers=headers, timeout=30,
                           json={"model": RECIPE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            assert r.status_code == 401 and r.json()["error"]["type"] == "auth_error", r.text
        assert httpx.get(ROUTER + "/metrics", timeout=10).status_code == 401
        assert served() == before

        # spark-b's engine stops: the health check takes it out (the router's view says DOWN), and a burst
        # then all goes to spark-a.
        [engine_b] = [n for n in lab.containers(lab.hosts[1]) if "vllm" in n]
        assert lab.sh(lab.hosts[1], f"docker stop {engine_b}").returncode == 0
        until(lambda: router_view(key).get("spark-b") == "DOWN", "spark-b DOWN in the router's view")
        assert router_view(key)["spark-a"] == "UP"
        status = json.loads(sparktop(lab, "status", "--inventory", str(inventory), "--json").stdout)
        seen = {e["url"]: e for e in status["engines"]}
        assert seen[ROUTER]["backends"] == {"spark-a": "UP", "spark-b": "DOWN"}, seen[ROUTER]  # the monitor too
        before_a = metric(ENGINES["spark-a"], "vllm:request_success_total")
        async with httpx.AsyncClient(timeout=120) as client:
            statuses = await asyncio.gather(*(stream(client, key) for _ in range(4)))
        assert statuses == [200] * 4
        assert metric(ENGINES["spark-a"], "vllm:request_success_total") - before_a == 4
    finally:
        stopped = sparktop(lab, "stop", "--inventory", str(inventory), "--all")
        if SPLITS:
            print("\nHAProxy leastconn over two twin vLLMs, requests per backend: "
                  + ", ".join(f"c{c} {s['spark-a']}/{s['spark-b']}" for c, s in SPLITS.items()))
    assert stopped.returncode == 0, stopped.stderr
    assert_nothing_left(lab)


async def test_litellm_in_front_of_haproxy_keeps_its_exact_split(lab):
    """`2x solo,litellm`: the real LiteLLM on the router's port, its one deployment the HAProxy behind it on
    the next; bursts through LiteLLM split exactly as HAProxy's own do, and LiteLLM checks the key."""
    if not Path(HAPROXY).exists():
        pytest.fail("the router tests need HAProxy: run the tests with scripts/test, which installs it "
                    "(or apt-get install haproxy)")
    inventory = lab.inventory()
    lab.put_weights(MODEL)
    launched = sparktop(lab, "launch", RECIPE, "--layout", "2x solo,litellm", "--inventory", str(inventory),
                        "--yes", "--timeout", "300", timeout=500)
    balancer = "http://127.0.0.2:4001"
    splits = {}
    try:
        assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
        assert "router: LiteLLM 1.106.2 + HAProxy 3.2.24 leastconn on spark-a, as the layout says" in launched.stdout
        key = router_key(lab)
        assert key
        until(lambda: router_view(key, balancer) == {"spark-a": "UP", "spark-b": "UP"}, "both backends UP")
        for c in (2, 4, 8):
            splits[c] = await burst(c, key)  # through LiteLLM, on the router's port
            assert splits[c] == {"spark-a": c // 2, "spark-b": c // 2}, (c, splits[c])
        before = served()
        r = httpx.post(ROUTER + "/v1/chat/completions", headers={"Authorization": "Bearer not-the-key"}, timeout=60,
                       json={"model": RECIPE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code in (400, 401) and "via" not in r.headers, r.text  # LiteLLM's refusal, not HAProxy's
        assert served() == before
        status = json.loads(sparktop(lab, "status", "--inventory", str(inventory), "--json").stdout)
        seen = {e["url"]: e for e in status["engines"]}
        assert (seen[ROUTER]["kind"], seen[balancer]["kind"]) == ("router", "haproxy"), seen
        assert seen[balancer]["backends"] == {"spark-a": "UP", "spark-b": "UP"}, seen[balancer]
    finally:
        stopped = sparktop(lab, "stop", "--inventory", str(inventory), "--all")
    assert stopped.returncode == 0, stopped.stderr
    assert_nothing_left(lab)
