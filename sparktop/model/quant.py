"""What a quantization stores, and the precision vLLM computes it in on SM 12.x.

Two facts decide a quantized layer's speed: the bytes a step reads (the
stored bits per weight, scales included) and the tensor-core precision its
GEMMs run at, which depends on the kernel vLLM picks for the format on the
GPU at hand — a W4A16 kernel (Marlin) reads 4-bit weights but multiplies in
BF16, while an NVFP4 or FP8 checkpoint on a Blackwell-family GPU can run on
the FP4/FP8 tensor cores. The kernel paths and their sources are in
`data/gb10-sources.md`; the table below is what the model uses.

A checkpoint does not quantize every layer: gpt-oss keeps attention, the
router and the unembedding in BF16 and stores only the experts in MXFP4;
ModelOpt NVFP4 and FP8 checkpoints usually leave the unembedding (and
sometimes Mamba mixers, routers or attention) in BF16. A card says which
format each part of the model is stored in (`Quantization`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sparktop.errors import SparktopError


@dataclass(frozen=True)
class Format:
    name: str
    bits: float  # stored bits per weight, scales included
    compute: str  # tensor-core precision of its dense GEMMs on SM 12.x: fp4 | fp8 | bf16
    kernel: str  # the kernel path vLLM takes (for the report; sources in data/gb10-sources.md)
    moe_compute: str = "bf16"  # ... of its grouped expert GEMMs (MoE kernels)
    moe_kernel: str = ""
    # The fewest rows its dense GEMM kernel computes: a decode step of one
    # sequence still pays for a whole tile. Marlin and cuBLAS handle small M
    # with 16-row tiles; vLLM's SM120 CUTLASS FP8 and NVFP4 kernels use
    # 128x128x128 tiles (data/gb10-sources.md).
    tile_m: int = 16


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("bf16", 16.0, "bf16", "cuBLAS / CUTLASS BF16", "bf16", "Triton fused_moe BF16"),
    Format("fp16", 16.0, "bf16", "cuBLAS FP16", "bf16", "Triton fused_moe FP16"),
    # Per-channel or 128x128 block scales: a fraction of a bit.
    Format("fp8", 8.0, "fp8", "CUTLASS FP8 (W8A8, SM120 kernels)", "fp8",
           "FlashInfer CUTLASS / Triton fused MoE W8A8", 128),
    # One E8M0 scale per 32 FP4 values; gpt-oss's MoE.
    Format("mxfp4", 4.25, "bf16", "Marlin MXFP4 (W4A16)", "bf16", "Marlin MXFP4 MoE (W4A16)"),
    # One FP8 scale per 16 FP4 values plus a per-tensor FP32 scale.
    Format("nvfp4", 4.5, "fp4", "CUTLASS NVFP4 (W4A4, SM120 kernels)", "fp4", "FlashInfer / vLLM CUTLASS NVFP4 MoE",
           128),
    # The community Spark image behind the gpt-oss articles: MXFP4 experts
    # multiplied with FP8 activations in a CUTLASS grouped GEMM.
    Format("mxfp4-w4a8", 4.25, "bf16", "Marlin MXFP4 (W4A16)", "fp8", "CUTLASS FP8xFP4 grouped GEMM (community image)"),
    # GPTQ / AWQ with group 128: an FP16 scale (and a 4-bit zero) per 128 weights.
    Format("int4", 4.16, "bf16", "Marlin W4A16", "bf16", "Marlin MoE W4A16"),
    Format("int8", 8.16, "bf16", "Marlin W8A16", "bf16", "Marlin MoE W8A16"),
    # GGUF blocks (llama.cpp's ggml-quants: 32 weights per block with an FP16 scale, K-quants in 256-weight
    # super-blocks); llama.cpp's CUDA backend multiplies them with int8 MMA (MMQ) once a batch has rows enough,
    # dequantizing dot products (MMVQ) below that.
    Format("q8_0", 8.5, "fp8", "llama.cpp MMQ/MMVQ (Q8_0)", "fp8", "llama.cpp MMQ MoE (Q8_0)"),
    Format("q6_k", 6.5625, "fp8", "llama.cpp MMQ/MMVQ (Q6_K)", "fp8", "llama.cpp MMQ MoE (Q6_K)"),
    Format("q5_k_m", 5.69, "fp8", "llama.cpp MMQ/MMVQ (Q5_K_M)", "fp8", "llama.cpp MMQ MoE (Q5_K_M)"),
    # Q4_K_M keeps some tensors (half the FFN down projections, attention V) in Q6_K: ~4.85 bits on average.
    Format("q4_k_m", 4.85, "fp8", "llama.cpp MMQ/MMVQ (Q4_K_M)", "fp8", "llama.cpp MMQ MoE (Q4_K_M)"),
    Format("q4_0", 4.5, "fp8", "llama.cpp MMQ/MMVQ (Q4_0)", "fp8", "llama.cpp MMQ MoE (Q4_0)"),
)}
GGUF = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")

ALIASES = {"gptq-int4": "int4", "int4-gptq": "int4", "int4-awq": "int4", "int4-w4a16": "int4", "awq": "int4",
           "gptq": "int4", "w4a16": "int4", "fp8-dynamic": "fp8",
           "fp8_e4m3": "fp8", "modelopt_fp4": "nvfp4", "modelopt": "fp8", "bfloat16": "bf16", "float16": "fp16",
           "auto": "bf16", "none": "bf16", "mxfp4-moe": "mxfp4", "compressed-tensors-fp8": "fp8",
           "q4_k": "q4_k_m", "q4_k_s": "q4_k_m", "q5_k": "q5_k_m", "q5_k_s": "q5_k_m", "f16": "fp16", "f32": "bf16",
           "mxfp4_moe": "mxfp4"}


def fmt(name: str) -> Format:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in FORMATS:
        raise SparktopError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[key]


@dataclass(frozen=True)
class Quantization:
    """The stored format of each part of a model."""

    scheme: str  # what the checkpoint is called by (mxfp4, nvfp4, fp8, bf16, gptq-int4 ...)
    experts: Format
    linear: Format  # dense MLPs, shared experts
    lm_head: Format
    recurrent: Format  # Mamba / gated-delta projections (often left at higher precision)
    attention: Format  # attention projections (some exports keep them in BF16)

    @classmethod
    def of(cls, scheme: str, experts: str | None = None, linear: str | None = None,
           lm_head: str | None = None, recurrent: str | None = None,
           attention: str | None = None) -> Quantization:
        """Defaults: a checkpoint quantizes every linear layer in its format but
        the unembedding, which stays BF16 (true of ModelOpt, llm-compressor,
        GPTQ and AWQ exports); gpt-oss's MXFP4 covers only the experts."""
        if scheme.strip().lower() == "mxfp4-spark":
            # The community MXFP4 image (eugr --exp-mxfp4): FP8xFP4 MoE, and
            # attention and lm_head stored in MXFP4 too (Marlin W4A16).
            return cls(scheme, fmt(experts or "mxfp4-w4a8"), fmt(linear or "mxfp4"), fmt(lm_head or "mxfp4"),
                       fmt(recurrent or linear or "mxfp4"), fmt(attention or linear or "mxfp4"))
        base = fmt(scheme)
        if base.name in GGUF:
            # A GGUF quantizes every linear layer, attention and the output matrix (kept in Q6_K below 6 bits).
            head = lm_head or ("q6_k" if base.bits < 6 else base.name)
            return cls(scheme, fmt(experts or base.name), fmt(linear or base.name), fmt(head),
                       fmt(recurrent or linear or base.name), fmt(attention or linear or base.name))
        if experts is None:
            experts = base.name
        if linear is None:
            linear = "bf16" if base.name == "mxfp4" else base.name
        return cls(scheme, fmt(experts), fmt(linear), fmt(lm_head or "bf16"), fmt(recurrent or linear),
                   fmt(attention or linear))

    def on_backend(self, moe_backend: str = "auto", linear_backend: str = "auto") -> Quantization:
        """The same weights through the kernels `--moe-backend` /
        `--linear-backend` force: Marlin dequantizes to BF16 (W4A16/W8A16)
        and handles small batches with 16-row tiles."""
        def marlin(f: Format) -> Format:
            return replace(f, compute="bf16", moe_compute="bf16", tile_m=16, kernel=f"Marlin ({f.name} weights)",
                           moe_kernel=f"Marlin MoE ({f.name} weights)")

        def forced(f: Format) -> Format:  # BF16/FP16 layers are not quantized: Marlin leaves them be
            return f if f.name in ("bf16", "fp16") else marlin(f)

        q = self
        if moe_backend == "marlin" and q.experts.name not in ("bf16", "fp16"):
            q = replace(q, experts=marlin(q.experts))
        if linear_backend == "marlin":
            q = replace(q, linear=forced(q.linear), attention=forced(q.attention), recurrent=forced(q.recurrent))
        return q

    def describe(self, present: set[str] | None = None) -> str:
        """The scheme, and the format of each part where they differ; only
        the parts in `present` (a model without experts has no "experts")."""
        parts = {"experts": self.experts.name, "attention": self.attention.name, "linear": self.linear.name,
                 "recurrent": self.recurrent.name, "lm_head": self.lm_head.name}
        if present is not None:
            parts = {k: v for k, v in parts.items() if k in present}
        if len(set(parts.values())) == 1:
            return self.scheme
        return f"{self.scheme} (" + ", ".join(f"{k} {v}" for k, v in parts.items()) + ")"
