"""Benchmark: the twin's c=1 decode rate against its model and the GB10 roofline.

Starts `sparktop twin serve --model M` as a subprocess (real time, speed 1),
streams one request of `--tokens` tokens, and prints the measured decode
tokens/s, the model's prediction for that context, and the bandwidth
roofline (all weights and KV read at 273 GB/s, no overheads).

    python tests/benchmarks/twin_decode.py --model gpt-oss-120b --tokens 256
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-oss-120b")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt-words", type=int, default=1000)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "sparktop", "twin", "serve", "--model", args.model,
                             "--host", "127.0.0.1", "--port", str(port), "--startup-speed", "100"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        body = {"model": args.model, "messages": [{"role": "user", "content": "word " * args.prompt_words}],
                "max_tokens": args.tokens, "ignore_eos": True, "stream": True,
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
    decode = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    ttft = stamps[0] - start
    m = PerfModel(find_card(args.model), k=load_constants())  # what the twin runs
    ctx = prompt + args.tokens // 2
    print(f"model            {args.model}")
    print(f"prompt tokens    {prompt}")
    print(f"TTFT             {ttft * 1000:.0f} ms (model prefill {m.prefill_seconds(prompt) * 1000:.0f} ms)")
    print(f"decode measured  {decode:.1f} tokens/s over {len(stamps)} tokens")
    print(f"decode modeled   {m.decode_tps(1, ctx):.1f} tokens/s")
    print(f"roofline bound   {m.roofline_decode_tps(1, ctx):.1f} tokens/s (273 GB/s, no overheads)")
    print(f"efficiency       {decode / m.roofline_decode_tps(1, ctx) * 100:.0f}% of the roofline")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
