"""How the real routers split requests over two replicas, beside the router model.

The LiteLLM proxy sparktop launches (the lab's `litellm[proxy]==1.106.2`,
tests/e2e/lab.py `ensure_litellm`), configured by the launcher's own
`litellm_config` (sparktop.launch.topology), and HAProxy (Debian's, with the
launcher's own `haproxy_config`, sparktop.launch.haproxy: `leastconn`, the
default), in front of two twin engines (`sparktop twin serve`, fast). For
each routing strategy: lockstep bursts of
c simultaneous streamed requests (each burst waits for the one before to
finish), and a continuous load (c in flight, each refilled as one ends).
Requests per backend are read from each twin's own counters
(`vllm:request_success_total` on /metrics), never from timing.

Printed per strategy and c: the busiest backend's mean share of a burst, how
often a whole burst went to one backend, the splits seen, and the same two
figures from the router model (sparktop.model.routers). Run standalone:
`python -m tests.benchmarks.router_split [--reps 20]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import yaml

from tests.benchmarks.common import ROOT, Bench, Row, say

TITLE = "LiteLLM's and HAProxy's split over two replicas vs the router model"
NEEDS = ("twin",)

MODEL = "llama-3.1-8b"
SPEED = "20"  # the twins at 20x a Spark's pace: a burst takes well under a second
TG = 24  # output tokens per request: long enough that a burst's requests overlap
KEY = "sk-router-split"
LEVELS = (2, 4, 8, 16)
# (LiteLLM's routing_strategy, the layout's router word the launcher writes it from, the model's row id)
STRATEGIES = (("simple-shuffle", "shuffle"), ("least-busy", "least-busy"),
              ("latency-based-routing", "latency"), ("leastconn", "leastconn"))
HAPROXY_WORD = "leastconn"  # HAProxy's, not LiteLLM's


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, deadline: float, headers: dict | None = None) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2, headers=headers).status_code == 200:
                return
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer")


def served(url: str) -> int:
    """Requests the twin at `url` has finished, from its own /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return round(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("vllm:request_success_total{")))


async def one(client: httpx.AsyncClient, router: str, i: int) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"request {i}: tell me about routers"}],
            "max_tokens": TG, "stream": True}
    async with client.stream("POST", f"{router}/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {KEY}"}) as r:
        r.raise_for_status()
        async for _ in r.aiter_bytes():
            pass


async def burst(router: str, c: int, client: httpx.AsyncClient | None = None) -> None:
    """c requests at once: on fresh connections, or on `client`'s (kept alive from the bursts before)."""
    if client is not None:
        await asyncio.gather(*(one(client, router, i) for i in range(c)))
        return
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as fresh:
        await asyncio.gather(*(one(fresh, router, i) for i in range(c)))


async def bursts(router: str, c: int, reps: int, twins: list[str], warm: bool) -> list[tuple[int, ...]]:
    """`reps` bursts of c, each after the one before has finished: requests per backend for each."""
    got = []
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as client:
        for _ in range(reps):
            before = [served(u) for u in twins]
            await burst(router, c, client if warm else None)
            after = [served(u) for u in twins]
            got.append(tuple(a - b for a, b in zip(after, before, strict=True)))
    return got


async def continuous(router: str, c: int, requests: int) -> None:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as client:
        left = list(range(requests))

        async def slot() -> None:
            while left:
                await one(client, router, left.pop())

        await asyncio.gather(*(slot() for _ in range(c)))


def start_haproxy(backends: list[str], work: Path) -> tuple[subprocess.Popen, str]:
    """Debian's HAProxy with the config the launcher writes, its key from the environment as in a launch."""
    from sparktop.launch.haproxy import HEALTH, haproxy_config
    from sparktop.launch.topology import ROUTER_KEY_ENV
    from tests.e2e.lab import HAPROXY

    port = free_port()
    path = work / "haproxy.cfg"
    path.write_text(haproxy_config("127.0.0.1", port, [(f"r{i + 1}", u) for i, u in enumerate(backends)],
                                   ROUTER_KEY_ENV))
    log = open(work / "haproxy.log", "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([HAPROXY, "-W", "-db", "-f", str(path)], stdout=log, stderr=log, cwd=work,
                            env={**os.environ, ROUTER_KEY_ENV: KEY})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + HEALTH, time.monotonic() + 30)
    except RuntimeError as exc:
        proc.terminate()
        tail = (work / "haproxy.log").read_text().strip().splitlines()[-3:]
        raise RuntimeError(f"HAProxy did not start: {' | '.join(tail)}") from exc
    return proc, url


