"""What a twin server says in its engine's words: a dialect.

One `TwinServer` (`twin/server.py`) runs every engine's stand-in: the same
start-up (bind, load, size the KV cache, capture graphs, serve), the same
scheduler and the same performance model timing it. What differs between
vLLM, SGLang, llama.cpp and TensorRT-LLM is what they *say*: the command
line they take, their log lines, their metric names and types, their extra
routes, their model list and their errors. A dialect holds exactly that,
read from each engine's own source (the facts and their commits are in
tests/fixtures/SOURCES.md), and the conformance tests hold it there.

The base `Dialect` is no engine's: its defaults are neutral (derived from
the subclass's row where there is a neutral answer: `prog` and
`process_name` its first program, `owned_by` its id), and what only an
engine can say (its command line, its demo command, its errors) it leaves
to the subclass. vLLM's words are `dialects/vllm.py`'s, as SGLang's are
`sglang.py`'s.

Adding an engine to the twin: a module here with a `Dialect` subclass naming
its `engine_ids` row (its id, name and programs), listed in
`dialects.DIALECTS` (with the helper programs its images run beside the
server, if any); its `tool_main` is what those programs do on a test host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from aiohttp import web

from sparktop.clock import SYSTEM, Clock
from sparktop.engine_ids import EngineId
from sparktop.twin.dialects import programs_of

if TYPE_CHECKING:
    from pathlib import Path

    from sparktop.twin.args import ServeArgs
    from sparktop.twin.server import TwinServer
    from sparktop.twin.startup import StartupPlan


class TwinLog:
    """Log lines in one engine's format; `info`/`warning`/`error`/`engine`
    take a source location, which a log that prints one prints (vLLM's
    `[model.py:555]`); others ignore it or print their own."""

    def __init__(self, stream: TextIO | None = None, process: str = "", clock: Clock = SYSTEM):
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
        """A line of the engine's core, where a log tells it from the API server's (vLLM's `EngineCore`)."""
        self.info(where, message)

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


# What a dialect's `tool_main` runs a twin server of its engine with: its command line -> the exit code.
Serve = Callable[[list[str]], int]

# Where a dialect's route handlers find their server (`request.app[TWIN]`).
TWIN: web.AppKey[Any] = web.AppKey("twin")


def error_json(status: int, body: dict) -> web.Response:
    return web.json_response(body, status=status)


def openai_error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    """An error in OpenAI's envelope: `{"error": {"message", "type", "param", "code"}}`."""
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}},
                             status=status)


# vLLM's wording of two errors, shared: vLLM's dialect answers `invalid` and `unparsable` so, and so do SGLang's
# and TensorRT-LLM's, whose requests the OpenAI routes check in vLLM 0.32's order (their engines' own words
# for these are not imitated); llama.cpp answers its own.

def parameter_error(message: str, param: str, value: object) -> web.Response:
    """vLLM's VLLMValidationError: a 400 that names the parameter and its value."""
    return openai_error(400, f"{message} (parameter={param}, value={value})", "BadRequestError", param)


def validation_error(loc: str, kind: str, msg: str, value: object, ctx: dict | None = None) -> web.Response:
    """FastAPI's request validation error as vLLM's handler words it."""
    detail: dict[str, object] = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx is not None:
        detail["ctx"] = ctx
    return openai_error(400, f"1 validation error:\n  {detail}", "Bad Request", loc)


class Dialect:
    """One engine's words. The defaults are what no engine would say otherwise
    (no extra route but /health, no metrics, nothing logged, no fingerprint);
    what only an engine can answer (its command line, its errors) a subclass
    says, and the base raises NotImplementedError."""

    # The engine it imitates: its row of `engine_ids`, which sets `id` and `name`. Every subclass names its own.
    row: ClassVar[EngineId]
    id: ClassVar[str]
    name: ClassVar[str]
    # The programs it answers as a test host's stand-in (`tool_main`): its row's and the helpers the registry
    # lists (`dialects.DIALECTS`).
    programs: ClassVar[tuple[str, ...]]
    version: ClassVar[str] = ""  # the release whose words it speaks
    prog: ClassVar[str] = ""  # its command, for usage lines; unset: its row's first program
    owned_by: ClassVar[str] = ""  # /v1/models' owned_by; unset: its row's id
    process_name: ClassVar[str] = ""  # how nvidia-smi lists its GPU process; unset: its row's first program
    server_header: ClassVar[str | None] = None
    log_class: ClassVar[type[TwinLog]] = TwinLog
    # Over several nodes it joins its own workers (`join`), not through the twin's rendezvous or Ray (multinode.py).
    own_distribution: ClassVar[bool] = False
    # A /v1/completions request without max_tokens gets this many; None lets it run to the end of the context.
    completion_max_tokens: ClassVar[int | None] = None
    # Whether start-up takes the model's `torch.compile` stage (vLLM's torch.compile, TensorRT-LLM's autotuning).
    compiles: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        row = cls.row
        cls.id, cls.name = row.id, row.name
        cls.programs = programs_of(row.id)
        first = row.programs[0] if row.programs else row.id
        cls.prog = cls.prog or first
        cls.owned_by = cls.owned_by or row.id
        cls.process_name = cls.process_name or first

    # -- the stand-in programs --------------------------------------------------------

    def tool_main(self, program: str, argv: list[str], serve: Serve) -> int:
        """Run `program` (one of `programs`) with `argv`, as a test host's stand-in for it (`twin/node.py`); its
        exit code. `serve(argv)` runs a twin server of this engine from its command line (`server.serve_main`,
        which node.py hands over: a dialect sits below the server and never imports it). The default: the
        program is the server and `argv` its command line."""
        return serve(argv)

    # -- the command line ---------------------------------------------------------

    def parse(self, argv: list[str], prog: str | None = None) -> ServeArgs:
        """Its command line. `prog`: the command its usage lines name, where the dialect takes one
        (vLLM's, run as `sparktop twin serve`); the others name their own `prog`."""
        raise NotImplementedError

    def demo_argv(self, image: str, model: str, where: list[str], twin: list[str], root: Path) -> list[str]:
        """What follows `docker run ... --network host` in the twin's demo to serve `model` from `image`, as
        the engine's own images start it (`where`: --host and --port; `twin`: the twin's own flags; `root`:
        the demo cluster's folder, for a file the command needs)."""
        raise NotImplementedError

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
        (llama.cpp's -c); None: from its share of memory (`gpu_memory_utilization`)."""
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
        raise NotImplementedError

    def invalid(self, message: str, param: str, value: object) -> web.Response:
        """The error for a request parameter out of range (`max_tokens` below 1 or past the context),
        naming the parameter and its value."""
        raise NotImplementedError

    def unparsable(self, loc: str, kind: str, msg: str, value: object, ctx: dict | None = None) -> web.Response:
        """The error for a request its schema refuses (a body that is not JSON, a field of the wrong type),
        as pydantic words it (`loc` "body.max_tokens", `kind` "int_type", `msg`, the input, pydantic's ctx)."""
        raise NotImplementedError

    def admit(self, server: TwinServer) -> web.Response | None:
        """The refusal of a generation request its queue limits turn away, or None: admitted (no limits)."""
        return None

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
