"""vLLM 0.32's words: `vllm serve` flags (`vllm_args.py`), its log lines
(start-up stages as vLLM's sources print them; the format in
`vllm_log.py`), `/metrics` with vLLM's families (`vllm_metrics.py`),
`/version`, `/load`, `/ping`, its development routes (`/sleep`, `/wake_up`,
`/is_sleeping` with `--enable-sleep-mode` under `VLLM_SERVER_DEV_MODE=1`),
its admission limits (`--max-num-queued-reqs`, `--max-num-queued-tokens`:
503s), its fingerprint, model card and errors, and the `vllm` program of a
test host (`vllm serve`, or a real vLLM where `SPARKTOP_REAL_VLLM` names
one). Held to a real vLLM 0.32 by the conformance tests (`tests/real/`,
fixtures recorded from it in `tests/fixtures/vllm-0.32.0/`).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sparktop import engine_ids
from sparktop.model.cards import GIB
from sparktop.twin.dialects.base import (
    TWIN,
    Dialect,
    Serve,
    TwinMetrics,
    openai_error,
    parameter_error,
    validation_error,
)
from sparktop.twin.dialects.vllm_log import VllmLog
from sparktop.twin.dialects.vllm_metrics import VllmMetrics
from sparktop.twin.engine import BLOCK, PAUSE_MODES

if TYPE_CHECKING:
    from pathlib import Path

    from sparktop.twin.args import ServeArgs
    from sparktop.twin.engine import Engine
    from sparktop.twin.server import TwinServer
    from sparktop.twin.startup import StartupPlan

VLLM_VERSION = "0.32.0"
# In a container's environment (an image's ENV): the python of a real vLLM
# install; `vllm serve` then runs it instead of the twin.
REAL_VLLM = "SPARKTOP_REAL_VLLM"
# check_admission's refusals (--max-num-queued-reqs, --max-num-queued-tokens).
BUSY = "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance."
BACKLOG = ("The engine has reached its prefill token backlog limit. Please try again later or on a different "
           "instance.")


def dev_mode() -> bool:
    """vLLM's VLLM_SERVER_DEV_MODE: development routes (sleep among them) on."""
    try:
        return bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0") or 0))
    except ValueError:
        return False


