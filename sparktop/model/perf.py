"""The roofline of one vLLM engine step on GB10 node(s), part by part.

One engine step runs some decode tokens (one per running sequence) and some
prefill chunks through every layer. Each part of the model costs the larger
of its memory time and its compute time (a roofline per part, summed):

- linear layers (attention / Mamba projections, dense MLPs, shared
  experts): their weights read once per step; 2 FLOPs per weight per token
  at the precision their kernel computes in (`quant`);
- experts: the experts the step's tokens activate — E·(1 − (1 − k/E)^B)
  per MoE layer for B tokens, with B shrunk to B^γ because tokens of one
  batch route alike — read once, each with a fixed memory-side cost on top
  of its bytes (a grouped GEMM streams every touched expert as its own
  small matrix: the ramp and tail of each transfer, its scales); their
  GEMMs padded to a tensor-core tile per expert;
- the unembedding: read once, multiplied only for the sampled positions
  (one per sequence in the step);
- attention: every sequence reads its KV cache (sliding-window layers at
  most the window), and computes scores over its context in BF16;
- recurrent layers (Mamba-2, gated delta): each sequence reads and writes
  its fixed state; prefill runs the chunked scan.

On top: a fixed cost per step (scheduling, sampling), per layer (kernel
launches; more without CUDA graphs), per sequence (sampling and output
processing). Tensor parallelism over k nodes divides weights, heads and
FLOPs by k and adds two ring all-reduces per layer over the link
(2(k−1)/k of the activations, plus NCCL's per-call latency and a few
microseconds per hop past two); Ray adds its
executor's cost per step.

Memory: KV capacity is `gpu_memory_utilization × memory − weights −
activations`; a sequence takes KV blocks for its full-attention context,
plus a fixed share for sliding windows and recurrent state.

The constants (`constants.Constants`) are few, physical, and shared by every
model and kernel; `fit.py` fits them to the published figures, and the
hardware peaks they scale (`hardware`) are the vendor's, never fitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sparktop.model.cards import GIB, ModelCard
from sparktop.model.constants import DEFAULT_CONSTANTS, Constants
from sparktop.model.hardware import GB10, Hardware

TILE_M = 16  # rows of the smallest tensor-core tile a GEMM kernel issues




def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _padded(rows: int, tile: int) -> int:
    """Rows a GEMM kernel computes for `rows` of input: whole tiles."""
    return ceil_div(rows, tile) * tile


@dataclass
class PerfModel:
    """Timing and memory of one engine (one node, or `tp` x `pp` nodes) serving `card`.

    Pipeline parallel (`pp` stages, each over `tp` nodes) splits the layers:
    each node holds 1/(tp x pp) of the weights and 1/pp of the KV cache. A
    batch passes the stages one after the other, so one pass costs what the
    tp-only engine's step costs plus a hop of activations between stages;
    vLLM keeps `pp` micro-batches in flight, so a step of n sequences costs
    a pass of n/pp of them. Decode that is bound by reading the weights
    gains nothing from that (every token still reads all of them, one
    stage after another); prefill, bound by compute, gains up to pp times."""

    card: ModelCard
    tp: int = 1
    pp: int = 1
    hw: Hardware = GB10
    k: Constants = DEFAULT_CONSTANTS
    kv_dtype_bytes: int | None = None
    ray: bool = False
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        card, k, tp, hw = self.card, self.k, self.tp, self.hw
        a, q = card.arch, card.quant
        self._bw = hw.bandwidth_gbs * 1e9 * k.bandwidth_efficiency
        peak = lambda precision: hw.achieved(precision) * 1e12 * k.compute_efficiency  # noqa: E731
        # Dense GEMMs by part: (bytes, FLOPs per row, rate, tile rows) for
        # attention projections, dense MLPs and shared experts, and
        # recurrent-mixer projections, each in its own format.
        self._dense = [(params * f.bits / 8 / tp, 2 * params / tp, peak(f.compute), f.tile_m)
                       for params, f in ((a.attention_params, q.attention), (a.dense_ffn_params, q.linear),
                                         (a.recurrent_params, q.recurrent)) if params]
        self._head_bytes = a.lm_head_params * q.lm_head.bits / 8 / tp
        self._head_flops = 2 * a.lm_head_params / tp
        self._head_peak = peak(q.lm_head.compute)
        self._head_tile = q.lm_head.tile_m
        moe = a.moe
        self._moe_layers = sum(f.layers for f in a.ffn if f.experts)
        self._experts = (moe.experts, moe.experts_active) if moe else (0, 0)
        self._expert_bytes = (a.expert_params_total / moe.experts if moe else 0.0) * q.experts.bits / 8 / tp
        self._expert_flops = 2 * (moe.expert_params if moe else 0.0) / tp  # one expert, one layer, one token
        self._exp_peak = hw.achieved(q.experts.moe_compute) * 1e12 * k.moe_efficiency
        self._attn_peak = hw.achieved("bf16") * 1e12 * k.attention_efficiency
        dtype = self.kv_dtype_bytes or card.kv_dtype_bytes
        # Per attention group: (layers, bytes per token per layer on this node, window, score FLOPs per node)
        self._attn = []
        for g in a.attention:
            share = 1.0 if g.mla else max(g.kv_heads / tp, 1) / g.kv_heads
            self._attn.append((g.layers, g.kv_elems * dtype * share, g.window, g.score_flops / tp))
        self._rec_state = a.state_bytes_per_seq / tp
        self._rec_prefill_flops = sum(r.layers * r.prefill_flops for r in a.recurrent) / tp
        self._rec_decode_flops = sum(r.layers * r.decode_flops for r in a.recurrent) / tp
        # Two all-reduces per transformer layer (after the mixer, after the
        # FFN); a Nemotron-H layer holds one of the two, so one.
        mixers = a.attn_layers + sum(r.layers for r in a.recurrent)
        self._allreduces = mixers + sum(f.layers for f in a.ffn) if tp > 1 else 0
        self._layers = a.layers
        # Activation bytes per token (one pass, BF16): every layer's hidden
        # state, plus each MoE layer's k expert copies in and out.
        act = a.hidden_size * a.layers
        for f in a.ffn:
            if f.experts:
                act += f.layers * f.experts_active * (f.expert_width + f.expert_inter)
        self._act_bytes = 2.0 * act / tp
        self._factors = k.model_factors.get(card.name, (1.0, 1.0))

    # -- memory ---------------------------------------------------------------

    @property
    def weights_bytes_per_node(self) -> float:
        return self.card.weights_gib * GIB / (self.tp * self.pp)

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one more token of context takes on one node: the
        full-attention layers (sliding layers stop growing at the window)
        of its pipeline stage."""
        full = sum(layers * per for layers, per, window, _ in self._attn if not window)
        return (full or sum(layers * per for layers, per, _, _ in self._attn) or 1.0) / self.pp

    @property
    def seq_state_bytes(self) -> float:
        """Fixed per-sequence memory on one node: recurrent state, and the
        sliding-window layers' KV (a window's worth, once the sequence is
        longer than it), of its pipeline stage."""
        sliding = sum(layers * per * window for layers, per, window, _ in self._attn if window)
        has_full = any(not window for _, _, window, _ in self._attn)
        return (self._rec_state + (sliding if has_full else 0.0)) / self.pp

    def activation_reserve_bytes(self, max_num_batched_tokens: int = 8192) -> float:
        # Peak activations grow with the batch the profiler runs.
        act = max_num_batched_tokens * self.card.hidden_size * 2 * 16
        return self.k.activation_reserve_gib * GIB + act

    def kv_budget_bytes(self, gpu_memory_utilization: float, max_num_batched_tokens: int = 8192) -> float:
        return (gpu_memory_utilization * self.hw.memory_gib * GIB - self.weights_bytes_per_node
                - self.activation_reserve_bytes(max_num_batched_tokens))

    def kv_capacity_tokens(self, gpu_memory_utilization: float, max_num_batched_tokens: int = 8192) -> int:
        budget = self.kv_budget_bytes(gpu_memory_utilization, max_num_batched_tokens)
        return max(0, int(budget // self.kv_bytes_per_token))

    # -- time -----------------------------------------------------------------

    def _roof(self, nbytes: float, flops: float, peak: float) -> float:
        return max(nbytes / self._bw, flops / peak if peak else 0.0)

    def _attention(self, decode_sums: Sequence[float], prefill: Sequence[tuple[int, int]]) -> float:
        """decode_sums: per attention group, the context all decoding
        sequences attend to (a sliding group counts at most its window each)."""
        kv, flops = self.attention_traffic(decode_sums, prefill)
        return self._roof(kv, flops, self._attn_peak)

    def attention_traffic(self, decode_sums: Sequence[float],
                          prefill: Sequence[tuple[int, int]]) -> tuple[float, float]:
        """(KV bytes read, FLOPs) of a step's attention (see `_attention`)."""
        kv = flops = 0.0
        for (layers, per, window, score), ctx in zip(self._attn, decode_sums, strict=True):
            if window:
                pre = sum(n * min(c + n / 2, window) for n, c in prefill)
                pre_read = sum(min(c + n, window + n) for n, c in prefill)
            else:
                pre = sum(n * (c + n / 2) for n, c in prefill)
                pre_read = sum(c + n for n, c in prefill)
            kv += layers * per * (ctx + pre_read)
            flops += layers * score * (ctx + pre)
        return kv, flops

    def step_time(self, decode_ctx: Sequence[int], prefill: Sequence[tuple[int, int]] = ()) -> float:
        """Seconds for one step.

        decode_ctx: context length of every sequence decoding one token.
        prefill: (new tokens, context already computed) for every prefill chunk.
        """
        total = sum(decode_ctx)
        sums = [sum(min(c, w) for c in decode_ctx) if w and decode_ctx and min(decode_ctx) < w else
                (len(decode_ctx) * w if w else total) for _, _, w, _ in self._attn]
        return self._staged(len(decode_ctx), sums, prefill)

    def decode_time(self, n: int, ctx_sum: float, min_ctx: int) -> float | None:
        """A pure decode step of n sequences whose contexts add up to ctx_sum,
        without the list (the virtual clock's fast path); None when some
        sequence is still shorter than a sliding window (use step_time)."""
        if any(w and min_ctx < w for _, _, w, _ in self._attn):
            return None
        return self._staged(n, [n * w if w else ctx_sum for _, _, w, _ in self._attn], ())

    def _staged(self, n_decode: int, decode_sums: Sequence[float], prefill: Sequence[tuple[int, int]]) -> float:
        """A step through every pipeline stage: with pp micro-batches in
        flight, a pass of 1/pp of the step's sequences, plus the hops
        between the stages (see the class docstring)."""
        pp = self.pp
        if pp == 1:
            return self._step(n_decode, decode_sums, prefill)
        if n_decode + len(prefill) < pp or not self.k.pipeline_overlap:  # one pass through every stage
            tokens = n_decode + sum(n for n, _ in prefill)
            return self._step(n_decode, decode_sums, prefill) + (pp - 1) * self._hop(tokens)
        # pp micro-batches of whole sequences; the slowest sets the pace.
        worst = 0.0
        for i in range(pp):
            n = n_decode // pp + (i < n_decode % pp)
            chunks = list(prefill[i::pp])
            if not n and not chunks:
                continue
            share = n / n_decode if n_decode else 0.0
            tokens = n + sum(c for c, _ in chunks)
            worst = max(worst, self._step(n, [v * share for v in decode_sums], chunks) + (pp - 1) * self._hop(tokens))
        return worst

    def _hop(self, tokens: int) -> float:
        """One stage handing its activations (BF16) to the next over the link."""
        k = self.k
        return k.allreduce_latency_s / 2 + tokens * self.card.hidden_size * 2 / (
            self.hw.link_gbps / 8 * 1e9 * k.link_efficiency)

    def _step(self, n_decode: int, decode_sums: Sequence[float], prefill: Sequence[tuple[int, int]]) -> float:
        k = self.k
        n_prefill = sum(n for n, _ in prefill)
        tokens = n_decode + n_prefill
        if tokens == 0:
            return 0.0
        seqs = n_decode + len(prefill)
        t = sum(self._roof(nbytes, flops * _padded(tokens, tile), rate) for nbytes, flops, rate, tile in self._dense)
        t += self._roof(self._head_bytes, self._head_flops * _padded(seqs, self._head_tile), self._head_peak)
        if self._moe_layers:
            active = self._experts[1]
            touched = self.touched_experts(tokens)
            # Each touched expert multiplies its share of the tokens, padded to a tile.
            per_expert = tokens * active / touched if touched else 0.0
            padded = touched * max(per_expert, TILE_M)
            t += max(touched * (self._expert_bytes / self._bw + self._moe_layers * k.expert_read_s),
                     self._expert_flops * self._moe_layers * padded / self._exp_peak)
        t += self._attention(decode_sums, prefill)
        if self._rec_state:
            state = 2 * self._rec_state * seqs
            flops = self._rec_decode_flops * n_decode + self._rec_prefill_flops * n_prefill
            t += self._roof(state, flops, self._attn_peak)
        t += k.activation_passes * self._act_bytes * tokens / self._bw
        layer_cost = k.eager_layer_overhead_s if self.enforce_eager else k.layer_overhead_s
        t += k.step_overhead_s + self._layers * layer_cost + seqs * k.seq_overhead_s
        if self.tp > 1:
            t += self._allreduce(tokens)
        if self.ray:
            t += k.ray_step_overhead_s
        decode_f, prefill_f = self._factors
        if decode_f != 1.0 or prefill_f != 1.0:
            share = n_prefill / tokens
            t *= decode_f * (1 - share) + prefill_f * share
        return t

    def _allreduce(self, tokens: int) -> float:
        """Ring all-reduces of the step's activations (BF16) over the link."""
        msg = tokens * self.card.hidden_size * 2
        return self._allreduces * self.allreduce_s(msg)

    def _allreduce_wire(self, msg: int) -> float:
        """The time a ring all-reduce of `msg` bytes spends on the link: each
        node sends and receives 2(k-1)/k of it."""
        hops = 2 * (self.tp - 1)
        return msg * hops / self.tp / (self.hw.link_gbps / 8 * 1e9 * self.k.link_efficiency)

    def link_bytes_per_token(self) -> float:
        """Bytes each node sends over the link per token the engine processes
        (prompt or generated), as NCCL's ring all-reduces move them: the
        token's BF16 hidden state, 2(k-1)/k of it sent per all-reduce, two
        all-reduces a layer; with pipeline stages, each stage's layers and the
        hidden state handed to the next stage. It receives as much. 0 for one node."""
        # Each pipeline stage all-reduces only its own layers, and hands the token's hidden state on to the
        # next stage (one send in, one out, averaged over the stages).
        reduce = self._allreduces / self.pp * self.card.hidden_size * 2 * 2 * (self.tp - 1) / self.tp \
            if self.tp > 1 else 0.0
        hand_on = self.card.hidden_size * 2 * (self.pp - 1) / self.pp if self.pp > 1 else 0.0
        return reduce + hand_on

    def allreduce_s(self, msg: int) -> float:
        """One all-reduce of `msg` bytes across this engine's tensor-parallel nodes."""
        if self.tp <= 1:
            return 0.0
        hops = 2 * (self.tp - 1)
        return self.k.allreduce_latency_s + (hops - 2) * self.k.allreduce_hop_s + self._allreduce_wire(msg)

    def touched_experts(self, tokens: float) -> float:
        """Experts per MoE layer a step over `tokens` reads: the card's E(1 - (1 - k/E)^B) with B = tokens^γ,
        the tokens that route independently of one another (γ < 1: a batch's tokens route alike). The one
        place the law is written; the step's time, its bytes and the twin's traffic account all read it."""
        return self.card.touched_experts(tokens ** self.k.expert_batch_exponent)

    def decode_tps(self, batch: int = 1, ctx: int = 1024) -> float:
        """Aggregate generation tokens/s of `batch` sequences all decoding."""
        return batch / self.step_time([ctx] * batch)

    def decode_bytes(self, batch: int = 1, ctx: int = 1024) -> float:
        """Bytes one node reads for one decode step of `batch` sequences
        (with pipeline stages: what the stages read one after the other,
        per node of a stage; the time a step can take is bound by it all
        the same, micro-batches or not)."""
        experts = self.touched_experts(batch) * self._expert_bytes
        kv = sum(layers * per * (min(ctx, window) if window else ctx) for layers, per, window, _ in self._attn)
        dense = sum(nbytes for nbytes, *_ in self._dense)
        return dense + self._head_bytes + experts + batch * (kv + 2 * self._rec_state)

    def roofline_decode_tps(self, batch: int = 1, ctx: int = 1024) -> float:
        """Upper bound: every byte read at the full nominal bandwidth, nothing else.
        Pipeline stages read for pp micro-batches of batch/pp sequences each."""
        micro = -(-batch // self.pp) if batch >= self.pp else batch
        return batch / (self.decode_bytes(micro, ctx) / (self.hw.bandwidth_gbs * 1e9))

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
