"""vLLM 0.32's words: `vllm serve` flags, its log lines (start-up stages as
vLLM's sources print them), `/metrics` with vLLM's families
(`twin/metrics.py`), `/version`, `/load`, `/ping`, and its errors. Held to a
real vLLM 0.32 by the conformance tests (`tests/real/`, fixtures recorded
from it in `tests/fixtures/vllm-0.32.0/`).
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sparktop import engine_ids
from sparktop.twin.dialects.base import TWIN, Dialect, TwinMetrics
from sparktop.twin.metrics import VllmMetrics
from sparktop.twin.vlog import VllmLog

if TYPE_CHECKING:
    from sparktop.twin.args import ServeArgs
    from sparktop.twin.server import TwinServer
    from sparktop.twin.startup import StartupPlan

VLLM_VERSION = "0.32.0"


def _invalid(message: str, param: str, value: object) -> web.Response:
    """vLLM's VLLMValidationError: a 400 that names the parameter and its value."""
    return web.json_response({"error": {"message": f"{message} (parameter={param}, value={value})",
                                         "type": "BadRequestError", "param": param, "code": 400}}, status=400)


class VllmDialect(Dialect):
    row = engine_ids.get("vllm")
    version = VLLM_VERSION
    prog = "vllm serve"
    owned_by = "vllm"
    process_name = "VLLM::EngineCore"
    log_class = VllmLog
    sleep_mode = True

    def parse(self, argv: list[str], prog: str | None = None) -> ServeArgs:
        from sparktop.twin.args import parse_serve_args

        return parse_serve_args(argv, prog=prog or self.prog)

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
        server.log.engine("kv_cache_utils.py:1711", f"GPU KV cache size: {tokens:,} tokens")
        server.log.engine("kv_cache_utils.py:1716", f"Maximum concurrency for {max_len:,} tokens per "
                                                    f"request: {concurrency:.2f}x")

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
        if server.sleep_routes:
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

    def too_long(self, server: TwinServer, prompt: int, max_len: int, from_text: bool) -> web.Response:
        # A text prompt is tokenized with truncation at max_model_len + 1, so
        # vLLM knows only that it has at least that many tokens.
        count = min(prompt, max_len + 1) if from_text else prompt
        qualifier = "at least " if count == max_len + 1 else ""
        return _invalid(f"This model's maximum context length is {max_len} tokens. However, your prompt "
                        f"contains {qualifier}{count} input tokens, which exceeds this limit even without any "
                        "output tokens. Please reduce the length of the input prompt.", "input_tokens", count)

    def unknown_model(self, server: TwinServer, model: str) -> web.Response | None:
        return web.json_response({"error": {"message": f"The model `{model}` does not exist. Valid aliases: "
                                                       f"{server.args.name}.", "type": "NotFoundError",
                                             "param": "model", "code": 404}}, status=404)
