"""The engines the twin speaks: one dialect module each (see `base.py`).

Imported on demand, by id: a twin that serves vLLM never loads SGLang's
registry, and the modules may import the twin's parts that import `base`.
Any name of an engine (`llama-cpp`, `trt-llm`) finds its dialect through
`engine_ids`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from sparktop import engine_ids

if TYPE_CHECKING:
    from sparktop.twin.dialects.base import Dialect

# engine id (its `engine_ids` row) -> module, class
DIALECTS: dict[str, tuple[str, str]] = {
    "vllm": ("sparktop.twin.dialects.vllm", "VllmDialect"),
    "sglang": ("sparktop.twin.dialects.sglang", "SglangDialect"),
    "llama.cpp": ("sparktop.twin.dialects.llamacpp", "LlamaCppDialect"),
    "trtllm": ("sparktop.twin.dialects.trtllm", "TrtllmDialect"),
}
def speaks(name: str) -> bool:
    """Whether the twin speaks the engine `name` names (an id or any alias, any case)."""
    row = engine_ids.lookup(name)
    return row is not None and row.id in DIALECTS


def dialect_for(engine: str) -> Dialect:
    """The dialect of an engine id or runtime name; KeyError when the twin does not speak it."""
    row = engine_ids.lookup(engine)
    module, cls = DIALECTS[row.id if row is not None else engine]
    return getattr(importlib.import_module(module), cls)()
