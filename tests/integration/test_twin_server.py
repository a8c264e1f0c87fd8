"""The twin as a client sees it: an OpenAI client, prometheus-client's
parser, and timing that follows the twin's own performance model.

Where a test is about time (a token's pace, requests overlapping, startup's
order) the twin runs on simulated time (tests/helpers/simulated.py), so what
it asserts is what the model computes, however busy this machine is. The
CLI's twin is another process and runs on real time: those tests assert
exit codes and what it says, never how fast."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparktop.model.fit import load_constants
from sparktop.model.perf import PerfModel
from sparktop.twin.dialects.vllm_args import parse_serve_args
from sparktop.twin.dialects.vllm_metrics import ITL_BUCKETS, TTFT_BUCKETS
from sparktop.twin.server import TwinServer
from tests.conftest import free_port
from tests.helpers.simulated import sim_clock, sim_twin, simulated
from tests.helpers.sweep_sim import record_steps

_clients: list[openai.AsyncOpenAI] = []


def client(server) -> openai.AsyncOpenAI:
    oa = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    _clients.append(oa)
    return oa


@pytest.fixture(autouse=True)
async def _close_clients():
    # An AsyncOpenAI client left to the garbage collector closes its pool from
    # __del__ at an arbitrary moment, and that can swallow a response of a
    # client still in use (seen with openai 2.54 and 3.54): close each one.
    yield
    while _clients:
        await _clients.pop().close()


def metric_families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families: dict, name: str, suffix: str = "", **labels) -> float:
    fam = families[name]
    total = 0.0
    for s in fam.samples:
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


async def test_openai_client_streams_a_chat_with_usage(twin):
    server = await twin("llama-3.1-8b", speed=20)
    oa = client(server)
    models = await oa.models.list()
    assert [m.id for m in models.data] == ["llama-3.1-8b"]
    stream = await oa.chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "Tell me about the GB10."}],
        max_tokens=24, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    text, usage, finish, ids = "", None, None, 0
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
            ids += len((choice.model_extra or {}).get("token_ids") or [])
    assert usage.completion_tokens == 24 == ids
    assert usage.prompt_tokens > 8
    assert finish == "length"
    assert len(text.split()) >= 12


async def test_non_streaming_chat_and_completions(twin):
    server = await twin("llama-3.1-8b", speed=50)
    oa = client(server)
    chat = await oa.chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=10,
        extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 10
    assert chat.choices[0].message.content
    comp = await oa.completions.create(model="llama-3.1-8b", prompt="The Spark has", max_tokens=7,
                                       extra_body={"ignore_eos": True})
    assert comp.usage.completion_tokens == 7 and comp.choices[0].text
    stream = await oa.completions.create(model="llama-3.1-8b", prompt="Once", max_tokens=5, stream=True,
                                         extra_body={"ignore_eos": True})
    pieces = [c.choices[0].text async for c in stream if c.choices]
    assert len([p for p in pieces if p]) == 5


async def test_reasoning_model_streams_reasoning_before_content_and_effort_shortens_it(twin):
    server = await twin("gpt-oss-120b", speed=200)
    oa = client(server)

    async def reasoning_share(effort: str) -> tuple[int, int, bool]:
        stream = await oa.chat.completions.create(
            model="gpt-oss-120b", messages=[{"role": "user", "content": f"Plan a benchmark ({effort})."}],
            max_tokens=2000, stream=True, extra_body={"reasoning_effort": effort})
        reasoning = content = 0
        order_ok = True
        async for chunk in stream:
            for choice in chunk.choices:
                extra = choice.delta.model_extra or {}
                if extra.get("reasoning_content"):
                    reasoning += 1
                    order_ok = order_ok and content == 0
                if choice.delta.content:
                    content += 1
        return reasoning, content, order_ok

    low = [await reasoning_share("low") for _ in range(3)]
    high = [await reasoning_share("high") for _ in range(3)]
    assert all(r > 0 and c > 0 and ok for r, c, ok in low)
    assert all(ok for _, _, ok in high)
    assert sum(r for r, _, _ in low) * 2 < sum(r for r, _, _ in high)


async def test_metrics_parse_with_vllm_names_types_labels_and_buckets(twin):
    server = await twin("gemma4-26b-a4b", speed=50)
    oa = client(server)
    await asyncio.gather(*(oa.chat.completions.create(
        model="gemma4-26b-a4b", messages=[{"role": "user", "content": "x " * 300}], max_tokens=20,
        extra_body={"ignore_eos": True}) for _ in range(3)))
    async with httpx.AsyncClient() as http:
        text = (await http.get(server.url + "/metrics")).text
    fams = metric_families(text)
    kinds = {
        "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge", "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter", "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter", "vllm:num_preemptions": "counter",
        "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram", "vllm:request_success": "counter",
    }
    for name, kind in kinds.items():
        assert fams[name].type == kind, name
    labels = {"model_name": "gemma4-26b-a4b", "engine": "0"}
    assert sample(fams, "vllm:generation_tokens", "_total", **labels) == 60
    assert sample(fams, "vllm:request_success", "_total", finished_reason="length") == 3
    assert sample(fams, "vllm:time_to_first_token_seconds", "_count") == 3
    assert sample(fams, "vllm:inter_token_latency_seconds", "_count") == 57
    prompt = sample(fams, "vllm:prompt_tokens", "_total")
    assert prompt == sample(fams, "vllm:prefix_cache_queries", "_total") > 900
    ttft_les = sorted({float(s.labels["le"]) for s in fams["vllm:time_to_first_token_seconds"].samples
                       if s.name.endswith("_bucket")})
    assert ttft_les[:-1] == TTFT_BUCKETS and ttft_les[-1] == float("inf")
    itl_les = sorted({float(s.labels["le"]) for s in fams["vllm:inter_token_latency_seconds"].samples
                      if s.name.endswith("_bucket")})
    assert itl_les[:-1] == ITL_BUCKETS
    # As from vLLM, each counter also exposes a `_created` gauge family.
    assert fams["vllm:prompt_tokens_created"].type == "gauge"


@simulated
async def test_each_c1_token_takes_the_models_decode_step_at_its_context():
    """A lone request decodes at the model's pace: token k+1 comes one decode step at the context the
    request then holds (prompt + k) after token k, divided by the twin's speed. On simulated time the
    client's stamps are the twin's steps, so this holds to the clock's microsecond; the same pace on real time
    is a measurement (tests/benchmarks/twin_decode.py)."""
    speed = 2.0
    clock = sim_clock()
    async with sim_twin("gpt-oss-120b", speed=speed, clock=clock) as server:
        model = PerfModel(server.card, k=load_constants())  # the twin runs the fitted constants
        async with httpx.AsyncClient(timeout=60) as http:
            body = {"model": "gpt-oss-120b", "messages": [{"role": "user", "content": "word " * 500}],
                    "max_tokens": 160, "stream": True, "ignore_eos": True,
                    "stream_options": {"include_usage": True}}
            stamps = []
            prompt_tokens = None
            async with http.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    data = json.loads(line[6:])
                    if data.get("usage"):
                        prompt_tokens = data["usage"]["prompt_tokens"]
                    for choice in data["choices"]:
                        delta = choice.get("delta", {})
                        if delta.get("content") or delta.get("reasoning_content"):
                            stamps.append(clock.now())
    assert len(stamps) == 160 and prompt_tokens is not None
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    # The first decode step attends to the prompt, each next one to one token more.
    steps = [1 / model.decode_tps(1, prompt_tokens + k) / speed for k in range(len(gaps))]
    assert gaps == pytest.approx(steps, abs=2e-6)  # the loop's clock counts whole microseconds
    rate = len(gaps) / (stamps[-1] - stamps[0]) / speed  # at Spark's speed
    assert rate == pytest.approx(len(steps) / sum(steps) / speed, rel=1e-5)
    # And it is physically plausible: below the bandwidth roofline of a GB10.
    assert rate < model.roofline_decode_tps(1, prompt_tokens + len(gaps))


@simulated
async def test_kv_usage_rises_with_concurrency():
    """The KV cache holds more the more requests run together: its use after every step of the engine (what
    vllm:kv_cache_usage_perc publishes), not a gauge sampled now and then. On simulated time the requests of a
    group reach the engine together whatever the machine's load."""
    async with sim_twin("llama-3.1-8b", "--gpu-memory-utilization", "0.2", "--max-model-len", "8192",
                        speed=20) as server:
        steps = record_steps(server)

        async def peak_usage(concurrency: int) -> float:
            oa = client(server)
            first = len(steps)
            results = await asyncio.gather(*(oa.chat.completions.create(
                model="llama-3.1-8b", messages=[{"role": "user", "content": f"{i} " + "tok " * 800}],
                max_tokens=64, extra_body={"ignore_eos": True}) for i in range(concurrency)))
            assert all(r.usage.completion_tokens == 64 for r in results)
            mine = steps[first:]
            assert max(s.running + s.waiting for s in mine) == concurrency  # all of them were in at once
            return max(s.kv_usage for s in mine)

        one, eight, thirty_two = await peak_usage(1), await peak_usage(8), await peak_usage(32)
    assert 0 < one < eight < thirty_two


