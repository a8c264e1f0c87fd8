"""Is the load generator ever the bottleneck? Client CPU per streamed token,
sparktop's sweep vs llama-benchy 0.4.0, side by side against one twin that
emits as fast as it can; then c=256 streams from a client pinned to one core.

    python tests/benchmarks/sweep_client_cost.py [--rounds 3] [--c 64] [--tg 256]
    python tests/benchmarks/sweep_client_cost.py --real [--c 8]   # against a real vLLM (CPU build)

With --real the server is vLLM 0.32's CPU build serving the tests' tiny Llama
(tests/helpers/real_vllm.py), started once on core 0, the clients on core 1:
the real engine's own stream (its chunk shapes, its pace) instead of the twin's.

Each tool runs as its own process; its CPU time comes from the kernel
(getrusage of the child). Start-up (imports, corpus) is measured with a tiny
run and subtracted, so the figure is the cost of streaming alone:
  per token = (CPU big − CPU tiny) / (tokens big − tokens tiny).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers.real_vllm import free_port  # noqa: E402
from tests.helpers.tokenizer import book_text, train_tokenizer  # noqa: E402
from tests.helpers.twin_process import start_twin_process  # noqa: E402
from tests.helpers.venvs import llama_benchy  # noqa: E402

BOOK_URL = "http://book.invalid/book.txt"
TITLE = "client CPU per streamed token, sparktop vs llama-benchy"
NEEDS = ("twin",)


def child_cpu(cmd: list[str], env=None, cwd=None) -> tuple[float, float, subprocess.CompletedProcess]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {(p.stderr or p.stdout)[-800:]}")
    return cpu, wall, p


def start_twin(tok: Path, port: int, speed: float, cpu: str | None = None) -> subprocess.Popen:
    proc, _ = start_twin_process("llama-3.1-8b", "--tokenizer", str(tok), "--max-num-seqs", "512", speed=speed,
                                 cpu=cpu, port=port)
    return proc


MODEL = "llama-3.1-8b"
CLIENT_CORE = "0"


def benchy(exe: Path, url: str, tok: Path, home: Path, c: int, runs: int, tg: int, out: Path):
    env = dict(os.environ, HOME=str(home), HF_HUB_OFFLINE="1")
    cpu, wall, _ = child_cpu(["taskset", "-c", CLIENT_CORE, str(exe), "--base-url", url + "/v1", "--model", MODEL,
                              "--tokenizer",
                              str(tok), "--book-url", BOOK_URL, "--pp", "64", "--tg", str(tg), "--concurrency",
                              str(c), "--runs", str(runs), "--exact-tg", "--skip-coherence", "--format", "json",
                              "--save-result", str(out)], env=env)
    tokens = (runs + 1) * c * tg  # --exact-tg: every request, warm-up included, streams tg tokens
    return cpu, wall, tokens


def ours(url: str, tok: Path, results: Path, c: int, runs: int, tg: int, pin: str | None = None):
    pin = pin or CLIENT_CORE
    cmd = [sys.executable, "-m", "sparktop", "sweep", "-e", url, "--tokenizer", str(tok), "--pp", "64", "--tg",
           str(tg), "-c", str(c), "--runs", str(runs), "--exact-tg", "--json", "--results", str(results)]
    if pin:
        cmd = ["taskset", "-c", pin, *cmd]
    cpu, wall, p = child_cpu(cmd)
    report = json.loads(p.stdout)
    tokens = (runs + 1) * c * tg
    return cpu, wall, tokens, report


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--c", type=int, default=64)
    ap.add_argument("--tg", type=int, default=256)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--speed", type=float, default=1000.0, help="twin speed-up (high: as fast as it can)")
    ap.add_argument("--real", action="store_true", help="a real vLLM (CPU build) instead of the twin")
    return ap


def measure(args, c256: bool = True) -> dict:
    """Client CPU per streamed token of each tool by round, and (`c256`) sparktop's c=256 level from one core."""
    exe = llama_benchy()
    out: dict = {"per_token": {"sparktop": [], "llama-benchy": []}, "c256": None}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        book = book_text()
        tok = train_tokenizer(tmp / "tokenizer.json", book)
        cache = tmp / "home" / ".cache" / "llama-benchy"
        cache.mkdir(parents=True)
        (cache / (hashlib.md5(BOOK_URL.encode()).hexdigest() + ".txt")).write_text(book)
        per_token = out["per_token"]
        # Each measurement gets a fresh twin pinned to core 1 and the client
        # pinned to core 0: the server's pace sets how many SSE events share
        # a read, so both tools must meet the same, unloaded server.
        for r in range(args.rounds):
            for tool in (("sparktop", "llama-benchy") if r % 2 == 0 else ("llama-benchy", "sparktop")):
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                twin = start_twin(tok, port, args.speed, cpu="1")
                try:
                    if tool == "sparktop":
                        small = ours(url, tok, tmp / f"r{r}s", 1, 1, 2)
                        big = ours(url, tok, tmp / f"r{r}b", args.c, args.runs, args.tg)
                    else:
                        small = benchy(exe, url, tok, tmp / "home", 1, 1, 2, tmp / f"b{r}s.json")
                        big = benchy(exe, url, tok, tmp / "home", args.c, args.runs, args.tg, tmp / f"b{r}b.json")
                finally:
                    twin.terminate()
                    twin.wait()
                cost = (big[0] - small[0]) / (big[2] - small[2])
                per_token[tool].append(cost)
                print(f"round {r + 1} {tool:13} {big[2]:7d} tokens  cpu {big[0]:6.2f}s (start-up "
                      f"{small[0]:.2f}s)  wall {big[1]:6.2f}s  {cost * 1e6:6.1f} µs/token", flush=True)
        if c256:
            # c=256 from a client pinned to one core, the twin on the other.
            port = free_port()
            twin = start_twin(tok, port, 50.0, cpu="1")
            try:
                cpu, wall, tokens, report = ours(f"http://127.0.0.1:{port}", tok, tmp / "c256", 256, 2, 64)
                (lv,) = report["levels"]
                out["c256"] = {"cpu": cpu, "wall": wall, **lv}
            finally:
                twin.terminate()
                twin.wait()
    return out


