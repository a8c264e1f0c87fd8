"""Every engine recognised by what it answers, never by its port, and read
into the one EngineSnapshot with what it does not export said so: on real
answers recorded from a real llama-server (tests/fixtures/llama.cpp-b11434,
scripts/capture_llamacpp.py) and a real vLLM 0.32 (tests/fixtures/vllm-0.32.0),
a real SGLang /metrics (the shared capture), and the shapes Ollama's, TGI's
and LiteLLM's sources give (tests/fixtures/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparktop.observe.engines import Answer, EngineUnreachable, NotAnEngine, by_id, for_command, recognise
from sparktop.observe.engines.llamacpp import LlamaCpp, kv_from_slots
from sparktop.observe.engines.sglang import NAMES as SGLANG
from sparktop.observe.prometheus import EngineMetrics
from sparktop.observe.snapshot import EngineSnapshot

FIX = Path(__file__).resolve().parents[1] / "fixtures"
LLAMA = FIX / "llama.cpp-b11434"
VLLM = FIX / "vllm-0.32.0"


class Server:
    """Answers by path, as a server gave them; every path asked is remembered."""

    def __init__(self, routes: dict[str, tuple[int, dict, bytes | str]]):
        self.routes = routes
        self.asked: list[str] = []

    async def get(self, path: str) -> Answer:
        self.asked.append(path)
        if path not in self.routes:
            return Answer(path, 404, {"content-type": "application/json"}, b'{"detail":"Not Found"}')
        status, headers, body = self.routes[path]
        return Answer(path, status, {k.lower(): v for k, v in headers.items()},
                      body.encode() if isinstance(body, str) else body)


def llama_routes(slots: str = "slots-idle.json", metrics: str = "metrics-idle.txt") -> dict:
    header = {"Server": "llama.cpp", "Content-Type": "application/json; charset=utf-8"}
    return {"/v1/models": (200, header, (LLAMA / "models.json").read_bytes()),
            "/props": (200, header, (LLAMA / "props.json").read_bytes()),
            "/slots": (200, header, (LLAMA / slots).read_bytes()),
            "/metrics": (200, {"Server": "llama.cpp", "Content-Type": "text/plain; version=0.0.4"},
                         (LLAMA / metrics).read_bytes()),
            "/health": (200, header, (LLAMA / "health.json").read_bytes())}


async def test_a_real_llama_server_is_recognised_by_its_header_and_tells_its_build_and_slots():
    server = Server(llama_routes())
    engine = await recognise(server.get)
    assert engine.id == "llama.cpp" and engine.how == "Server: llama.cpp header"
    props = json.loads((LLAMA / "props.json").read_text())
    assert engine.version == props["build_info"] and engine.slots == props["total_slots"] == 4
    assert engine.max_model_len == 512  # -c 2048 over 4 slots: what one request may hold
    # Recognised on its first answer: nothing else of it was asked but what its details need.
    assert server.asked == ["/v1/models", "/props"]


async def test_llama_cpp_figures_come_from_its_counters_and_slots_and_the_rest_is_not_exported():
    server = Server(llama_routes("slots-busy.json", "metrics-busy.txt"))
    engine = await recognise(server.get)
    d = await engine.read(server.get, 0.0, True)
    busy = json.loads((LLAMA / "slots-busy.json").read_text())[0]
    assert d.running == 1 and d.waiting == 0
    # One slot (-np 1) holding its prompt and what it has decoded, of its 2048 tokens.
    assert d.kv_usage == pytest.approx(busy["n_prompt_tokens"] / busy["n_ctx"])
    snap = EngineSnapshot(key="u", url="u", t=0.0, state="ready")
    engine.fill(snap, d)
    assert snap.kind == "llama.cpp" and snap.engine == "llama.cpp"
    assert set(snap.not_exported) == {"ttft", "itl", "queue", "e2e", "preemptions", "finished"}
    assert snap.not_exported_text("ttft", "itl") == "TTFT, ITL: not exported by llama.cpp"


async def test_llama_cpp_generation_rate_counts_tokens_still_being_decoded():
    """Its generated-token counter moves only when a request ends: the rate adds what busy slots decoded."""
    engine = LlamaCpp("test")
    busy = json.loads((LLAMA / "slots-busy.json").read_text())
    metrics = (LLAMA / "metrics-busy.txt").read_text()
    decoded = busy[0]["next_token"][0]["n_decoded"]
    assert "llamacpp:tokens_predicted_total 0" in metrics  # nothing ended yet, though it is generating
    later = [{**busy[0], "n_prompt_tokens": busy[0]["n_prompt_tokens"] + 200,
              "next_token": [{**busy[0]["next_token"][0], "n_decoded": decoded + 200}]}]
    header = {"Server": "llama.cpp"}
    first = Server({"/slots": (200, header, json.dumps(busy)), "/metrics": (200, header, metrics)})
    await engine.read(first.get, 10.0, False)
    second = Server({"/slots": (200, header, json.dumps(later)), "/metrics": (200, header, metrics)})
    d = await engine.read(second.get, 12.0, False)
    assert d.gen_tps == pytest.approx(100.0)  # 200 tokens decoded in 2 s, none of them counted yet


def test_kv_from_slots_knows_a_unified_cache_from_one_per_slot():
    slots = [{"id": i, "n_ctx": 8192, "is_processing": i < 2, "n_prompt_tokens": 1000} for i in range(4)]
    assert kv_from_slots(slots, unified=True) == pytest.approx(2000 / 8192)  # one buffer every slot may fill
    assert kv_from_slots(slots, unified=False) == pytest.approx(2000 / (4 * 8192))
    # Unknown: four slots of the model's whole context each can only be the unified default.
    assert kv_from_slots(slots, None, ctx_train=8192) == pytest.approx(2000 / 8192)
    assert kv_from_slots(slots, None, ctx_train=32768) == pytest.approx(2000 / (4 * 8192))
    assert kv_from_slots([]) is None


async def test_a_llama_server_without_metrics_or_slots_says_so_in_a_line():
    header = {"Server": "llama.cpp"}
    routes = llama_routes()
    routes["/metrics"] = (501, header, (LLAMA / "error-no-metrics.json").read_bytes())
    routes["/slots"] = (501, header, (LLAMA / "error-no-slots.json").read_bytes())
    server = Server(routes)
    engine = await recognise(server.get)
    d = await engine.read(server.get, 0.0, True)
    snap = EngineSnapshot(key="u", url="u", t=0.0, state="ready")
    engine.fill(snap, d)
    assert snap.reason == "llama-server runs without --metrics: tokens/s and the queue are not exported"
    assert {"gen_tps", "prompt_tps", "kv", "waiting"} <= set(snap.not_exported)


async def test_vllm_is_recognised_by_owned_by_and_its_version():
    routes = {"/v1/models": (200, {}, (VLLM / "models.json").read_bytes()),
              "/version": (200, {}, (VLLM / "version.json").read_bytes())}
    engine = await recognise(Server(routes).get)
    assert (engine.id, engine.version, engine.how) == ("vllm", "0.32.0", "owned_by vllm in /v1/models")


async def test_a_vllm_behind_an_api_key_is_recognised_by_its_version_route():
    routes = {"/v1/models": (401, {}, b'{"error":"Unauthorized"}'),
              "/version": (200, {}, (VLLM / "version.json").read_bytes())}
    engine = await recognise(Server(routes).get)
    assert engine.id == "vllm" and engine.how == "/version answered 0.32.0"


def test_sglang_figures_from_a_real_sglang_metrics_page():
    text = (FIX / "captures" / "metrics_sglang_llama3.1-8b_sglang-docs.txt").read_text()
    m = EngineMetrics(SGLANG)
    d = m.add(m.parse(text, 0.0))
    assert (d.kv_usage, d.running, d.waiting) == (0.28, 162, 2826)
    assert d.prompt_tokens_total == 8128902 and d.gen_tokens_total == 7557572
    assert d.prefix_hit_rate == pytest.approx(0.007507552643049313)  # its gauge, this release has no counter
    # An old release: time per output token stands in for ITL; no queue histogram, no retraction counter.
    assert "itl" not in d.missing and {"queue", "preemptions"} <= set(d.missing)


OLLAMA = {  # shapes from ollama/ollama's api/types.go and server/routes.go (tests/fixtures/SOURCES.md)
    "/v1/models": (200, {}, '{"object":"list","data":[{"id":"gpt-oss:20b","object":"model","created":1,'
                            '"owned_by":"library"}]}'),
    "/api/version": (200, {}, '{"version":"0.12.6"}'),
    "/api/ps": (200, {}, '{"models":[{"name":"gpt-oss:20b","model":"gpt-oss:20b","size":14000000000,'
                         '"digest":"x","details":{"format":"gguf","family":"gptoss","parameter_size":"20.9B",'
                         '"quantization_level":"MXFP4"},"expires_at":"2026-11-24T22:00:00Z",'
                         '"size_vram":14000000000,"context_length":8192}]}'),
}


async def test_ollama_is_recognised_by_its_version_route_and_exports_no_serving_figures():
    server = Server(OLLAMA)
    engine = await recognise(server.get)
    assert (engine.id, engine.version) == ("ollama", "0.12.6")
    d = await engine.read(server.get, 0.0, True)
    snap = EngineSnapshot(key="u", url="u", t=0.0, state="ready")
    engine.fill(snap, d)
    assert snap.model == "gpt-oss:20b" and snap.max_model_len == 8192
    assert snap.not_exported_text("kv", "gen_tps", "ttft") == "KV cache, gen t/s, TTFT: not exported by Ollama"


async def test_tgi_and_litellm_and_any_openai_server_are_told_apart():
    tgi = Server({"/v1/models": (200, {}, '{"object":"list","data":[{"id":"m","object":"model","created":0,'
                                          '"owned_by":"m"}]}'),
                  "/info": (200, {}, '{"model_id":"m","version":"3.3.6","router":"text-generation-router",'
                                     '"max_total_tokens":8192}')})
    assert (await recognise(tgi.get)).id == "tgi"
    litellm = Server({"/v1/models": (401, {}, '{"error":"Authentication Error"}'),
                      "/health/liveliness": (200, {}, '"I\'m alive!"')})
    router = await recognise(litellm.get)
    assert router.id == "router" and router.router
    plain = Server({"/v1/models": (200, {}, '{"object":"list","data":[{"id":"m","object":"model"}]}')})
    generic = await recognise(plain.get)
    assert generic.id == "openai" and "lists models" in generic.how


@pytest.mark.parametrize(("body", "headers", "reason"), [
    (b"<!DOCTYPE html><html><body>502 Bad Gateway</body></html>", {"Content-Type": "text/html"},
     "not an engine: /metrics answered an HTML page"),
    (b"# HELP x\n\xff\xfe\x00garbage", {}, "/metrics is not Prometheus text (it answered bytes that are not UTF-8)"),
    (b"hello\n", {}, "not an engine sparktop knows: /v1/models answered HTTP 404, and /metrics has no engine's "
                     "series"),
])
async def test_what_is_no_engine_says_what_it_is_in_a_line(body, headers, reason):
    proxy = Server({"/metrics": (200, headers, body), "/": (200, headers, body)})
    with pytest.raises(NotAnEngine) as raised:
        await recognise(proxy.get)
    assert raised.value.reason == reason


async def test_a_server_that_does_not_answer_is_unreachable_not_an_engine_of_some_kind():
    async def refused(path: str) -> Answer:
        raise EngineUnreachable("connection refused")

    with pytest.raises(EngineUnreachable):
        await recognise(refused)


async def test_a_tensorrt_llm_plain_metrics_route_is_never_asked():
    """Its /metrics is JSON taken off a queue: reading it steals what its owner reads."""
    trt = Server({"/v1/models": (200, {}, '{"object":"list","data":[{"id":"m","object":"model","created":1,'
                                          '"owned_by":"tensorrt_llm"}]}'),
                  "/version": (200, {}, '{"version":"1.3.0rc13"}'), "/prometheus/metrics": (404, {}, ""),
                  "/health": (200, {}, "")})
    engine = await recognise(trt.get)
    await engine.read(trt.get, 0.0, True)
    assert engine.id == "trtllm" and "/metrics" not in trt.asked


def test_engines_are_found_by_their_command_lines_and_images():
    cases = {
        ("python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--port", "30000"):
            ("sglang", 30000, "Qwen/Qwen3-8B"),
        ("/app/llama-server", "-hf", "ggml-org/gpt-oss-120b-GGUF", "--alias", "gpt-oss-120b"):
            ("llama.cpp", 8080, "gpt-oss-120b"),
        ("trtllm-serve", "nvidia/Llama-3.1-8B-Instruct-FP4", "--port", "8355"):
            ("trtllm", 8355, "nvidia/Llama-3.1-8B-Instruct-FP4"),
        ("/usr/bin/ollama", "serve"): ("ollama", 11434, None),
    }
    for argv, (engine_id, port, model) in cases.items():
        found = for_command(list(argv))
        assert found is not None and found[0].id == engine_id, argv
        assert (found[0].port(list(argv)), found[0].served_model(list(argv))) == (port, model)
    assert for_command(["/app/ggml-rpc-server", "-H", "10.0.0.2"])[0].is_worker(["/app/ggml-rpc-server"])
    assert by_id("llama.cpp").from_image("ghcr.io/ggml-org/llama.cpp:server-cuda")
