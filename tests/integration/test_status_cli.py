"""`sparktop status` for scripts: JSON with each engine's KV cache, queue and
token rates, read from a running twin. The load is held on for as long as
status runs (requests far longer than its watch, ended by the test), and
status starts only once the twin says all four run: what it reports is a
state, not a race between this machine's speed and the requests' length."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys

import httpx

from tests.helpers.scraper import parse
from tests.helpers.twin_process import start_twin_process


def test_status_json_reports_engine_figures_under_load():
    server, url = start_twin_process("llama-3.1-8b", speed=4)
    try:

        async def load_and_status():
            client = httpx.AsyncClient(timeout=120)
            running = 0.0

            async def one(i):
                # ~40 s of decoding at speed 4: longer than status takes to start and watch, cancelled after.
                await client.post(url + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": f"{i} " + "x " * 500}],
                    "max_tokens": 4000, "ignore_eos": True})

            async def four_running() -> bool:
                nonlocal running
                running = parse((await client.get(url + "/metrics")).text).get("vllm:num_requests_running", 0)
                return running == 4

            jobs = [asyncio.create_task(one(i)) for i in range(4)]
            try:
                deadline = asyncio.get_running_loop().time() + 60
                while not await four_running():
                    assert asyncio.get_running_loop().time() < deadline, f"{running} of 4 running after 60 s"
                    await asyncio.sleep(0.1)
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "sparktop", "status", "--json", "--engine", url + "/v1",
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
                out, err = await proc.communicate()
                # Still all four when status had its answer: the figures it printed were taken under this load.
                assert await four_running(), f"the load ended before status did ({running} running)"
            finally:
                for job in jobs:
                    job.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*jobs, return_exceptions=True)
                await client.aclose()
            return proc.returncode, out.decode(), err.decode()

        code, out, err = asyncio.run(load_and_status())
    finally:
        server.terminate()
        server.wait(10)
    assert code == 0, err
    data = json.loads(out)
    (engine,) = [e for e in data["engines"] if e["url"] == url]
    assert engine["state"] == "ready" and engine["model"] == "llama-3.1-8b"
    assert engine["running"] == 4 and engine["waiting"] == 0
    assert 0 < engine["kv_cache_usage"] < 1
    assert engine["gen_tps"] > 0 and engine["prompt_tps"] is not None
    assert data["nodes"][0]["memory_gib"]["total"] > 0  # this machine, read like a node
    # How it was found, the request figures, where it runs and its event log (none in 2 s of calm).
    assert engine["found"] == "given (--engine)" and engine["events"] == []
    assert engine["finished_by_reason"] is not None and engine["requests_total"] == sum(
        engine["finished_by_reason"].values())
    assert engine["started"] and engine["gen_tokens_total"] > 0 and engine["nodes"] == []
    assert set(engine["latency_ms"] or {}) <= {"ttft", "itl", "queue", "e2e"}
    assert engine["peaks"]["running"] == 4
    assert "events" in data["nodes"][0] and "energy" in data["nodes"][0]
