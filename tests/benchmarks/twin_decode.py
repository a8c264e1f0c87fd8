"""Benchmark: the twin's c=1 decode rate against its model and the GB10 roofline.

Starts `sparktop twin serve --model M` as a subprocess (real time, speed 1),
streams one request of `--tokens` tokens, and prints the measured decode
tokens/s, the model's prediction for that context, and the bandwidth
roofline (all weights and KV read at 273 GB/s, no overheads).

    python tests/benchmarks/twin_decode.py --model gpt-oss-120b --tokens 256

On simulated time the twin's decode is the model's exactly
(tests/helpers/simulated.py); this is the same on real time.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time

import httpx

from sparktop.model.cards import find_card
from sparktop.model.fit import load_constants
from sparktop.model.perf import PerfModel

TITLE = "the twin's c=1 decode vs its model"
NEEDS = ("twin",)


def measure(model: str, tokens: int, prompt_words: int) -> dict:
    """One request of `tokens` streamed from a fresh twin of `model` at Spark's speed: what it measured and what
    the model says for that context."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "sparktop", "twin", "serve", "--model", model,
                             "--host", "127.0.0.1", "--port", str(port), "--startup-speed", "100"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the twin of {model} did not answer /health in 120 s")
            time.sleep(0.1)
        body = {"model": model, "messages": [{"role": "user", "content": "word " * prompt_words}],
                "max_tokens": tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        stamps, prompt = [], 0
        start = time.perf_counter()
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                data = json.loads(line[6:])
                if data.get("usage"):
                    prompt = data["usage"]["prompt_tokens"]
                for choice in data["choices"]:
                    d = choice.get("delta", {})
                    if d.get("content") or d.get("reasoning_content"):
                        stamps.append(time.perf_counter())
    finally:
        proc.terminate()
        proc.wait(10)
    m = PerfModel(find_card(model), k=load_constants())  # what the twin runs
    ctx = prompt + tokens // 2
    return {"prompt": prompt, "tokens": len(stamps), "decode": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
            "ttft_ms": (stamps[0] - start) * 1000, "model_decode": m.decode_tps(1, ctx),
            "model_prefill_ms": m.prefill_seconds(prompt) * 1000, "roofline": m.roofline_decode_tps(1, ctx)}


def run(bench) -> list:
    """For run_all: the median of a few fresh twins' c=1 decode beside the model's and the roofline."""
    from tests.benchmarks.common import Row, median

    model, n = "gpt-oss-120b", bench.pick(1, 3)
    got = [measure(model, 256, 1000) for _ in range(n)]
    first = got[0]
    decode = median(g["decode"] for g in got)
    return [Row("twin_decode", f"{model} c1 decode t/s ({first['prompt']}-token prompt)", decode,
                first["model_decode"], "the model", "t/s", n),
            Row("twin_decode", f"{model} c1 decode t/s against the roofline (273 GB/s, no overheads)", decode,
                first["roofline"], "roofline", "t/s", n),
            Row("twin_decode", f"{model} c1 TTFT (the model: its prefill alone)",
                median(g["ttft_ms"] for g in got), first["model_prefill_ms"], "the model", "ms", n)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-oss-120b")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt-words", type=int, default=1000)
    args = ap.parse_args()
    r = measure(args.model, args.tokens, args.prompt_words)
    print(f"model            {args.model}")
    print(f"prompt tokens    {r['prompt']}")
    print(f"TTFT             {r['ttft_ms']:.0f} ms (model prefill {r['model_prefill_ms']:.0f} ms)")
    print(f"decode measured  {r['decode']:.1f} tokens/s over {r['tokens']} tokens")
    print(f"decode modeled   {r['model_decode']:.1f} tokens/s")
    print(f"roofline bound   {r['roofline']:.1f} tokens/s (273 GB/s, no overheads)")
    print(f"efficiency       {r['decode'] / r['roofline'] * 100:.0f}% of the roofline")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
