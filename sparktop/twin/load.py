"""A light, ever-changing background load for the demo, so the numbers move.

Each endpoint gets a slowly varying number of concurrent streaming chats
(between `--min` and `--max`) with prompts of a few hundred to a few
thousand words; a share of them repeat a long shared prefix, so the prefix
cache has something to hit. Run it as its own process:

    python -m sparktop.twin.load http://127.0.0.2:8000 http://127.0.0.3:8000

With `--step-aside` (the demo's), while a sweep (or a study) on this machine measures one of the nodes
(`sparktop.measuring`), the load sends that node nothing new, so the sweep measures the engine, not this
load. Without it, it is any other client's traffic, which a sweep's guard must catch.

A LiteLLM router in front wants its master key: `$SPARKTOP_LOAD_API_KEY`
(from the environment, never the command line, which `ps` shows).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random

import httpx

from sparktop.measuring import host_of, measured_hosts

SHARED = "You are a careful assistant for a team that runs vLLM on two DGX Spark nodes. " * 40
WORDS = ["memory", "bandwidth", "decode", "prefill", "expert", "cache", "token", "batch", "latency", "node", "cluster",
         "router", "kernel", "tensor", "parallel", "ray", "engine", "queue", "spark", "unified", "weights",
         "attention", "context", "sequence"]


async def one_request(client: httpx.AsyncClient, url: str, model: str, rng: random.Random) -> None:
    words = rng.choice([200, 400, 800, 1500, 3000])
    # Random words: only the shared system prompt should hit the prefix cache.
    prompt = " ".join(rng.choice(WORDS) for _ in range(words))
    messages = [{"role": "user", "content": prompt}]
    if rng.random() < 0.4:
        messages.insert(0, {"role": "system", "content": SHARED})
    body = {"model": model, "messages": messages, "max_tokens": rng.choice([64, 128, 256, 512]),
            "stream": True, "reasoning_effort": "low"}
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
            async for _ in r.aiter_bytes():
                pass
    except httpx.HTTPError:
        await asyncio.sleep(1.0)


async def model_of(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        r = await client.get(url + "/v1/models", timeout=2)
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return None


async def drive(url: str, low: int, high: int, period: float, seed: int, step_aside: bool = False) -> None:
    rng = random.Random(seed)
    phase = rng.random() * 2 * math.pi
    loop = asyncio.get_running_loop()
    start = loop.time()
    inflight: set[asyncio.Task] = set()
    key = os.environ.get("SPARKTOP_LOAD_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=high + 4), headers=headers) as client:
        model = None
        while True:
            if model is None:
                model = await model_of(client, url)
                if model is None:
                    await asyncio.sleep(1)
                    continue
            t = loop.time() - start
            target = round(low + (high - low) * (0.5 + 0.5 * math.sin(2 * math.pi * t / period + phase)))
            if step_aside and host_of(url) in measured_hosts():
                target = 0  # a sweep measures this node: step aside (what is in flight finishes) until it ends
            while len(inflight) < target:
                task = asyncio.create_task(one_request(client, url, model, rng))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
            await asyncio.sleep(0.5)


async def orphan_watch(parent: int | None) -> None:
    """Stop when the process that started us is gone."""
    if not parent:
        return
    while os.getppid() == parent:
        await asyncio.sleep(1.0)


async def main_async(urls: list[str], low: int, high: int, period: float, parent: int | None = None,
                     step_aside: bool = False) -> None:
    drivers = [asyncio.create_task(drive(u.rstrip("/"), low, high, period, i, step_aside))
               for i, u in enumerate(urls)]
    if parent:
        await orphan_watch(parent)
        for task in drivers:
            task.cancel()
        await asyncio.gather(*drivers, return_exceptions=True)
    else:
        await asyncio.gather(*drivers)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparktop.twin.load")
    ap.add_argument("urls", nargs="+")
    ap.add_argument("--min", type=int, default=1)
    ap.add_argument("--max", type=int, default=6)
    ap.add_argument("--period", type=float, default=90.0, help="seconds per load cycle")
    ap.add_argument("--parent", type=int, help="exit when this process is no longer our parent")
    ap.add_argument("--step-aside", action="store_true", help="send nothing new to a node a sweep on this "
                    "machine is measuring (the demo's load)")
    args = ap.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main_async(args.urls, args.min, args.max, args.period, args.parent, args.step_aside))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
