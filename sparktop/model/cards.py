"""Model cards: the models sparktop knows, as data.

A card is one YAML file in `data/cards/`: the model's name and Hugging Face
id, the real `config.json` it was read from (in `data/configs/`, with its
source in `data/configs/SOURCES.md`), how its checkpoint is quantized (which
parts in which format), the memory its weights take once loaded where a
Spark log or article measured it, and a few serving facts (chat template
length, reasoning). Geometry and parameter counts are never typed in: they
come from the config (`architecture`), and the vendor's published totals
are kept beside them so a test can hold the two together.

Any other model can be described on the fly from its config.json
(`card_from_config`), quantization read from the config's own
`quantization_config` when it has one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from sparktop.errors import SparktopError
from sparktop.model.architecture import Architecture, from_config, read_config
from sparktop.model.quant import Quantization
from sparktop.yamlfile import safe_load

GIB = 1024**3
DATA = Path(__file__).parent / "data"
CARD_DIR = DATA / "cards"
CONFIG_DIR = DATA / "configs"


class UnknownModel(SparktopError):
    pass


@dataclass(frozen=True)
class ModelCard:
    name: str
    hf_id: str
    arch: Architecture
    quant: Quantization
    measured_weights_gib: float | None = None  # resident weights on one node, as a log or article gives it
    weights_source: str = ""
    published_total_b: float | None = None  # the vendor's own parameter counts
    published_active_b: float | None = None
    aliases: tuple[str, ...] = ()
    chat_overhead_tokens: int = 8  # tokens the chat template adds per conversation
    reasoning: bool = False
    max_model_len: int = 131072
    kv_dtype_bytes: int = 2  # the KV cache's element size with --kv-cache-dtype auto
    config_path: str = ""
    notes: str = ""
    extra_loaded_b: float = 0.0  # parameters loaded but not run per token (vision tower, MTP head)

    # -- what the config says ---------------------------------------------------

    def quant_text(self) -> str:
        """The checkpoint's formats, naming only the parts this model has."""
        a = self.arch
        present = {"attention", "lm_head"} | ({"experts"} if a.moe else set()) | \
            ({"linear"} if a.dense_ffn_params else set()) | ({"recurrent"} if a.recurrent_params else set())
        return self.quant.describe(present)

    @property
    def layers(self) -> int:
        return self.arch.layers

    @property
    def hidden_size(self) -> int:
        return self.arch.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.arch.vocab_size

    @property
    def attn_layers(self) -> int:
        return self.arch.attn_layers

    @property
    def total_params_b(self) -> float:
        return self.arch.total_params / 1e9

    @property
    def active_params_b(self) -> float:
        return self.arch.active_params / 1e9

    @property
    def is_moe(self) -> bool:
        return self.arch.moe is not None

    @property
    def experts(self) -> int:
        return self.arch.moe.experts if self.arch.moe else 0

    @property
    def experts_active(self) -> int:
        return self.arch.moe.experts_active if self.arch.moe else 0

    @property
    def architecture(self) -> str:
        kinds = []
        if self.arch.recurrent:
            kinds.append("hybrid-" + self.arch.recurrent[0].kind)
        if any(a.mla for a in self.arch.attention):
            kinds.append("mla")
        kinds.append("moe" if self.is_moe else "dense")
        return "-".join(kinds)

    @property
    def quantization(self) -> str:
        return self.quant.scheme

    # -- bytes --------------------------------------------------------------------

    @cached_property
    def weight_bytes(self) -> dict[str, float]:
        """Bytes of each part as stored (one node, no parallelism)."""
        a, q = self.arch, self.quant
        return {
            "embed": a.embed_params * 2,  # a BF16 lookup table
            "lm_head": 0.0 if a.tied_embeddings else a.lm_head_params * q.lm_head.bits / 8,
            "attention": a.attention_params * q.attention.bits / 8,
            "linear": a.dense_ffn_params * q.linear.bits / 8,
            "recurrent": a.recurrent_params * q.recurrent.bits / 8,
            "experts": a.expert_params_total * q.experts.bits / 8,
            "extra": self.extra_loaded_b * 1e9 * q.linear.bits / 8,
        }

    @property
    def computed_weights_gib(self) -> float:
        return sum(self.weight_bytes.values()) / GIB

    @property
    def weights_gib(self) -> float:
        """Resident weight memory on one node: measured where known, else computed."""
        return self.measured_weights_gib or round(self.computed_weights_gib, 2)

    @property
    def bits_per_weight(self) -> float:
        """Average stored bits of the weights one token reads (for display)."""
        a, q = self.arch, self.quant
        parts = [(a.lm_head_params, q.lm_head.bits), (a.attention_params, q.attention.bits),
                 (a.dense_ffn_params, q.linear.bits),
                 (a.recurrent_params, q.recurrent.bits), (a.expert_params_active, q.experts.bits)]
        n = sum(p for p, _ in parts)
        return round(sum(p * b for p, b in parts) / n, 2) if n else 16.0

    # -- routing ------------------------------------------------------------------

    def touched_experts(self, tokens: float) -> float:
        """Expected experts per MoE layer that a step over `tokens` activates.

        Each token picks k of E experts; with independent routing the chance
        an expert is untouched by B tokens is (1 - k/E)^B.
        """
        moe = self.arch.moe
        if moe is None or tokens <= 0:
            return 0.0
        e, k = moe.experts, moe.experts_active
        return e * (1.0 - (1.0 - k / e) ** tokens)

    def describe(self) -> str:
        kind = f"{self.experts}x{self.experts_active} MoE" if self.is_moe else "dense"
        return (f"{self.name} ({self.hf_id}): {self.total_params_b:.1f}B total, {self.active_params_b:.2f}B active, "
                f"{kind}, {self.quant_text()}, {self.weights_gib:g} GiB weights")


