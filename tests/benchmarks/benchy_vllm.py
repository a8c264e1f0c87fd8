"""Benchmark: sparktop's sweep beside llama-benchy 0.4.0 on the real vLLM CPU build.

    python -m tests.benchmarks.benchy_vllm [--quick] [--vllm-server URL,WORKDIR]

The real vLLM serving the tests' tiny Llama (tests/helpers/real_vllm.py,
pinned to core 0; both clients on the other cores, one at a time), at c1 and
c4, pp 1536, tg 128, 5 runs. The tools run in alternating pairs (3; 1 with
--quick; the first of a pair alternates too) and their medians are set side
by side. Each tool is held to what the server measured during its own run:
the server's speed on a shared CPU drifts between two runs by more than the
tools differ.

- decode per request, as a share of vLLM's own (generated tokens after the
  first over its decode-time histogram, during that tool's run): like with
  like, the sweep's `tg_tps_req_llama_benchy` counts tokens as llama-benchy
  does (it skips chunks that stream no text); sparktop's own count is a row
  of its own;
- at c1, the prompt tokens over the prefill span (pp t/s x the span each
  divides by; both with `--latency-mode none`: neither takes a round-trip
  estimate off it). llama-benchy's span ends at the first chunk with a
  choice in it, which vLLM sends with the role alone a few ms before the
  first token; sparktop's ends with the first token;
- at c4, the batch's prefill rate (prompt tokens to the last first token);
- TTFT as each tool read it (llama-benchy's clock starts before aiohttp
  serializes its body: its own work is in it).
"""

from __future__ import annotations

import sys

from tests.benchmarks.common import Bench, Row, median, say, standalone
from tests.benchmarks.sweep_vs_vllm import LEVELS, PP, RUNS, TG, sweep_level

TITLE = "llama-benchy vs sparktop on the real vLLM"
NEEDS = ("vllm",)
NO_LATENCY = ["--latency-mode", "none"]


def decode_rate(before: dict, after: dict) -> float:
    """vLLM's decode rate per request over a run: generated tokens after the first over the decode time."""
    def delta(name: str) -> float:
        return after[name] - before[name]

    return ((delta("vllm:request_generation_tokens_sum") - delta("vllm:request_generation_tokens_count"))
            / delta("vllm:request_decode_time_seconds_sum"))


def run(bench: Bench) -> list[Row]:
    from tests.helpers.benchy import run_llama_benchy
    from tests.helpers.real_vllm import CLIENT_CPUS, MODEL_NAME, pinned
    from tests.helpers.scraper import scrape

    server = bench.vllm()
    pairs = bench.pick(1, 3)
    work = bench.dir("benchy-vllm")
    tokenizer = server.model / "tokenizer.json"
    rows: list[Row] = []
    for c in LEVELS:
        got: dict[str, list[float]] = {k: [] for k in ("tg", "tg_lb", "own", "ttft", "ttft_lb", "pp", "pp_lb",
                                                     "span_lb")}
        for i in range(pairs):
            for tool in ("lb", "sp") if i % 2 == 0 else ("sp", "lb"):
                say(f"{TITLE}: c{c}, pair {i + 1}/{pairs}, {'llama-benchy' if tool == 'lb' else 'sparktop'}")
                before = scrape(server.url)
                if tool == "lb":
                    (theirs,) = run_llama_benchy(server.url, MODEL_NAME, tokenizer, work / f"lb{c}-{i}", pp=PP,
                                                 tg=TG, levels=[c], runs=RUNS, extra=NO_LATENCY,
                                                 prefix=pinned(CLIENT_CPUS)).values()
                    vllm = decode_rate(before, scrape(server.url))
                    got["tg_lb"].append(theirs["tg_req_throughput"]["mean"] / vllm)
                    got["ttft_lb"].append(theirs["e2e_ttft"]["mean"])
                    got["pp_lb"].append(theirs["pp_throughput"]["mean"])
                    got["span_lb"].append(theirs["est_ppt"]["mean"])
                else:
                    ours = sweep_level(server, work / f"sp{c}-{i}", c, extra=tuple(NO_LATENCY))
                    vllm = decode_rate(before, scrape(server.url))
                    got["tg"].append(ours["tg_tps_req_llama_benchy"] / vllm)
                    got["own"].append(ours["tg_tps_req"] / vllm)
                    got["ttft"].append(ours["ttft_ms_mean"])
                    got["pp"].append(ours["pp_tps_total"])
        rows.append(Row("benchy_vllm", f"c{c} decode per request as a share of vLLM's (llama-benchy's count)",
                        median(got["tg"]), median(got["tg_lb"]), "llama-benchy", "", pairs, "diff"))
        rows.append(Row("benchy_vllm", f"c{c} decode per request as a share of vLLM's (sparktop's own count)",
                        median(got["own"]), 1.0, "vLLM histogram", "", pairs, "diff"))
        if c == 1:
            mine = [p * t / 1000 for p, t in zip(got["pp"], got["ttft"], strict=True)]
            theirs_ = [p * t / 1000 for p, t in zip(got["pp_lb"], got["span_lb"], strict=True)]
            rows.append(Row("benchy_vllm", f"c{c} prompt tokens over the prefill span (pp x span)", median(mine),
                            median(theirs_), "llama-benchy", "tok", pairs))
            rows.append(Row("benchy_vllm", f"c{c} llama-benchy's span: to its first response, not the first token",
                            median(got["ttft"]), median(got["span_lb"]), "llama-benchy", "ms", pairs))
        else:
            rows.append(Row("benchy_vllm", f"c{c} prefill t/s, the batch", median(got["pp"]), median(got["pp_lb"]),
                            "llama-benchy", "t/s", pairs))
        rows.append(Row("benchy_vllm", f"c{c} TTFT as the client read it", median(got["ttft"]),
                        median(got["ttft_lb"]), "llama-benchy", "ms", pairs))
    return rows


if __name__ == "__main__":
    sys.exit(standalone(run))
