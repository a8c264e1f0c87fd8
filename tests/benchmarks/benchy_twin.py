"""Benchmark: sparktop's sweep beside llama-benchy 0.4.0 (the tool the articles used) on one twin at Spark's speed.

    python -m tests.benchmarks.benchy_twin            # depth 0 (c1, c2, c4) and depth 4096 (c1, c2), 3 pairs
    python -m tests.benchmarks.benchy_twin --quick    # one pair each

One twin process (llama-3.1-8b, speed 1, a tokenizer.json trained here,
`--request-log`) serves both tools, each its own process, one after the
other, offline (llama-benchy's book pre-seeded under a temporary HOME). They
run in alternating pairs (llama-benchy first in even pairs) and the medians
over the pairs are set side by side, per level:

- decode t/s, the batch's and per request: the sweep's `*_llama_benchy`
  figures (llama-benchy's way of counting decode tokens, on the sweep's
  requests) beside llama-benchy's `tg_throughput` / `tg_req_throughput`;
- prompt tokens over the prefill span (pp t/s x TTFT): the same tokens
  counted over the same span give 1.0;
- TTFT as each tool read it, and each less the server's own TTFT for its
  requests (the twin logs when each request's handler began and its first
  token went out): what the client's own work adds (llama-benchy's clock
  starts before aiohttp serializes its body); a decode step beside it for
  scale, since a TTFT read at the wrong token is off by one;
- the prompt tokens the server counted per request, at c1 the engine's time
  to the first token for each tool's requests (the same work asked: 1.0),
  and at depth 4096 the share of the context found in the prefix cache.

Sparktop's side is `sparktop sweep --exact-tg --no-remeasure` (each level
once: the request log groups batches); llama-benchy's `--exact-tg`. At depth
both load each context into the prefix cache first (llama-benchy's
`--enable-prefix-caching`, sparktop's `--prefix-cache on`); depth 4096 is
run at c1 and c2.

What the suite keeps of this (tests/integration/test_llama_benchy_agreement.py):
the counts: both tools' requests carry the same prompt and cached tokens at
the server, and at depth the context is found in the cache.
"""

from __future__ import annotations

import statistics
import sys

from tests.benchmarks.common import Bench, Row, median, say, standalone
from tests.helpers.benchy import Pair, run_pairs
from tests.helpers.request_log import Served, mean_engine_ms, mean_step_ms, mean_ttft_ms

TITLE = "llama-benchy vs sparktop on the twin"
NEEDS = ("twin",)


def counted(served: list[Served], attr: str) -> float:
    return statistics.fmean(getattr(r, attr) for r in served)


def level_rows(name: str, d: int, c: int, pairs: list[Pair]) -> list[Row]:
    n = len(pairs)
    at = f"d{d} c{c}"

    def both(mine, theirs) -> tuple[float | None, float | None]:
        return median(mine(p) for p in pairs), median(theirs(p) for p in pairs)

    step = median(mean_step_ms(p.served_ours) for p in pairs)
    rows = []
    for figure, unit, mine, theirs, compare, note in (
        ("decode t/s, the batch (llama-benchy's count)", "t/s", lambda p: p.ours.tg_tps_total_llama_benchy,
         lambda p: p.theirs["tg_throughput"]["mean"], "ratio", ""),
        ("decode t/s per request (llama-benchy's count)", "t/s", lambda p: p.ours.tg_tps_req_llama_benchy,
         lambda p: p.theirs["tg_req_throughput"]["mean"], "ratio", ""),
        ("prompt tokens over the prefill span (pp x TTFT)", "tok",
         lambda p: p.ours.pp_tps_total * p.ours.ttft_ms_mean / 1000,
         lambda p: p.theirs["pp_throughput"]["mean"] * p.theirs["e2e_ttft"]["mean"] / 1000, "ratio", ""),
        ("TTFT as the client read it", "ms", lambda p: p.ours.ttft_ms_mean, lambda p: p.theirs["e2e_ttft"]["mean"],
         "ratio", ""),
        ("the client's TTFT less the server's for its requests", "ms",
         lambda p: p.ours.ttft_ms_mean - mean_ttft_ms(p.served_ours),
         lambda p: p.theirs["e2e_ttft"]["mean"] - mean_ttft_ms(p.served_theirs), "diff",
         f"a decode step: {step:.1f} ms" if step else ""),
        ("prompt tokens per request at the server", "tok", lambda p: counted(p.served_ours, "prompt_tokens"),
         lambda p: counted(p.served_theirs, "prompt_tokens"), "diff", ""),
    ):
        a, b = both(mine, theirs)
        rows.append(Row(name, f"{at} {figure}", a, b, "llama-benchy", unit, n, compare, note))
    if c == 1:
        a, b = both(lambda p: mean_engine_ms(p.served_ours), lambda p: mean_engine_ms(p.served_theirs))
        rows.append(Row(name, f"{at} the engine's time to the first token (the same work)", a, b, "llama-benchy",
                        "ms", n))
    if d:
        a, b = both(lambda p: counted(p.served_ours, "cached_tokens") / d,
                    lambda p: counted(p.served_theirs, "cached_tokens") / d)
        rows.append(Row(name, f"{at} context found in the prefix cache (share of depth)", a, b, "llama-benchy", "",
                        n, "diff"))
    return rows


def run(bench: Bench) -> list[Row]:
    pairs = bench.pick(1, 3)
    rows: list[Row] = []
    say(f"{TITLE}: depth 0, c1/c2/c4, {pairs} pair(s)")
    flat = run_pairs(bench.dir("benchy-twin-d0"), pairs, [1, 2, 4], [0], [], [])
    for (d, c), got in flat.items():
        rows += level_rows("benchy_twin", d, c, got)
    say(f"{TITLE}: depth 0 and 4096 with the prefix cache, c1/c2, {pairs} pair(s)")
    deep = run_pairs(bench.dir("benchy-twin-d4096"), pairs, [1, 2], [0, 4096],
                     ["--depth", "0,4096", "--prefix-cache", "on"], ["--depth", "0", "4096", "--enable-prefix-caching"])
    for (d, c), got in deep.items():
        if d:  # depth 0 with the prefix cache on is the run above's again
            rows += level_rows("benchy_twin", d, c, got)
    return rows


if __name__ == "__main__":
    sys.exit(standalone(run))

