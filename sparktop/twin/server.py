"""A vLLM stand-in's life: bind, start up, serve, stop.

It starts the way vLLM does: the port is bound first, then weights load,
memory is profiled, the KV cache is sized and graphs are captured, each stage
taking modeled time and logged in vLLM's words; only then does the API answer.
A model that does not fit fails the way vLLM fails: an error in the log and a
non-zero exit. The pieces live next door: startup.py sizes memory and decides
failure, openai_api.py answers HTTP, multinode.py joins tensor-parallel peers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import sys
import time
from typing import TextIO

from aiohttp import web

from sparktop.model.cards import GIB, UnknownModel, find_card
from sparktop.twin.args import ServeArgs, parse_serve_args
from sparktop.twin.engine import BLOCK, Engine, EngineConfig
from sparktop.twin.host import TwinHost
from sparktop.twin.metrics import VllmMetrics
from sparktop.twin.multinode import HEAD_WAIT_SECONDS, MultiNode
from sparktop.twin.openai_api import VLLM_VERSION, OpenAIRoutes
from sparktop.twin.rendezvous import HeadRendezvous
from sparktop.twin.startup import StartupError, StartupPlan, fitted_constants, plan_startup
from sparktop.twin.text import load_tokenizer
from sparktop.twin.vlog import VllmLog

# node.py, cli.py and tests import these from here, though most are defined next door.
__all__ = ["HEAD_WAIT_SECONDS", "VLLM_VERSION", "StartupError", "StartupPlan", "TwinServer", "fitted_constants",
           "plan_startup", "serve_main"]



class TwinServer(MultiNode, OpenAIRoutes):
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
        if args.world_size > 1:
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
        self.metrics = metrics = VllmMetrics(args.name, plan.max_model_len)
        # vLLM estimates each step's FLOPs and bytes only with --enable-mfu-metrics.
        traffic = (lambda t: metrics.on_traffic(t.flops, t.read_bytes, t.write_bytes)) \
            if args.enable_mfu_metrics else None
        self.engine = Engine(plan.perf, EngineConfig(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=plan.max_num_batched_tokens,
            max_model_len=plan.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
            enable_prefix_caching=args.enable_prefix_caching, speed=self.speed,
        ), metrics, traffic=traffic)
        metrics.log_cache_config(self._cache_config(plan, self.engine))
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

    def _cache_config(self, plan: StartupPlan, engine: Engine) -> dict[str, str]:
        """What vLLM's cache_config_info says about the KV cache the twin sized."""
        args = self.args
        return {
            "block_size": str(BLOCK), "effective_attention_block_size": str(BLOCK),
            "cache_dtype": args.kv_cache_dtype, "enable_prefix_caching": str(args.enable_prefix_caching),
            "gpu_memory_utilization": str(args.gpu_memory_utilization),
            "num_gpu_blocks": str(engine.num_blocks), "kv_cache_size_tokens": str(engine.kv_capacity_tokens),
            "kv_cache_memory_bytes": str(int(engine.num_blocks * BLOCK * plan.perf.kv_bytes_per_token)),
            "kv_cache_max_concurrency": str(round(engine.max_concurrency(plan.max_model_len), 2)),
        }

    async def _serve_http(self) -> None:
        self._runner = web.AppRunner(self._application(), access_log=None, handle_signals=False)
        await self._runner.setup()
        assert self.sock is not None, "start() binds the port before the API server starts"
        site = web.SockSite(self._runner, self.sock)
        await site.start()
        self.log.info("api_server.py:602", f"Starting vLLM API server 0 on http://{self.args.host}:{self.port}")
        routes = ["/health", "/metrics", "/version", "/v1/models", "/v1/chat/completions", "/v1/completions"]
        if self.sleep_routes:
            self.log.warning("__init__.py:43", "SECURITY WARNING: Development endpoints are enabled! "
                                               "This should NOT be used in production!")
            routes += ["/sleep", "/wake_up", "/is_sleeping"]
        for route in routes:
            post = "completions" in route or route in ("/sleep", "/wake_up")
            self.log.info("launcher.py:46", f"Route: {route}, Methods: {'POST' if post else 'GET'}")
        self.log.raw(f"INFO:     Started server process [{os.getpid()}]")
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
        assert engine is not None, "the stats log starts once the engine has"
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
