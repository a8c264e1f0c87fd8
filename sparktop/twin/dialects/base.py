"""What a twin server says in its engine's words: a dialect.

One `TwinServer` (`twin/server.py`) runs every engine's stand-in: the same
start-up (bind, load, size the KV cache, capture graphs, serve), the same
scheduler and the same performance model timing it. What differs between
vLLM, SGLang, llama.cpp and TensorRT-LLM is what they *say*: the command
line they take, their log lines, their metric names and types, their extra
routes, their model list and their errors. A dialect holds exactly that,
read from each engine's own source (the facts and their commits are in
tests/fixtures/SOURCES.md), and the conformance tests hold it there.

Adding an engine to the twin: a module here with a `Dialect` subclass naming
its `engine_ids` row (its id and name), listed in `dialects.DIALECTS`, and
its stand-in command in `twin/node.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from aiohttp import web

from sparktop import engine_ids
from sparktop.clock import SYSTEM, Clock
from sparktop.engine_ids import EngineId

if TYPE_CHECKING:
    from pathlib import Path

    from sparktop.twin.args import ServeArgs
    from sparktop.twin.server import TwinServer
    from sparktop.twin.startup import StartupPlan


class TwinLog:
    """Log lines in one engine's format; `info`/`warning`/`error`/`engine`
    take the source location vLLM prints (others ignore it or print their own)."""

    def __init__(self, stream: TextIO | None = None, process: str = "APIServer", clock: Clock = SYSTEM):
        self.stream = stream or sys.stdout
        self.process = process
        self.pid = os.getpid()
        self.clock = clock  # the server's (`TwinServer.clock`), for a log that counts time (llama.cpp's)

    def use_clock(self, clock: Clock) -> None:
        """Keep time on `clock` from now on: the server's, when it made this log without giving it."""
        self.clock = clock

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed log must not take the server down

    def line(self, level: str, where: str, message: str, process: str | None = None) -> None:
        self._write(f"{time.strftime('[%Y-%m-%d %H:%M:%S]')} {message}")

    def info(self, where: str, message: str, process: str | None = None) -> None:
        self.line("INFO", where, message, process)

    def warning(self, where: str, message: str, process: str | None = None) -> None:
        self.line("WARNING", where, message, process)

    def error(self, where: str, message: str, process: str | None = None) -> None:
        self.line("ERROR", where, message, process)

    def engine(self, where: str, message: str) -> None:
        self.info(where, message, "EngineCore")

    def raw(self, message: str, process: str | None = None) -> None:
        self._write(message)


class TwinMetrics:
    """An engine's Prometheus registry as the scheduler feeds it (`MetricsSink`).
    The base keeps nothing: an engine without metrics (Ollama) uses it as is."""

    def on_step(self, *, prompt_tokens, generation_tokens, preemptions, running, waiting, kv_usage,
                iteration_tokens):
        pass

    def on_prefix(self, *, queries, hits):
        pass

    def on_first_token(self, seq, ttft, queue_time):
        pass

    def on_token_gap(self, gap):
        pass

    def on_finish(self, seq, reason, now):
        pass

    def on_traffic(self, flops: float, read_bytes: float, write_bytes: float) -> None:
        pass

    def record_sleep_state(self, sleeping: bool, level: int) -> None:
        pass

    @contextlib.contextmanager
    def sleep_operation(self, operation: str) -> Iterator[None]:
        yield

    def record_admission_rejection(self, reason: str) -> None:
        pass

    def log_cache_config(self, info: dict[str, str]) -> None:
        pass

    def set_idle(self, running: int, waiting: int, kv_usage: float) -> None:
        pass

    def render(self) -> bytes:
        return b""


def add_twin_flags(parser: argparse.ArgumentParser) -> None:
    """The twin's own flags, which every dialect's command line takes besides its engine's."""
    parser.add_argument("--speed", type=float, help="(twin) run every modeled duration this many times faster")
    parser.add_argument("--startup-speed", type=float, help="(twin) speed-up for startup only")
    parser.add_argument("--twin-home", help="(twin) the simulated host's state directory")


def twin_settings(ns: argparse.Namespace) -> dict[str, Any]:
    """ServeArgs keywords from the twin's own flags (`SPARKTOP_TWIN_SPEED` when --speed is not given)."""
    speed = ns.speed if ns.speed is not None else float(os.environ.get("SPARKTOP_TWIN_SPEED", "0") or 0) or 1.0
    return {"speed": speed, "startup_speed": ns.startup_speed, "twin_home": ns.twin_home}


# Where a dialect's route handlers find their server (`request.app[TWIN]`).
TWIN: web.AppKey[Any] = web.AppKey("twin")


def error_json(status: int, body: dict) -> web.Response:
    return web.json_response(body, status=status)


