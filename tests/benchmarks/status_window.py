"""Benchmark: `sparktop status --seconds 10`'s generation rate beside the real vLLM's own counter.

    python -m tests.benchmarks.status_window [--quick] [--vllm-server URL,WORKDIR]

A steady load on the real vLLM CPU build (a sweep at c8 of 64-token prompts
and 1,024-token outputs: more requests than run at once, each long enough that
no wave of endings and starts falls into one run and not the next), then
`status --json --seconds 10` run 10 times in a row (3 with --quick). Around
each run this script reads `vllm:generation_tokens_total` itself, just before
it starts and just after it ends: status's window lies inside that span (it
starts a second later and ends before), so under a steady load the two rates
differ only by the load's own wobble and the second or two at either end.

Before status took its rate over the whole of --seconds (against the last two
polls), three runs in a row printed 0.0 on this engine and the rest 0.66x to
1.31x: a real engine's counters move in bursts. The suite keeps what cannot
drift (tests/real/test_status_window_real.py): every run shows a rate and
its latency percentiles over the window.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

from tests.benchmarks.common import ROOT, Bench, Row, median, say, standalone

TITLE = "status --seconds 10 vs the real vLLM's counter"
NEEDS = ("vllm",)
SECONDS = 10


def start_load(server, work, *, c: int = 8, runs: int = 60, pp: int = 64, tg: int = 1024) -> subprocess.Popen:
    """A sweep in its own process: the load a user puts on the engine (stopped by the caller); its output in
    `work`/load.log."""
    log = open(work / "load.log", "w")  # noqa: SIM115 - the load's, closed with it
    results = work / "results"
    return subprocess.Popen(
        [sys.executable, "-m", "sparktop", "sweep", "--endpoint", server.url + "/v1", "--tokenizer",
         str(server.model / "tokenizer.json"), "--pp", str(pp), "--tg", str(tg), "-c", str(c), "--runs", str(runs),
         "--exact-tg", "--no-warmup", "--json", "--results", str(results)],
        stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT)


def wait_running(url: str, load: subprocess.Popen, at_least: float, log, timeout: float = 300) -> None:
    from tests.helpers.scraper import scrape

    deadline = time.monotonic() + timeout
    while scrape(url).get("vllm:num_requests_running", 0) < at_least:
        if load.poll() is not None:
            raise RuntimeError("the load ended: " + log.read_text()[-2000:])
        if time.monotonic() > deadline:
            raise RuntimeError(f"the load never had {at_least:g} requests running")
        time.sleep(0.2)


def run(bench: Bench) -> list[Row]:
    from tests.helpers.scraper import scrape

    server = bench.vllm()
    runs = bench.pick(3, 10)
    work = bench.dir("status-window")
    load = start_load(server, work, runs=runs * 6)
    status_rates, truths = [], []
    try:
        wait_running(server.url, load, 8, work / "load.log")
        time.sleep(3)  # past the first prefill: what is compared is a steady decode
        for i in range(runs):
            say(f"{TITLE}: run {i + 1}/{runs}")
            if load.poll() is not None:
                raise RuntimeError("the load ended before the runs")
            t0, c0 = time.monotonic(), scrape(server.url)["vllm:generation_tokens_total"]
            out = subprocess.run([sys.executable, "-m", "sparktop", "status", "--json", "--engine", server.url,
                                  "--seconds", str(SECONDS)], capture_output=True, text=True, timeout=120, cwd=ROOT)
            t1, c1 = time.monotonic(), scrape(server.url)["vllm:generation_tokens_total"]
            if out.returncode != 0:
                raise RuntimeError(f"sparktop status failed: {out.stderr[-2000:]}")
            (engine,) = [e for e in json.loads(out.stdout)["engines"] if e["url"] == server.url]
            status_rates.append(engine["gen_tps"])
            truths.append((c1 - c0) / (t1 - t0))
    finally:
        load.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            load.wait(60)
    ratios = [s / t for s, t in zip(status_rates, truths, strict=True) if s is not None and t]
    return [Row("status_window", f"status --seconds {SECONDS}: generation t/s, median of the runs",
                median(status_rates), median(truths), "vLLM counter", "t/s", runs,
                note=f"runs' ratios {min(ratios):.3f}-{max(ratios):.3f}" if ratios else "no ratio")]


if __name__ == "__main__":
    sys.exit(standalone(run))