@simulated
async def test_preemptions_appear_when_the_cache_is_over_full():
    """32 requests that together need more KV than the cache holds: on simulated time they are all in the
    engine at once whatever the machine's load, so the cache overflows every time."""
    # A small cache: ~8k tokens of KV for requests needing 32 x 1.2k.
    async with sim_twin("llama-3.1-8b", "--gpu-memory-utilization", "0.112", "--max-model-len", "4096",
                        speed=50) as server:
        assert server.engine.kv_capacity_tokens < 12000
        oa = client(server)
        results = await asyncio.gather(*(oa.chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": f"{i} " + "tok " * 1000}],
            max_tokens=200, extra_body={"ignore_eos": True}) for i in range(32)))
        assert all(r.usage.completion_tokens == 200 for r in results)
        async with httpx.AsyncClient() as http:
            fams = metric_families((await http.get(server.url + "/metrics")).text)
        assert sample(fams, "vllm:num_preemptions", "_total") == server.engine.total_preemptions > 0


async def test_prefix_cache_hits_on_a_repeated_prompt(twin):
    # vLLM 0.32 reports cached tokens in usage only with --enable-prompt-tokens-details.
    server = await twin("llama-3.1-8b", "--enable-prompt-tokens-details", speed=50)
    oa = client(server)
    messages = [{"role": "user", "content": "shared context " * 400}]
    for _ in range(2):
        r = await oa.chat.completions.create(model="llama-3.1-8b", messages=messages, max_tokens=4,
                                             extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens_details.cached_tokens > 700
    async with httpx.AsyncClient() as http:
        fams = metric_families((await http.get(server.url + "/metrics")).text)
    assert sample(fams, "vllm:prefix_cache_hits", "_total") > 700


async def test_the_request_log_holds_each_streamed_request_as_the_server_served_it(twin, tmp_path):
    """`--request-log`: what a timing test holds a client's first token to. A line per request, with the
    usage's prompt tokens, the prefix cache's hits, and the server's moments in the order they happen."""
    log = tmp_path / "requests.jsonl"
    server = await twin("llama-3.1-8b", "--request-log", str(log), speed=50)
    oa = client(server)
    messages = [{"role": "user", "content": "shared context " * 400}]
    usages = []
    for _ in range(2):
        stream = await oa.chat.completions.create(model="llama-3.1-8b", messages=messages, max_tokens=8,
                                                  stream=True, stream_options={"include_usage": True},
                                                  extra_body={"ignore_eos": True})
        usages += [chunk.usage async for chunk in stream if chunk.usage]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(x["prompt_tokens"], x["output_tokens"], x["stream"]) for x in lines] == \
        [(u.prompt_tokens, u.completion_tokens, True) for u in usages]
    assert lines[0]["cached_tokens"] == 0 and lines[1]["cached_tokens"] > 700
    for x in lines:
        assert x["received"] <= x["arrival"] <= x["first_token"] <= x["first_sent"] <= x["last_sent"]
    # The second request was sent after the first was read to its end.
    assert lines[1]["received"] > lines[0]["last_sent"]