class VllmDialect(Dialect):
    row = engine_ids.get("vllm")
    version = VLLM_VERSION
    prog = "vllm serve"
    owned_by = "vllm"
    process_name = "VLLM::EngineCore"
    log_class = VllmLog
    # A /v1/completions request without max_tokens gets 16 (its protocol's default).
    completion_max_tokens = 16
    # It compiles the model with torch.compile before capturing graphs.
    compiles = True

    def __init__(self) -> None:
        self.sleep_level = 0  # the level of the last /sleep, until a full wake-up

    # -- the `vllm` program -------------------------------------------------------------

    def tool_main(self, program: str, argv: list[str], serve: Serve) -> int:
        if not argv or argv[0] in ("-h", "--help"):
            print("usage: vllm serve MODEL [options]  (sparktop twin)")
            return 0
        if argv[0] in ("-v", "--version"):
            print(VLLM_VERSION)
            return 0
        real = os.environ.get(REAL_VLLM)
        if real and argv[0] == "serve" and len(argv) > 1:
            # An image that holds a real vLLM (the CPU build, in the lab): its own
            # API server, which `vllm serve MODEL ARGS` is, with MODEL as --model.
            os.execv(real, [real, "-m", "vllm.entrypoints.openai.api_server", "--model", argv[1], *argv[2:]])
        if argv[0] != "serve":
            print(f"vllm: error: argument subparser: invalid choice: '{argv[0]}' (choose from 'serve')",
                  file=sys.stderr)
            return 2
        return serve(argv[1:])

    # -- the command line ---------------------------------------------------------------

    def parse(self, argv: list[str], prog: str | None = None) -> ServeArgs:
        from sparktop.twin.dialects.vllm_args import parse_serve_args

        return parse_serve_args(argv, prog=prog or self.prog)

    def demo_argv(self, image: str, model: str, where: list[str], twin: list[str], root: Path) -> list[str]:
        """vLLM's image, whose entrypoint is `vllm serve`."""
        return [image, model, *where, "--gpu-memory-utilization", "0.7", *twin]

    def fingerprint(self, server: TwinServer) -> str | None:
        """vLLM's `full` fingerprint: version, parallelism, 8 hex of the config's hash."""
        assert server.plan is not None, "the API server starts after the plan"
        args, plan = server.args, server.plan
        config = (args.model, args.name, args.tensor_parallel_size, plan.max_model_len, args.kv_cache_dtype,
                  args.enable_prefix_caching, args.max_num_seqs, plan.max_num_batched_tokens,
                  args.enforce_eager, args.gpu_memory_utilization)
        parts = [f"vllm-{VLLM_VERSION}"]
        if args.tensor_parallel_size > 1:
            parts.append(f"tp{args.tensor_parallel_size}")
        parts.append(hashlib.sha256(repr(config).encode()).hexdigest()[:8])
        return "-".join(parts)

    # -- start-up, in vLLM's words --------------------------------------------------

    def begin(self, server: TwinServer) -> None:
        args, log = server.args, server.log
        assert isinstance(log, VllmLog)
        log.banner(VLLM_VERSION, args.model)
        shown = {"model_tag": args.model, **{k: v for k, v in args.given.items() if k != "api_key"}}
        if args.extra:
            shown["extra"] = " ".join(args.extra)
        log.info("utils.py:233", f"non-default args: {shown}")

    def planned(self, server: TwinServer, plan: StartupPlan) -> None:
        log = server.log
        log.info("model.py:555", f"Resolved architecture: {server.card.architecture} ({server.card.name})")
        log.info("model.py:1680", f"Using max model len {plan.max_model_len}")
        log.info("scheduler.py:239",
                 f"Chunked prefill is enabled with max_num_batched_tokens={plan.max_num_batched_tokens}.")
        if server.args.world_size == 1:
            log.engine("parallel_state.py:1402", "world_size=1 rank=0 local_rank=0 backend=nccl")

    def loading(self, server: TwinServer) -> None:
        server.log.engine("gpu_model_runner.py:4777", f"Starting to load model {server.args.model}...")

    def loaded(self, server: TwinServer, weights_gib: float, seconds: float, total: float) -> None:
        server.log.engine("default_loader.py:384", f"Loading weights took {seconds:.2f} seconds")
        server.log.engine("gpu_model_runner.py:4879", f"Model loading took {weights_gib:.2f} GiB memory and "
                                                      f"{total:.6f} seconds")

    def compiled(self, server: TwinServer, seconds: float) -> None:
        server.log.engine("monitor.py:53", f"torch.compile took {seconds:.2f} s in total")

    def profiled(self, server: TwinServer, plan: StartupPlan) -> None:
        server.log.engine("gpu_worker.py:440", f"Available KV cache memory: {plan.kv_budget_gib:.2f} GiB")

    def kv_sized(self, server: TwinServer, tokens: int, max_len: int, concurrency: float) -> None:
        assert server.plan is not None and server.engine is not None, "sized once the engine exists"
        assert isinstance(server.metrics, VllmMetrics), "its own metrics"
        server.metrics.log_cache_config(self._cache_config(server, server.plan, server.engine))
        server.log.engine("kv_cache_utils.py:1711", f"GPU KV cache size: {tokens:,} tokens")
        server.log.engine("kv_cache_utils.py:1716", f"Maximum concurrency for {max_len:,} tokens per "
                                                    f"request: {concurrency:.2f}x")

    @staticmethod
    def _cache_config(server: TwinServer, plan: StartupPlan, engine: Engine) -> dict[str, str]:
        """What vLLM's cache_config_info says about the KV cache the twin sized."""
        args = server.args
        return {
            "block_size": str(BLOCK), "effective_attention_block_size": str(BLOCK),
            "cache_dtype": args.kv_cache_dtype, "enable_prefix_caching": str(args.enable_prefix_caching),
            "gpu_memory_utilization": str(args.gpu_memory_utilization),
            "num_gpu_blocks": str(engine.num_blocks), "kv_cache_size_tokens": str(engine.kv_capacity_tokens),
            "kv_cache_memory_bytes": str(int(engine.num_blocks * BLOCK * plan.perf.kv_bytes_per_token)),
            "kv_cache_max_concurrency": str(round(engine.max_concurrency(plan.max_model_len), 2)),
        }

    def capturing(self, server: TwinServer) -> None:
        server.log.engine("gpu_model_runner.py:6042", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)")

    def captured(self, server: TwinServer, seconds: float, init_seconds: float) -> None:
        if seconds:
            server.log.engine("gpu_model_runner.py:6133", f"Graph capturing finished in {seconds:.0f} secs, "
                                                          "took 0.66 GiB")
        server.log.engine("core.py:299", f"init engine (profile, create kv cache, warmup model) took "
                                         f"{init_seconds:.2f} seconds")

    def serving(self, server: TwinServer) -> None:
        log = server.log
        log.info("api_server.py:602", f"Starting vLLM API server 0 on http://{server.args.host}:{server.port}")
        routes = ["/health", "/metrics", "/version", "/v1/models", "/v1/chat/completions", "/v1/completions"]
        if self.sleep_routes(server):
            log.warning("__init__.py:43", "SECURITY WARNING: Development endpoints are enabled! "
                                          "This should NOT be used in production!")
            routes += ["/sleep", "/wake_up", "/is_sleeping"]
        for route in routes:
            post = "completions" in route or route in ("/sleep", "/wake_up")
            log.info("launcher.py:46", f"Route: {route}, Methods: {'POST' if post else 'GET'}")
        log.raw(f"INFO:     Started server process [{os.getpid()}]")
        log.raw("INFO:     Waiting for application startup.")
        log.raw("INFO:     Application startup complete.")

    def stats(self, server: TwinServer, prompt_tps: float, gen_tps: float, running: int, waiting: int,
              kv: float) -> None:
        hit_rate = getattr(server.metrics, "prefix_hit_rate", None)
        server.log.info("loggers.py:271", (
            f"Engine 000: Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
            f"Avg generation throughput: {gen_tps:.1f} tokens/s, "
            f"Running: {running} reqs, Waiting: {waiting} reqs, "
            f"GPU KV cache usage: {kv * 100:.1f}%"
            + (f", Prefix cache hit rate: {hit_rate * 100:.1f}%" if hit_rate is not None else "")))

    def start_failed(self, server: TwinServer, message: str) -> None:
        server.log.error("core.py:866", "EngineCore failed to start.")
        server.log.raw(message)

    def died(self, server: TwinServer, message: str) -> None:
        server.log.error("core.py:1000", f"EngineCore failed: {message}")

    def stopping(self, server: TwinServer) -> None:
        server.log.info("launcher.py:110", "Shutting down FastAPI HTTP server.")

    def access(self, server: TwinServer, request: web.Request, status: int) -> None:
        peer = request.remote or "-"
        server.log.raw(f'INFO:     {peer} - "{request.method} {request.path} HTTP/1.1" {status} '
                       f'{"OK" if status == 200 else ""}'.rstrip())

    # -- serving ----------------------------------------------------------------------

    def metrics(self, server: TwinServer, plan: StartupPlan) -> TwinMetrics:
        return VllmMetrics(server.args.name, plan.max_model_len)

    def routes(self, app: web.Application, server: TwinServer) -> None:
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/load", self._load)
        app.router.add_get("/metrics", self._metrics)
        if self.sleep_routes(server):
            app.router.add_post("/sleep", self._sleep)
            app.router.add_post("/wake_up", self._wake_up)
            app.router.add_get("/is_sleeping", self._is_sleeping)

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def _load(self, request: web.Request) -> web.Response:
        engine = request.app[TWIN].engine
        return web.json_response({"server_load": len(engine.running) + len(engine.waiting)})

    async def _metrics(self, request: web.Request) -> web.Response:
        server = request.app[TWIN]
        engine, metrics = server.engine, server.metrics
        metrics.set_idle(len(engine.running), len(engine.waiting), engine.kv_usage)
        return web.Response(body=metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def model_card(self, server: TwinServer) -> dict[str, Any]:
        import secrets

        assert server.plan is not None, "the API server starts after the plan"
        permission = {
            "id": f"modelperm-{secrets.token_hex(8)}", "object": "model_permission",
            "created": int(server.clock.wall()),
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False,
        }
        return {"id": server.args.name, "object": "model", "created": server._created, "owned_by": "vllm",
                "root": server.args.model, "parent": None, "max_model_len": server.plan.max_model_len,
                "permission": [permission]}

    # -- sleep mode (its development routes) ----------------------------------------------

    @staticmethod
    def sleep_routes(server: TwinServer) -> bool:
        """/sleep, /wake_up and /is_sleeping: with --enable-sleep-mode, in its dev mode."""
        return server.args.enable_sleep_mode and dev_mode()

    async def _sleep(self, request: web.Request) -> web.Response:
        server = request.app[TWIN]
        engine, metrics = server.engine, server.metrics
        assert engine is not None and isinstance(metrics, VllmMetrics), "the API server starts after the engine"
        raw = request.query.get("level", "1")
        try:
            level = int(raw)
        except ValueError:
            return self.unparsable("query.level", "int_parsing", "Input should be a valid integer, unable to parse "
                                   "string as an integer", raw)
        if not 0 <= level <= 2:
            bound, kind = ("ge", "greater_than_equal") if level < 0 else ("le", "less_than_equal")
            limit = 0 if level < 0 else 2
            words = "greater than or equal to" if level < 0 else "less than or equal to"
            return self.unparsable("query.level", kind, f"Input should be {words} {limit}", raw, {bound: limit})
        mode = request.query.get("mode", "abort")
        if mode not in PAUSE_MODES:
            return self.unparsable("query.mode", "literal_error", "Input should be 'abort', 'wait' or 'keep'", mode,
                                   {"expected": "'abort', 'wait' or 'keep'"})
        started = server.clock.now()
        with metrics.sleep_operation("sleep"):
            await engine.sleep(level, mode)
            if level >= 1:
                await asyncio.sleep(self._offload_seconds(server, level) / server.speed)
                self._log_sleep(server, server.clock.now() - started)
        metrics.record_sleep_state(True, level)
        self.sleep_level = level
        self.access(server, request, 200)
        return web.json_response({"status": "sleeping", "level": level})

    async def _wake_up(self, request: web.Request) -> web.Response:
        server = request.app[TWIN]
        engine, metrics = server.engine, server.metrics
        assert engine is not None and isinstance(metrics, VllmMetrics), "the API server starts after the engine"
        tags: list[str] | None = request.query.getall("tags", []) or None
        server.log.info("api_router.py:49", f"wake up the engine with tags: {tags}")
        with metrics.sleep_operation("wake"):
            if engine.sleeping_tags:
                await asyncio.sleep(self._offload_seconds(server, self.sleep_level) / server.speed)
            awake = engine.wake_up(tags)
        if awake:
            metrics.record_sleep_state(False, 0)
            self.sleep_level = 0
        self.access(server, request, 200)
        return web.json_response({"status": "awake" if awake else "sleeping", "tags": tags})

    async def _is_sleeping(self, request: web.Request) -> web.Response:
        server = request.app[TWIN]
        engine = server.engine
        assert engine is not None, "the API server starts after the engine"
        self.access(server, request, 200)
        return web.json_response({"is_sleeping": engine.is_sleeping})

    @staticmethod
    def _log_sleep(server: TwinServer, took: float) -> None:
        """vLLM's two lines: the time asleep took, and the memory it freed
        (weights and KV cache; the CUDA context stays)."""
        assert server.plan is not None, "the API server starts after the plan"
        freed = server.plan.perf.weights_bytes_per_node / GIB + server.plan.kv_budget_gib
        server.log.engine("gpu_worker.py:326", f"Sleep mode freed {freed:.2f} GiB memory, 0.50 GiB memory is "
                                               "still in use.")
        server.log.engine("abstract.py:390", f"It took {took:.6f} seconds to fall asleep.")

    @staticmethod
    def _offload_seconds(server: TwinServer, level: int) -> float:
        """Level 1 copies the weights to host memory and back (one pass over
        them at the node's bandwidth); level 2 only frees and reallocates."""
        assert server.plan is not None, "the API server starts after the plan"
        perf = server.plan.perf
        if level != 1:
            return 0.05
        return perf.weights_bytes_per_node / (perf.hw.bandwidth_gbs * 1e9 * perf.k.bandwidth_efficiency)

    # -- its errors -------------------------------------------------------------------------

    def invalid(self, message: str, param: str, value: object) -> web.Response:
        return parameter_error(message, param, value)

    def unparsable(self, loc: str, kind: str, msg: str, value: object, ctx: dict | None = None) -> web.Response:
        return validation_error(loc, kind, msg, value, ctx)

    def admit(self, server: TwinServer) -> web.Response | None:
        """vLLM's check_admission: the queue limits, each a 503 and a count in
        `vllm:admission_rejections_total`."""
        engine, metrics, args = server.engine, server.metrics, server.args
        assert engine is not None and isinstance(metrics, VllmMetrics), "the API server starts after the engine"
        if args.max_num_queued_reqs is not None and \
                len(engine.running) + len(engine.waiting) + 1 > args.max_num_queued_reqs:
            metrics.record_admission_rejection("max_num_queued_reqs")
            return openai_error(503, BUSY, "Service Unavailable")
        if args.max_num_queued_tokens is not None:
            # Every request still in prefill counts its whole prompt, as in vLLM.
            backlog = sum(s.prompt_len for s in list(engine.running) + list(engine.waiting) if s.output_count == 0)
            if backlog >= args.max_num_queued_tokens:
                metrics.record_admission_rejection("max_num_queued_tokens")
                return openai_error(503, BACKLOG, "Service Unavailable")
        return None

    def too_long(self, server: TwinServer, prompt: int, max_len: int, from_text: bool) -> web.Response:
        # A text prompt is tokenized with truncation at max_model_len + 1, so
        # vLLM knows only that it has at least that many tokens.
        count = min(prompt, max_len + 1) if from_text else prompt
        qualifier = "at least " if count == max_len + 1 else ""
        return self.invalid(f"This model's maximum context length is {max_len} tokens. However, your prompt "
                            f"contains {qualifier}{count} input tokens, which exceeds this limit even without any "
                            "output tokens. Please reduce the length of the input prompt.", "input_tokens", count)

    def unknown_model(self, server: TwinServer, model: str) -> web.Response | None:
        return openai_error(404, f"The model `{model}` does not exist. Valid aliases: {server.args.name}.",
                            "NotFoundError", "model")
