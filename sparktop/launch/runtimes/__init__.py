"""The runtimes sparktop launches, one module each: how one engine of a
layout is started in that runtime's commands (`base.Runtime`). A recipe
names its runtime by any name of its engine in `engine_ids` (sparkrun's
`vllm | sglang | llama-cpp | trtllm`, or `llama.cpp`); sparkrun's vLLM
flavours are vLLM here. A runtime's id is its engine's id there.

Adding a runtime: a module here with a `Runtime` subclass naming its
`engine_ids` row, listed in `RUNTIMES`; the engine it starts must be one `observe.engines` recognises,
and the twin must speak it (`twin/dialects/`) for the lab to launch it.
"""

from __future__ import annotations

from sparktop import engine_ids
from sparktop.errors import SparktopError
from sparktop.launch.runtimes.base import Runtime
from sparktop.launch.runtimes.llamacpp import LlamaCppRuntime
from sparktop.launch.runtimes.sglang import SglangRuntime
from sparktop.launch.runtimes.trtllm import TrtllmRuntime
from sparktop.launch.runtimes.vllm import VllmRuntime

RUNTIMES: dict[str, Runtime] = {r.id: r for r in (VllmRuntime(), SglangRuntime(), LlamaCppRuntime(), TrtllmRuntime())}


class UnknownRuntime(SparktopError):
    pass


def runtime_id(name: str) -> str:
    """The runtime a recipe's `runtime:` names, by any of its engine's names (`llama-cpp`, sparkrun's
    `vllm-distributed`) -> engine_ids' id; UnknownRuntime when sparktop launches no such runtime."""
    row = engine_ids.lookup(name)
    if row is None or row.id not in RUNTIMES:
        known = ", ".join(r.sparkrun or r.id for r in engine_ids.ROWS if r.id in RUNTIMES)
        what = f"{name} is not a runtime sparktop launches" if row is None or row.id == name.strip().lower() else (
            f"{name} is {row.name}, not a runtime sparktop launches")
        raise UnknownRuntime(f"{what} ({known})")
    return row.id


def runtime_for(name: str) -> Runtime:
    return RUNTIMES[runtime_id(name)]
