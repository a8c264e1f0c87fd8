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
    rank = {name: i for i, (name, _) in enumerate(STAGES)}
    for raw in lines:
        line = strip_prefix(raw)
        for name, pattern in STAGES:
            if pattern.search(line) and (state.stage is None or rank[name] >= rank[state.stage]):
                state.stage = name
        if m := _KV_TOKENS.search(line):
            state.kv_tokens = int(m.group(1).replace(",", ""))
        if m := _WEIGHTS.search(line):
            state.weights_gib = float(m.group(1))
        if FAILURE.search(line):
            state.failed = True
            # The exception line says why; the traceback head does not.
            if "Traceback" not in line:
                state.reason = line
    return state
