"""The runtimes sparktop launches, one module each: how one engine of a
layout is started in that runtime's commands (`base.Runtime`). A recipe
names its runtime as sparkrun does (`runtime: vllm | sglang | llama-cpp |
trtllm`); sparkrun's vLLM flavours are vLLM here.

Adding a runtime: a module here with a `Runtime` subclass listed in
`RUNTIMES`; the engine it starts must be one `observe.engines` recognises,
and the twin must speak it (`twin/dialects/`) for the lab to launch it.
"""

from __future__ import annotations

from sparktop.errors import SparktopError
from sparktop.launch.runtimes.base import Runtime
from sparktop.launch.runtimes.llamacpp import LlamaCppRuntime
from sparktop.launch.runtimes.sglang import SglangRuntime
from sparktop.launch.runtimes.trtllm import TrtllmRuntime
from sparktop.launch.runtimes.vllm import VllmRuntime

RUNTIMES: dict[str, Runtime] = {r.id: r for r in (VllmRuntime(), SglangRuntime(), LlamaCppRuntime(), TrtllmRuntime())}
# sparkrun's names, and what people type.
ALIASES = {"vllm-distributed": "vllm", "vllm-ray": "vllm", "eugr-vllm": "vllm", "llama.cpp": "llama-cpp",
           "llamacpp": "llama-cpp", "llama_cpp": "llama-cpp", "tensorrt-llm": "trtllm", "trt-llm": "trtllm",
           "tensorrt_llm": "trtllm"}


class UnknownRuntime(SparktopError):
    pass


def runtime_id(name: str) -> str:
    """The runtime a recipe's `runtime:` names (UnknownRuntime when sparktop launches no such runtime)."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in RUNTIMES:
        raise UnknownRuntime(f"{name} is not a runtime sparktop launches ({', '.join(RUNTIMES)})")
    return key


def runtime_for(name: str) -> Runtime:
    return RUNTIMES[runtime_id(name)]


def for_engine(engine: str) -> Runtime | None:
    """The runtime that starts an engine (`observe.engines` id)."""
    return next((r for r in RUNTIMES.values() if r.engine == engine), None)