async def test_bad_requests_get_vllm_style_errors(twin):
    server = await twin("llama-3.1-8b", "--max-model-len", "2048", "--api-key", "sekret", speed=50)
    async with httpx.AsyncClient() as http:
        assert (await http.get(server.url + "/v1/models")).status_code == 401
        auth = {"Authorization": "Bearer sekret"}
        too_long = await http.post(server.url + "/v1/chat/completions", headers=auth, json={
            "model": "llama-3.1-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5000})
        assert too_long.status_code == 400
        # vLLM 0.32's words (tests/real checks the twin says what the real server says).
        assert "max_tokens=5000 cannot be greater than max_model_len=2048" in too_long.json()["error"]["message"]
        wrong = await http.post(server.url + "/v1/chat/completions", headers=auth, json={
            "model": "nope", "messages": [{"role": "user", "content": "x"}]})
        assert wrong.status_code == 404
        assert (await http.get(server.url + "/health")).status_code == 200
        assert "version" in (await http.get(server.url + "/version")).json()


@simulated
async def test_health_does_not_answer_until_startup_is_done():
    """Startup's modeled stages (5x faster) pass on simulated time: /health refuses while they run, answers
    once the last is done, and the log says each stage in vLLM's order."""
    args = parse_serve_args(["llama-3.1-8b", "--host", "127.0.0.1", "--port", "0", "--load-format", "dummy",
                             "--enforce-eager", "--startup-speed", "5"])
    log = io.StringIO()
    server = TwinServer(args, log=log, clock=sim_clock())
    task = asyncio.create_task(server.start())
    try:
        while server.port is None:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(timeout=10) as http:
            with pytest.raises(httpx.ConnectError):  # bound, not listening: refused at once
                await http.get(server.url + "/health")
            assert server.stage != "ready" and not task.done()
            await task
            assert server.stage == "ready"
            assert (await http.get(server.url + "/health")).status_code == 200
    finally:
        await server.stop()
    text = log.getvalue()
    for words in ("Loading weights took", "Available KV cache memory", "GPU KV cache size",
                  "Maximum concurrency for", "Application startup complete."):
        assert words in text
    assert text.index("Loading weights took") < text.index("GPU KV cache size") < text.index("startup complete")


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparktop", *args], capture_output=True, text=True,
                          timeout=timeout)


def healthy(url: str, proc: subprocess.Popen, limit: float = 60.0) -> None:
    """Until the twin process answers /health (a limit for a hang, far above the second it takes)."""
    deadline = time.monotonic() + limit
    while True:
        assert proc.poll() is None, f"the twin exited with {proc.returncode} before it was healthy"
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"the twin was not healthy within {limit:g} s"
        time.sleep(0.1)


def test_a_model_too_large_for_one_spark_fails_to_start():
    port = free_port()
    r = run_cli("twin", "serve", "--model", "qwen3-235b-a22b", "--port", str(port), "--startup-speed", "1000")
    assert r.returncode != 0
    assert "CUDA out of memory" in r.stdout


def test_a_model_with_no_room_for_kv_cache_fails_like_vllm():
    port = free_port()
    r = run_cli("twin", "serve", "--model", "nemotron-3-super-120b-a12b", "--port", str(port),
                "--gpu-memory-utilization", "0.6", "--startup-speed", "1000")
    assert r.returncode == 1
    assert "No available memory for the cache blocks" in r.stdout


def test_port_already_in_use_fails():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("twin", "serve", "--model", "llama-3.1-8b", "--host", "127.0.0.1", "--port", str(port))
    assert r.returncode == 1
    assert "Address already in use" in r.stdout


def test_twin_serve_cli_answers_a_streaming_chat_and_metrics(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sparktop", "twin", "serve", "--model", "gpt-oss-120b",
                             "--host", "127.0.0.1", "--port", str(port), "--startup-speed", "200"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        healthy(url, proc)
        body = {"model": "gpt-oss-120b", "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        usage = json.loads(lines[-2][6:])["usage"]
        assert usage["completion_tokens"] == 8
        metrics = httpx.get(url + "/metrics").text
        assert 'vllm:generation_tokens_total{engine="0",model_name="gpt-oss-120b"} 8.0' in metrics
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert "Application startup complete." in out
