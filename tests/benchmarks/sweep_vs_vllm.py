"""Benchmark: the sweep's figures beside what vLLM 0.32 measured itself, on the real vLLM CPU build.

    python -m tests.benchmarks.sweep_vs_vllm [--quick] [--vllm-server URL,WORKDIR]

The real vLLM serving the tests' tiny Llama (tests/helpers/real_vllm.py,
pinned to core 0; the sweep on the other cores) is swept at c1 and c4
(`sparktop sweep --pp 1536 --tg 128 --runs 5 --exact-tg --no-warmup`), its
/metrics read before and after each level. Nothing else talks to it
meanwhile, so the histograms' growth is that level's requests plus the one
calibration request the sweep sends first (a short prompt, `max_tokens` 1):
the smallest observation in each histogram, so its bucket bounds what it
added to the sums. Per level, the median over `pairs` sweeps (3; 1 with
--quick):

- TTFT: the sweep's mean beside vLLM's `time_to_first_token_seconds` sum over
  the level's requests (less the calibration's bucket: the middle of the
  two bounds). A client sees the server's time plus HTTP and the first
  chunk's trip.
- decode t/s per request: the sweep's beside vLLM's generated tokens after the
  first over `request_decode_time_seconds`.
- prefill t/s per request at c1: the sweep's beside the prompt over vLLM's
  TTFT (beyond one request a mean of rates is not the rate of the mean TTFT).

The suite keeps the counts (tests/real/test_sweep_real.py): the server saw
the sweep's requests, every one generated the tokens asked, with prompts of
the length asked.
"""

from __future__ import annotations

import subprocess
import sys

from tests.benchmarks.common import ROOT, Bench, Row, median, say, standalone

TITLE = "the sweep vs vLLM's own histograms on the real vLLM"
NEEDS = ("vllm",)
PP, TG, RUNS = 1536, 128, 5  # prompts as long as four fit in the 8,192-token cache with their output
LEVELS = [1, 4]


def sweep_level(server, results, c: int, *, pp: int = PP, tg: int = TG, runs: int = RUNS,
                extra: tuple[str, ...] = ()) -> dict:
    """One `sparktop sweep` level on the clients' cores: the level's figures (LevelStats.as_dict)."""
    from sparktop.bench.results import load_run
    from tests.helpers.real_vllm import CLIENT_CPUS, pinned

    r = subprocess.run(
        [*pinned(CLIENT_CPUS), sys.executable, "-m", "sparktop", "sweep", "--endpoint", server.url + "/v1",
         "--tokenizer", str(server.model / "tokenizer.json"), "--pp", str(pp), "--tg", str(tg), "-c", str(c),
         "--runs", str(runs), "--exact-tg", "--no-warmup", *extra, "--json", "--results", str(results)],
        capture_output=True, text=True, timeout=1200, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"sparktop sweep c{c} failed: {r.stderr[-2000:]}")
    (run_dir,) = results.iterdir()
    (level,) = [lv.as_dict() for lv in load_run(run_dir).levels()]
    return level


def smallest_bounds(before: dict, after: dict, name: str) -> tuple[float, float]:
    """The bucket the smallest new observation of histogram `name` fell in."""
    lower = 0.0
    for le in sorted(after[name]):
        if after[name][le] - before[name].get(le, 0.0) >= 1:
            return lower, le
        lower = le
    raise RuntimeError(f"no new observation in {name}")


def server_figures(text_before: str, text_after: str) -> dict:
    """What vLLM measured over one level (the calibration request taken out)."""
    from tests.helpers.scraper import buckets, parse

    before, after = parse(text_before), parse(text_after)
    hb, ha = buckets(text_before), buckets(text_after)

    def delta(name: str) -> float:
        return after[name] - before[name]

    n = delta("vllm:time_to_first_token_seconds_count") - 1
    gen = delta("vllm:request_generation_tokens_sum") - 1
    t_lo, t_hi = smallest_bounds(hb, ha, "vllm:time_to_first_token_seconds")
    ttft_sum = delta("vllm:time_to_first_token_seconds_sum")
    ttft_ms = ((ttft_sum - t_hi) / n * 1000, (ttft_sum - t_lo) / n * 1000)
    return {"requests": n, "generated": gen, "ttft_ms": sum(ttft_ms) / 2, "ttft_ms_bounds": ttft_ms,
            # the calibration request's decode time is 0: it made one token
            "tg_req": (gen - n) / delta("vllm:request_decode_time_seconds_sum")}


def run(bench: Bench) -> list[Row]:
    from tests.helpers.scraper import scrape_text

    server = bench.vllm()
    pairs = bench.pick(1, 3)
    work = bench.dir("sweep-vs-vllm")
    rows: list[Row] = []
    for c in LEVELS:
        ours, theirs = [], []
        for i in range(pairs):
            say(f"{TITLE}: c{c}, sweep {i + 1}/{pairs}")
            before = scrape_text(server.url)
            ours.append(sweep_level(server, work / f"c{c}-{i}", c))
            theirs.append(server_figures(before, scrape_text(server.url)))
            if theirs[-1]["requests"] != ours[-1]["requests"]:
                say(f"  the server saw {theirs[-1]['requests']:g} requests, the sweep {ours[-1]['requests']}")
        width = median(t["ttft_ms_bounds"][1] - t["ttft_ms_bounds"][0] for t in theirs)
        rows.append(Row("sweep_vs_vllm", f"c{c} TTFT mean", median(o["ttft_ms_mean"] for o in ours),
                        median(t["ttft_ms"] for t in theirs), "vLLM histogram", "ms", pairs,
                        note=f"vLLM's less the calibration's bucket, ±{width / 2:.2f} ms"))
        rows.append(Row("sweep_vs_vllm", f"c{c} decode t/s per request", median(o["tg_tps_req"] for o in ours),
                        median(t["tg_req"] for t in theirs), "vLLM histogram", "t/s", pairs))
        if c == 1:
            rows.append(Row("sweep_vs_vllm", f"c{c} prefill t/s per request", median(o["pp_tps_req"] for o in ours),
                            median(PP / (t["ttft_ms"] / 1000) for t in theirs), "vLLM histogram", "t/s", pairs))
    return rows


if __name__ == "__main__":
    sys.exit(standalone(run))