# -- loading ---------------------------------------------------------------------


def _quant_from_config(cfg: dict) -> Quantization:
    """The quantization a config.json declares (quantization_config), or BF16."""
    qc = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config") or {}
    method = str(qc.get("quant_method", "")).lower()
    if not method:
        return Quantization.of("bf16")
    if method == "mxfp4":
        return Quantization.of("mxfp4")
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        bits = int(qc.get("bits", 4))
        return Quantization.of("int4" if bits == 4 else "int8")
    if method == "fp8":
        return Quantization.of("fp8")
    if method == "modelopt":
        algo = str(qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo") or "").lower()
        return Quantization.of("nvfp4" if "fp4" in algo else "fp8")
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        text = json.dumps(groups).lower()
        if '"num_bits": 4' in text and '"type": "float"' in text:
            return Quantization.of("nvfp4")
        if '"num_bits": 8' in text and '"type": "float"' in text:
            return Quantization.of("fp8")
        if '"num_bits": 4' in text:
            return Quantization.of("int4")
        return Quantization.of("int8")
    raise SparktopError(f"quantization {method!r} is not one sparktop models; give --quant "
                        "(bf16, fp8, nvfp4, mxfp4, int4)")


def card_from_config(path: str | Path, name: str | None = None, quant: str | None = None) -> ModelCard:
    """A card for any model, from its config.json (a file or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except OSError as exc:
        raise UnknownModel(f"{path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UnknownModel(f"{path}: not JSON ({exc})") from None
    arch = from_config(cfg, str(path))
    q = Quantization.of(quant) if quant else _quant_from_config(cfg)
    # A folder's config.json is named after the folder; qwen3-8b.json after itself.
    default = path.parent.name if path.stem == "config" and path.parent.name else path.stem
    return ModelCard(name=name or default, hf_id=str(cfg.get("_name_or_path") or path),
                     arch=arch, quant=q, max_model_len=arch.max_position_embeddings, config_path=str(path))


def _load_card(path: Path) -> ModelCard:
    d = safe_load(path.read_text())
    cfg_path = CONFIG_DIR / d["config"]
    q = d.get("quantization") or {}
    if isinstance(q, str):
        q = {"scheme": q}
    quant = Quantization.of(q.get("scheme", "bf16"), q.get("experts"), q.get("linear"), q.get("lm_head"),
                            q.get("recurrent"), q.get("attention"))
    arch = read_config(cfg_path)
    pub = d.get("published") or {}
    return ModelCard(
        name=d["name"], hf_id=d["hf_id"], arch=arch, quant=quant,
        measured_weights_gib=d.get("weights_gib"), weights_source=d.get("weights_source", ""),
        published_total_b=pub.get("total_params_b"), published_active_b=pub.get("active_params_b"),
        aliases=tuple(d.get("aliases") or ()), chat_overhead_tokens=int(d.get("chat_overhead_tokens", 8)),
        reasoning=bool(d.get("reasoning", False)),
        max_model_len=int(d.get("max_model_len") or arch.max_position_embeddings),
        kv_dtype_bytes=int(d.get("kv_dtype_bytes", 2)), config_path=str(cfg_path), notes=d.get("notes", ""),
        extra_loaded_b=float(d.get("extra_loaded_b", 0.0)),
    )


def _load_all() -> dict[str, ModelCard]:
    cards = {}
    for path in sorted(CARD_DIR.glob("*.yaml")):
        card = _load_card(path)
        cards[card.name] = card
    return cards


CARDS: dict[str, ModelCard] = _load_all()


def find_card(name: str) -> ModelCard:
    """A card by short name, HF id or alias (case-insensitive); a path to a
    config.json (or a folder with one) describes any other model."""
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
    p = Path(name.strip())
    if p.suffix == ".json" and p.is_file() or p.is_dir() and (p / "config.json").is_file():
        return card_from_config(p)
    known = ", ".join(sorted(CARDS))
    raise UnknownModel(f"unknown model {name!r}; the twin knows: {known} (or give a path to a config.json)")
