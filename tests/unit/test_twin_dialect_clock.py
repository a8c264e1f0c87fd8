"""The llama.cpp and SGLang twins on simulated time (tests/helpers/simulated.py): whatever dialect it speaks,
the twin charges the API server's per-request cost before a request reaches its engine, as the model does
(`request_overhead_s`), and keeps every time it reports on the server's clock. So a lone streamed request's
first token comes exactly when the model says, one API cost and one prefill step after it was sent, and what
the server says of its own time (llama.cpp's `timings`, `created` and log stamps, SGLang's scheduler seconds
and its warm-up) is the loop's time, to the loop's microsecond."""

from __future__ import annotations

import asyncio
import io
import json
import re

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparktop.clock import Clock
from sparktop.twin.dialects.llamacpp import LlamaCppDialect
from sparktop.twin.dialects.sglang import WARMUP_TEXT, WARMUP_TOKENS, SglangDialect, SglangMetrics
from sparktop.twin.server import TwinServer
from tests.helpers.simulated import sim_clock, simulated

GGUF = "/models/Llama-3.1-8B-Instruct-Q4_K_M.gguf"
SPEED = 2.0
PROMPT = list(range(1000, 1300))  # 300 token ids, sent as they are: no tokenizer, no cached prefix
MAX_TOKENS = 6
IDLE_S = 500.0  # simulated seconds the twin idles before the request: the machine's clock is far behind
TICK = 2e-6  # looptime's clock moves in microseconds: each sleep's end is rounded to one


def prefill_s(server: TwinServer, prompt: int) -> float:
    """One prefill step of `prompt` uncached tokens on an idle engine, as the twin's engine times it."""
    assert server.engine is not None
    return server.engine.perf.step_time([], [(prompt, 0)]) / server.speed


def decode_s(server: TwinServer, prompt: int, tokens: int) -> float:
    """The decode steps after the first token, up to `tokens` in all: step k attends prompt + k - 1 tokens."""
    assert server.engine is not None
    return sum(server.engine.perf.step_time([prompt + k - 1], []) for k in range(1, tokens)) / server.speed


def api_s(server: TwinServer) -> float:
    assert server.plan is not None
    return server.plan.perf.k.request_overhead_s / server.speed


async def stream(url: str) -> tuple[float, float, list[dict]]:
    """A streamed /v1/completions of PROMPT: (loop time of its first token's chunk, of the stream's end,
    every data chunk)."""
    loop = asyncio.get_running_loop()
    body = {"model": "any", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}
    first: float | None = None
    chunks: list[dict] = []
    async with aiohttp.ClientSession() as http, http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            if first is None:
                first = loop.time()
            chunks.append(json.loads(line[6:]))
    assert first is not None
    return first, loop.time(), chunks


async def llamacpp(clock: Clock) -> TwinServer:
    dialect = LlamaCppDialect()
    args = dialect.parse(["-m", GGUF, "--host", "127.0.0.1", "--port", "0", "--speed", str(SPEED),
                          "--startup-speed", "1e6", "-np", "4", "-c", "4096"])
    server = TwinServer(args, log=io.StringIO(), dialect=dialect, clock=clock)
    await server.start()
    return server


def log_seconds(stamp: str) -> float:
    """llama.cpp's log stamp (minutes.seconds.ms.µs since start) in seconds."""
    m, s, ms, us = (int(x) for x in stamp.split("."))
    return m * 60 + s + ms / 1e3 + us / 1e6


@simulated
async def test_first_token_timings_and_the_servers_own_time_are_the_models_on_the_loops_clock():
    loop = asyncio.get_running_loop()
    clock = sim_clock()

    # -- llama.cpp: its own completion handler --------------------------------------------------------------------
    started = loop.time()
    server = await llamacpp(clock)
    try:
        await asyncio.sleep(IDLE_S)
        sent = loop.time()
        first, done, chunks = await stream(server.url)
        prefill, decode = prefill_s(server, len(PROMPT)), decode_s(server, len(PROMPT), MAX_TOKENS)
        # The API server's cost, then one prefill step: the model's TTFT, to the loop's microsecond.
        assert first - sent == pytest.approx(api_s(server) + prefill, abs=TICK)
        assert done - sent == pytest.approx(api_s(server) + prefill + decode, abs=TICK)
        last = chunks[-1]
        assert last["usage"]["prompt_tokens"] == len(PROMPT) and last["usage"]["completion_tokens"] == MAX_TOKENS
        # Its timings: the prompt from its step's start to the first token, generation from there to the last.
        assert last["timings"]["prompt_ms"] == pytest.approx(prefill * 1e3, abs=TICK * 1e3)
        assert last["timings"]["predicted_ms"] == pytest.approx(decode * 1e3, abs=TICK * 1e3)
        assert last["created"] == int(clock.wall())
        # Its log counts the server's time since it started: the slot's release is stamped at the last token.
        stream_log = server.log.stream
        assert isinstance(stream_log, io.StringIO)
        (release,) = [line for line in stream_log.getvalue().splitlines() if "stop processing" in line]
        stamp = re.match(r"(\d+\.\d\d\.\d{3}\.\d{3}) ", release)
        assert stamp is not None, release
        assert log_seconds(stamp.group(1)) == pytest.approx(done - started, abs=TICK)
    finally:
        await server.stop()

    # -- SGLang: its warm-up request, then vLLM's OpenAI routes -------------------------------------------------
    dialect = SglangDialect()
    args = dialect.parse(["--model-path", "llama-3.1-8b", "--host", "127.0.0.1", "--port", "0", "--speed",
                          str(SPEED), "--startup-speed", "1e6"])
    server = TwinServer(args, log=io.StringIO(), dialect=dialect, clock=clock)
    await server.start()
    try:
        ready = loop.time()
        (warm_up,) = [t for t in server._tasks if t.get_name() == "sglang-warmup"]
        await warm_up
        assert dialect.up
        warm = len([1, *server.tokenizer.encode(WARMUP_TEXT)])
        # Its warm-up is a request through its API server too: the API cost, a prefill, the decodes.
        assert loop.time() - ready == pytest.approx(
            api_s(server) + prefill_s(server, warm) + decode_s(server, warm, WARMUP_TOKENS), abs=TICK)
        metrics = server.metrics
        assert isinstance(metrics, SglangMetrics)

        def scheduler_seconds() -> float:
            """sglang:scheduler_stage_seconds_total over its stages: the scheduler's wall time, idle or busy."""
            return sum(s.value for f in text_string_to_metric_families(metrics.render().decode())
                       for s in f.samples if s.name == "sglang:scheduler_stage_seconds_total")

        counted, since = scheduler_seconds(), loop.time()
        await asyncio.sleep(IDLE_S)
        sent = loop.time()
        first, done, chunks = await stream(server.url)
        assert first - sent == pytest.approx(api_s(server) + prefill_s(server, len(PROMPT)), abs=TICK)
        assert done - sent == pytest.approx(api_s(server) + prefill_s(server, len(PROMPT))
                                            + decode_s(server, len(PROMPT), MAX_TOKENS), abs=TICK)
        # Its scheduler's idle and busy seconds are the loop's.
        assert scheduler_seconds() - counted == pytest.approx(loop.time() - since, abs=TICK)
    finally:
        await server.stop()
