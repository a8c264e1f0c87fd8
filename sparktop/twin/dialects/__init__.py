"""The engines the twin speaks: one dialect module each (see `base.py`).

Imported on demand, by id: a twin that serves vLLM never loads SGLang's
registry, and the modules may import the twin's parts that import `base`.
Any name of an engine (`llama-cpp`, `trt-llm`) finds its dialect through
`engine_ids`.

The registry also says which programs each dialect answers as a test host's
stand-in (`twin/node.py`): its row's `programs` (`llama-server`,
`rpc-server`, ...) and the helper programs its images run beside the server
(TensorRT-LLM's `trtllm-llmapi-launch`, `mpirun` and `sshd`), so that which
dialect owns a program is known without importing any dialect module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparktop import engine_ids

if TYPE_CHECKING:
    from sparktop.twin.dialects.base import Dialect


@dataclass(frozen=True)
class DialectEntry:
    module: str
    cls: str
    # Programs its images run beside its row's `programs`, which its dialect answers too (`Dialect.tool_main`).
    helpers: tuple[str, ...] = ()


# engine id (its `engine_ids` row) -> where its dialect is
DIALECTS: dict[str, DialectEntry] = {
    "vllm": DialectEntry("sparktop.twin.dialects.vllm", "VllmDialect"),
    "sglang": DialectEntry("sparktop.twin.dialects.sglang", "SglangDialect"),
    "llama.cpp": DialectEntry("sparktop.twin.dialects.llamacpp", "LlamaCppDialect"),
    "trtllm": DialectEntry("sparktop.twin.dialects.trtllm", "TrtllmDialect",
                           helpers=("trtllm-llmapi-launch", "mpirun", "sshd")),
}


def programs_of(engine_id: str) -> tuple[str, ...]:
    """The programs the dialect of `engine_id` answers: its row's, then its helpers (none unless registered)."""
    entry = DIALECTS.get(engine_id)
    return (*engine_ids.get(engine_id).programs, *(entry.helpers if entry is not None else ()))


def _owners() -> dict[str, str]:
    """program -> the engine id whose dialect answers it; a program two dialects claim is a mistake."""
    out: dict[str, str] = {}
    for engine_id in DIALECTS:
        for program in programs_of(engine_id):
            if program in out:
                raise AssertionError(f"dialects: {program!r} is both {out[program]}'s and {engine_id}'s")
            out[program] = engine_id
    return out


# Every program a dialect answers -> its engine id, in the registry's order.
PROGRAMS: dict[str, str] = _owners()


def speaks(name: str) -> bool:
    """Whether the twin speaks the engine `name` names (an id or any alias, any case)."""
    row = engine_ids.lookup(name)
    return row is not None and row.id in DIALECTS


def dialect_for(engine: str) -> Dialect:
    """The dialect of an engine id or runtime name; KeyError when the twin does not speak it."""
    row = engine_ids.lookup(engine)
    entry = DIALECTS[row.id if row is not None else engine]
    return getattr(importlib.import_module(entry.module), entry.cls)()
