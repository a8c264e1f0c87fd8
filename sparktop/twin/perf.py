"""A roofline model of vLLM serving a model card on GB10 node(s).

One engine step processes some decode tokens (one per running sequence) and
some prefill chunks. Its time is

    overhead + layers * per-layer launch cost
    + max(bytes read / effective bandwidth, flops / effective compute)
    + (TP=2) per-layer all-reduces over the link
    + (Ray) executor overhead

- bytes read: the dense weights, plus the experts the step's tokens
  activate (E * (1 - (1 - k/E)^B) per MoE layer for B tokens), plus the KV
  cache of every sequence (sliding-window layers read at most the window),
  plus the recurrent state of hybrid Mamba layers;
- flops: 2 * active parameters per token, plus attention over the context;
- TP=2 halves each node's reads and flops and adds two all-reduces of
  tokens * hidden * 2 bytes per layer over the ConnectX-7 link;
- KV capacity: gpu_memory_utilization * memory - weights - activations.

The constants are few, physical, and shared by every model; `model_factors`
holds at most one factor per model for a reason the articles name (a kernel
path, an attention backend). `twin/fit.py` fits them to the published
figures; the defaults here are round numbers that land near them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from sparktop.twin.cards import GIB, ModelCard


@dataclass(frozen=True)
class Hardware:
    name: str = "GB10"
    memory_gib: float = 119.6  # what CUDA reports as total on a Spark (MemTotal)
    bandwidth_gbs: float = 273.0  # LPDDR5x, shared by CPU and GPU
    peak_tflops: float = 125.0  # dense BF16-class tensor throughput
    link_gbps: float = 200.0  # one ConnectX-7 port
    load_gibps: float = 0.5  # weights from a warm local disk into memory


GB10 = Hardware()


@dataclass(frozen=True)
class Constants:
    bandwidth_efficiency: float = 0.85  # of 273 GB/s reached by large reads
    compute_efficiency: float = 0.30  # of peak reached by prefill GEMMs
    step_overhead_s: float = 0.002  # scheduler, sampling, host work per step
    layer_overhead_s: float = 0.0001  # kernel launches per layer with CUDA graphs
    eager_layer_overhead_s: float = 0.0004  # ... without CUDA graphs (--enforce-eager)
    allreduce_latency_s: float = 25e-6  # one NCCL all-reduce over RoCE
    link_efficiency: float = 0.8
    ray_step_overhead_s: float = 0.0012  # Ray executor per step (vs multiprocessing)
    router_overhead_s: float = 0.015  # LiteLLM per request (added at the router)
    expert_batch_exponent: float = 1.0  # γ: routing correlation within a batch (1 = independent)
    # Non-KV memory vLLM keeps (CUDA graphs, activation peak, allocator
    # slack). Real Spark logs show more (the gemma4 bf16 log leaves ~18 GiB
    # between weights + KV and the utilisation share, most of it the OS);
    # 3 GiB is the least that makes the one published out-of-memory case
    # (Nemotron 3 Super solo at c64, util 0.70) not fit, 2.5 did not.
    activation_reserve_gib: float = 3.0
    # model name -> (decode factor, prefill factor): step time multipliers
    model_factors: Mapping[str, tuple[float, float]] = field(default_factory=dict)


DEFAULT_CONSTANTS = Constants()


@dataclass
class PerfModel:
    """Timing and memory of one engine (one or two nodes) serving `card`."""

    card: ModelCard
    tp: int = 1
    hw: Hardware = GB10
    k: Constants = DEFAULT_CONSTANTS
    kv_dtype_bytes: int | None = None
    ray: bool = False
    enforce_eager: bool = False

    def with_(self, **changes) -> "PerfModel":
        return replace(self, **changes)

    # -- memory ---------------------------------------------------------------

    @property
    def weights_bytes_per_node(self) -> float:
        return self.card.weights_gib * GIB / self.tp

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one token of context takes on one node (all attention layers)."""
        per_layer = self.card.kv_bytes_per_token_layer(self.kv_dtype_bytes)
        # KV heads split across TP ranks; with fewer heads than ranks they replicate.
        share = max(self.card.kv_heads / self.tp, 1) / self.card.kv_heads
        return self.card.attn_layers * per_layer * share

    @property
    def seq_state_bytes(self) -> float:
        """Fixed per-sequence memory (Mamba state) on one node."""
        return self.card.mamba_state_mib * 1024**2 / self.tp

    def activation_reserve_bytes(self, max_num_batched_tokens: int = 8192) -> float:
        # Peak activations grow with the batch the profiler runs.
        act = max_num_batched_tokens * self.card.hidden_size * 2 * 16
        return self.k.activation_reserve_gib * GIB + act

    def kv_budget_bytes(self, gpu_memory_utilization: float, max_num_batched_tokens: int = 8192) -> float:
        return (
            gpu_memory_utilization * self.hw.memory_gib * GIB
            - self.weights_bytes_per_node
            - self.activation_reserve_bytes(max_num_batched_tokens)
        )

    def kv_capacity_tokens(self, gpu_memory_utilization: float, max_num_batched_tokens: int = 8192) -> int:
        budget = self.kv_budget_bytes(gpu_memory_utilization, max_num_batched_tokens)
        return max(0, int(budget // self.kv_bytes_per_token))

    def memory_per_node_gib(self, gpu_memory_utilization: float) -> float:
        """What the engine holds on each node once started (weights + cache pool)."""
        return gpu_memory_utilization * self.hw.memory_gib

    # -- time -----------------------------------------------------------------

    def _kv_read_bytes(self, ctx: int) -> float:
        card = self.card
        per_layer = card.kv_bytes_per_token_layer(self.kv_dtype_bytes)
        share = max(card.kv_heads / self.tp, 1) / card.kv_heads
        sliding = min(ctx, card.sliding_window) if card.sliding_layers else 0
        return (card.full_attn_layers * ctx + card.sliding_layers * sliding) * per_layer * share

    def step_time(self, decode_ctx: Sequence[int], prefill: Sequence[tuple[int, int]] = ()) -> float:
        """Seconds for one step.

        decode_ctx: context length of every sequence decoding one token.
        prefill: (new tokens, context already computed) for every prefill chunk.
        """
        card, k, tp = self.card, self.k, self.tp
        n_decode = len(decode_ctx)
        n_prefill = sum(n for n, _ in prefill)
        tokens = n_decode + n_prefill
        if tokens == 0:
            return 0.0
        bytes_per_param = card.bits_per_weight / 8
        params_read = card.dense_params_b + card.touched_experts(tokens ** k.expert_batch_exponent) * \
            card.expert_params_b
        weight_bytes = params_read * 1e9 * bytes_per_param / tp
        kv_bytes = sum(self._kv_read_bytes(c) for c in decode_ctx)
        kv_bytes += sum(self._kv_read_bytes(c + n) for n, c in prefill)
        state_bytes = 2 * self.seq_state_bytes * (n_decode + len(prefill))
        t_mem = (weight_bytes + kv_bytes + state_bytes) / (self.hw.bandwidth_gbs * 1e9 * k.bandwidth_efficiency)

        flops = 2 * card.active_params_b * 1e9 * tokens
        attn = 4 * card.attn_layers * card.hidden_size
        flops += attn * sum(decode_ctx)
        flops += attn * sum(n * (c + n / 2) for n, c in prefill)
        t_comp = flops / tp / (self.hw.peak_tflops * 1e12 * k.compute_efficiency)

        layer_cost = k.eager_layer_overhead_s if self.enforce_eager else k.layer_overhead_s
        t = k.step_overhead_s + card.layers * layer_cost + max(t_mem, t_comp)
        if tp > 1:
            msg_bytes = tokens * card.hidden_size * 2
            per_allreduce = k.allreduce_latency_s + msg_bytes * (tp - 1) / tp * 2 / (
                self.hw.link_gbps / 8 * 1e9 * k.link_efficiency
            )
            t += 2 * card.layers * per_allreduce
        if self.ray:
            t += k.ray_step_overhead_s
        decode_f, prefill_f = k.model_factors.get(card.name, (1.0, 1.0))
        if decode_f != 1.0 or prefill_f != 1.0:
            share = n_prefill / tokens
            t *= decode_f * (1 - share) + prefill_f * share
        return t

    def decode_tps(self, batch: int = 1, ctx: int = 1024) -> float:
        """Aggregate generation tokens/s of `batch` sequences all decoding."""
        return batch / self.step_time([ctx] * batch)

    def roofline_decode_tps(self, batch: int = 1, ctx: int = 1024) -> float:
        """Upper bound: every byte read at the full 273 GB/s, no overheads."""
        card = self.card
        params = card.dense_params_b + card.touched_experts(batch ** self.k.expert_batch_exponent) * \
            card.expert_params_b
        total = params * 1e9 * card.bits_per_weight / 8 / self.tp + batch * self._kv_read_bytes(ctx)
        return batch / (total / (self.hw.bandwidth_gbs * 1e9))

    def prefill_seconds(self, prompt_tokens: int, chunk: int = 8192) -> float:
        """Time to prefill one prompt alone, in chunks of `chunk` tokens."""
        t, done = 0.0, 0
        while done < prompt_tokens:
            n = min(chunk, prompt_tokens - done)
            t += self.step_time([], [(n, done)])
            done += n
        return t

    # -- startup --------------------------------------------------------------

    def startup_stages(self, load_format: str = "auto") -> list[tuple[str, float]]:
        """(stage, seconds) in the order vLLM goes through them."""
        load = 1.0 if load_format == "dummy" else self.weights_bytes_per_node / GIB / self.hw.load_gibps
        stages = [("init", 4.0), ("loading weights", load), ("memory profiling", 3.0)]
        if not self.enforce_eager:
            stages += [("torch.compile", 25.0), ("graph capture", 10.0)]
        stages.append(("api server", 2.0))
        return stages


def gib(x: float) -> float:
    return x / GIB


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