class Dialect:
    """One engine's words. The defaults are the OpenAI-compatible parts every
    engine shares; subclasses say what is theirs."""

    # The engine it imitates: its row of `engine_ids`, which sets `id` and `name` (a subclass names its own).
    row: ClassVar[EngineId] = engine_ids.get(engine_ids.DEFAULT)
    id: ClassVar[str] = row.id
    name: ClassVar[str] = row.name
    version: ClassVar[str] = ""  # the release whose words it speaks
    prog: ClassVar[str] = "vllm serve"  # its command, for usage lines
    owned_by: ClassVar[str] = "vllm"
    process_name: ClassVar[str] = "VLLM::EngineCore"  # how nvidia-smi lists its GPU process
    server_header: ClassVar[str | None] = None
    log_class: ClassVar[type[TwinLog]] = TwinLog
    # Over several nodes it joins its own workers (`join`), not through vLLM's rendezvous or Ray.
    own_distribution: ClassVar[bool] = False
    # A /v1/completions request without max_tokens gets this many (vLLM's and
    # SGLang's protocol default 16); None lets it run to the end of the context.
    completion_max_tokens: ClassVar[int | None] = 16
    # vLLM compiles the model with torch.compile before capturing graphs; SGLang
    # and llama.cpp do not by default, so their twins skip that wait.
    compiles: ClassVar[bool] = True
    # vLLM's sleep mode: /sleep, /wake_up and /is_sleeping with --enable-sleep-mode in its dev mode.
    sleep_mode: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.id, cls.name = cls.row.id, cls.row.name

    # -- the command line ---------------------------------------------------------

    def parse(self, argv: list[str], prog: str | None = None) -> ServeArgs:
        """Its command line. `prog`: the command its usage lines name, where the dialect takes one
        (vLLM's, run as `sparktop twin serve`); the others name their own `prog`."""
        raise NotImplementedError

    def demo_argv(self, image: str, model: str, where: list[str], twin: list[str], root: Path) -> list[str]:
        """What follows `docker run ... --network host` in the twin's demo to serve `model` from `image`, as
        the engine's own images start it (`where`: --host and --port; `twin`: the twin's own flags; `root`:
        the demo cluster's folder, for a file the command needs). The default is vLLM's image, whose
        entrypoint is `vllm serve`."""
        return [image, model, *where, "--gpu-memory-utilization", "0.7", *twin]

    # -- start-up -----------------------------------------------------------------

    def logger(self, stream: TextIO | None, clock: Clock = SYSTEM) -> TwinLog:
        return self.log_class(stream, clock=clock)

    def startup_stages(self, plan: StartupPlan, load_format: str) -> dict[str, float]:
        """The start-up stages this engine goes through, in seconds."""
        stages = dict(plan.perf.startup_stages(load_format))
        if not self.compiles:
            stages.pop("torch.compile", None)
        return stages

    def kv_tokens(self, server: TwinServer, plan: StartupPlan) -> int | None:
        """The KV cache's size in tokens where the engine sizes it its own way
        (llama.cpp's -c); None: as vLLM does, from its share of memory."""
        return None

    def begin(self, server: TwinServer) -> None:
        """The first lines: version, arguments."""

    def planned(self, server: TwinServer, plan: StartupPlan) -> None:
        """Architecture, context length, batch limits."""

    async def join(self, server: TwinServer) -> None:
        """With `own_distribution`: reach the other nodes before loading (StartupError if one is missing)."""

    def loading(self, server: TwinServer) -> None:
        pass

    def loaded(self, server: TwinServer, weights_gib: float, seconds: float, total: float) -> None:
        pass

    def compiled(self, server: TwinServer, seconds: float) -> None:
        pass

    def profiled(self, server: TwinServer, plan: StartupPlan) -> None:
        pass

    def kv_sized(self, server: TwinServer, tokens: int, max_len: int, concurrency: float) -> None:
        pass

    def capturing(self, server: TwinServer) -> None:
        pass

    def captured(self, server: TwinServer, seconds: float, init_seconds: float) -> None:
        pass

    def serving(self, server: TwinServer) -> None:
        """The API server is up: its routes and the line that says it listens."""

    def ready(self, server: TwinServer) -> None:
        """After serving: a line of its own that it is ready (SGLang's warm-up), or nothing."""

    def stats(self, server: TwinServer, prompt_tps: float, gen_tps: float, running: int, waiting: int,
              kv: float) -> None:
        """The periodic line of an engine that is working."""

    def start_failed(self, server: TwinServer, message: str) -> None:
        server.log.error("", message)

    def died(self, server: TwinServer, message: str) -> None:
        server.log.error("", message)

    def stopping(self, server: TwinServer) -> None:
        pass

    def access(self, server: TwinServer, request: web.Request, status: int) -> None:
        pass

    # -- serving --------------------------------------------------------------------

    def metrics(self, server: TwinServer, plan: StartupPlan) -> TwinMetrics:
        return TwinMetrics()

    def routes(self, app: web.Application, server: TwinServer) -> None:
        """Its own routes, added before the OpenAI ones."""
        app.router.add_get("/health", self.health)

    async def health(self, request: web.Request) -> web.Response:
        server = request.app[TWIN]
        return web.Response(status=503 if server.failure else 200)

    def model_card(self, server: TwinServer) -> dict[str, Any]:
        """One entry of /v1/models."""
        return {"id": server.args.name, "object": "model", "created": server._created, "owned_by": self.owned_by}

    def models_body(self, server: TwinServer) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_card(server)]}

    def too_long(self, server: TwinServer, prompt: int, max_len: int, from_text: bool) -> web.Response:
        """The error for a prompt longer than the context."""
        return error_json(400, {"object": "error", "message": f"The input ({prompt} tokens) is longer than the "
                                f"model's context length ({max_len} tokens).", "type": "BadRequestError",
                                "param": None, "code": 400})

    def unknown_model(self, server: TwinServer, model: str) -> web.Response | None:
        """The error for a request naming another model; None: the engine serves it anyway."""
        return None

    def fingerprint(self, server: TwinServer) -> str | None:
        """The `system_fingerprint` its responses carry, or None."""
        return None

    def usage_extra(self, server: TwinServer) -> dict[str, Any]:
        """What its usage objects carry beyond OpenAI's."""
        return {}

    def final_chunk_extra(self, server: TwinServer, seq: Any, completion: int) -> dict[str, Any]:
        """What its last streamed chunk carries beyond OpenAI's (llama.cpp's `timings`)."""
        return {}


def dump(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"))