def start_router(strategy_word: str, backends: list[str], work: Path, litellm: Path | None) -> tuple[
        subprocess.Popen, str]:
    from sparktop.launch.runtimes.vllm import VllmRuntime
    from sparktop.launch.topology import ROUTER_KEY_ENV, litellm_config

    if strategy_word == HAPROXY_WORD:
        return start_haproxy(backends, work)
    assert litellm is not None

    config = litellm_config(MODEL, strategy_word, [(f"{VllmRuntime.router_provider}/{MODEL}", u) for u in backends])
    path = work / f"litellm-{strategy_word}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    log = open(work / f"litellm-{strategy_word}.log", "w")  # noqa: SIM115 - closed with the process
    env = {**os.environ, ROUTER_KEY_ENV: KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1",
           "LITELLM_LOG": "ERROR"}
    proc = subprocess.Popen([str(litellm), "--config", str(path), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=log, env=env, cwd=work)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health/liveliness", time.monotonic() + 400)  # its imports take minutes on a busy CPU
    except RuntimeError as exc:
        proc.terminate()
        tail = (work / f"litellm-{strategy_word}.log").read_text().strip().splitlines()[-3:]
        raise RuntimeError(f"LiteLLM ({strategy_word}) did not start: {' | '.join(tail)}") from exc
    return proc, url


def measure(reps: int, levels=LEVELS, strategies=STRATEGIES, work: Path | None = None, warm: bool = False) -> dict:
    """{(strategy, c, "burst"|"continuous"): [(requests on backend 1, on backend 2), ...]}"""
    from tests.e2e.lab import ensure_litellm

    litellm = ensure_litellm() if any(word != HAPROXY_WORD for _, word in strategies) else None
    out: dict = {}
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = work or Path(tmp)
        try:
            twins = []
            for i in range(2):
                port = free_port()
                log = open(work / f"twin-{i}.log", "w")  # noqa: SIM115 - closed with the process
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "sparktop", "twin", "serve", MODEL, "--host", "127.0.0.1", "--port",
                     str(port), "--speed", SPEED, "--startup-speed", "500"],
                    stdout=log, stderr=log, cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)}))
                twins.append(f"http://127.0.0.1:{port}")
            for url in twins:
                wait_http(f"{url}/health", time.monotonic() + 120)
            for strategy, word in strategies:
                proc, router = start_router(word, twins, work, litellm)
                procs.append(proc)
                asyncio.run(burst(router, 2))  # warm-up (first-request imports), not counted
                for c in levels:
                    got = asyncio.run(bursts(router, c, reps, twins, warm))
                    out[(strategy, c, "burst")] = got
                    before = [served(u) for u in twins]
                    asyncio.run(continuous(router, c, 8 * c))
                    after = [served(u) for u in twins]
                    out[(strategy, c, "continuous")] = [tuple(a - b for a, b in zip(after, before, strict=True))]
                    say(f"{strategy} c{c}: bursts {Counter(got).most_common()} "
                        f"continuous {out[(strategy, c, 'continuous')]}")
                proc.terminate()
                proc.wait(10)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
    return out


def figures(splits: list[tuple[int, ...]]) -> tuple[float, float]:
    """(the busiest backend's mean share, the share of bursts that all went to one backend)."""
    shares = [max(s) / sum(s) for s in splits if sum(s)]
    alone = [max(s) == sum(s) for s in splits if sum(s)]
    return sum(shares) / len(shares), sum(alone) / len(alone)


def model_figures(word: str, c: int) -> tuple[float, float]:
    from sparktop.model.routers import mean_max_share, one_backend_share, router_for

    points = router_for(word).splits(c, 2)
    return mean_max_share(points), one_backend_share(points)


