"""Model cards: the facts about a model that decide how fast it runs on a GB10.

A card holds what the performance model needs and nothing else: how many
parameters a token touches (active) and how many exist (total), how many
bits each weight has, the attention geometry that sizes the KV cache, the
expert counts that decide how many experts a batch activates, and the
memory the loaded weights take.

Sources: parameter counts, quantization and memory of gpt-oss-120b,
gemma4-26b-a4b and nemotron-3-super come from
`reference/published-benchmarks.yaml`; layer geometry comes from the models'
published configs where known. Where a config is not public the geometry is
an estimate, marked `estimated=True`, chosen so that KV-cache sizes agree
with real vLLM logs on a Spark (captures/vllm-startup_*.log): e.g. Gemma4-26B
in bf16 logs 40.61 GiB -> 177,440 tokens, i.e. ~240 KB per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparktop.errors import SparktopError

GIB = 1024**3


@dataclass(frozen=True)
class ModelCard:
    name: str
    hf_id: str
    architecture: str  # dense | moe | hybrid-mamba | hybrid-mamba-moe
    total_params_b: float
    active_params_b: float
    quantization: str
    bits_per_weight: float  # effective bits per weight as read from memory
    layers: int
    hidden_size: int
    attn_layers: int  # layers that keep a KV cache
    kv_heads: int
    head_dim: int
    weights_gib: float  # resident weight memory on one node (TP=1)
    experts: int = 0
    experts_active: int = 0
    sliding_layers: int = 0  # of attn_layers, those with a sliding window
    sliding_window: int = 0
    mamba_layers: int = 0
    mamba_state_mib: float = 0.0  # recurrent state per sequence (all mamba layers)
    kv_dtype_bytes: int = 2  # default KV-cache element size ("auto")
    reasoning: bool = False
    max_model_len: int = 131072
    vocab_size: int = 128256
    chat_overhead_tokens: int = 8  # tokens the chat template adds per conversation
    aliases: tuple[str, ...] = ()
    estimated: bool = False
    notes: str = ""

    # -- derived facts -------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.experts > 0 and self.experts_active > 0

    @property
    def expert_params_b(self) -> float:
        """Parameters of one expert summed over all MoE layers (billions)."""
        if not self.is_moe:
            return 0.0
        return (self.total_params_b - self.active_params_b) / (self.experts - self.experts_active)

    @property
    def dense_params_b(self) -> float:
        """Parameters every token reads: attention, shared experts, head."""
        return self.active_params_b - self.experts_active * self.expert_params_b

    @property
    def full_attn_layers(self) -> int:
        return self.attn_layers - self.sliding_layers

    def kv_bytes_per_token_layer(self, kv_dtype_bytes: int | None = None) -> int:
        """K and V for one token in one attention layer."""
        dtype = kv_dtype_bytes or self.kv_dtype_bytes
        return 2 * self.kv_heads * self.head_dim * dtype

    def touched_experts(self, tokens: int) -> float:
        """Expected experts per MoE layer that a step over `tokens` activates.

        Each token picks k of E experts; with independent routing the chance
        an expert is untouched by B tokens is (1 - k/E)^B.
        """
        if not self.is_moe or tokens <= 0:
            return 0.0
        e, k = self.experts, self.experts_active
        return e * (1.0 - (1.0 - k / e) ** tokens)

    def describe(self) -> str:
        kind = f"{self.experts}x{self.experts_active} MoE" if self.is_moe else "dense"
        return (
            f"{self.name} ({self.hf_id}): {self.total_params_b:g}B total, {self.active_params_b:g}B active, "
            f"{kind}, {self.quantization} ~{self.bits_per_weight:g} bits, {self.weights_gib:g} GiB weights"
        )


CARDS: dict[str, ModelCard] = {}


def _add(card: ModelCard) -> ModelCard:
    CARDS[card.name] = card
    return card


_add(ModelCard(
    name="gpt-oss-120b",
    hf_id="openai/gpt-oss-120b",
    architecture="moe",
    total_params_b=117, active_params_b=5.1,
    quantization="mxfp4", bits_per_weight=4,
    layers=36, hidden_size=2880, attn_layers=36, sliding_layers=18, sliding_window=128,
    kv_heads=8, head_dim=64, experts=128, experts_active=4,
    weights_gib=61, reasoning=True, max_model_len=131072, vocab_size=201088,
    chat_overhead_tokens=70,
    notes="alternating banded (128) and full attention; harmony chat format adds a system preamble",
))

_add(ModelCard(
    name="gpt-oss-20b",
    hf_id="openai/gpt-oss-20b",
    architecture="moe",
    total_params_b=21, active_params_b=3.6,
    quantization="mxfp4", bits_per_weight=4,
    layers=24, hidden_size=2880, attn_layers=24, sliding_layers=12, sliding_window=128,
    kv_heads=8, head_dim=64, experts=32, experts_active=4,
    weights_gib=13, reasoning=True, max_model_len=131072, vocab_size=201088,
    chat_overhead_tokens=70,
))

_add(ModelCard(
    name="gemma4-26b-a4b",
    hf_id="google/gemma-4-26B-A4B-it",
    architecture="moe",
    total_params_b=25.2, active_params_b=3.8,
    quantization="fp8", bits_per_weight=8,
    layers=30, hidden_size=2816, attn_layers=30, sliding_layers=25, sliding_window=1024,
    kv_heads=8, head_dim=256, experts=128, experts_active=8,
    weights_gib=25.67, max_model_len=262144, vocab_size=262144,
    chat_overhead_tokens=10, estimated=True,
    notes="head dims 256 local / 512 global force TRITON_ATTN; KV geometry sized to the 0.20.0 Spark log",
))

_add(ModelCard(
    name="nemotron-3-super-120b-a12b",
    hf_id="nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4",
    architecture="hybrid-mamba-moe",
    total_params_b=120, active_params_b=12,
    quantization="nvfp4", bits_per_weight=5,
    layers=88, hidden_size=4096, attn_layers=8, kv_heads=2, head_dim=128,
    experts=512, experts_active=22,
    mamba_layers=40, mamba_state_mib=160,
    weights_gib=69.5, reasoning=True, max_model_len=262144, vocab_size=131072,
    chat_overhead_tokens=30, estimated=True,
    aliases=("nemotron-3-super",),
    notes="LatentMoE: Mamba-2 + MoE + a few attention layers; per-sequence Mamba state dominates its cache",
))

_add(ModelCard(
    name="qwen3-235b-a22b",
    hf_id="Qwen/Qwen3-235B-A22B-GPTQ-Int4",
    architecture="moe",
    total_params_b=235, active_params_b=22,
    quantization="gptq-int4", bits_per_weight=4.25,
    layers=94, hidden_size=4096, attn_layers=94, kv_heads=4, head_dim=128,
    experts=128, experts_active=8,
    weights_gib=116, reasoning=True, max_model_len=40960, vocab_size=151936,
    chat_overhead_tokens=10,
    notes="does not fit one Spark: cluster only (TP=2, expert parallel)",
))

_add(ModelCard(
    name="nemotron-super-49b-v1.5",
    hf_id="nvidia/Llama-3_3-Nemotron-Super-49B-v1_5-NVFP4",
    architecture="dense",
    total_params_b=49.9, active_params_b=49.9,
    quantization="nvfp4", bits_per_weight=4.5,
    layers=80, hidden_size=8192, attn_layers=49, kv_heads=8, head_dim=128,
    weights_gib=29.5, reasoning=True, max_model_len=131072, vocab_size=128256,
    chat_overhead_tokens=20, estimated=True,
    notes="NAS-pruned Llama-3.3-70B: some blocks have no attention",
))

_add(ModelCard(
    name="nemotron-nano-9b-v2",
    hf_id="nvidia/NVIDIA-Nemotron-Nano-9B-v2-NVFP4",
    architecture="hybrid-mamba",
    total_params_b=8.9, active_params_b=8.9,
    quantization="nvfp4", bits_per_weight=4.5,
    layers=56, hidden_size=4480, attn_layers=4, kv_heads=8, head_dim=128,
    mamba_layers=27, mamba_state_mib=40,
    weights_gib=6.5, reasoning=True, max_model_len=131072, vocab_size=131072,
    chat_overhead_tokens=20, estimated=True,
    aliases=("nvidia/NVIDIA-Nemotron-Nano-9B-v2", "nvidia/NVIDIA-Nemotron-Nano-9B-v2-FP8"),
))

_add(ModelCard(
    name="llama-3.1-8b",
    hf_id="nvidia/Llama-3.1-8B-Instruct-FP8",
    architecture="dense",
    total_params_b=8.03, active_params_b=8.03,
    quantization="fp8", bits_per_weight=8,
    layers=32, hidden_size=4096, attn_layers=32, kv_heads=8, head_dim=128,
    weights_gib=8.5, max_model_len=131072, vocab_size=128256,
    aliases=("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
))

_add(ModelCard(
    name="llama-3.1-70b",
    hf_id="RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8",
    architecture="dense",
    total_params_b=70.6, active_params_b=70.6,
    quantization="fp8", bits_per_weight=8,
    layers=80, hidden_size=8192, attn_layers=80, kv_heads=8, head_dim=128,
    weights_gib=67.7, max_model_len=131072, vocab_size=128256,
    aliases=("meta-llama/Llama-3.1-70B-Instruct", "nvidia/Llama-3.1-70B-Instruct-FP8"),
))


class UnknownModel(SparktopError):
    pass


def find_card(name: str) -> ModelCard:
    """A card by short name, HF id or alias (case-insensitive)."""
    wanted = name.strip().lower()
    for card in CARDS.values():
        names = {card.name, card.hf_id, *card.aliases}
        if wanted in {n.lower() for n in names}:
            return card
    # A path-like id whose last part is a card name or its HF repo name.
    tail = wanted.rstrip("/").rsplit("/", 1)[-1]
    for card in CARDS.values():
        if tail in {card.name.lower(), card.hf_id.lower().rsplit("/", 1)[-1]}:
            return card
    known = ", ".join(sorted(CARDS))
    raise UnknownModel(f"unknown model {name!r}; the twin knows: {known}")
