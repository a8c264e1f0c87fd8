"""A vLLM-compatible HTTP server backed by the twin engine.

Routes: /health, /ping, /version, /load, /metrics, /v1/models,
/v1/chat/completions and /v1/completions (SSE streaming with
`stream_options.include_usage`, and not). It starts the way vLLM does: the
port is bound first, then weights load, memory is profiled, the KV cache is
sized and graphs are captured, each stage taking modeled time and logged in
vLLM's words; only then does the API answer. A model that does not fit fails
the way vLLM fails: an error in the log and a non-zero exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
import signal
import socket
import sys
import time
import zlib
from dataclasses import dataclass
from typing import TextIO

from aiohttp import web

from sparktop import __version__
from sparktop.twin.args import ServeArgs, parse_serve_args
from sparktop.model.cards import GIB, ModelCard, UnknownModel, find_card
from sparktop.twin.engine import BLOCK, Engine, EngineConfig, FinishEvent, Sequence, TokenEvent
from sparktop.twin.host import BASE_USED_KB, TwinHost
from sparktop.twin.metrics import VllmMetrics
from sparktop.model.perf import PerfModel
from sparktop.twin.rendezvous import HeadRendezvous, join
from sparktop.twin.text import OutputText, chat_prompt_ids, load_tokenizer, natural_lengths
from sparktop.twin.vlog import VllmLog

VLLM_VERSION = f"0.20.1+sparktop.twin{__version__.replace('.', '')}"
HEAD_WAIT_SECONDS = 600.0  # torch.distributed's store timeout, in modeled time


class StartupError(Exception):
    """vLLM would have failed to start: the message is what it logs last."""


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status=status
    )


@dataclass
class StartupPlan:
    perf: PerfModel
    kv_budget_gib: float
    kv_tokens: int
    max_model_len: int
    max_num_batched_tokens: int


def fitted_constants():
    """The constants fitted to the published figures: the twin runs what
    `sparktop predict` predicts."""
    from sparktop.model.fit import load_constants

    return load_constants()


def plan_startup(card: ModelCard, args: ServeArgs, other_used_mib: int = 0) -> StartupPlan:
    """Size everything vLLM sizes at startup; raise StartupError where vLLM would."""
    kv_dtype = 1 if args.kv_cache_dtype.startswith("fp8") else None
    perf = PerfModel(card, tp=args.tensor_parallel_size, kv_dtype_bytes=kv_dtype,
                     ray=args.ray, enforce_eager=args.enforce_eager, k=fitted_constants())
    hw = perf.hw
    max_len = args.max_model_len or card.max_model_len
    batched = args.max_num_batched_tokens or 8192
    want = args.gpu_memory_utilization * hw.memory_gib
    # The OS and desktop of a Spark hold a few GiB that CUDA cannot have.
    free = hw.memory_gib - BASE_USED_KB / 1024**2 - other_used_mib / 1024
    if other_used_mib and want > free:
        raise StartupError(
            f"ValueError: Free memory on device cuda:0 ({free:.2f}/{hw.memory_gib:.2f} GiB) on startup is "
            f"less than desired GPU memory utilization ({args.gpu_memory_utilization}, {want:.2f} GiB). "
            "Decrease GPU memory utilization or reduce GPU memory used by other processes."
        )
    weights = perf.weights_bytes_per_node / GIB
    if weights > free - 1.0:
        raise StartupError(
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {weights:.2f} GiB. GPU 0 has a "
            f"total capacity of {hw.memory_gib:.2f} GiB of which {max(0.0, free - 1.0):.2f} GiB is free."
        )
    budget = perf.kv_budget_bytes(args.gpu_memory_utilization, batched) / GIB
    if budget <= 0:
        raise StartupError(
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine."
        )
    tokens = perf.kv_capacity_tokens(args.gpu_memory_utilization, batched)
    per_seq = perf.seq_state_bytes / perf.kv_bytes_per_token
    if tokens < max_len + per_seq:
        needed = (max_len * perf.kv_bytes_per_token + perf.seq_state_bytes) / GIB
        raise StartupError(
            f"ValueError: To serve at least one request with the models's max seq len ({max_len}), "
            f"({needed:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({budget:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{int(max(0, tokens - per_seq))}. Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine."
        )
    return StartupPlan(perf, budget, tokens, max_len, batched)


class TwinServer:
    """One vLLM stand-in. `await start()` runs startup and begins serving;
    `await stop()` shuts down. `run()` does both and waits for a signal."""

    def __init__(self, args: ServeArgs, log: TextIO | None = None, host: TwinHost | None = None):
        self.args = args
        self.card = find_card(args.model)
        self.log = VllmLog(log)
        self.host = host if host is not None else (TwinHost(args.twin_home) if args.twin_home else TwinHost.from_env())
        # A simulated host may set its own pace (the lab speeds startup up);
        # flags given on the command line win.
        config = self.host.config if self.host else {}
        self.speed = args.speed if "speed" in args.given else float(config.get("speed", args.speed) or 1.0)
        self.startup_speed = args.startup_speed or float(config.get("startup_speed", 0) or 0) or self.speed
        self.engine: Engine | None = None
        self.metrics: VllmMetrics | None = None
        self.plan: StartupPlan | None = None
        self.tokenizer = load_tokenizer(args.tokenizer, self.card.vocab_size)
        self.stage = "init"
        self.ready = asyncio.Event()
        self.failed = asyncio.Event()
        self.failure: str | None = None
        self.sock: socket.socket | None = None
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task] = []
        self._rdv: HeadRendezvous | None = None
        self._ray = None
        self._ids = itertools.count(1)
        self._created = int(time.time())
        self._registered = False

    # -- helpers ---------------------------------------------------------------

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.args.host in ("0.0.0.0", "", "::") else self.args.host
        return f"http://{host}:{self.port}"

    async def _sleep(self, modeled: float) -> None:
        await asyncio.sleep(max(0.0, modeled / self.startup_speed))

    def _bind(self) -> None:
        # vLLM binds its port before building the engine (so the port is
        # taken for the whole startup) but listens only once the API server
        # starts: until then a connection is refused.
        host = self.args.host or "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, self.args.port))
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self.sock = sock
        self.port = sock.getsockname()[1]

    def _fail(self, message: str) -> None:
        self.failure = message
        self.failed.set()

    # -- startup ---------------------------------------------------------------

    async def start(self) -> None:
        args, card, log = self.args, self.card, self.log
        log.banner(VLLM_VERSION, args.model)
        shown = {"model_tag": args.model, **{k: v for k, v in args.given.items() if k != "api_key"}}
        if args.extra:
            shown["extra"] = " ".join(args.extra)
        log.info("utils.py:233", f"non-default args: {shown}")
        if args.headless:
            await self._run_headless()
            return
        self._bind()
        log.info("model.py:555", f"Resolved architecture: {card.architecture} ({card.name})")
        other = self.host.used_mib(exclude_pid=os.getpid()) if self.host else 0
        self.plan = plan = plan_startup(card, args, other)
        log.info("model.py:1680", f"Using max model len {plan.max_model_len}")
        log.info("scheduler.py:239",
                 f"Chunked prefill is enabled with max_num_batched_tokens={plan.max_num_batched_tokens}.")
        tp = args.tensor_parallel_size
        if tp > 1:
            await self._start_distributed(plan)
        else:
            log.engine("parallel_state.py:1402", "world_size=1 rank=0 local_rank=0 backend=nccl")
        used_mib = int(args.gpu_memory_utilization * plan.perf.hw.memory_gib * 1024)
        weights_gib = plan.perf.weights_bytes_per_node / GIB
        if self.host:
            self.host.register(os.getpid(), "VLLM::EngineCore", int(weights_gib * 1024),
                               cache_mib=int(weights_gib * 1024))
            self._registered = True
        stages = dict(plan.perf.startup_stages(args.load_format))
        log.engine("gpu_model_runner.py:4777", f"Starting to load model {args.model}...")
        self.stage = "loading weights"
        await self._sleep(stages["loading weights"])
        log.engine("default_loader.py:384", f"Loading weights took {stages['loading weights']:.2f} seconds")
        log.engine("gpu_model_runner.py:4879",
                   f"Model loading took {weights_gib:.2f} GiB memory and "
                   f"{stages['init'] + stages['loading weights']:.6f} seconds")
        self.stage = "memory profiling"
        if "torch.compile" in stages:
            await self._sleep(stages["torch.compile"])
            log.engine("monitor.py:53", f"torch.compile took {stages['torch.compile']:.2f} s in total")
        await self._sleep(stages["memory profiling"])
        log.engine("gpu_worker.py:440", f"Available KV cache memory: {plan.kv_budget_gib:.2f} GiB")
        self.metrics = VllmMetrics(args.name, plan.max_model_len, cache_info={
            "block_size": str(BLOCK), "cache_dtype": args.kv_cache_dtype,
            "enable_prefix_caching": str(args.enable_prefix_caching),
            "gpu_memory_utilization": str(args.gpu_memory_utilization),
            "num_gpu_blocks": str(plan.kv_tokens // BLOCK),
        })
        self.engine = Engine(plan.perf, EngineConfig(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=plan.max_num_batched_tokens,
            max_model_len=plan.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
            enable_prefix_caching=args.enable_prefix_caching, speed=self.speed,
        ), self.metrics)
        log.engine("kv_cache_utils.py:1711", f"GPU KV cache size: {self.engine.kv_capacity_tokens:,} tokens")
        log.engine("kv_cache_utils.py:1716", f"Maximum concurrency for {plan.max_model_len:,} tokens per "
                                             f"request: {self.engine.max_concurrency(plan.max_model_len):.2f}x")
        if self.host:
            self.host.register(os.getpid(), "VLLM::EngineCore", used_mib, cache_mib=int(weights_gib * 1024))
        if "graph capture" in stages:
            self.stage = "graph capture"
            log.engine("gpu_model_runner.py:6042", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)")
            await self._sleep(stages["graph capture"])
            log.engine("gpu_model_runner.py:6133",
                       f"Graph capturing finished in {stages['graph capture']:.0f} secs, took 0.66 GiB")
        total_init = stages["memory profiling"] + stages.get("torch.compile", 0) + stages.get("graph capture", 0)
        log.engine("core.py:299", f"init engine (profile, create kv cache, warmup model) took {total_init:.2f} seconds")
        self.stage = "api server"
        await self._sleep(stages["api server"])
        self.engine.start()
        await self._serve_http()
        self.stage = "ready"
        self._tasks.append(asyncio.create_task(self._heartbeat()))
        self._tasks.append(asyncio.create_task(self._stats_log()))
        self.ready.set()

    async def _start_distributed(self, plan: StartupPlan) -> None:
        args, log = self.args, self.log
        tp = args.tensor_parallel_size
        used_mib = int(args.gpu_memory_utilization * plan.perf.hw.memory_gib * 1024)
        if args.ray:
            from sparktop.twin.ray import RayDriver, head_address

            address = head_address(self.host)
            if not address:
                raise StartupError(
                    "ValueError: The number of required GPUs exceeds the total number of available GPUs in "
                    f"the placement group. Required: {tp}, available: 1 (no Ray cluster is running; start "
                    "one with `ray start --head` and `ray start --address`)"
                )
            log.info("ray_utils.py:357", f"Connecting to existing Ray cluster at address: {address}")
            driver = RayDriver(address, f"{self.host.name if self.host else 'twin'}-{os.getpid()}")
            try:
                workers = await driver.connect(tp, used_mib)
            except (OSError, asyncio.TimeoutError) as exc:
                raise StartupError(f"ConnectionError: could not connect to the Ray cluster at {address}: {exc}")
            except RuntimeError as exc:
                raise StartupError(f"ValueError: {exc}")
            self._ray = driver
            log.info("ray_distributed_executor.py:180",
                     f"RayWorkerWrapper placed on: {', '.join(workers) or 'this node'}")
            self._tasks.append(asyncio.create_task(self._watch_ray(driver)))
            return
        if args.nnodes < 2:
            raise StartupError(
                f"ValueError: world_size ({tp}) is larger than the number of available GPUs (1) on this node; "
                "use --nnodes/--node-rank for multi-node tensor parallelism or the Ray executor"
            )
        init = f"tcp://{args.master_addr}:{args.master_port}"
        log.engine("parallel_state.py:1402",
                   f"world_size={tp} rank=0 local_rank=0 distributed_init_method={init} backend=nccl")
        self._rdv = HeadRendezvous(args.master_addr, args.master_port, args.nnodes, args.model,
                                   on_lost=self._peer_lost)
        try:
            await self._rdv.start()
        except OSError as exc:
            raise StartupError(f"torch.distributed.DistNetworkError: failed to bind {init}: {exc.strerror}")
        log.engine("parallel_state.py:1410", f"Waiting for {args.nnodes - 1} more node(s) to join at {init}")
        self.stage = "waiting for workers"
        wait = HEAD_WAIT_SECONDS / self.startup_speed
        try:
            await self._rdv.wait(wait, {"used_mib": used_mib})
        except asyncio.TimeoutError:
            raise StartupError(
                f"torch.distributed.DistStoreError: Timed out after {HEAD_WAIT_SECONDS:.0f} seconds waiting "
                f"for clients. 1/{args.nnodes} clients joined."
            )
        hosts = ", ".join(p.host for p in self._rdv.peers)
        log.engine("parallel_state.py:1715", f"all {args.nnodes} nodes joined (workers on {hosts})")

    def _peer_lost(self, reason: str) -> None:
        self.log.error("multiproc_executor.py:151",
                       f"Worker proc died unexpectedly ({reason}); NCCL communicator was aborted, shutting down.")
        if self.engine:
            self.engine.fail(f"EngineCore encountered a fatal error: {reason}")
        self._fail(reason)

    async def _watch_ray(self, driver) -> None:
        reason = await driver.watch()
        self.log.error("ray_distributed_executor.py:480",
                       f"ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task "
                       f"({reason}).")
        if self.engine:
            self.engine.fail(f"EngineCore encountered a fatal error: {reason}")
        self._fail(reason)

    async def _run_headless(self) -> None:
        args, log = self.args, self.log
        rank = args.node_rank
        log.info("api_server.py:1931", f"Launching headless worker rank {rank} (nnodes={args.nnodes}) "
                                       f"for {args.model}; master tcp://{args.master_addr}:{args.master_port}")
        wait = HEAD_WAIT_SECONDS / self.startup_speed
        try:
            reader, writer, reply = await join(args.master_addr, args.master_port, {
                "rank": rank, "model": args.model, "host": self.host.name if self.host else socket.gethostname(),
            }, wait)
        except TimeoutError as exc:
            raise StartupError(f"torch.distributed.DistNetworkError: {exc}")
        except RuntimeError as exc:
            raise StartupError(f"RuntimeError: {exc}")
        self._peer_writer = writer  # keep the connection open while we serve
        used = int(reply.get("used_mib", 0))
        if self.host:
            self.host.register(os.getpid(), f"VLLM::Worker_TP{rank}", used)
            self._registered = True
        log.engine("parallel_state.py:1715", f"rank {rank} joined the head; serving as a headless worker")
        self.stage = "ready"
        self.ready.set()

        async def follow():
            from sparktop.twin import wire

            while True:
                msg = await wire.recv(reader)
                if msg is None:
                    break
                if self.host and "util" in msg:
                    self.host.update_util(os.getpid(), float(msg["util"]))
            log.error("multiproc_executor.py:151",
                      "RuntimeError: NCCL communicator was aborted: the head node went away.")
            self._fail("the head node went away")

        self._tasks.append(asyncio.create_task(follow()))

    async def _serve_http(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/load", self.load)
        app.router.add_get("/metrics", self.metrics_route)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.SockSite(self._runner, self.sock)
        await site.start()
        self.log.info("api_server.py:602", f"Starting vLLM API server 0 on http://{self.args.host}:{self.port}")
        for route in ("/health", "/metrics", "/version", "/v1/models", "/v1/chat/completions", "/v1/completions"):
            self.log.info("launcher.py:46", f"Route: {route}, Methods: {'POST' if 'completions' in route else 'GET'}")
        self.log.raw("INFO:     Started server process [%d]" % os.getpid())
        self.log.raw("INFO:     Waiting for application startup.")
        self.log.raw("INFO:     Application startup complete.")

    async def _heartbeat(self) -> None:
        """Publish GPU utilisation for nvidia-smi (here and on TP peers)."""
        while True:
            util = self.engine.utilization(1.0) if self.engine else 0.0
            if self.host and self._registered:
                self.host.update_util(os.getpid(), util)
            if self._rdv:
                await self._rdv.broadcast({"util": util})
            if self._ray:
                await self._ray.util(util)
            await asyncio.sleep(0.5)

    async def _stats_log(self) -> None:
        """vLLM's periodic 'Engine 000: Avg prompt throughput ...' line."""
        engine = self.engine
        last = (time.monotonic(), engine.total_prompt_tokens, engine.total_generation_tokens)
        while True:
            await asyncio.sleep(10)
            now = (time.monotonic(), engine.total_prompt_tokens, engine.total_generation_tokens)
            dt = max(1e-6, now[0] - last[0])
            if now[1] == last[1] and now[2] == last[2] and not engine.running and not engine.waiting:
                last = now
                continue
            self.log.info("loggers.py:271", (
                f"Engine 000: Avg prompt throughput: {(now[1] - last[1]) / dt:.1f} tokens/s, "
                f"Avg generation throughput: {(now[2] - last[2]) / dt:.1f} tokens/s, "
                f"Running: {len(engine.running)} reqs, Waiting: {len(engine.waiting)} reqs, "
                f"GPU KV cache usage: {engine.kv_usage * 100:.1f}%, Prefix cache hit rate: 0.0%"))
            last = now

    # -- shutdown --------------------------------------------------------------

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.engine:
            await self.engine.stop()
        if self._runner:
            await self._runner.cleanup()
            self._runner = None
        if self.sock:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None
        if self._rdv:
            await self._rdv.close()
        if self._ray:
            self._ray.close()
        if getattr(self, "_peer_writer", None) is not None:
            self._peer_writer.close()
        if self.host and self._registered:
            self.host.unregister(os.getpid())
            self._registered = False

    # -- routes ----------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        key = self.args.api_key
        if not key or not request.path.startswith("/v1"):
            return True
        return request.headers.get("Authorization", "") == f"Bearer {key}"

    def _access(self, request: web.Request, status: int) -> None:
        peer = request.remote or "-"
        self.log.raw(f'INFO:     {peer} - "{request.method} {request.path} HTTP/1.1" {status} '
                     f'{"OK" if status == 200 else ""}'.rstrip())

    async def health(self, request: web.Request) -> web.Response:
        if self.failure:
            return web.Response(status=503)
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def load(self, request: web.Request) -> web.Response:
        engine = self.engine
        return web.json_response({"server_load": len(engine.running) + len(engine.waiting)})

    async def metrics_route(self, request: web.Request) -> web.Response:
        engine = self.engine
        self.metrics.set_idle(len(engine.running), len(engine.waiting), engine.kv_usage)
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def models(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        self._access(request, 200)
        return web.json_response({"object": "list", "data": [{
            "id": self.args.name, "object": "model", "created": self._created, "owned_by": "vllm",
            "root": self.args.model, "parent": None, "max_model_len": self.plan.max_model_len,
        }]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        if not self._authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, "The request body is not valid JSON.", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, "The request body must be a JSON object.", "BadRequestError")
        model = body.get("model")
        if model not in (None, self.args.name):
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        if self.failure or (self.engine and self.engine.failed):
            return _error(500, self.failure or self.engine.failed, "InternalServerError")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _error(400, "messages must be a non-empty list", "BadRequestError", "messages")
            prompt_ids = chat_prompt_ids(messages, self.tokenizer, self.card.chat_overhead_tokens)
            seed_text = json.dumps(messages, sort_keys=True)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                prompt_ids = list(prompt)
            elif isinstance(prompt, str):
                prompt_ids = [1] + self.tokenizer.encode(prompt)
            else:
                return _error(400, "prompt must be a string or a list of token ids", "BadRequestError", "prompt")
            seed_text = str(prompt)
        max_len = self.plan.max_model_len
        prompt_len = len(prompt_ids)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is None:
            max_tokens = max_len - prompt_len
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, f"max_tokens must be at least 1, got {max_tokens}.", "BadRequestError", "max_tokens")
        if prompt_len + max_tokens > max_len:
            return _error(400, (
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion."), "BadRequestError")
        effort = body.get("reasoning_effort") or (body.get("chat_template_kwargs") or {}).get("reasoning_effort")
        seed = zlib.crc32(seed_text.encode()) ^ next(self._ids)
        natural, think = natural_lengths(seed, self.card.reasoning and chat, effort)
        seq = Sequence(
            request_id=f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(16)}",
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            min_tokens=int(body.get("min_tokens") or 0),
            ignore_eos=bool(body.get("ignore_eos", False)),
            natural_len=natural,
        )
        out = OutputText(seed, think, self.card.vocab_size)
        self.engine.submit(seq)
        stream = bool(body.get("stream", False))
        opts = body.get("stream_options") or {}
        try:
            if stream:
                return await self._stream(request, seq, out, chat, bool(opts.get("include_usage")),
                                          bool(opts.get("continuous_usage_stats")),
                                          bool(body.get("return_token_ids")))
            return await self._complete(request, seq, out, chat, bool(body.get("return_token_ids")))
        except ConnectionResetError:
            # The client went away mid-stream: what it asked for is dropped, as in vLLM.
            self.engine.abort(seq)
            return web.Response(status=499)
        except asyncio.CancelledError:
            self.engine.abort(seq)
            raise
        finally:
            if not seq.finished:
                self.engine.abort(seq)

    def _chunk(self, seq: Sequence, chat: bool, choice: dict | None, usage: dict | None = None) -> bytes:
        data = {
            "id": seq.request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.args.name,
            "choices": [choice] if choice is not None else [],
        }
        if usage is not None:
            data["usage"] = usage
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    @staticmethod
    def _usage(prompt: int, completion: int, cached: int) -> dict:
        usage = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
        if cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    async def _stream(self, request, seq: Sequence, out: OutputText, chat: bool, include_usage: bool,
                      continuous: bool, token_ids: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        self._access(request, 200)
        index = 0
        token_finish = None
        while True:
            event = await seq.events.get()
            if isinstance(event, TokenEvent):
                parts = []
                if event.first and chat:
                    parts.append(self._chunk(seq, chat, {
                        "index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                        "finish_reason": None}))
                for _ in range(event.count):
                    text, tid, reasoning = out.token(index)
                    index += 1
                    if chat:
                        delta = {"reasoning_content": text} if reasoning else {"content": text}
                        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
                    else:
                        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
                    if token_ids:
                        choice["token_ids"] = [tid]
                    if event.finish:
                        choice["finish_reason"] = token_finish = event.finish
                    usage = self._usage(seq.prompt_len, index, seq.cached_tokens) if continuous else None
                    parts.append(self._chunk(seq, chat, choice, usage))
                await resp.write(b"".join(parts))
            elif isinstance(event, FinishEvent):
                if event.reason == "error":
                    err = {"error": {"message": event.message, "type": "InternalServerError", "code": 500}}
                    await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                else:
                    if token_finish is None:
                        final = ({"index": 0, "delta": {}, "logprobs": None, "finish_reason": event.reason}
                                 if chat else {"index": 0, "text": "", "logprobs": None,
                                               "finish_reason": event.reason})
                        await resp.write(self._chunk(seq, chat, final))
                    if include_usage:
                        await resp.write(self._chunk(
                            seq, chat, None, self._usage(event.prompt_tokens, event.completion_tokens,
                                                         event.cached_tokens)))
                await resp.write(b"data: [DONE]\n\n")
                break
        await resp.write_eof()
        return resp

    async def _complete(self, request, seq: Sequence, out: OutputText, chat: bool, token_ids: bool) -> web.Response:
        while True:
            event = await seq.events.get()
            if isinstance(event, FinishEvent):
                break
        if event.reason == "error":
            return _error(500, event.message, "InternalServerError")
        texts = [out.token(i) for i in range(event.completion_tokens)]
        reasoning = "".join(t for t, _, r in texts if r)
        content = "".join(t for t, _, r in texts if not r)
        if chat:
            message = {"role": "assistant", "content": content or None}
            if reasoning:
                message["reasoning_content"] = reasoning
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": event.reason}
        else:
            choice = {"index": 0, "text": reasoning + content, "logprobs": None, "finish_reason": event.reason}
        if token_ids:
            choice["token_ids"] = [tid for _, tid, _ in texts]
        self._access(request, 200)
        return web.json_response({
            "id": seq.request_id, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": self.args.name, "choices": [choice],
            "usage": self._usage(event.prompt_tokens, event.completion_tokens, event.cached_tokens),
        })

    # -- process entry ---------------------------------------------------------

    async def run(self) -> int:
        """Start, serve until SIGTERM/SIGINT or a fatal error, stop. Exit code."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        code = 0
        try:
            starting = asyncio.create_task(self.start())
            stopper = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait({starting, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if starting in done:
                starting.result()  # raises StartupError
            else:
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
                return 0
            failed = asyncio.create_task(self.failed.wait())
            await asyncio.wait({stopper, failed}, return_when=asyncio.FIRST_COMPLETED)
            if self.failed.is_set():
                self.log.error("core.py:1000", f"EngineCore failed: {self.failure}")
                code = 1
            failed.cancel()
            stopper.cancel()
            self.log.info("launcher.py:110", "Shutting down FastAPI HTTP server.")
        except StartupError as exc:
            self.log.error("core.py:866", "EngineCore failed to start.")
            self.log.raw(str(exc))
            code = 1
        except OSError as exc:
            self.log.raw(f"OSError: [Errno {exc.errno}] {exc.strerror}")
            code = 1
        finally:
            await self.stop()
        return code


def serve_main(argv: list[str], prog: str = "vllm serve") -> int:
    args = parse_serve_args(argv, prog=prog)
    try:
        server = TwinServer(args)
    except UnknownModel as exc:
        print(f"ValueError: {exc}", file=sys.stderr)
        return 1
    return asyncio.run(server.run())
