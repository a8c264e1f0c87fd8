"""GGUF names: which model a llama.cpp file or repo holds, and in what
quantization (`gpt-oss-120b-mxfp4.gguf`, `ggml-org/gpt-oss-120b-GGUF:MXFP4`,
`Qwen/Qwen3-8B-GGUF:Q4_K_M`), for the model cards and the performance model.
"""

from __future__ import annotations

import re

from sparktop.model.cards import ModelCard, UnknownModel, find_card

_QUANT = re.compile(r"[-_.](?:ud-)?(?:q\d(?:_[a-z0-9]+)*|iq\d\w*|f16|bf16|f32|mxfp4(?:_moe)?|fp8)$", re.I)
# A GGUF's quantization as the performance model names the format (model/quant.py).
FORMATS = {"mxfp4": "mxfp4", "mxfp4_moe": "mxfp4", "q8_0": "q8_0", "q4_k_m": "q4_k_m", "q4_k": "q4_k_m",
           "q4_k_s": "q4_k_m", "q4_0": "q4_0", "q5_k_m": "q5_k_m", "q5_k": "q5_k_m", "q6_k": "q6_k", "f16": "fp16",
           "bf16": "bf16"}


def is_gguf_path(model: str) -> bool:
    """A path to one GGUF file (llama-server's `-m`), not a Hugging Face repo."""
    return model.lower().endswith(".gguf")


def gguf_names(model: str) -> tuple[str, str | None]:
    """(the model a GGUF holds, its quantization tag, lower case) from its file or repo name."""
    name, _, tag = model.partition(":")
    name = name.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"\.gguf$", "", name, flags=re.I)
    name = re.sub(r"-\d{5}-of-\d{5}$", "", name)  # a split file's part number
    name = re.sub(r"[-_]gguf$", "", name, flags=re.I)
    quant = tag or None
    while (m := _QUANT.search(name)) is not None:
        quant = quant or m.group(0)[1:]
        name = name[:m.start()]
    return name, quant.lower() if quant else None


def gguf_format(model: str) -> str | None:
    """The performance model's format for a GGUF's quantization (None: unknown)."""
    return FORMATS.get(gguf_names(model)[1] or "")


def gguf_card(model: str) -> ModelCard:
    """The card of the model a GGUF holds, by its name (UnknownModel when none matches)."""
    name = gguf_names(model)[0].lower()
    bare = name.removesuffix("-instruct").removesuffix("-it").replace("meta-", "")
    for candidate in dict.fromkeys([name, bare, bare.removesuffix("-instruct")]):
        try:
            return find_card(candidate)
        except UnknownModel:
            continue
    return find_card(name)  # raises, naming the cards there are