def report(out: dict) -> list[str]:
    lines = [f"{'strategy':22} {'c':>3} {'load':10} {'max share':>9} {'all on one':>10} "
             f"{'model max':>9} {'model one':>9}  splits (backend 1/backend 2: times)"]
    words = dict(STRATEGIES)
    for (strategy, c, load), splits in out.items():
        mx, one_ = figures(splits)
        seen = ", ".join(f"{a}/{b}: {n}" for (a, b), n in sorted(Counter(splits).items(), key=lambda x: -x[1]))
        if load == "burst":
            mm, mo = model_figures(words[strategy], c)
            model = f"{mm:>9.2f} {mo:>9.0%}"
        else:  # predict_serve splits a continuous load evenly over the replicas of these
            model = f"{0.5:>9.2f} {0.0:>9.0%}" if words[strategy] in ("shuffle", "least-busy", HAPROXY_WORD) \
                else f"{'-':>9} {'-':>9}"
        lines.append(f"{strategy:22} {c:>3} {load:10} {mx:>9.2f} {one_:>10.0%} {model}  {seen}")
    return lines


def fit_race(out: dict, strategy: str = "least-busy") -> float | None:
    """least-busy's race probability q that best explains the bursts that all went to one backend: under the
    mechanism (sparktop.model.routers.race_splits) a burst of c all goes to one backend only as one wave, with
    probability q**(c-1). Maximum likelihood over every burst, on a grid of 0.01."""
    bursts = [(c, max(s) == sum(s)) for (name, c, load), splits in out.items()
              if name == strategy and load == "burst" for s in splits if sum(s)]
    if not bursts:
        return None

    def loglik(q: float) -> float:
        return sum(math.log(q ** (c - 1) if alone else 1 - q ** (c - 1)) for c, alone in bursts)

    return max((i / 100 for i in range(1, 100)), key=loglik)


def run(bench: Bench) -> list[Row]:
    reps = bench.pick(6, 20)
    out = measure(reps, strategies=(*STRATEGIES[:2], STRATEGIES[3]))
    rows = []
    for (strategy, c, load), splits in out.items():
        if load != "burst":
            continue
        mx, one_ = figures(splits)
        mm, mo = model_figures(dict(STRATEGIES)[strategy], c)
        product = "HAProxy" if strategy == HAPROXY_WORD else "LiteLLM 1.106.2"
        rows.append(Row("router_split", f"{strategy} c{c}: bursts all on one backend", mo, one_, product,
                        "share", len(splits), compare="diff"))
        rows.append(Row("router_split", f"{strategy} c{c}: busiest backend's share", mm, mx, product,
                        "share", len(splits), compare="diff"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20, help="bursts per strategy and c")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)))
    ap.add_argument("--strategies", default=",".join(s for s, _ in STRATEGIES))
    ap.add_argument("--warm", action="store_true",
                    help="every burst on connections kept alive from the bursts before (default: fresh ones)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the twins and LiteLLM are stopped too
    levels = tuple(int(x) for x in args.levels.split(","))
    want = args.strategies.split(",")
    out = measure(args.reps, levels, tuple(s for s in STRATEGIES if s[0] in want), warm=args.warm)
    print(f"{', '.join(want)} over two twin engines ({MODEL}, x{SPEED}), {args.reps} lockstep bursts per c "
          f"({'kept-alive' if args.warm else 'fresh'} connections), "
          "continuous load 8c requests with c in flight; counts from each twin's /metrics")
    for line in report(out):
        print(line)
    q = fit_race(out)
    if q is not None:
        from sparktop.model.routers import LEAST_BUSY_RACE, one_backend_share, race_splits

        fitted = ", ".join(f"c{c} {one_backend_share(race_splits(c, 2, q)):.0%}" for c in levels)
        print(f"least-busy's race probability fitted to these bursts: q = {q:.2f} (all on one backend then: "
              f"{fitted}); the model ships q = {LEAST_BUSY_RACE}")


if __name__ == "__main__":
    main()
