"""A twin server's life, whichever engine it imitates: bind, start up, serve, stop.

Every engine's stand-in starts the same way: the port is bound first, then
weights load, memory is profiled, the KV cache is sized and graphs are
captured, each stage taking modeled time and logged in its dialect's words
(`twin/dialects/`, one per engine; `engine_ids.DEFAULT`'s when none is
named); only then does the API answer. A model that does not fit fails as
its engine fails: an error in the log and a non-zero exit. The pieces live
next door: startup.py sizes memory and decides failure, openai_api.py
answers the OpenAI routes, the dialect its own routes and words,
multinode.py joins tensor-parallel peers (where the dialect does not join
its own, `Dialect.own_distribution`).

The twin's own, in every dialect: `POST /twin/hang` (or SIGUSR1, which
toggles) makes its engine hang, answering /health and its API while it
makes no tokens, so a watchdog has something real to catch
(`Engine.hang`); `POST /twin/stall` stalls every stream after its first
tokens while the rest is served (`Engine.stall`), for a canary request
(`observe.canary`) to catch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import signal
import socket
import sys
from collections.abc import Mapping
from typing import TextIO

from aiohttp import web

from sparktop.clock import SYSTEM, Clock
from sparktop.engine_ids import DEFAULT
from sparktop.model.cards import GIB, UnknownModel, find_card
from sparktop.model.forecast import labelled_card
from sparktop.model.quant import Quantization
from sparktop.twin.args import ServeArgs
from sparktop.twin.dialects import dialect_for
from sparktop.twin.dialects.base import Dialect, TwinMetrics
from sparktop.twin.engine import Engine, EngineConfig
from sparktop.twin.host import TwinHost
from sparktop.twin.multinode import HEAD_WAIT_SECONDS, MultiNode
from sparktop.twin.openai_api import OpenAIRoutes
from sparktop.twin.rendezvous import HeadRendezvous
from sparktop.twin.startup import StartupError, StartupPlan, container_labels, plan_startup, twin_basis
from sparktop.twin.text import load_tokenizer

# cli.py and tests import these from here, though most are defined next door.
__all__ = ["HEAD_WAIT_SECONDS", "StartupError", "StartupPlan", "TwinServer", "plan_startup", "serve_main"]



class TwinServer(MultiNode, OpenAIRoutes):
    """One engine's stand-in, in its dialect's words. `await start()` runs startup and begins serving;
    `await stop()` shuts down. `run()` does both and waits for a signal."""

    def __init__(self, args: ServeArgs, log: TextIO | None = None, host: TwinHost | None = None,
                 dialect: Dialect | None = None, clock: Clock = SYSTEM, environ: Mapping[str, str] | None = None):
        self.args = args
        # Every time the twin keeps (its steps, the request log, the stats line) is on this clock: a test
        # gives it a virtual-time loop's (sparktop.clock.loop_clock) to serve on simulated time.
        self.clock = clock
        self.dialect = dialect or dialect_for(DEFAULT)  # whose words it speaks
        # The container's labels (a plan's card, its format and stack) and image, when it runs in one.
        self.labels, self.image = container_labels(environ)
        self.card = labelled_card(find_card(args.model), self.labels)
        if args.quantization:  # a GGUF's quantization, vLLM's or SGLang's --quantization: the weights read
            self.card = dataclasses.replace(self.card, quant=Quantization.of(args.quantization))
        self.log = self.dialect.logger(log, clock)
        self.host = host if host is not None else (TwinHost(args.twin_home) if args.twin_home else TwinHost.from_env())
        # A simulated host may set its own pace (the lab speeds startup up);
        # flags given on the command line win.
        config = self.host.config if self.host else {}
        self.speed = args.speed if "speed" in args.given else float(config.get("speed", args.speed) or 1.0)
        self.startup_speed = args.startup_speed or float(config.get("startup_speed", 0) or 0) or self.speed
        self.engine: Engine | None = None
        self.metrics: TwinMetrics | None = None
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
        self._created = int(clock.wall())
        self._registered = False

    # -- helpers ---------------------------------------------------------------

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.args.host in ("0.0.0.0", "", "::") else self.args.host
        return f"http://{host}:{self.port}"

    async def _sleep(self, modeled: float) -> None:
        await asyncio.sleep(max(0.0, modeled / self.startup_speed))

    def _bind(self) -> None:
        # The port is bound before the engine is built (so it is taken for
        # the whole startup, as vLLM takes it) but listens only once the API
        # server starts: until then a connection is refused.
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
        args, card, say = self.args, self.card, self.dialect
        say.begin(self)
        if args.headless:
            await self._run_headless()
            return
        self._bind()
        other = self.host.used_mib(exclude_pid=os.getpid()) if self.host else 0
        self.basis = twin_basis(card, self.dialect.id, self.labels, self.image)
        self.plan = plan = plan_startup(card, args, other, engine=self.dialect.id, basis=self.basis)
        say.planned(self, plan)
        if say.own_distribution:
            await say.join(self)
        elif args.world_size > 1:
            await self._start_distributed(plan)
        weights_gib = plan.perf.weights_bytes_per_node / GIB
        fixed_kv = say.kv_tokens(self, plan)
        # vLLM and SGLang take their share of memory up front; llama.cpp holds the weights and its -c tokens.
        used_mib = int(args.gpu_memory_utilization * plan.perf.hw.memory_gib * 1024) if fixed_kv is None else int(
            (weights_gib + fixed_kv * plan.perf.kv_bytes_per_token / GIB + 1.0) * 1024)
        if self.host:
            self.host.register(os.getpid(), say.process_name, int(weights_gib * 1024),
                               cache_mib=int(weights_gib * 1024))
            self._registered = True
        stages = say.startup_stages(plan, args.load_format)
        say.loading(self)
        self.stage = "loading weights"
        await self._sleep(stages["loading weights"])
        say.loaded(self, weights_gib, stages["loading weights"], stages["init"] + stages["loading weights"])
        self.stage = "memory profiling"
        if "torch.compile" in stages:
            await self._sleep(stages["torch.compile"])
            say.compiled(self, stages["torch.compile"])
        await self._sleep(stages["memory profiling"])
        say.profiled(self, plan)
        self.metrics = metrics = say.metrics(self, plan)
        # Each step's FLOPs and bytes are estimated only when asked (vLLM's and SGLang's --enable-mfu-metrics).
        traffic = (lambda t: metrics.on_traffic(t.flops, t.read_bytes, t.write_bytes)) \
            if args.enable_mfu_metrics else None
        self.engine = Engine(plan.perf, EngineConfig(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=plan.max_num_batched_tokens,
            max_model_len=plan.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
            enable_prefix_caching=args.enable_prefix_caching, speed=self.speed,
            kv_tokens=say.kv_tokens(self, plan),
        ), metrics, clock=self.clock.now, traffic=traffic)
        say.kv_sized(self, self.engine.kv_capacity_tokens, plan.max_model_len,
                     self.engine.max_concurrency(plan.max_model_len))
        if self.host:
            self.host.register(os.getpid(), say.process_name, used_mib, cache_mib=int(weights_gib * 1024))
        if "graph capture" in stages:
            self.stage = "graph capture"
            say.capturing(self)
            await self._sleep(stages["graph capture"])
        total_init = stages["memory profiling"] + stages.get("torch.compile", 0) + stages.get("graph capture", 0)
        say.captured(self, stages.get("graph capture", 0.0), total_init)
        self.stage = "api server"
        await self._sleep(stages["api server"])
        self.engine.start()
        await self._serve_http()
        self.stage = "ready"
        say.ready(self)
        self._tasks.append(asyncio.create_task(self._heartbeat()))
        self._tasks.append(asyncio.create_task(self._stats_log()))
        self.ready.set()

    async def _serve_http(self) -> None:
        self._runner = web.AppRunner(self._application(), access_log=None, handle_signals=False)
        await self._runner.setup()
        assert self.sock is not None, "start() binds the port before the API server starts"
        site = web.SockSite(self._runner, self.sock)
        await site.start()
        self.dialect.serving(self)

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
        """The engine's periodic throughput line (vLLM's 'Engine 000: Avg prompt throughput ...')."""
        engine = self.engine
        assert engine is not None, "the stats log starts once the engine has"
        last = (self.clock.now(), engine.total_prompt_tokens, engine.total_generation_tokens)
        while True:
            await asyncio.sleep(10)
            now = (self.clock.now(), engine.total_prompt_tokens, engine.total_generation_tokens)
            dt = max(1e-6, now[0] - last[0])
            if now[1] == last[1] and now[2] == last[2] and not engine.running and not engine.waiting:
                last = now
                continue
            self.dialect.stats(self, (now[1] - last[1]) / dt, (now[2] - last[2]) / dt, len(engine.running),
                               len(engine.waiting), engine.kv_usage)
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
        if self._request_log is not None:  # after the handlers, which write it as they end
            self._request_log.close()
            self._request_log = None
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

    def toggle_hang(self) -> None:
        """SIGUSR1: the engine hangs, or is let go (`Engine.hang`, as `POST /twin/hang`); before it is
        built, nothing happens."""
        if self.engine is not None:
            self.engine.hang(not self.engine.hung)

    # -- process entry ---------------------------------------------------------

    async def run(self) -> int:
        """Start, serve until SIGTERM/SIGINT or a fatal error, stop. Exit code."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGUSR1, self.toggle_hang)  # the twin's own, as POST /twin/hang
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
                self.dialect.died(self, self.failure or "")
                code = 1
            failed.cancel()
            stopper.cancel()
            self.dialect.stopping(self)
        except StartupError as exc:
            self.dialect.start_failed(self, str(exc))
            code = 1
        except OSError as exc:
            self.log.raw(f"OSError: [Errno {exc.errno}] {exc.strerror}")
            code = 1
        finally:
            await self.stop()
        return code


def serve_main(argv: list[str], prog: str | None = None, engine: str = DEFAULT) -> int:
    """A twin server from its engine's command line (`vllm serve ...`, `llama-server ...`). `prog`: the command
    its usage lines name, where its dialect takes one (`sparktop twin serve`); by default its dialect's own."""
    dialect = dialect_for(engine)
    try:
        args = dialect.parse(argv, prog or dialect.prog)
        server = TwinServer(args, dialect=dialect)
    except UnknownModel as exc:
        print(f"ValueError: {exc}", file=sys.stderr)
        return 1
    return asyncio.run(server.run())
