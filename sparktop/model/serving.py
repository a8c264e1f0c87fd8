"""How an engine is set up, as far as speed and memory go: vLLM's serving flags.

One place turns `vllm serve` flags (a recipe's `vllm:` mapping, `--set
FLAG=VALUE`, the twin's command line) into the settings the scheduler and
the performance model use, with vLLM's own defaults where a flag is not
given — so `sparktop predict`, the launcher's prediction and the twin all
read a recipe the same way.

Defaults are vLLM's for a GPU with at least 70 GiB that is not an A100
(`EngineArgs.get_batch_defaults`), which is what a GB10 reports: an
OpenAI-compatible server schedules up to 1024 sequences and 8192 tokens per
step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from sparktop.errors import SparktopError

DEFAULT_MAX_NUM_SEQS = 1024
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class Serving:
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_model_len: int | None = None  # None: the model's own
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False
    # The kernels vLLM 0.25+ is told to use (`--moe-backend`, `--linear-backend`):
    # `marlin` dequantizes to BF16, which Spark recipes use around SM121 gaps.
    moe_backend: str = "auto"
    linear_backend: str = "auto"
    # A KV cache of a fixed size in tokens (llama.cpp's -c), in place of a share of memory.
    kv_tokens: int | None = None

    @property
    def kv_dtype_bytes(self) -> int | None:
        """KV element size the flag asks for (None: the model's own dtype)."""
        return 1 if self.kv_cache_dtype.startswith("fp8") else None

    def with_flags(self, flags: Mapping[str, Any], where: str = "--set") -> Serving:
        """These settings with vLLM flags applied (`max_num_seqs: 64`,
        `--kv-cache-dtype fp8`, `no_enable_prefix_caching: true` ...)."""
        changes: dict[str, Any] = {}
        known = {f.name: f for f in fields(self)}
        for raw, value in flags.items():
            key = str(raw).lstrip("-").replace("-", "_")
            negated = key.startswith("no_") and key[3:] in known
            if negated:
                key, value = key[3:], not _truthy(value, where, raw)
            if key not in known:
                continue  # a flag that does not change speed or memory (host, port, served name ...)
            kind = known[key].type
            try:
                if "bool" in str(kind):
                    changes[key] = _truthy(value, where, raw)
                elif "float" in str(kind):
                    changes[key] = float(value)
                elif key == "max_model_len":
                    changes[key] = parse_length(value)
                elif "int" in str(kind):
                    changes[key] = int(value)
                else:
                    changes[key] = str(value)
            except (TypeError, ValueError):
                raise SparktopError(f"{where} {raw}={value!r}: not a valid value for --{key.replace('_', '-')}") \
                    from None
        out = replace(self, **changes)
        if not out.enable_chunked_prefill and "max_num_batched_tokens" not in changes and out.max_model_len:
            # Without chunked prefill a whole prompt must fit one step.
            out = replace(out, max_num_batched_tokens=max(out.max_num_batched_tokens, out.max_model_len))
        if not 0 < out.gpu_memory_utilization <= 1:
            raise SparktopError(f"{where} gpu_memory_utilization={out.gpu_memory_utilization}: must be in (0, 1]")
        if out.max_num_seqs < 1 or out.max_num_batched_tokens < 1:
            raise SparktopError(f"{where}: max_num_seqs and max_num_batched_tokens must be at least 1")
        return out

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any] | None = None, where: str = "--set") -> Serving:
        return cls().with_flags(flags or {}, where)


def _truthy(value: Any, where: str, key: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on", ""):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise SparktopError(f"{where} {key}={value!r}: expected true or false")


def parse_length(value: Any) -> int:
    """vLLM's `--max-model-len` forms: 32768, 32k, 1m."""
    text = str(value).strip().lower()
    scale = 1
    if text.endswith("k"):
        scale, text = 1024, text[:-1]
    elif text.endswith("m"):
        scale, text = 1024 * 1024, text[:-1]
    return int(float(text) * scale)
