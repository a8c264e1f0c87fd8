"""The engines the twin speaks: one dialect module each (see `base.py`).

Imported on demand, by id: a twin that serves vLLM never loads SGLang's
registry, and the modules may import the twin's parts that import `base`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparktop.twin.dialects.base import Dialect

# engine id (as `observe.engines` names it) -> module, class
DIALECTS: dict[str, tuple[str, str]] = {
    "vllm": ("sparktop.twin.dialects.vllm", "VllmDialect"),
    "sglang": ("sparktop.twin.dialects.sglang", "SglangDialect"),
    "llama.cpp": ("sparktop.twin.dialects.llamacpp", "LlamaCppDialect"),
    "trtllm": ("sparktop.twin.dialects.trtllm", "TrtllmDialect"),
}
# What people type (`sparktop demo --runtime llama-cpp`, a recipe's runtime) -> engine id.
RUNTIME_ALIASES = {"llama-cpp": "llama.cpp", "llamacpp": "llama.cpp", "llama_cpp": "llama.cpp",
                   "tensorrt-llm": "trtllm", "trt-llm": "trtllm", "tensorrt_llm": "trtllm"}


def dialect_for(engine: str) -> Dialect:
    """The dialect of an engine id or runtime name; KeyError when the twin does not speak it."""
    key = RUNTIME_ALIASES.get(engine, engine)
    module, cls = DIALECTS[key]
    return getattr(importlib.import_module(module), cls)()
