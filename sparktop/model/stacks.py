"""The software stack a vLLM figure was measured on, as an input of the model.

Published Spark figures disagree with each other because their sources ran
different builds: eugr's community `vllm-node` images (FlashInfer, patched
CUTLASS kernels for SM12.1), NVIDIA's NGC `vllm` containers, upstream
`vllm/vllm-openai` images with Marlin kernels forced around SM121 gaps, and
so on. `data/stacks.yaml` names those stacks, says which one each source ran
(with a quote), and which image names identify each.

A stack scales the shared physical constants by a few factors fitted to its
own figures (`fit.fit_stacks`), never per model (`constants.STACK_FACTOR_FIELDS`,
applied by `Constants.for_stack`):

- `bandwidth`: on `bandwidth_efficiency` (how close its decode kernels read
  at the nominal 273 GB/s: Marlin dequantises on the fly, a native FP4 path
  does not);
- `gemm`: on `compute_efficiency` and `moe_efficiency` (its dense and grouped
  expert GEMM kernels: prefill, and decode at high concurrency);
- `overhead`: on the per-step and per-layer host cost (scheduler version,
  async scheduling, CUDA graph capture sizes).

Whether CUDA graphs ran and the KV cache's dtype are facts of a run, not of
a stack: they come from the source (`cuda_graphs`, `kv_dtype` in
stacks.yaml, `serving` flags in the figures) and go to the model as they do
for a user's own recipe (`Serving.enforce_eager`, `kv_cache_dtype`).

Which stack a prediction uses: `predict --stack ID`; else the recipe's image
matched against `known_images`; an image no pattern knows is treated as the
default stack and `predict` says so.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from sparktop.errors import SparktopError
from sparktop.yamlfile import safe_load

STACKS_FILE = Path(__file__).parent / "data" / "stacks.yaml"
# What a recipe without an image runs: sparktop's default image (settings.Defaults.image), NVIDIA's NGC build.
DEFAULT_STACK = "ngc-vllm"
UNKNOWN = "unknown"


class UnknownStack(SparktopError):
    pass


@dataclass(frozen=True)
class Stack:
    id: str
    name: str
    description: str = ""
    images: tuple[str, ...] = ()
    attention_backend: str = ""
    kernel: str = ""
    cuda_graphs: bool | None = None


@dataclass(frozen=True)
class SourceStack:
    """What a source says it ran; `rules` pick another stack (or graphs, KV dtype) for some of its figures."""

    stack: str
    cuda_graphs: bool | None = None
    kv_dtype: str | None = None
    documented: float = 0.5
    image: str = ""
    rules: tuple[tuple[dict, dict], ...] = ()


@dataclass(frozen=True)
class Stacks:
    stacks: dict[str, Stack]
    sources: dict[str, SourceStack]
    images: tuple[tuple[str, str], ...]  # (glob, stack id), first match wins

    def known(self) -> list[str]:
        return sorted(self.stacks)

    def get(self, stack_id: str) -> Stack:
        if stack_id not in self.stacks:
            raise UnknownStack(f"unknown stack {stack_id!r} (known: {', '.join(self.known())})")
        return self.stacks[stack_id]

    def for_image(self, image: str | None) -> tuple[str, str | None]:
        """(stack id, a note when it is assumed): the first known pattern the
        image matches; the default stack, said, for an image none matches."""
        if not image:
            return DEFAULT_STACK, None
        for pattern, stack in self.images:
            if fnmatch.fnmatchcase(image, pattern) and stack in self.stacks:
                return stack, None
        return DEFAULT_STACK, (f"image {image} is not a known vLLM build: predicted as {DEFAULT_STACK} "
                               f"({self.stacks[DEFAULT_STACK].name}); --stack chooses another")

    def for_figure(self, source: str, figure: dict[str, Any] | None = None) -> tuple[str, bool | None, str | None,
                                                                                     float]:
        """(stack, CUDA graphs, KV dtype, how well documented) of one figure of `source`."""
        src = self.sources.get(source)
        if src is None:
            return UNKNOWN, None, None, 0.2
        for match, then in src.rules:
            if all(_field(figure or {}, key) == want for key, want in match.items()):
                return (str(then.get("stack") or src.stack), _graphs(then.get("cuda_graphs", src.cuda_graphs)),
                        then.get("kv_dtype") or src.kv_dtype, src.documented)
        return src.stack, src.cuda_graphs, src.kv_dtype, src.documented


def _field(figure: dict, dotted: str) -> Any:
    value: Any = figure
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _graphs(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


@cache
def load_stacks(path: Path = STACKS_FILE) -> Stacks:
    data = safe_load(path.read_text()) or {}
    stacks = {}
    for sid, s in (data.get("stacks") or {}).items():
        stacks[sid] = Stack(sid, str(s.get("name") or sid), str(s.get("description") or "").strip(),
                            tuple(s.get("images") or ()), str(s.get("attention_backend") or ""),
                            str(s.get("moe_kernel") or s.get("gemm_kernel") or ""), _graphs(s.get("cuda_graphs")))
    sources = {}
    for name, s in (data.get("sources") or {}).items():
        rules = tuple((dict(r.get("match") or {}), dict(r)) for r in s.get("by_figure") or ())
        kv = s.get("kv_dtype")
        sources[name] = SourceStack(str(s.get("stack") or UNKNOWN), _graphs(s.get("cuda_graphs")),
                                    kv if isinstance(kv, str) and kv != UNKNOWN else None,
                                    float(s.get("documented") or 0.2), str(s.get("image") or ""), rules)
    images = tuple((str(p), str(sid)) for p, sid in (data.get("known_images") or {}).items())
    return Stacks(stacks, sources, images)


# -- factors ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackFactors:
    """Each stack's fitted factors (`constants.STACK_FACTOR_FIELDS`); a stack not in it runs the shared constants."""

    factors: dict[str, dict[str, float]] = field(default_factory=dict)

    def of(self, stack: str | None) -> dict[str, float]:
        return self.factors.get(stack or "", {})
