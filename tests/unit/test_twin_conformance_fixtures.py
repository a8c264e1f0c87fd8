"""The twin answers what a real vLLM 0.32.0 answered, and its new figures follow its simulation.

The first part replays `tests/fixtures/vllm-0.32.0/INDEX.json` (the requests
`scripts/capture_vllm.py` sent to a real vLLM 0.32.0) to an in-process twin
serving as `tiny-llama` with the same context length, and holds each answer
to the recorded one by shape (`tests/helpers/conformance.py`): status, keys
and JSON types, the kinds of SSE chunks in order, every `vllm:` metric
family with its type, label names and buckets. What the twin keeps different
on purpose is in `sparktop.twin.dialects.vllm_differences`.

The second part checks that what vLLM 0.32 added is the twin's own
simulation, not constants: requests waiting by reason under a queue, prompt
tokens by source after prefix-cache hits, the estimated bytes per GPU within
GB10's bandwidth, preemptions per request, admission limits, and sleep mode.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparktop.model.cards import find_card
from sparktop.model.fit import load_constants
from sparktop.model.perf import PerfModel
from sparktop.twin.dialects.vllm import VLLM_VERSION
from sparktop.twin.dialects.vllm_differences import DIFFERENCES
from sparktop.twin.engine import step_traffic
from sparktop.twin.openai_api import TWIN_HEADER
from tests.helpers import conformance as c
from tests.helpers.simulated import sim_clock, sim_twin, simulated

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm-0.32.0"
INDEX = json.loads((FIXTURES / "INDEX.json").read_text())
MODEL = "tiny-llama"  # the name the real server served
MAX_MODEL_LEN = 2048
CARD = "llama-3.1-8b"  # a dense Llama, as the recorded tiny one
CHAT = [{"role": "user", "content": "the node reads the cache"}]


def expand(value: object) -> object:
    """INDEX.json's requests with the elided prompt written out again
    ("<10740 characters: 'node node node node '...>")."""
    if isinstance(value, dict):
        return {k: expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v) for v in value]
    if isinstance(value, str):
        m = re.fullmatch(r"<(\d+) characters: '(.+)'\.\.\.>", value)
        if m:
            length, unit = int(m.group(1)), m.group(2)
            return (unit * (length // len(unit) + 1))[:length]
    return value


async def start(twin, *flags: str, speed: float = 50):
    return await twin(CARD, "--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN), *flags,
                      speed=speed)


def sim_start(*flags: str):
    """The same twin at Spark's speed on simulated time (tests/helpers/simulated.py; the test is marked
    `@simulated`): a request of 1000 tokens runs some 40 s of the loop's time and none of this machine's, so a
    state the test waits for stays while it looks, however busy the machine is."""
    return sim_twin(CARD, "--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN), *flags)


async def replay(server) -> tuple[dict[str, httpx.Response], str, str]:
    """Every request of INDEX.json in its order, with /metrics before and after."""
    answers: dict[str, httpx.Response] = {}
    async with httpx.AsyncClient(timeout=60) as http:
        idle = (await http.get(server.url + "/metrics")).text
        for name, entry in INDEX.items():
            body = expand(entry["request"])
            url = server.url + entry["path"]
            answers[name] = await (http.get(url) if body is None else http.post(url, json=body))
        after = (await http.get(server.url + "/metrics")).text
    return answers, idle, after


def value(text: str, sample: str, **labels: str) -> float:
    """The sum of a sample's values over the series matching `labels`."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def scrape(server) -> str:
    async with httpx.AsyncClient(timeout=30) as http:
        return (await http.get(server.url + "/metrics")).text


