"""Where a starting engine is, read from its log, and why a running one died.

The stage names are what a user sees on an engine card while it starts:
loading weights, memory profiling, KV cache, graph capture, ready; or
failed, with the line that says why. Each engine words them its own way
(`LogPatterns`, one table per engine module in `observe/engines/`); vLLM's
come from real Spark logs (reference/captures/vllm-startup_*.log), including
the one without uvicorn's "Application startup complete." line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LogPatterns:
    """One engine's words in its log."""

    stages: tuple[tuple[str, re.Pattern], ...]  # ordered: a later stage wins over an earlier one
    failure: re.Pattern  # a line that says it failed to start
    wrapper: re.Pattern | None = None  # a failure line that only repeats another (the cause came before)
    dead: re.Pattern | None = None  # its words for an engine that died after start-up
    kv_tokens: re.Pattern | None = None  # the KV cache's size in tokens, group 1
    weights_gib: re.Pattern | None = None  # the weights' size, GiB, group 1
    prefix: re.Pattern = field(default_factory=lambda: re.compile(r"^$"))  # process tags to strip
    level: re.Pattern = field(default_factory=lambda: re.compile(r"^$"))  # level and time stamp (group `level`)


# vLLM's (`engines/vllm.py` names them as its log patterns).
STAGES: list[tuple[str, re.Pattern]] = [
    ("initializing", re.compile(r"non-default args|Initializing a V1 LLM engine|Resolved architecture")),
    ("waiting for workers", re.compile(r"Waiting for \d+ more node|waiting for clients", re.I)),
    ("loading weights", re.compile(r"Starting to load model|Loading safetensors checkpoint shards|"
                                   r"Loading weights|Time spent downloading weights")),
    ("compiling", re.compile(r"torch\.compile|Dynamo bytecode transform|Compiling a graph")),
    ("memory profiling", re.compile(r"Model loading took|Initial profiling/warmup run|Profiling CUDA graph memory")),
    ("kv cache", re.compile(r"Available KV cache memory|GPU KV cache size|Maximum concurrency for")),
    ("graph capture", re.compile(r"Capturing CUDA graphs|Capturing cudagraphs|Graph capturing")),
    ("api server", re.compile(r"init engine .* took|Starting vLLM (API )?server|Available routes are")),
    ("ready", re.compile(r"Application startup complete|\"GET /v1/models HTTP/1\.1\" 200")),
]
# A Python exception line ("ValueError: ...", "torch.OutOfMemoryError: ..."),
# or vLLM's own words for a dead engine.
FAILURE = re.compile(
    r"^[\w.]*(Error|Exception): |CUDA out of memory|EngineCore failed|Engine core initialization failed|"
    r"Traceback \(most recent call last\)"
)
# What the API server says after the engine core failed: a consequence, not
# the cause, which the core logged before it ("See root cause above").
WRAPPER = re.compile(r"Engine core initialization failed|See root cause above|EngineDeadError|EngineCore failed|"
                     r"Engine core proc \S+ died")
_PREFIX = re.compile(r"^\((?:APIServer|EngineCore)[^)]*\)\s*")
_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_WEIGHTS = re.compile(r"Model loading took ([\d.]+) GiB")


_LEVEL = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
                    r"\[[^\]]*\]\s?")
# vLLM's words for an engine that has died at run time: the EngineCore's own
# fatal error, what the API server says about it, the client noticing.
DEAD = re.compile(r"EngineCore encountered a fatal error|EngineDeadError|Engine core proc \S+ died unexpectedly|"
                  r"EngineCore failed")
VLLM_LOG = LogPatterns(tuple(STAGES), FAILURE, WRAPPER, DEAD, _KV_TOKENS, _WEIGHTS, _PREFIX, _LEVEL)


@dataclass
class StartupState:
    stage: str | None = None
    failed: bool = False
    reason: str | None = None
    kv_tokens: int | None = None
    weights_gib: float | None = None


def strip_prefix(line: str, patterns: LogPatterns = VLLM_LOG) -> str:
    return patterns.prefix.sub("", line).strip()


def latest_run(lines: list[str], patterns: LogPatterns = VLLM_LOG) -> list[str]:
    """The lines of the container's latest run: from the last line of its first start-up stage on (a
    restarted container's log keeps its earlier runs, whose shutdown and errors are not this run's); `lines`
    itself (the same list) when no line says a start (a tail that begins later)."""
    first = patterns.stages[0][1] if patterns.stages else None
    if first is None:
        return lines
    for i in range(len(lines) - 1, -1, -1):
        if first.search(lines[i]):
            return lines[i:]
    return lines


def startup_state(lines: list[str], patterns: LogPatterns = VLLM_LOG) -> StartupState:
    state = StartupState()
    cause: str | None = None
    rank = {name: i for i, (name, _) in enumerate(patterns.stages)}
    for raw in lines:
        line = patterns.level.sub("", strip_prefix(raw, patterns))  # "ERROR 11-23 13:57:15 [core.py:1510] ..."
        for name, pattern in patterns.stages:
            if pattern.search(line) and (state.stage is None or rank[name] >= rank[state.stage]):
                state.stage = name
        if patterns.kv_tokens is not None and (m := patterns.kv_tokens.search(line)):
            state.kv_tokens = int(m.group(1).replace(",", ""))
        if patterns.weights_gib is not None and (m := patterns.weights_gib.search(line)):
            state.weights_gib = float(m.group(1))
        if patterns.failure.search(line):
            state.failed = True
            # The exception line says why; the traceback head does not; the
            # first exception that is not a wrapper of another is the cause.
            if "Traceback" not in line and (cause is None or patterns.wrapper is not None
                                             and patterns.wrapper.search(cause)):
                cause = line
    state.reason = cause
    return state


# -- an engine that dies after start-up ------------------------------------------

_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception): ")


def message(line: str, patterns: LogPatterns = VLLM_LOG) -> tuple[str | None, str]:
    """(level, message) of a log line, the process tag and stamp removed."""
    line = strip_prefix(line, patterns)
    m = patterns.level.match(line)
    if m is None:
        return None, line
    return m.groupdict().get("level"), line[m.end():]


def runtime_failure(lines: list[str], patterns: LogPatterns = VLLM_LOG) -> str | None:
    """Why a running engine died, from the tail of its log: the first error
    line of its death (`EngineCore encountered a fatal error.`), with the
    exception that caused it when the traceback names one. None while the
    log shows no dead engine (a request's own ERROR lines do not count)."""
    if patterns.dead is None:
        return None
    first: str | None = None
    cause: str | None = None
    for raw in lines:
        level, text = message(raw, patterns)
        if first is None:
            if patterns.dead.search(text) and level in ("ERROR", "CRITICAL", "E", "F", None):
                first = text.strip()
            continue
        stripped = text.strip()
        if cause is None and _EXCEPTION.match(stripped) and "EngineDeadError" not in stripped:
            cause = stripped
    if first is None:
        return None
    return f"{first} {cause}" if cause and cause not in first else first
