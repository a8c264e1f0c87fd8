"""The sweep on a real engine counts what vLLM 0.32 counted itself: the
requests it sent, the tokens each generated and the prompt each carried, as
the server's own histograms say, one request at a time and four at once.

The server is the shared tiny Llama on the CPU, on a core of its own; the
clients run on the other (tests/helpers/real_vllm.py says why). Nothing else
talks to it during a sweep, so the histograms' growth is that sweep's
requests plus the one calibration request the sweep sends first (a short
prompt, `max_tokens` 1): the smallest observation in each histogram, so its
bucket bounds what it added to the sums.

How close the sweep's rates and first tokens come to vLLM's own, and to
llama-benchy's on the same server, is a measurement of this machine:
`python -m tests.benchmarks.sweep_vs_vllm` and `tests.benchmarks.benchy_vllm`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sparktop.bench.results import load_run
from tests.helpers.real_vllm import CLIENT_CPUS, pinned
from tests.helpers.scraper import buckets, parse, scrape_text

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]

PP, TG, RUNS = 256, 32, 3  # counts do not depend on the size: small enough to take seconds
LEVELS = [1, 4]


def delta(before: dict, after: dict, name: str) -> float:
    return after[name] - before[name]


def smallest_bounds(before: dict, after: dict, name: str) -> tuple[float, float]:
    """The bucket the smallest new observation of histogram `name` fell in."""
    lower = 0.0
    for le in sorted(after[name]):
        if after[name][le] - before[name].get(le, 0.0) >= 1:
            return lower, le
        lower = le
    raise AssertionError(f"no new observation in {name}")


def sweep_level(server, tmp_path, c: int) -> dict:
    results = tmp_path / f"results-c{c}"
    r = subprocess.run(
        [*pinned(CLIENT_CPUS), sys.executable, "-m", "sparktop", "sweep", "--endpoint", server.url + "/v1",
         "--tokenizer", str(server.model / "tokenizer.json"), "--pp", str(PP), "--tg", str(TG), "-c", str(c),
         "--runs", str(RUNS), "--exact-tg", "--no-warmup", "--json", "--results", str(results)],
        capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (run_dir,) = results.iterdir()
    (level,) = [lv.as_dict() for lv in load_run(run_dir).levels()]
    return level


def test_the_sweep_counts_the_requests_and_tokens_vllm_counted(vllm_server, tmp_path):
    for c in LEVELS:
        text_before = scrape_text(vllm_server.url)
        ours = sweep_level(vllm_server, tmp_path, c)
        text_after = scrape_text(vllm_server.url)
        before, after = parse(text_before), parse(text_after)
        hb, ha = buckets(text_before), buckets(text_after)
        n = delta(before, after, "vllm:time_to_first_token_seconds_count") - 1  # less the calibration
        assert n == c * RUNS == ours["requests"], f"c{c}: the server saw {n} requests, the sweep {ours['requests']}"
        assert ours["errors"] == 0
        assert delta(before, after, "vllm:request_success_total") == n + 1
        # Every request of the level generated TG tokens, the calibration one.
        gen = delta(before, after, "vllm:request_generation_tokens_sum") - 1
        assert gen == n * TG == delta(before, after, "vllm:generation_tokens_total") - 1, \
            f"c{c}: the server generated {gen} tokens for {n} requests of {TG}"
        # The prompts, less the calibration's (somewhere in its histogram bucket).
        p_lo, p_hi = smallest_bounds(hb, ha, "vllm:request_prompt_tokens")
        prompt_sum = delta(before, after, "vllm:request_prompt_tokens_sum")
        assert prompt_sum == delta(before, after, "vllm:prompt_tokens_total")
        prompt = ((prompt_sum - p_hi) / n, (prompt_sum - p_lo) / n)
        assert prompt[0] <= PP <= prompt[1] + 1, f"c{c}: prompts of {prompt} tokens for --pp {PP}"
        # What the sweep measured of them is there (its values are a benchmark's, not this test's).
        assert all(ours[k] and ours[k] > 0 for k in ("ttft_ms_mean", "tg_tps_req", "pp_tps_req", "tg_tps_total")), \
            ours
