"""A model's layers, read from its real `config.json`.

What decides how fast a model runs is not its headline parameter count but
what each layer holds: which mixer (full or sliding-window attention, MLA,
Mamba-2, gated-delta linear attention, none), which feed-forward (dense,
mixture of experts with or without shared experts, none), and the sizes of
each. This module turns the config formats of the architectures Spark
owners run into one description, `Architecture`: the layers grouped by
kind, with their parameters, the KV cache or recurrent state each keeps per
token or per sequence, and the FLOPs each costs.

Formats read: Llama / Qwen3 / Mistral (dense), Qwen3-MoE, gpt-oss,
Gemma 3/4 (local and global attention of different head sizes, MoE),
DeciLM (NAS blocks with no-op or linear-replaced attention and variable FFN
widths: Nemotron Super 49B), Nemotron-H (the `hybrid_override_pattern` of
Mamba-2, attention, MLP and MoE layers: Nemotron Nano 9B v2, Nemotron 3),
Qwen3-Next (gated-delta linear attention + gated attention, MoE with a
shared expert), GLM-4.5 (first dense layers then MoE with shared experts)
and DeepSeek-V2/V3 (MLA, shared experts). A config of another architecture
is read as a plain transformer when it has the usual keys, and refused with
a clear error when it does not.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from sparktop.errors import SparktopError


class ConfigFormatError(SparktopError):
    pass


@dataclass(frozen=True)
class Attention:
    """Attention layers of one shape (a model can have two: local and global)."""

    layers: int
    q_heads: int
    kv_heads: int  # 0 for MLA (its cache is one latent, not per head)
    qk_dim: int  # per head, for the scores
    v_dim: int  # per head, for the values
    window: int = 0  # sliding window, 0 = full
    params: float = 0.0  # linear weights of one layer (projections)
    kv_elems: int = 0  # cache elements per token per layer (K and V, or the MLA latent)
    mla: bool = False

    def ctx(self, n: int) -> int:
        """Context tokens one query attends to at position n."""
        return min(n, self.window) if self.window else n

    @property
    def score_flops(self) -> float:
        """FLOPs per query token per context token (QK^T and PV)."""
        return 2.0 * self.q_heads * (self.qk_dim + self.v_dim)


@dataclass(frozen=True)
class Recurrent:
    """Layers with a fixed per-sequence state instead of a KV cache."""

    kind: str  # mamba2 | gated-delta
    layers: int
    params: float  # linear weights of one layer
    state_bytes: float  # per sequence per layer (SSM/delta state + conv state)
    prefill_flops: float  # per token per layer, beyond its projections (the chunked scan)
    decode_flops: float  # per token per layer, beyond its projections


@dataclass(frozen=True)
class FFN:
    """Feed-forward layers of one shape."""

    layers: int
    dense_params: float = 0.0  # a dense MLP, or the shared experts of a MoE layer
    experts: int = 0
    experts_active: int = 0
    expert_params: float = 0.0  # one expert of one layer
    router_params: float = 0.0
    expert_width: int = 0  # what an expert reads in and writes out (hidden, or LatentMoE's latent)
    expert_inter: int = 0  # its intermediate width


@dataclass(frozen=True)
class Architecture:
    kind: str  # the config's model_type / architecture, as read
    hidden_size: int
    vocab_size: int
    layers: int
    attention: tuple[Attention, ...]
    recurrent: tuple[Recurrent, ...]
    ffn: tuple[FFN, ...]
    tied_embeddings: bool
    max_position_embeddings: int
    other_params: float = 0.0  # layers replaced by a plain linear map (DeciLM)
    notes: tuple[str, ...] = field(default=())

    # -- parameter counts ------------------------------------------------------

    @property
    def embed_params(self) -> float:
        return float(self.vocab_size * self.hidden_size)

    @property
    def lm_head_params(self) -> float:
        """Read for every sampled token, tied or not."""
        return float(self.vocab_size * self.hidden_size)

    @property
    def mixer_params(self) -> float:
        return self.attention_params + self.recurrent_params

    @property
    def attention_params(self) -> float:
        """Attention projections (and DeciLM's linear replacements)."""
        return sum(a.layers * a.params for a in self.attention) + self.other_params

    @property
    def recurrent_params(self) -> float:
        return sum(r.layers * r.params for r in self.recurrent)

    @property
    def dense_ffn_params(self) -> float:
        return sum(f.layers * (f.dense_params + f.router_params) for f in self.ffn)

    @property
    def expert_params_total(self) -> float:
        return sum(f.layers * f.experts * f.expert_params for f in self.ffn)

    @property
    def expert_params_active(self) -> float:
        return sum(f.layers * f.experts_active * f.expert_params for f in self.ffn)

    @property
    def total_params(self) -> float:
        head = 0.0 if self.tied_embeddings else self.lm_head_params
        return self.embed_params + head + self.mixer_params + self.dense_ffn_params + self.expert_params_total

    @property
    def active_params(self) -> float:
        """Parameters one token multiplies by (the embedding is a lookup, not counted)."""
        return self.lm_head_params + self.mixer_params + self.dense_ffn_params + self.expert_params_active

    @property
    def moe(self) -> FFN | None:
        """The MoE shape (the largest, where a model has more than one)."""
        moes = [f for f in self.ffn if f.experts]
        return max(moes, key=lambda f: f.layers) if moes else None

    @property
    def attn_layers(self) -> int:
        return sum(a.layers for a in self.attention)

    def kv_elems_per_token(self) -> float:
        """Cache elements one token of context takes over all attention layers
        (sliding layers counted in full, as if the context were within their window)."""
        return float(sum(a.layers * a.kv_elems for a in self.attention))

    @property
    def state_bytes_per_seq(self) -> float:
        return sum(r.layers * r.state_bytes for r in self.recurrent)


# -- reading configs ------------------------------------------------------------------


def _get(cfg: dict, *keys, default=None):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def _need(cfg: dict, path: str, *keys):
    v = _get(cfg, *keys)
    if v is None:
        raise ConfigFormatError(f"{path}: config has no {' / '.join(keys)}")
    return v


def _gqa(hidden: int, heads: int, kv: int, d: int, dv: int | None = None, gated_q: bool = False) -> float:
    dv = dv or d
    q = hidden * heads * d * (2 if gated_q else 1)
    return float(q + hidden * kv * (d + dv) + heads * dv * hidden)


def _swiglu(hidden: int, inter: int) -> float:
    return 3.0 * hidden * inter


def _count_layers(types: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in types:
        out[t] = out.get(t, 0) + 1
    return out


def read_config(path: str | Path) -> Architecture:
    """The architecture of the model whose config.json is at `path`."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigFormatError(f"{path}: {exc}") from None
    return from_config(cfg, str(path))


def from_config(cfg: dict, where: str = "config.json") -> Architecture:
    if "text_config" in cfg and "hidden_size" not in cfg:
        # Multimodal wrappers (Gemma 3/4, Llama 4, Qwen-VL): the language model is what serves tokens.
        text = dict(cfg["text_config"])
        text.setdefault("model_type", cfg.get("model_type", ""))
        text.setdefault("architectures", cfg.get("architectures", []))
        text.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", text.get("tie_word_embeddings")))
        cfg = text
    arch = " ".join(cfg.get("architectures") or [])
    mtype = str(cfg.get("model_type", ""))
    if "hybrid_override_pattern" in cfg or mtype.startswith("nemotron_h") or "NemotronH" in arch:
        return _nemotron_h(cfg, where)
    if "block_configs" in cfg:
        return _decilm(cfg, where)
    if mtype.startswith(("qwen3_next", "qwen3_5")) or "Qwen3Next" in arch or "Qwen3_5" in arch:
        return _qwen3_next(cfg, where)
    if "kv_lora_rank" in cfg:
        return _deepseek(cfg, where)
    if mtype.startswith("gemma"):
        return _gemma(cfg, where)
    return _transformer(cfg, where)


def _common(cfg: dict, where: str) -> tuple[int, int, int, int, int, int]:
    hidden = int(_need(cfg, where, "hidden_size", "d_model", "n_embd"))
    layers = int(_need(cfg, where, "num_hidden_layers", "n_layer", "num_layers"))
    heads = int(_need(cfg, where, "num_attention_heads", "n_head"))
    kv = int(_get(cfg, "num_key_value_heads", "num_kv_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    vocab = int(_need(cfg, where, "vocab_size"))
    return hidden, layers, heads, kv, head_dim, vocab


def _max_len(cfg: dict) -> int:
    return int(_get(cfg, "max_position_embeddings", "max_seq_len", "seq_length", default=131072))


def _tied(cfg: dict) -> bool:
    return bool(_get(cfg, "tie_word_embeddings", default=False))


def _attention_split(cfg: dict, layers: int) -> tuple[int, int]:
    """(full, sliding) attention layer counts."""
    window = int(_get(cfg, "sliding_window", default=0) or 0)
    types = cfg.get("layer_types")
    if types:
        n = _count_layers(types)
        sliding = n.get("sliding_attention", 0)
        return layers - sliding, sliding if window else 0
    if window and cfg.get("use_sliding_window", True) is not False and cfg.get("model_type") != "qwen3_moe":
        if cfg.get("model_type", "").startswith(("qwen", "llama")):
            return layers, 0  # these carry a sliding_window value but do not use it by default
        return 0, layers
    return layers, 0


def _transformer(cfg: dict, where: str) -> Architecture:
    """Llama, Qwen3, Mistral, gpt-oss, Qwen3-MoE, GLM-4.5 and the like."""
    hidden, layers, heads, kv, d, vocab = _common(cfg, where)
    window = int(_get(cfg, "sliding_window", default=0) or 0)
    full, sliding = _attention_split(cfg, layers)
    attn_params = _gqa(hidden, heads, kv, d)
    attn = [Attention(full, heads, kv, d, d, 0, attn_params, 2 * kv * d)] if full else []
    if sliding:
        attn.append(Attention(sliding, heads, kv, d, d, window, attn_params, 2 * kv * d))
    experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0)
    ffn: list[FFN] = []
    if experts:
        k = int(_need(cfg, where, "num_experts_per_tok", "experts_per_token", "num_experts_per_token"))
        moe_inter = int(_get(cfg, "moe_intermediate_size", default=0) or _need(cfg, where, "intermediate_size"))
        shared = int(_get(cfg, "n_shared_experts", default=0) or 0)
        shared_inter = int(_get(cfg, "shared_expert_intermediate_size", default=0) or 0)
        shared_params = _swiglu(hidden, shared_inter) if shared_inter else shared * _swiglu(hidden, moe_inter)
        dense_first = int(_get(cfg, "first_k_dense_replace", default=0) or 0)
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        step = int(_get(cfg, "decoder_sparse_step", default=1) or 1)
        moe_layers = [i for i in range(dense_first, layers) if i not in mlp_only and (i + 1) % step == 0]
        dense_layers = layers - len(moe_layers)
        ffn.append(FFN(len(moe_layers), shared_params, experts, k, _swiglu(hidden, moe_inter), hidden * experts,
                       hidden, moe_inter))
        if dense_layers:
            ffn.append(FFN(dense_layers, _swiglu(hidden, int(_need(cfg, where, "intermediate_size")))))
    else:
        ffn.append(FFN(layers, _swiglu(hidden, int(_need(cfg, where, "intermediate_size", "n_inner")))))
    # Multi-token-prediction layers (GLM, DeepSeek) are weights a plain `vllm serve` loads but never runs.
    return Architecture(str(cfg.get("model_type", "")), hidden, vocab, layers, tuple(attn), (), tuple(ffn),
                        _tied(cfg), _max_len(cfg))


def _gemma(cfg: dict, where: str) -> Architecture:
    """Gemma 3/4: local (sliding) and global attention layers, possibly with
    different head sizes; an optional MoE beside a dense MLP."""
    hidden, layers, heads, kv, d, vocab = _common(cfg, where)
    window = int(_get(cfg, "sliding_window", default=0) or 0)
    types = cfg.get("layer_types")
    if types:
        n = _count_layers(types)
        sliding = n.get("sliding_attention", 0)
    else:
        pattern = int(_get(cfg, "sliding_window_pattern", default=6) or 6)
        sliding = layers - layers // pattern
    full = layers - sliding
    g_d = int(_get(cfg, "global_head_dim", default=d))
    g_kv = int(_get(cfg, "num_global_key_value_heads", default=kv))
    # Gemma 4 may share K and V in global layers (attention_k_eq_v): one tensor cached, not two.
    kv_mult = 1 if cfg.get("attention_k_eq_v") else 2
    attn = []
    if sliding:
        attn.append(Attention(sliding, heads, kv, d, d, window, _gqa(hidden, heads, kv, d), 2 * kv * d))
    if full:
        attn.append(Attention(full, heads, g_kv, g_d, g_d, 0, _gqa(hidden, heads, g_kv, g_d), kv_mult * g_kv * g_d))
    experts = int(_get(cfg, "num_experts", "num_local_experts", default=0) or 0)
    inter = int(_need(cfg, where, "intermediate_size"))
    if experts:
        k = int(_need(cfg, where, "top_k_experts", "num_experts_per_tok"))
        moe_inter = int(_need(cfg, where, "moe_intermediate_size", "expert_intermediate_size"))
        ffn = [FFN(layers, _swiglu(hidden, inter), experts, k, _swiglu(hidden, moe_inter), hidden * experts,
                   hidden, moe_inter)]
    else:
        ffn = [FFN(layers, _swiglu(hidden, inter))]
    return Architecture(str(cfg.get("model_type", "")), hidden, vocab, layers, tuple(attn), (), tuple(ffn),
                        bool(_get(cfg, "tie_word_embeddings", default=True)), _max_len(cfg))


def _ffn_mult_to_intermediate(mult: float, hidden: int) -> int:
    """DeciLM's rule: 2/3 of mult x hidden, rounded up to a multiple of 256."""
    inter = int(2 * mult * hidden / 3)
    return int(math.ceil(inter / 256) * 256)


def _decilm(cfg: dict, where: str) -> Architecture:
    """DeciLM (Nemotron Super 49B): a NAS-searched Llama whose blocks may drop
    attention or replace it (or the FFN) with a single linear map, and whose
    FFN widths vary by block."""
    hidden, layers, heads, _, d, vocab = _common(cfg, where)
    blocks = cfg["block_configs"]
    by_kv: dict[int, int] = {}
    linear = 0
    ffn_by_inter: dict[int, int] = {}
    for b in blocks:
        a, f = b.get("attention", {}), b.get("ffn", {})
        if a.get("replace_with_linear"):
            linear += 1
        elif not a.get("no_op"):
            kv = heads // int(a.get("n_heads_in_group") or 1)
            by_kv[kv] = by_kv.get(kv, 0) + 1
        if f.get("replace_with_linear"):
            linear += 1
        elif not f.get("no_op"):
            inter = _ffn_mult_to_intermediate(float(f["ffn_mult"]), hidden)
            ffn_by_inter[inter] = ffn_by_inter.get(inter, 0) + 1
    attn = tuple(Attention(n, heads, kv, d, d, 0, _gqa(hidden, heads, kv, d), 2 * kv * d)
                 for kv, n in sorted(by_kv.items()))
    ffn = tuple(FFN(n, _swiglu(hidden, inter)) for inter, n in sorted(ffn_by_inter.items()))
    no_attn = len(blocks) - sum(by_kv.values())
    return Architecture("decilm", hidden, vocab, len(blocks), attn, (), ffn, _tied(cfg), _max_len(cfg),
                        other_params=float(linear * hidden * hidden),
                        notes=(f"{no_attn} of {len(blocks)} blocks have no attention",))


def _mamba2(cfg: dict, hidden: int) -> Recurrent:
    nheads = int(_get(cfg, "mamba_num_heads", default=0) or 0)
    head_dim = int(_get(cfg, "mamba_head_dim", default=64))
    d_inner = nheads * head_dim if nheads else int(_get(cfg, "expand", default=2)) * hidden
    nheads = nheads or d_inner // head_dim
    d_state = int(_get(cfg, "ssm_state_size", "mamba_d_state", "state_size", default=128))
    groups = int(_get(cfg, "n_groups", "mamba_n_groups", default=8))
    conv = int(_get(cfg, "conv_kernel", "mamba_d_conv", default=4))
    chunk = int(_get(cfg, "chunk_size", "mamba_chunk_size", default=256))
    conv_dim = d_inner + 2 * groups * d_state
    params = hidden * (2 * d_inner + 2 * groups * d_state + nheads) + d_inner * hidden + conv_dim * conv
    # The SSM state in the dtype the config asks vLLM to cache it in (Nemotron
    # asks for float32), the conv state in the model's dtype.
    ssm_bytes = 4 if str(cfg.get("mamba_ssm_cache_dtype", "")).startswith("float32") else 2
    state = nheads * head_dim * d_state * ssm_bytes + conv_dim * (conv - 1) * 2
    # SSD: the state update and read-out (~2 x 2 x d_inner x d_state) plus the
    # within-chunk quadratic part (~2 x chunk x (d_inner + groups x d_state)).
    prefill = 4.0 * d_inner * d_state + 2.0 * chunk * (d_inner + groups * d_state)
    decode = 4.0 * d_inner * d_state
    return Recurrent("mamba2", 0, float(params), float(state), prefill, decode)


def _nemotron_h(cfg: dict, where: str) -> Architecture:
    """Nemotron-H: one mixer per layer, by the pattern's letter: M Mamba-2,
    * attention, - MLP (squared ReLU, not gated), E mixture of experts."""
    hidden = int(_need(cfg, where, "hidden_size"))
    vocab = int(_need(cfg, where, "vocab_size"))
    pattern = str(cfg["hybrid_override_pattern"])
    n = _count_layers(list(pattern))
    heads = int(_need(cfg, where, "num_attention_heads"))
    kv = int(_get(cfg, "num_key_value_heads", default=heads))
    d = int(_get(cfg, "head_dim", "attention_head_dim", default=hidden // heads))
    attn = (Attention(n.get("*", 0), heads, kv, d, d, 0, _gqa(hidden, heads, kv, d), 2 * kv * d),) \
        if n.get("*") else ()
    m = _mamba2(cfg, hidden)
    rec = (Recurrent(m.kind, n.get("M", 0), m.params, m.state_bytes, m.prefill_flops, m.decode_flops),) \
        if n.get("M") else ()
    ffn = []
    if n.get("-"):
        ffn.append(FFN(n["-"], 2.0 * hidden * int(_need(cfg, where, "intermediate_size"))))
    if n.get("E"):
        experts = int(_need(cfg, where, "n_routed_experts", "num_experts"))
        k = int(_need(cfg, where, "num_experts_per_tok"))
        inter = int(_need(cfg, where, "moe_intermediate_size"))
        latent = int(_get(cfg, "moe_latent_size", default=0) or 0)
        width = latent or hidden
        # Squared-ReLU experts (up, down); LatentMoE runs them in a smaller
        # latent width, with a projection in and out shared by all experts.
        expert = 2.0 * width * inter
        shared_inter = int(_get(cfg, "moe_shared_expert_intermediate_size", default=0) or 0)
        shared = 2.0 * hidden * shared_inter * int(_get(cfg, "n_shared_experts", default=1) or 1) \
            if shared_inter else 0.0
        proj = 2.0 * hidden * latent if latent else 0.0
        ffn.append(FFN(n["E"], shared + proj, experts, k, expert, float(hidden * experts), width, inter))
    return Architecture("nemotron_h", hidden, vocab, len(pattern), attn, rec, tuple(ffn), _tied(cfg),
                        _max_len(cfg))


def _qwen3_next(cfg: dict, where: str) -> Architecture:
    """Qwen3-Next and Qwen3.5/3.6: three gated-delta (linear attention) layers
    to one gated attention layer; the FFN a MoE with one shared expert, or
    (the dense Qwen3.5/3.6 models) a plain MLP."""
    hidden, layers, heads, kv, d, vocab = _common(cfg, where)
    types = cfg.get("layer_types")
    if types:
        full = _count_layers(types).get("full_attention", 0)
    else:
        full = layers // int(_get(cfg, "full_attention_interval", default=4))
    linear = layers - full
    hk = int(_need(cfg, where, "linear_num_key_heads"))
    hv = int(_need(cfg, where, "linear_num_value_heads"))
    dk = int(_need(cfg, where, "linear_key_head_dim"))
    dv = int(_need(cfg, where, "linear_value_head_dim"))
    conv = int(_get(cfg, "linear_conv_kernel_dim", default=4))
    conv_dim = 2 * hk * dk + hv * dv
    params = hidden * (2 * hk * dk + 2 * hv * dv + 2 * hv) + hv * dv * hidden + conv_dim * conv
    # vLLM keeps the delta-rule state in float32 and the conv state in the model dtype.
    state = hv * dk * dv * 4 + conv_dim * (conv - 1) * 2
    chunk = 64
    rec = (Recurrent("gated-delta", linear, float(params), float(state),
                     4.0 * hv * dk * dv + 2.0 * chunk * hv * (dk + dv), 4.0 * hv * dk * dv),)
    attn = (Attention(full, heads, kv, d, d, 0, _gqa(hidden, heads, kv, d, gated_q=True), 2 * kv * d),)
    experts = int(_get(cfg, "num_experts", default=0) or 0)
    if experts:
        k = int(_need(cfg, where, "num_experts_per_tok"))
        inter = int(_need(cfg, where, "moe_intermediate_size"))
        shared = int(_get(cfg, "shared_expert_intermediate_size", default=0) or 0)
        ffn = (FFN(layers, _swiglu(hidden, shared) + hidden, experts, k, _swiglu(hidden, inter),
                   float(hidden * experts), hidden, inter),)
    else:
        ffn = (FFN(layers, _swiglu(hidden, int(_need(cfg, where, "intermediate_size")))),)
    # Multi-token-prediction layers are loaded but only run with speculative decoding.
    return Architecture(str(cfg.get("model_type", "qwen3_next")), hidden, vocab, layers, attn, rec, ffn, _tied(cfg),
                        _max_len(cfg))


def _deepseek(cfg: dict, where: str) -> Architecture:
    """DeepSeek-V2/V3 (and Kimi, GLM-4.7-Flash): multi-head latent attention,
    whose cache is one compressed latent plus a rotary key per token."""
    hidden, layers, heads, _, _, vocab = _common(cfg, where)
    kv_rank = int(_need(cfg, where, "kv_lora_rank"))
    q_rank = int(_get(cfg, "q_lora_rank", default=0) or 0)
    nope = int(_need(cfg, where, "qk_nope_head_dim"))
    rope = int(_need(cfg, where, "qk_rope_head_dim"))
    v = int(_need(cfg, where, "v_head_dim"))
    q = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
    params = q + hidden * (kv_rank + rope) + kv_rank * heads * (nope + v) + heads * v * hidden
    # Decode runs the absorbed form: scores over (latent + rope), values over the latent.
    attn = (Attention(layers, heads, 0, kv_rank + rope, kv_rank, 0, float(params), kv_rank + rope, mla=True),)
    experts = int(_get(cfg, "n_routed_experts", default=0) or 0)
    ffn: list[FFN] = []
    inter = int(_need(cfg, where, "intermediate_size"))
    if experts:
        dense_first = int(_get(cfg, "first_k_dense_replace", default=0) or 0)
        freq = int(_get(cfg, "moe_layer_freq", default=1) or 1)
        moe_layers = sum(1 for i in range(dense_first, layers) if i % freq == 0)
        moe_inter = int(_need(cfg, where, "moe_intermediate_size"))
        shared = int(_get(cfg, "n_shared_experts", default=0) or 0)
        ffn.append(FFN(moe_layers, shared * _swiglu(hidden, moe_inter), experts,
                       int(_need(cfg, where, "num_experts_per_tok")), _swiglu(hidden, moe_inter),
                       float(hidden * experts), hidden, moe_inter))
        if layers - moe_layers:
            ffn.append(FFN(layers - moe_layers, _swiglu(hidden, inter)))
    else:
        ffn.append(FFN(layers, _swiglu(hidden, inter)))
    return Architecture(str(cfg.get("model_type", "deepseek")), hidden, vocab, layers, attn, (), tuple(ffn),
                        _tied(cfg), _max_len(cfg))