async def scrape_when(server, condition, timeout: float = 15.0) -> str:
    """The first scrape whose text satisfies `condition`: a state the twin reaches, waited for (on a busy
    machine requests sent together may arrive seconds apart)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition(text := await scrape(server)):
        assert asyncio.get_running_loop().time() < deadline, f"not reached in {timeout:g} s:\n{text}"
        await asyncio.sleep(0.02)
    return text


def in_flight(text: str) -> float:
    """Requests the engine holds, running or queued."""
    return value(text, "vllm:num_requests_running") + value(text, "vllm:num_requests_waiting")


# -- what a real vLLM 0.32.0 answered ------------------------------------------------


@pytest.fixture
async def replayed(twin):
    server = await start(twin)
    answers, idle, after = await replay(server)
    return server, answers, idle, after


@pytest.mark.parametrize("name", list(INDEX))
async def test_each_answer_has_the_recorded_status_and_shape(replayed, name):
    _, answers, _, _ = replayed
    answer, recorded = answers[name], (FIXTURES / name).read_text()
    assert answer.status_code == INDEX[name]["status"], answer.text
    if name.endswith(".sse"):
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert c.sse_kinds(answer.text) == c.sse_kinds(recorded)
        assert c.compare(c.sse_shapes(recorded), c.sse_shapes(answer.text), c.ignored("sse")) == []
    elif name.endswith(".json"):
        assert c.compare(c.json_shape(recorded), c.json_shape(answer.text), c.ignored("json")) == []
    else:
        assert answer.text == recorded


async def test_version_is_vllms_and_a_header_tells_the_twin(replayed):
    _, answers, _, _ = replayed
    assert answers["version.json"].json() == {"version": VLLM_VERSION} == json.loads(
        (FIXTURES / "version.json").read_text())
    assert answers["version.json"].headers[TWIN_HEADER]


async def test_error_bodies_say_what_vllm_says(replayed):
    _, answers, _, _ = replayed
    for name in ("error-unknown-model.json", "error-too-long.json"):
        # Same model name and context length as the recorded server: the same words.
        assert answers[name].json() == json.loads((FIXTURES / name).read_text())


async def test_streams_carry_token_ids_and_the_fingerprint_where_vllm_puts_them(replayed):
    server, answers, _, _ = replayed
    plain = c.sse_events(answers["chat-stream.sse"].text)
    with_ids = c.sse_events(answers["chat-stream-token-ids.sse"].text)
    assert plain[0]["prompt_token_ids"] is None and all(
        e["choices"][0]["token_ids"] is None for e in plain[1:-2])
    assert len(with_ids[0]["prompt_token_ids"]) == with_ids[-2]["usage"]["prompt_tokens"]
    assert sum(len(e["choices"][0]["token_ids"]) for e in with_ids[1:-2]) == 8
    fingerprint = plain[-2]["system_fingerprint"]
    assert fingerprint.startswith(f"vllm-{VLLM_VERSION}-") and len(fingerprint.rsplit("-", 1)[1]) == 8
    assert answers["chat.json"].json()["system_fingerprint"] == fingerprint == server.system_fingerprint


@pytest.mark.parametrize("recorded", ["metrics-idle.txt", "metrics-after.txt"])
async def test_every_vllm_family_with_its_type_labels_and_buckets(replayed, recorded):
    _, _, idle, after = replayed
    text = (FIXTURES / recorded).read_text()
    mine = idle if recorded == "metrics-idle.txt" else after
    assert c.compare(c.metric_families(text), c.metric_families(mine), c.ignored("metrics")) == []
    assert c.compare(c.histogram_buckets(text), c.histogram_buckets(mine)) == []
    # The same label values are there before any request (series created up front).
    for family, label in (("vllm:num_requests_waiting_by_reason", "reason"),
                          ("vllm:engine_sleep_state", "sleep_state"),
                          ("vllm:prompt_tokens_by_source", "source"),
                          ("vllm:prompt_tokens_cached_by_source", "source"),
                          ("vllm:request_success", "finished_reason"),
                          ("vllm:admission_rejections", "reason")):
        assert c.label_values(mine, family, label) == c.label_values(text, family, label), family


async def test_the_process_families_are_there_too_and_only_http_is_left_out(replayed):
    _, _, _, after = replayed
    recorded = c.metric_families((FIXTURES / "metrics-after.txt").read_text(), prefix="")
    diffs = c.compare(recorded, c.metric_families(after, prefix=""), c.ignored("metrics"))
    assert diffs == []
    assert c.compare(recorded, c.metric_families(after, prefix=""))  # without the list, http_* differ
    assert all(key.split(":", 1)[0] in ("metrics", "sse", "json") and reason for key, reason in DIFFERENCES.items())


def test_compare_reports_readable_differences():
    real = {"id": "x", "choices": [{"delta": {"content": "a"}, "token_ids": None}]}
    mine = {"id": "y", "choices": [{"delta": {"content": None}}], "extra": 1}
    diffs = c.compare(c.shape(real), c.shape(mine))
    assert diffs == ['choices[].delta.content: "str" expected, got "null"',
                     'choices[].token_ids: missing (expected "null")', 'extra: unexpected (got "int")']
    assert c.compare(c.shape(real), c.shape(mine), ["choices[].*", "extra"]) == []
    families = c.metric_families('# TYPE vllm:a_total counter\nvllm:a_total{engine="0",model_name="m"} 1\n')
    assert families == {"vllm:a": ("counter", ("engine", "model_name"))}
    assert c.compare(families, {}) == ["vllm:a: missing (expected counter with labels engine, model_name)"]


# -- what the new figures follow ----------------------------------------------------


@simulated
async def test_waiting_by_reason_is_the_queue_under_capacity():
    async with sim_start("--max-num-seqs", "2") as server, httpx.AsyncClient(timeout=60) as http:
        jobs = [asyncio.create_task(http.post(server.url + "/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": f"{i} queue"}], "max_tokens": 400,
            "ignore_eos": True})) for i in range(6)]
        text = await scrape_when(server, lambda text: in_flight(text) == 6)
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
    waiting = value(text, "vllm:num_requests_waiting")
    capacity = value(text, "vllm:num_requests_waiting_by_reason", reason="capacity")
    assert waiting == 4 and capacity == waiting
    assert value(text, "vllm:num_requests_waiting_by_reason", reason="deferred") == 0
    assert value(text, "vllm:num_requests_running") == 2


async def test_prompt_tokens_split_by_source_as_the_prefix_cache_hits(twin):
    server = await start(twin, "--enable-prompt-tokens-details")
    messages = [{"role": "user", "content": "shared context " * 300}]
    async with httpx.AsyncClient(timeout=60) as http:
        for _ in range(2):
            r = await http.post(server.url + "/v1/chat/completions", json={
                "model": MODEL, "messages": messages, "max_tokens": 4, "ignore_eos": True})
    usage = r.json()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached > 500
    text = await scrape(server)
    hits = value(text, "vllm:prompt_tokens_by_source_total", source="local_cache_hit")
    computed = value(text, "vllm:prompt_tokens_by_source_total", source="local_compute")
    assert hits == cached == value(text, "vllm:prefix_cache_hits_total")
    assert hits + computed == value(text, "vllm:prompt_tokens_total") == 2 * usage["prompt_tokens"]
    assert value(text, "vllm:prompt_tokens_cached_total") == hits
    assert value(text, "vllm:prompt_tokens_cached_by_source_total", source="device") == hits
    assert value(text, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert value(text, "vllm:request_prefill_kv_computed_tokens_sum") == computed
    # vLLM's iteration tokens: prompt tokens computed plus tokens generated.
    assert value(text, "vllm:iteration_tokens_total_sum") == computed + value(text, "vllm:generation_tokens_total")
    # The periodic log line's hit rate is the same hits over the same queries, not a constant 0.0 %.
    server.dialect.stats(server, 0.0, 0.0, 0, 0, 0.0)
    line = server.log.stream.getvalue().splitlines()[-1]
    rate = 100 * hits / value(text, "vllm:prefix_cache_queries_total")
    assert rate > 40
    assert line.endswith(f"Prefix cache hit rate: {rate:.1f}%"), line


async def test_prompt_tokens_details_only_when_asked_for(twin):
    server = await start(twin)
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(server.url + "/v1/chat/completions", json={
            "model": MODEL, "messages": CHAT, "max_tokens": 2})
    assert r.json()["usage"]["prompt_tokens_details"] is None  # as vLLM without --enable-prompt-tokens-details


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gpt-oss-120b", "nemotron-3-nano-30b-a3b", "gemma4-26b-a4b"])
def test_step_traffic_is_physical(name):
    card = find_card(name)
    perf = PerfModel(card, k=load_constants())
    bandwidth = perf.hw.bandwidth_gbs * 1e9
    for decode, prefill in (([1000], []), ([1000] * 32, []), ([30000] * 8, []), ([], [(8192, 0)]),
                            ([500] * 4, [(2048, 4096)])):
        traffic = step_traffic(perf, decode, prefill)
        seconds = perf.step_time(decode, prefill)
        assert 0 < traffic.read_bytes + traffic.write_bytes <= bandwidth * seconds
        tokens = len(decode) + sum(n for n, _ in prefill)
        # 2 FLOPs per active weight per token, and attention on top.
        assert 0.9 < traffic.flops / (2 * card.arch.active_params * tokens) < 2.5
    # A lone decode reads what the model says a decode step reads (the weights
    # it touches and the KV), and writes next to nothing.
    one = step_traffic(perf, [1000], [])
    assert one.read_bytes == pytest.approx(perf.decode_bytes(1, 1000), rel=0.05)
    assert one.write_bytes < one.read_bytes / 20
    capped = step_traffic(perf, [1000], [], seconds=1e-6)
    assert capped.read_bytes + capped.write_bytes == pytest.approx(bandwidth * 1e-6)


@simulated
async def test_estimated_bytes_over_a_decode_imply_a_bandwidth_below_the_roofline():
    """On simulated time (tests/helpers/simulated.py): the request's span on the loop's clock is the time the
    twin modelled for it (its steps at Spark's speed, and the API server's own per-request cost), exactly."""
    clock = sim_clock()
    async with sim_twin(CARD, "--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN),
                        "--enable-mfu-metrics", clock=clock) as server:
        before = await scrape(server)
        started = clock.now()
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.post(server.url + "/v1/chat/completions", json={
                "model": MODEL, "messages": CHAT, "max_tokens": 200, "ignore_eos": True})
        modeled_seconds = clock.now() - started
        after = await scrape(server)
        roofline = server.plan.perf.hw.bandwidth_gbs * 1e9
        active_params = server.card.arch.active_params
    assert r.json()["usage"]["completion_tokens"] == 200
    moved = sum(value(after, f"vllm:estimated_{k}_bytes_per_gpu_total") - value(before, f"vllm:estimated_{k}"
                                                                                 "_bytes_per_gpu_total")
                for k in ("read", "write"))
    # Never past the node's bandwidth; and a lone decode is bound by memory, so most of it (the rest of the
    # time is the prefill and the API server's own cost).
    assert 0.5 * roofline < moved / modeled_seconds < roofline
    flops = value(after, "vllm:estimated_flops_per_gpu_total")
    assert flops == pytest.approx(2 * active_params * (200 + r.json()["usage"]["prompt_tokens"]),
                                  rel=0.2)


async def test_estimates_stay_zero_without_mfu_metrics(twin):
    server = await start(twin)
    async with httpx.AsyncClient(timeout=60) as http:
        await http.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": CHAT,
                                                                   "max_tokens": 4})
    text = await scrape(server)
    assert value(text, "vllm:estimated_read_bytes_per_gpu_total") == 0  # as vLLM without --enable-mfu-metrics
    assert value(text, "vllm:generation_tokens_total") == 4


async def test_preemptions_are_observed_per_finished_request(twin):
    # A small cache (~8k tokens) for 12 requests of 1.2k tokens each.
    server = await twin(CARD, "--gpu-memory-utilization", "0.112", "--max-model-len", "4096", speed=50)
    async with httpx.AsyncClient(timeout=120) as http:
        await asyncio.gather(*(http.post(server.url + "/v1/chat/completions", json={
            "model": CARD, "messages": [{"role": "user", "content": f"{i} " + "tok " * 1000}], "max_tokens": 200,
            "ignore_eos": True}) for i in range(12)))
    text = await scrape(server)
    total = value(text, "vllm:num_preemptions_total")
    assert total > 0
    assert value(text, "vllm:request_num_preemptions_sum") == total
    assert value(text, "vllm:request_num_preemptions_count") == 12
    assert value(text, "vllm:request_num_preemptions_bucket", le="+Inf") == 12


@simulated
async def test_admission_limits_reject_with_503_and_count_by_reason():
    async with sim_start("--max-num-queued-reqs", "2", "--max-num-seqs", "1") as server, \
            httpx.AsyncClient(timeout=60) as http:
        body = {"model": MODEL, "messages": CHAT, "max_tokens": 300, "ignore_eos": True}
        jobs = [asyncio.create_task(http.post(server.url + "/v1/chat/completions", json=body)) for _ in range(2)]
        await scrape_when(server, lambda text: in_flight(text) == 2)
        rejected = await http.post(server.url + "/v1/chat/completions", json=body)
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        text = await scrape(server)
    assert rejected.status_code == 503
    assert rejected.json()["error"] == {
        "message": "The engine is currently busy and cannot accept new requests. Please try again later or on a "
                   "different instance.", "type": "Service Unavailable", "param": None, "code": 503}
    assert value(text, "vllm:admission_rejections_total", model_name=MODEL, reason="max_num_queued_reqs") == 1
    assert value(text, "vllm:admission_rejections_total", reason="max_num_queued_tokens") == 0


# -- sleep mode ---------------------------------------------------------------------


def sleep_state(text: str) -> dict[str, float]:
    return {state: value(text, "vllm:engine_sleep_state", sleep_state=state)
            for state in ("awake", "weights_offloaded", "discard_all")}


async def test_sleep_routes_need_sleep_mode_and_vllms_dev_mode(twin, monkeypatch):
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    server = await start(twin, "--enable-sleep-mode")
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.post(server.url + "/sleep")).status_code == 404
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    plain = await start(twin)
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.get(plain.url + "/is_sleeping")).status_code == 404


@simulated
async def test_sleep_level_1_offloads_and_queues_requests_until_wake_up(monkeypatch):
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    async with sim_start("--enable-sleep-mode") as server, httpx.AsyncClient(timeout=60) as http:
        url = server.url
        assert sleep_state(await scrape(server)) == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}
        running = asyncio.create_task(http.post(url + "/v1/chat/completions", json={
            "model": MODEL, "messages": CHAT, "max_tokens": 1000, "ignore_eos": True}))
        await scrape_when(server, lambda text: value(text, "vllm:num_requests_running") == 1)
        r = await http.post(url + "/sleep", params={"level": "1"})
        assert (r.status_code, r.json()) == (200, {"status": "sleeping", "level": 1})
        # The default pause mode aborts what was in flight.
        aborted = await running
        assert aborted.json()["choices"][0]["finish_reason"] == "abort"
        assert (await http.get(url + "/is_sleeping")).json() == {"is_sleeping": True}
        text = await scrape(server)
        assert sleep_state(text) == {"awake": 0, "weights_offloaded": 1, "discard_all": 0}
        # A request sent while asleep waits for capacity; it is not served.
        queued = asyncio.create_task(http.post(url + "/v1/chat/completions", json={
            "model": MODEL, "messages": CHAT, "max_tokens": 4}))
        text = await scrape_when(server, lambda text: in_flight(text) == 1)
        assert value(text, "vllm:num_requests_waiting_by_reason", reason="capacity") == 1
        assert value(text, "vllm:num_requests_running") == 0
        assert not queued.done()
        assert value(text, "vllm:kv_cache_usage_perc") == 0
        r = await http.post(url + "/wake_up")
        assert (r.status_code, r.json()) == (200, {"status": "awake", "tags": None})
        served = await asyncio.wait_for(queued, 10)
        assert served.json()["usage"]["completion_tokens"] == 4
        text = await scrape(server)
        assert sleep_state(text) == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}
        assert value(text, "vllm:request_success_total", finished_reason="abort") == 1
        assert value(text, "vllm:sleep_mode_operation_duration_seconds_count", operation="sleep") == 1
        assert (await http.get(url + "/is_sleeping")).json() == {"is_sleeping": False}


async def test_sleep_level_2_discards_all_and_a_partial_wake_up_keeps_it_asleep(twin, monkeypatch):
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    server = await start(twin, "--enable-sleep-mode")
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(server.url + "/sleep", params={"level": "2"})
        assert r.json() == {"status": "sleeping", "level": 2}
        assert sleep_state(await scrape(server)) == {"awake": 0, "weights_offloaded": 0, "discard_all": 1}
        r = await http.post(server.url + "/wake_up", params={"tags": "weights"})
        assert r.json() == {"status": "sleeping", "tags": ["weights"]}
        assert sleep_state(await scrape(server))["discard_all"] == 1
        r = await http.post(server.url + "/wake_up", params={"tags": "kv_cache"})
        assert r.json() == {"status": "awake", "tags": ["kv_cache"]}
        assert sleep_state(await scrape(server)) == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}
        bad = await http.post(server.url + "/sleep", params={"level": "3"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "query.level"
