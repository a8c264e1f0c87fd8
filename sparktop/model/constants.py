"""The performance model's constants: few, physical, shared by every model and
kernel (`fit.py` fits them to the published figures), and the factors a serving
runtime (`runtimes.py`) or a vLLM software stack (`stacks.py`) multiplies them by.

It imports nothing else of the model, so that every module of the model may
import it (a contract of `pyproject.toml`'s `[tool.importlinter]`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

# A runtime's factors (`runtimes.KNOBS`). What each factor multiplies.
FACTOR_FIELDS: dict[str, tuple[str, ...]] = {
    "bandwidth": ("bandwidth_efficiency",),
    "gemm": ("compute_efficiency", "moe_efficiency"),
    "attention": ("attention_efficiency",),
    "overhead": ("step_overhead_s", "layer_overhead_s"),
    "link": ("link_efficiency",),
}
CAPPED = ("bandwidth_efficiency", "compute_efficiency", "moe_efficiency", "attention_efficiency", "link_efficiency")

# A vLLM stack's factors (`stacks.py`, fitted by `fit.fit_stacks`).
STACK_FACTOR_FIELDS: dict[str, tuple[str, ...]] = {
    "bandwidth": ("bandwidth_efficiency",),
    "gemm": ("compute_efficiency", "moe_efficiency"),
    "overhead": ("step_overhead_s", "layer_overhead_s", "eager_layer_overhead_s"),
}
# A stack is another build of the same engine on the same chip: its kernels
# may be twice as slow, not ten times (past that it would be another engine).
STACK_FACTOR_RANGE = {"bandwidth": (0.5, 2.0), "gemm": (0.33, 3.0), "overhead": (0.2, 5.0)}


@dataclass(frozen=True)
class Constants:
    bandwidth_efficiency: float = 0.80  # of the nominal bandwidth reached by a step's reads
    compute_efficiency: float = 1.0  # of the measured large-GEMM rate reached by a step's dense GEMMs
    moe_efficiency: float = 0.35  # ... by grouped expert GEMMs (small per-expert GEMMs, routing)
    attention_efficiency: float = 0.30  # of the measured BF16 GEMM rate reached by attention and scans
    # Times each token's activations cross memory per layer (norms, residuals,
    # rotary, activation quantization, MoE gather and scatter of each of its
    # k expert copies): memory traffic that grows with tokens, not weights.
    activation_passes: float = 8.0
    step_overhead_s: float = 0.002  # scheduler, sampling, host work per step
    layer_overhead_s: float = 0.00005  # kernel launches per layer with CUDA graphs
    eager_layer_overhead_s: float = 0.0004  # ... without CUDA graphs (--enforce-eager)
    seq_overhead_s: float = 0.00002  # per sequence in a step: sampling, detokenizing, streaming
    # One small all-reduce between two nodes: mostly NCCL's own per-call cost
    # (kernel, host proxy), not the wire (nccl-tests on two Sparks: 30-35 us at 8 KB).
    allreduce_latency_s: float = 50e-6
    # What each ring hop past those two adds (tp=k makes 2(k-1) hops): one more
    # small RoCE send through the switch, a few microseconds (`ib_write_lat`).
    # Four Sparks at TP4 spend 54-64 us on a 48 KB all-reduce, about 1.5-2x
    # two nodes' 30-35 us, not the 3x that pricing every hop at half of it would say
    # (model/data/gb10-sources.md).
    allreduce_hop_s: float = 2.5e-6
    link_efficiency: float = 0.8
    ray_step_overhead_s: float = 0.0008  # Ray executor per step (vs multiprocessing)
    request_overhead_s: float = 0.010  # the API server per request: parsing, chat template, tokenizing
    router_overhead_s: float = 0.030  # LiteLLM per request (added at the router)
    expert_batch_exponent: float = 0.8  # γ: routing correlation within a batch (1 = independent)
    # Fixed memory-side time per touched expert per MoE layer, beyond its bytes at the bandwidth: what
    # makes many small experts (Nemotron 3 Super's 3 MB, Qwen3.6's) slower to stream than their bytes say
    # and few large ones (gpt-oss's 13 MB) not. TP halves an expert's bytes on a node, not this. Hidden
    # when the experts' GEMMs are compute-bound (prefill).
    expert_read_s: float = 2e-6
    # Non-KV memory vLLM keeps (CUDA graphs, activation peak, allocator
    # slack); 3 GiB is the least that makes the one published out-of-memory
    # case (Nemotron 3 Super solo at c64, util 0.70) not fit.
    activation_reserve_gib: float = 3.0
    # Pipeline stages work on different micro-batches at once (vLLM, SGLang, TensorRT-LLM); False: a step
    # passes the stages one after the other and the others wait (llama.cpp's rpc-server layer split).
    pipeline_overlap: bool = True
    # Left for a model whose kernel path no shared constant describes; empty
    # in the fitted set (every model is held to the same physics).
    model_factors: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # Each software stack's fitted factors (model/stacks.py), as ((stack, ((factor, value), ...)), ...):
    # a tuple, so the constants stay hashable and their repr names them.
    stack_factors: tuple = ()

    def stack_factor_map(self, stack: str | None) -> dict[str, float]:
        return dict(next((f for s, f in self.stack_factors if s == stack), ()))

    def for_stack(self, stack: str | None) -> Constants:
        """These constants as `stack` runs them (its factors applied, the table dropped)."""
        if not self.stack_factors:
            return self
        factors = self.stack_factor_map(stack)
        bare = replace(self, stack_factors=())
        return apply_factors(bare, factors, STACK_FACTOR_FIELDS) if factors else bare


DEFAULT_CONSTANTS = Constants()


def apply_factors(k: Constants, factors: dict[str, float],
                  fields: dict[str, tuple[str, ...]] = FACTOR_FIELDS) -> Constants:
    """`k` with each factor multiplied into the constants it stands for
    (`fields`: a runtime's, or a vLLM stack's); efficiencies stay at most 1
    (the nominal bandwidth, the measured GEMM rate)."""
    changes: dict[str, Any] = {}
    for name, value in factors.items():
        for f in fields[name]:
            v = getattr(k, f) * value
            changes[f] = min(v, 1.0) if f in CAPPED else v
    return replace(k, **changes)
