"""Benchmark: prefill and TTFT on published DGX Spark figures the fit never sees (issue 39).

    python -m tests.benchmarks.prefill_held_out

The figures below are HELD OUT: they are not in `model/data/published-*.yaml`
and must not be added there, nor any constant tuned to them. They check that
prefill generalises from physics, not from the fitted cells. Sources (issue 39's
research, docs/research/prefill-on-gb10.md):

- llama.cpp build 7280 (e95d0bc8f), `llama-bench` ppN, one sequence,
  n_batch = n_ubatch 16384, fa 1: DandinPower/llama.cpp_bench
  `dgx_spark/prefilling.log` @99971a00 (Qwen3-8B, Qwen3-32B, Qwen3-30B-A3B Q4_K_M);
- vLLM 0.26.1.dev (ghcr.io/miaai-lab/mia-vllm-gb10-linear-b12x), c1, 10 requests of ~10.15k / ~40.3k
  prompt tokens, max-num-batched-tokens 32768, FP8 KV, prefix caching off: 0xBakeer/inference-atlas
  `results/vllm/Qwen/Qwen3.6-35B-A3B/nvidia-gb10-dgx-spark/*--prefill-{8k,32k}-v1--*.json` (MTP 2 on in
  those runs: their TTFT includes the first speculative step; not modelled here).

Prints predicted vs published per figure, the MAPE per metric, and how many
fall inside the band `predict` states for a model no source measured.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sparktop.model import fit, runtimes  # noqa: E402
from sparktop.model.serving import Serving  # noqa: E402

LLAMA_CPP = [  # (card, prompt tokens, published pp t/s)
    ("qwen3-8b", 512, 3167.93), ("qwen3-8b", 2048, 2991.44), ("qwen3-8b", 16384, 1862.84),
    ("qwen3-32b", 512, 762.22), ("qwen3-32b", 2048, 683.22), ("qwen3-32b", 16384, 481.66),
    ("qwen3-30b-a3b", 512, 2541.61), ("qwen3-30b-a3b", 2048, 3101.13), ("qwen3-30b-a3b", 16384, 2059.56),
]
VLLM_SERVING = {"max_num_batched_tokens": 32768, "kv_cache_dtype": "fp8", "enable_prefix_caching": False}
VLLM = [  # (card, quant, prompt tokens, metric, published)
    ("qwen3.6-35b-a3b", "fp8", 10150, "ttft_ms", 2101.0),
    ("qwen3.6-35b-a3b", "fp8", 10150, "prefill_tps", 4833.0),
    ("qwen3.6-35b-a3b", "fp8", 40300, "ttft_ms", 8653.0),
    ("qwen3.6-35b-a3b", "nvfp4", 10150, "ttft_ms", 1624.0),
    ("qwen3.6-35b-a3b", "nvfp4", 10150, "prefill_tps", 6253.0),
]


def rows() -> list[tuple[str, str, float, float]]:
    """(label, metric, published, predicted) for every held-out figure."""
    out = []
    base = fit.load_constants()
    kl = runtimes.apply_runtime("llama.cpp", base.for_stack(None))
    for card, n, value in LLAMA_CPP:
        f = runtimes.Figure("llama.cpp", "held-out", card, "q4_k_m", "llama-bench", "prefill_tps", value,
                            prompt_tokens=n, serving=Serving().with_flags({"max_num_batched_tokens": 16384}))
        p, _ = runtimes.predicted(f, kl)
        out.append((f"llama.cpp {card} Q4_K_M pp{n}", "prefill_tps", value, p or 0.0))
    for card, quant, n, metric, value in VLLM:
        cell = fit.Cell(card, "solo", metric, 1, value, workload=("llama-benchy", n, 128, 1),
                        serving=Serving().with_flags(VLLM_SERVING), quant=quant)
        p, _ = fit.predicted(cell, base)
        out.append((f"vLLM {card} {quant} c1 {n} tok", metric, value, p or 0.0))
    return out


def main() -> int:
    errors: dict[str, list[float]] = {}
    print(f"{'figure':44} {'metric':12} {'published':>10} {'predicted':>10} {'error':>7}")
    for label, metric, pub, pred in rows():
        e = pred / pub - 1
        errors.setdefault(metric, []).append(abs(e))
        print(f"{label:44} {metric:12} {pub:10.0f} {pred:10.0f} {e:+7.1%}")
    bands = (fit.load_fit_summary().get("cross_validation") or {}).get("bands") or {}
    for metric, es in errors.items():
        band = (bands.get(metric) or {}).get("band")
        inside = f"; {sum(e <= band for e in es)} of {len(es)} inside the stated ±{band:.0%}" if band else ""
        print(f"MAPE {metric}: {statistics.fmean(es):.1%} ({len(es)} figures{inside})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