def run(bench) -> list:
    """For run_all: the medians per token, sparktop beside llama-benchy (the twin, pinned as above)."""
    from tests.benchmarks.common import Row

    args = parser().parse_args(["--rounds", "1"] if bench.quick else [])
    got = measure(args, c256=False)
    a, b = (statistics.median(got["per_token"][t]) for t in ("sparktop", "llama-benchy"))
    return [Row("sweep_client_cost", f"client CPU per streamed token (c={args.c}, tg {args.tg})", a * 1e6, b * 1e6,
                "llama-benchy", "µs/tok", args.rounds)]


def main() -> None:
    args = parser().parse_args()
    if args.real:
        return main_real(args)
    got = measure(args)
    a, b = (statistics.median(got["per_token"][t]) for t in ("sparktop", "llama-benchy"))
    print(f"\nmedian client CPU per streamed token: sparktop {a * 1e6:.1f} µs, llama-benchy {b * 1e6:.1f} µs"
          f" -> sparktop uses {a / b:.2f}x llama-benchy's")
    lv = got["c256"]
    print(f"\nc=256 on one core: {lv['requests']} requests, {lv['errors']} errors, decode "
          f"{lv['tg_tps_total']:,.0f} t/s total, client CPU {lv['cpu']:.1f}s over {lv['wall']:.1f}s wall "
          f"({lv['cpu'] / lv['wall']:.0%} of one core, start-up included)")


def main_real(args) -> None:
    global MODEL, CLIENT_CORE
    from tests.helpers import real_vllm

    MODEL, CLIENT_CORE = real_vllm.MODEL_NAME, "1"  # the server has core 0
    exe = llama_benchy()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        server = real_vllm.start(tmp / "server")
        try:
            tok = server.model / "tokenizer.json"
            cache = tmp / "home" / ".cache" / "llama-benchy"
            cache.mkdir(parents=True)
            (cache / (hashlib.md5(BOOK_URL.encode()).hexdigest() + ".txt")).write_text(book_text())
            print(f"vLLM {real_vllm.VLLM_VERSION} (CPU build) ready in {server.started_s:.0f} s, pinned to core 0; "
                  f"clients on core 1; c={args.c} tg={args.tg} runs={args.runs}", flush=True)
            per_token: dict[str, list[float]] = {"sparktop": [], "llama-benchy": []}
            for r in range(args.rounds):
                for tool in (("sparktop", "llama-benchy") if r % 2 == 0 else ("llama-benchy", "sparktop")):
                    if tool == "sparktop":
                        small = ours(server.url, tok, tmp / f"r{r}s", 1, 1, 2)
                        big = ours(server.url, tok, tmp / f"r{r}b", args.c, args.runs, args.tg)
                    else:
                        small = benchy(exe, server.url, tok, tmp / "home", 1, 1, 2, tmp / f"b{r}s.json")
                        big = benchy(exe, server.url, tok, tmp / "home", args.c, args.runs, args.tg,
                                     tmp / f"b{r}b.json")
                    cost = (big[0] - small[0]) / (big[2] - small[2])
                    per_token[tool].append(cost)
                    print(f"round {r + 1} {tool:13} {big[2]:7d} tokens  cpu {big[0]:6.2f}s (start-up "
                          f"{small[0]:.2f}s)  wall {big[1]:6.2f}s  {cost * 1e6:6.1f} µs/token", flush=True)
            a, b = statistics.median(per_token["sparktop"]), statistics.median(per_token["llama-benchy"])
            print(f"\nmedian client CPU per streamed token on real vLLM: sparktop {a * 1e6:.1f} µs, "
                  f"llama-benchy {b * 1e6:.1f} µs -> sparktop uses {a / b:.2f}x llama-benchy's")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
