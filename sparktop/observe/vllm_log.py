"""Where a starting vLLM is, read from its log.

The stage names are what a user sees on an engine card while it starts:
loading weights, memory profiling, KV cache, graph capture, ready; or
failed, with the line that says why. Patterns come from real Spark logs
(reference/captures/vllm-startup_*.log), including the one without
uvicorn's "Application startup complete." line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Ordered: a later stage wins over an earlier one.
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


@dataclass
class StartupState:
    stage: str | None = None
    failed: bool = False
    reason: str | None = None
    kv_tokens: int | None = None
    weights_gib: float | None = None


def strip_prefix(line: str) -> str:
    return _PREFIX.sub("", line).strip()


def startup_state(lines: list[str]) -> StartupState:
    state = StartupState()
    cause: str | None = None
    rank = {name: i for i, (name, _) in enumerate(STAGES)}
    for raw in lines:
        line = _LEVEL.sub("", strip_prefix(raw))  # "ERROR 11-23 13:57:15 [core.py:1510] ValueError: ..."
        for name, pattern in STAGES:
            if pattern.search(line) and (state.stage is None or rank[name] >= rank[state.stage]):
                state.stage = name
        if m := _KV_TOKENS.search(line):
            state.kv_tokens = int(m.group(1).replace(",", ""))
        if m := _WEIGHTS.search(line):
            state.weights_gib = float(m.group(1))
        if FAILURE.search(line):
            state.failed = True
            # The exception line says why; the traceback head does not; the
            # first exception that is not the API server's wrapper is the cause.
            if "Traceback" not in line and (cause is None or WRAPPER.search(cause)):
                cause = line
    state.reason = cause
    return state


# -- an engine that dies after start-up ------------------------------------------

# vLLM's words for an engine that has died at run time: the EngineCore's own
# fatal error, what the API server says about it, the client noticing.
DEAD = re.compile(r"EngineCore encountered a fatal error|EngineDeadError|Engine core proc \S+ died unexpectedly|"
                  r"EngineCore failed")
# vLLM's logging prefix after the process tag: "ERROR 01-08 17:16:15 [core.py:844] ".
_LEVEL = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
                    r"\[[^\]]*\]\s?")
_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception): ")


def message(line: str) -> tuple[str | None, str]:
    """(level, message) of a vLLM log line, the process tag and stamp removed."""
    line = strip_prefix(line)
    m = _LEVEL.match(line)
    if m is None:
        return None, line
    return m.group("level"), line[m.end():]


def runtime_failure(lines: list[str]) -> str | None:
    """Why a running engine died, from the tail of its log: the first error
    line of its death (`EngineCore encountered a fatal error.`), with the
    exception that caused it when the traceback names one. None while the
    log shows no dead engine (a request's own ERROR lines do not count)."""
    first: str | None = None
    cause: str | None = None
    for raw in lines:
        level, text = message(raw)
        if first is None:
            if DEAD.search(text) and level in ("ERROR", "CRITICAL", None):
                first = text.strip()
            continue
        stripped = text.strip()
        if cause is None and _EXCEPTION.match(stripped) and "EngineDeadError" not in stripped:
            cause = stripped
    if first is None:
        return None
    return f"{first} {cause}" if cause and cause not in first else first
