"""Parsers on real outputs captured on Spark nodes and in public docs and
issues (tests/fixtures/SOURCES.md and captures/INDEX.md say where each came
from)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sparktop.observe import hostparse
from sparktop.observe.engine_log import startup_state
from sparktop.observe.engines.vllm import NAMES as VLLM
from sparktop.observe.prometheus import EngineMetrics, MetricsError, Scrape, quantile

FIX = Path(__file__).resolve().parents[1] / "fixtures"
CAP = FIX / "captures"


def cap(name: str) -> str:
    return (CAP / name).read_text()


# -- memory ---------------------------------------------------------------------


def test_meminfo_used_is_total_minus_available():
    text = "MemTotal:       125441420 kB\nMemFree:         1000000 kB\nMemAvailable:   31694677 kB\n" \
           "Buffers:           95000 kB\nCached:         33204924 kB\nSwapTotal:      16777212 kB\n" \
           "SwapFree:       16777212 kB\n"
    mem = hostparse.parse_meminfo(text)
    assert mem.used == (125441420 - 31694677) * 1024
    assert mem.page_cache == (95000 + 33204924) * 1024


def test_meminfo_without_memavailable_estimates_it():
    mem = hostparse.parse_meminfo("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\nCached: 200 kB\n")
    assert mem.available == 350 * 1024


def test_cpu_percent_from_proc_stat_deltas():
    a = hostparse.parse_proc_stat_cpu("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    b = hostparse.parse_proc_stat_cpu("cpu  150 0 150 900 0 0 0 0 0 0\n")
    assert hostparse.cpu_percent(a, b) == pytest.approx(50.0)
    assert hostparse.cpu_percent(None, b) is None


# -- nvidia-smi -----------------------------------------------------------------


def test_gb10_csv_memory_is_na_and_util_is_read():
    # jethac: --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits
    rows = hostparse.parse_csv_query(cap("nvidia-smi_gb10_csv_name-memused-memtotal-util_noheader-nounits_util91_jethac.csv"),  # noqa: E501
                                     ["name", "memory.used", "memory.total", "utilization.gpu"])
    assert rows == [{"name": "NVIDIA GB10", "memory.used": None, "memory.total": None, "utilization.gpu": "91"}]


def test_gb10_csv_with_units_keeps_the_number():
    # jethac: utilization "96 %" because nounits was not given
    gpu = hostparse.parse_gpu_query(cap("nvidia-smi_gb10_csv_name-cc-driver-util_noheader_util96_during-vllm_jethac.csv"),  # noqa: E501
                                    ("name", "compute_cap", "driver_version", "utilization.gpu"))
    assert gpu.name == "NVIDIA GB10" and gpu.util == 96.0


def test_gb10_memory_total_na():
    rows = hostparse.parse_csv_query(cap("nvidia-smi_gb10_csv_name-cc-driver-memtotal_noheader_jethac.csv"),
                                     ["name", "compute_cap", "driver_version", "memory.total"])
    assert rows[0]["memory.total"] is None and rows[0]["compute_cap"] == "12.1"


def test_compute_apps_csv_with_and_without_units():
    assert [(p.pid, p.name, p.used_mib) for p in hostparse.parse_compute_apps(
        "577729, VLLM::EngineCore, 89093\n")] == [(577729, "VLLM::EngineCore", 89093)]
    with_units = "pid, process_name, used_gpu_memory [MiB]\n577729, VLLM::EngineCore, 89093 MiB\n"
    assert hostparse.parse_compute_apps(with_units)[0].used_mib == 89093
    assert hostparse.parse_compute_apps("1, ray::Worker, [N/A]\n")[0].used_mib is None
    assert hostparse.parse_compute_apps("") == []


def test_gpu_query_with_na_fields():
    gpu = hostparse.parse_gpu_query("96, 62, [N/A], 2405, P0\n")
    assert (gpu.util, gpu.temp, gpu.power, gpu.sm_clock, gpu.pstate) == (96.0, 62.0, None, 2405.0, "P0")
    gpu = hostparse.parse_gpu_query("[N/A], N/A, Not Supported, [N/A], P8\n")
    assert gpu.util is None and gpu.temp is None and gpu.pstate == "P8"


# -- docker ---------------------------------------------------------------------


def test_docker_ps_json_from_the_docker_docs():
    # docker/cli docs: `docker ps --format json`
    (c,) = hostparse.parse_docker_ps(cap("docker-ps_format-json_nginx_docker-cli-docs.jsonl"))
    assert (c.name, c.image, c.state, c.status, c.id) == ("boring_keldysh", "nginx", "running", "Up 3 seconds",
                                                          "a762a2b37a1d")
    assert c.command == "/docker-entrypoint.…"
    assert c.labels == {"maintainer": "NGINX Docker Maintainers <docker-maint@nginx.com>"}


def test_docker_ps_skips_noise():
    assert hostparse.parse_docker_ps("permission denied while trying to connect\n\n") == []


# -- vLLM /metrics ---------------------------------------------------------------


def test_spark_metrics_excerpt_without_type_lines():
    # kreuzhofer/dgx-manager fixture: vLLM 0.22.1rc1 on a Spark, grep-filtered, no HELP/TYPE
    s = Scrape.parse(cap("metrics_vllm-v0.22.1rc1_dgx-spark_grep-excerpt_dgx-manager.txt"), 0, VLLM)
    assert s.engine_seen
    assert s.total(("vllm:num_requests_running",)) == 0
    assert s.total(("vllm:num_requests_waiting",)) == 0  # not mixed with _by_reason
    assert s.mean(("vllm:kv_cache_usage_perc",)) == 0
    # `_created` in e+09 notation parses; the monitor keeps it only for the token counters.
    whole = Scrape.parse(cap("metrics_vllm-v0.22.1rc1_dgx-spark_grep-excerpt_dgx-manager.txt"), 0)
    assert whole.created(("vllm:num_preemptions_total",)) == pytest.approx(1.781276629357662e9)


def test_v0_metrics_legacy_names_and_a_truncated_histogram():
    text = (FIX / "metrics" / "vllm-v0_qwen2.5-coder-1.5b_aibrix-docs.txt").read_text()
    s = Scrape.parse(text, 0, VLLM)
    d = EngineMetrics(VLLM).add(s)
    assert d.kv_usage == 0.0  # from vllm:gpu_cache_usage_perc
    assert d.prefix_hit_rate is None  # -1 means "not measured"
    assert d.requests == 4 and d.preemptions == 0
    assert s.total(("vllm:generation_tokens_total",)) == 955
    # The monitor skips series it does not show; parsed whole, the truncated histogram still reads.
    assert s.histogram(("vllm:iteration_tokens_total",)) is None
    whole = Scrape.parse(text, 0)
    assert whole.histogram(("vllm:iteration_tokens_total",))[96.0] == 998


def test_v0_10_metrics_prefer_v1_names_over_deprecated_ones():
    s = Scrape.parse((FIX / "metrics" / "vllm-v0.10.0_glm-4.5_production-stack-issue-617.txt").read_text(), 0, VLLM)
    assert s.mean(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")) == pytest.approx(9.75010481363281e-06)
    assert s.total(("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")) == 32


def test_sglang_metrics_are_not_mistaken_for_vllm():
    # sgl-project/sglang docs: SGLang /metrics, histogram _sum before buckets
    s = Scrape.parse(cap("metrics_sglang_llama3.1-8b_sglang-docs.txt"), 0, VLLM)
    assert not s.engine_seen
    assert EngineMetrics(VLLM).add(s).kv_usage is None


def test_garbage_metrics_raise_a_clear_error():
    with pytest.raises(MetricsError):
        Scrape.parse('vllm:num_requests_running{model_name="a" 1\n', 0, VLLM)


def scrape(t, gen, prompt=0.0, created=1000.0, ttft=None, kv=0.5, nan=False):
    lines = [
        "# TYPE vllm:generation_tokens_total counter",
        f'vllm:generation_tokens_total{{model_name="m",engine="0"}} {gen}',
        "# TYPE vllm:generation_tokens_created gauge",
        f'vllm:generation_tokens_created{{engine="0",model_name="m"}} {created}',
        f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {prompt}',
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {"NaN" if nan else kv}',
    ]
    for le, count in (ttft or {}).items():
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",engine="0",model_name="m"}} {count}')
    return Scrape.parse("\n".join(lines) + "\n", t, VLLM)


def test_rates_from_counter_deltas_and_label_order_does_not_matter():
    m = EngineMetrics(VLLM)
    assert m.add(scrape(0, 1000, 5000)).gen_tps is None  # no rate from one scrape
    d = m.add(scrape(2, 1400, 9000))
    assert d.gen_tps == pytest.approx(200) and d.prompt_tps == pytest.approx(2000)


def test_counter_reset_on_restart_never_gives_a_negative_rate():
    m = EngineMetrics(VLLM)
    m.add(scrape(0, 50_000))
    d = m.add(scrape(1, 120, created=2000.0))  # restarted: counter back near zero
    assert d.gen_tps == pytest.approx(120)
    d = m.add(scrape(2, 320, created=2000.0))
    assert d.gen_tps == pytest.approx(200)


def test_nan_is_no_value():
    assert EngineMetrics(VLLM).add(scrape(0, 1, nan=True)).kv_usage is None


def test_percentiles_carry_over_scrapes_without_histograms():
    m = EngineMetrics(VLLM, window=30)
    m.add(scrape(0, 0, ttft={"0.1": 100, "0.5": 100, "1.0": 100, "+Inf": 100}))
    d = m.add(scrape(5, 0, ttft={"0.1": 100, "0.5": 150, "1.0": 200, "+Inf": 200}))
    light = Scrape.parse('vllm:generation_tokens_total{model_name="m"} 5\n', 6, VLLM, histograms=False)
    assert m.add(light).ttft_p50 == d.ttft_p50 == pytest.approx(0.5)


def test_percentiles_come_from_bucket_deltas_over_the_window():
    m = EngineMetrics(VLLM, window=30)
    old = {"0.1": 100, "0.5": 100, "1.0": 100, "+Inf": 100}  # 100 fast requests long ago
    m.add(scrape(0, 0, ttft=old))
    new = {"0.1": 100, "0.5": 150, "1.0": 200, "+Inf": 200}  # then 50 in (0.1,0.5], 50 in (0.5,1]
    d = m.add(scrape(10, 0, ttft=new))
    assert d.ttft_p50 == pytest.approx(0.5)
    assert d.ttft_p95 == pytest.approx(0.95)


def test_quantile_edge_cases():
    assert quantile(0.5, {}) is None
    assert quantile(0.5, {1.0: 0, math.inf: 0}) is None
    assert quantile(0.99, {1.0: 0, 2.0: 0, math.inf: 10}) == 2.0  # all above the last bound


# -- vLLM logs --------------------------------------------------------------------


def test_startup_stages_of_a_real_spark_log():
    lines = cap("vllm-startup_spark-solo_v0.20.0_gemma4-26b-bf16_jethac.log").splitlines()
    cut = next(i for i, line in enumerate(lines) if "Loading weights took" in line)
    assert startup_state(lines[:cut - 2]).stage == "loading weights"
    kv = next(i for i, line in enumerate(lines) if "GPU KV cache size" in line)
    state = startup_state(lines[: kv + 1])
    assert state.stage == "kv cache" and state.kv_tokens == 177440 and state.weights_gib == 48.5
    final = startup_state(lines)
    assert final.stage == "ready" and not final.failed


def test_a_log_without_the_uvicorn_line_is_still_ready():
    lines = cap("vllm-startup_spark-solo_v0.19.2rc1_nemotron-super-120b-nvfp4_NO-uvicorn-startup-line_djangodevreng.log")  # noqa: E501
    assert startup_state(lines.splitlines()).stage == "ready"


def test_a_failed_start_says_why():
    lines = cap("vllm-startup_spark-solo_v0.20.0_FAILED-valueerror_jethac.log").splitlines()
    state = startup_state(lines)
    assert state.failed
    assert state.reason.startswith("ValueError: Chunked MM input disabled")


def test_a_failed_start_names_the_engine_cores_error_not_the_api_servers_wrapper():
    # vLLM 0.32 (CPU build, recorded here): the EngineCore logs the ValueError at ERROR level, then
    # the API server's traceback ends with "RuntimeError: Engine core initialization failed. See root
    # cause above." The cause is the first.
    path = Path(__file__).parents[1] / "fixtures/vllm-logs/vllm-0.32.0-cpu_startup-failed_kv-cache-too-small.log"
    state = startup_state(path.read_text().splitlines())
    assert state.failed and state.stage == "memory profiling"
    assert state.reason.startswith("ValueError: To serve at least one request with the model's max seq len (2048)")


def test_a_dev_build_log():
    state = startup_state(cap("vllm-startup_spark-solo_dev-build-0.1.dev1_gemma4-12b_jethac.log").splitlines())
    assert state.stage == "ready" and state.kv_tokens == 336566


def test_a_failing_docker_is_said_in_a_few_words():
    # The CLI's own sentences (docker 27, no daemon; a user outside the docker group).
    assert hostparse.docker_problem(
        "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?", 1) \
        == "not running"
    assert hostparse.docker_problem(
        "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: "
        "Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.47/containers/json\": dial unix /var/run/docker.sock: "
        "connect: permission denied", 1) == "permission denied"
    assert hostparse.docker_problem("", 125) == "docker exited 125"
    odd = hostparse.docker_problem("Error response from daemon: something nobody has seen before, at length", 1)
    assert odd.startswith("something nobody") and len(odd) <= 40
