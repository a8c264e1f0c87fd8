"""`sparktop status` for scripts: JSON with each engine's KV cache, queue and
token rates, read from a running twin."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx

from tests.conftest import free_port


def test_status_json_reports_engine_figures_under_load():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "sparktop", "twin", "serve", "--model", "llama-3.1-8b",
                               "--host", "127.0.0.1", "--port", str(port), "--startup-speed", "1000",
                               "--speed", "4"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)

        async def load_and_status():
            async def one(i):
                async with httpx.AsyncClient(timeout=60) as c:
                    await c.post(url + "/v1/chat/completions", json={
                        "messages": [{"role": "user", "content": f"{i} " + "x " * 500}],
                        "max_tokens": 400, "ignore_eos": True})
            jobs = [asyncio.create_task(one(i)) for i in range(4)]
            await asyncio.sleep(0.5)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sparktop", "status", "--json", "--engine", url + "/v1",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await proc.communicate()
            await asyncio.gather(*jobs)
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
    assert engine["gen_tps"] > 10 and engine["prompt_tps"] is not None
    assert data["nodes"][0]["memory_gib"]["total"] > 0  # this machine, read like a node
    # How it was found, the request figures, where it runs and its event log (none in 2 s of calm).
    assert engine["found"] == "given (--engine)" and engine["events"] == []
    assert engine["finished_by_reason"] is not None and engine["requests_total"] == sum(
        engine["finished_by_reason"].values())
    assert engine["started"] and engine["gen_tokens_total"] > 0 and engine["nodes"] == []
    assert set(engine["latency_ms"] or {}) <= {"ttft", "itl", "queue", "e2e"}
    assert engine["peaks"]["running"] == 4
    assert "events" in data["nodes"][0] and "energy" in data["nodes"][0]
