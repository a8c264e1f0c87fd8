"""The series vLLM 0.32 added to /metrics, read from what a real vLLM 0.32.0
served (tests/fixtures/vllm-0.32.0) and from copies of it changed the way a
busy GPU server would change them: requests waiting by reason, admission
rejections, the sleep state, and vLLM's estimate of the bytes each GPU reads
and writes. Older outputs keep every new figure at None."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparktop.observe.engines.vllm import NAMES as VLLM
from sparktop.observe.prometheus import EngineMetrics, Scrape, relevant_lines
from sparktop.observe.snapshot import EngineSnapshot
from sparktop.status import engine_json

FIX = Path(__file__).resolve().parents[1] / "fixtures"
V032 = FIX / "vllm-0.32.0"
OLDER = [*sorted((FIX / "metrics").glob("*.txt")), *sorted((FIX / "captures").glob("metrics_*"))]
NEW_FIELDS = ("waiting_by_reason", "rejections", "rejections_by_reason", "rejection_rate", "rejections_recent",
              "rejections_span", "sleeping", "sleep_level", "mem_read_bps", "mem_write_bps")


def real(name: str = "metrics-after.txt") -> str:
    return (V032 / name).read_text()


def with_values(text: str, changes: dict[tuple[str, str], float]) -> str:
    """`text` with the value of each sample named `name` whose labels contain
    `label` (e.g. 'reason="deferred"') set: the real scrape, other figures."""
    for (name, label), value in changes.items():
        pattern = re.compile(rf"^({re.escape(name)}\{{[^}}\n]*{re.escape(label)}[^}}\n]*\}}) \S+$", re.M)
        text, count = pattern.subn(lambda m, value=value: f"{m.group(1)} {value!r}", text)
        assert count, (name, label)
    return text


def sleeping(level: int | None, text: str | None = None) -> str:
    """An engine put to sleep (POST /sleep?level=N), or one whose KV cache
    only was released (level None: awake 0 and neither level set)."""
    return with_values(text or real(), {
        ("vllm:engine_sleep_state", 'sleep_state="awake"'): 0.0,
        ("vllm:engine_sleep_state", 'sleep_state="weights_offloaded"'): 1.0 if level == 1 else 0.0,
        ("vllm:engine_sleep_state", 'sleep_state="discard_all"'): 1.0 if level == 2 else 0.0,
    })


def busy(t: float, *, capacity: float = 1, deferred: float = 2, rejected_reqs: float = 0, rejected_tokens: float = 0,
         read: float = 0.0, write: float = 0.0, text: str | None = None) -> str:
    """The real scrape with a queue, rejections and estimated bytes: counters
    grow at the given rates per second, `t` seconds in."""
    return with_values(text or real(), {
        ("vllm:num_requests_waiting", 'engine="0"'): float(capacity + deferred),
        ("vllm:num_requests_waiting_by_reason", 'reason="capacity"'): float(capacity),
        ("vllm:num_requests_waiting_by_reason", 'reason="deferred"'): float(deferred),
        ("vllm:admission_rejections_total", 'reason="max_num_queued_reqs"'): float(rejected_reqs * t),
        ("vllm:admission_rejections_total", 'reason="max_num_queued_tokens"'): float(rejected_tokens * t),
        ("vllm:estimated_read_bytes_per_gpu_total", 'engine="0"'): 1e12 + read * t,
        ("vllm:estimated_write_bytes_per_gpu_total", 'engine="0"'): 1e11 + write * t,
    })


def derive(*texts: str, step: float = 1.0, **kw):
    m = EngineMetrics(VLLM, **kw)
    out = None
    for i, text in enumerate(texts):
        out = m.add(Scrape.parse(text, i * step, VLLM))
    return out


# -- the real vLLM 0.32.0 output ------------------------------------------------------


@pytest.mark.parametrize("name", ["metrics-idle.txt", "metrics-after.txt"])
def test_real_032_output_awake_nothing_waiting_nothing_rejected_no_bandwidth(name):
    d = derive(real(name), real(name))
    assert d.waiting_by_reason == {"capacity": 0.0, "deferred": 0.0}
    assert sum(d.waiting_by_reason.values()) == d.waiting == 0
    assert d.rejections == 0 and d.rejections_by_reason == {"max_num_queued_reqs": 0.0, "max_num_queued_tokens": 0.0}
    assert d.rejection_rate == 0 and d.rejections_recent == 0
    assert d.sleeping is False and d.sleep_level is None
    # The CPU build does not estimate bytes: the counters stay 0, and 0 GB/s would mean nothing.
    assert d.mem_read_bps is None and d.mem_write_bps is None


@pytest.mark.parametrize("path", OLDER, ids=[p.name for p in OLDER])
def test_older_outputs_leave_the_new_figures_at_none(path):
    text = path.read_text()
    d = derive(text, text)
    expected_none = set(NEW_FIELDS)
    if "num_requests_waiting_by_reason" in text:  # vLLM 0.22 already had this one
        expected_none.discard("waiting_by_reason")
        assert sum(d.waiting_by_reason.values()) == d.waiting
    assert {f: getattr(d, f) for f in expected_none} == dict.fromkeys(expected_none)


def test_the_filter_keeps_the_new_series_and_nothing_more():
    kept = relevant_lines(real(), VLLM)
    for name in ("vllm:num_requests_waiting_by_reason{", "vllm:admission_rejections_total{",
                 "vllm:engine_sleep_state{", "vllm:estimated_read_bytes_per_gpu_total{",
                 "vllm:estimated_write_bytes_per_gpu_total{"):
        assert name in kept, name
    assert "vllm:admission_rejections_created" not in kept  # restarts are seen on the token counters
    assert "vllm:estimated_flops_per_gpu" not in kept  # not shown
    assert "vllm:estimated_read_bytes_per_gpu_created" not in kept
    # The cheap poll without histograms keeps them too.
    assert kept.count("\n") - relevant_lines(real(), VLLM, histograms=False).count("\n") > 0
    assert "vllm:engine_sleep_state{" in relevant_lines(real(), VLLM, histograms=False)
    # num_requests_waiting is still read alone, not summed with its breakdown.
    assert Scrape.parse(busy(0), 0, VLLM).total(("vllm:num_requests_waiting",)) == 3


# -- sleep -----------------------------------------------------------------------------


@pytest.mark.parametrize(("level", "expected"), [(1, 1), (2, 2), (None, None)])
def test_a_sleeping_engine_and_its_level(level, expected):
    d = derive(sleeping(level))
    assert d.sleeping is True and d.sleep_level == expected


def test_data_parallel_engines_report_the_deepest_sleep():
    text = real()
    second = "\n".join(line.replace('engine="0"', 'engine="1"') for line in text.splitlines()
                       if line.startswith("vllm:engine_sleep_state{"))
    both = text + second + "\n"
    assert Scrape.parse(both, 0, VLLM).sleep(VLLM.sleep_state) == (False, None)
    engine_1 = 'engine="1",model_name="tiny-llama",sleep_state='
    one_asleep = with_values(both, {("vllm:engine_sleep_state", engine_1 + '"awake"'): 0,
                                    ("vllm:engine_sleep_state", engine_1 + '"discard_all"'): 1})
    assert Scrape.parse(one_asleep, 0, VLLM).sleep(VLLM.sleep_state) == (True, 2)


def test_nan_sleep_state_is_no_value():
    text = with_values(real(), {("vllm:engine_sleep_state", 'sleep_state="awake"'): float("nan"),
                                ("vllm:engine_sleep_state", 'sleep_state="weights_offloaded"'): float("nan"),
                                ("vllm:engine_sleep_state", 'sleep_state="discard_all"'): float("nan")})
    assert derive(text).sleeping is None


# -- waiting by reason -----------------------------------------------------------------


def test_waiting_by_reason_sums_to_waiting():
    d = derive(busy(0, capacity=1, deferred=2))
    assert d.waiting == 3 and d.waiting_by_reason == {"capacity": 1.0, "deferred": 2.0}


# -- admission rejections --------------------------------------------------------------


def test_rejections_give_a_rate_a_recent_count_and_a_total_by_reason():
    m = EngineMetrics(VLLM, window=30, rate_window=5)
    first = m.add(Scrape.parse(busy(0, rejected_reqs=1.5, rejected_tokens=0.5), 0, VLLM))
    assert first.rejection_rate is None and first.rejections_recent is None  # one scrape: nothing is recent yet
    d = m.add(Scrape.parse(busy(2, rejected_reqs=1.5, rejected_tokens=0.5), 2, VLLM))
    assert d.rejection_rate == pytest.approx(2.0) and d.rejections_recent == pytest.approx(4)
    assert d.rejections_span == 2  # watched for 2 s so far: the count says over how long
    assert d.rejections == pytest.approx(4) and d.rejections_by_reason == {"max_num_queued_reqs": 3.0,
                                                                           "max_num_queued_tokens": 1.0}
    # They stop: the rate falls to 0 at once, the count stays for the window.
    d = m.add(Scrape.parse(busy(2, rejected_reqs=1.5, rejected_tokens=0.5), 10, VLLM))
    assert d.rejection_rate == 0 and d.rejections_recent == pytest.approx(4)
    d = m.add(Scrape.parse(busy(2, rejected_reqs=1.5, rejected_tokens=0.5), 40, VLLM))
    assert d.rejections_recent == 0 and d.rejections == pytest.approx(4) and d.rejections_span == 30


def test_rejections_after_a_restart_are_never_negative():
    m = EngineMetrics(VLLM)
    m.add(Scrape.parse(busy(100, rejected_reqs=1), 0, VLLM))
    restarted = with_values(busy(1, rejected_reqs=1), {("vllm:generation_tokens_created", 'engine="0"'): 2e9})
    d = m.add(Scrape.parse(restarted, 1, VLLM))
    assert d.rejection_rate == pytest.approx(1.0)  # everything since the restart is new


# -- bandwidth ---------------------------------------------------------------------------


def test_bandwidth_is_read_plus_write_bytes_per_second_between_scrapes():
    d = derive(busy(0, read=150e9, write=30e9), busy(2, read=150e9, write=30e9), step=2)
    assert d.mem_read_bps == pytest.approx(150e9) and d.mem_write_bps == pytest.approx(30e9)


def test_bandwidth_without_movement_is_no_figure():
    d = derive(busy(0), busy(0), step=2)  # nonzero counters that did not move: an idle GPU
    assert d.mem_read_bps is None and d.mem_write_bps is None


def test_bandwidth_per_gpu_is_the_mean_over_data_parallel_engines():
    def dp(t):  # engine 0 reads 100 GB/s on its GPU, engine 1 300 GB/s on another
        return busy(t, read=100e9) + ('vllm:estimated_read_bytes_per_gpu_total{engine="1",model_name="tiny-llama"} '
                                      f"{1e12 + 300e9 * t!r}\n")

    d = derive(dp(0), dp(1))
    assert d.mem_read_bps == pytest.approx(200e9)


# -- status --json ----------------------------------------------------------------------


def snapshot_of(*texts: str, state: str = "ready") -> EngineSnapshot:
    d = derive(*texts, step=2)
    return EngineSnapshot(key="u", url="http://127.0.0.1:8000", t=0, state=state, model="tiny-llama",
                          waiting=d.waiting, waiting_by_reason=d.waiting_by_reason, rejections=d.rejections,
                          rejections_by_reason=d.rejections_by_reason, rejection_rate=d.rejection_rate,
                          rejections_recent=d.rejections_recent, rejections_span=d.rejections_span,
                          sleep_level=d.sleep_level,
                          mem_read_bps=d.mem_read_bps, mem_write_bps=d.mem_write_bps)


def test_status_json_has_the_new_figures():
    busy_json = engine_json(snapshot_of(busy(0, rejected_reqs=1, read=150e9, write=30e9),
                                        busy(2, rejected_reqs=1, read=150e9, write=30e9)))
    assert busy_json["waiting_by_reason"] == {"capacity": 1.0, "deferred": 2.0}
    assert busy_json["admission_rejections"] == 2 and busy_json["admission_rejection_rate"] == 1.0
    assert busy_json["admission_rejections_recent"] == 2 and busy_json["admission_rejections_recent_s"] == 2
    assert busy_json["admission_rejections_by_reason"] == {"max_num_queued_reqs": 2.0, "max_num_queued_tokens": 0.0}
    assert (busy_json["mem_bw_gbs"], busy_json["mem_read_gbs"], busy_json["mem_write_gbs"]) == (180.0, 150.0, 30.0)
    assert busy_json["sleep_level"] is None
    asleep = engine_json(snapshot_of(sleeping(2), state="sleeping"))
    assert asleep["state"] == "sleeping" and asleep["sleep_level"] == 2


def test_status_json_from_an_older_engine_has_them_as_null():
    old = engine_json(EngineSnapshot(key="u", url="http://a:8000", t=0, state="ready", waiting=0))
    for key in ("sleep_level", "waiting_by_reason", "admission_rejections", "admission_rejections_by_reason",
                "admission_rejection_rate", "admission_rejections_recent", "admission_rejections_recent_s",
                "mem_bw_gbs", "mem_read_gbs", "mem_write_gbs"):
        assert old[key] is None, key


def _uncached(text: str, histograms: bool) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {}
    for family in text_string_to_metric_families(relevant_lines(text, VLLM, histograms)):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


@pytest.mark.parametrize("histograms", [True, False])
def test_lines_parsed_before_are_reused_and_read_the_same(histograms, monkeypatch):
    """A scrape reuses the samples of lines it has seen (most lines of the next
    scrape), and what it reads is what prometheus-client reads from the whole
    text: on vLLM's own output, and on a copy whose counters moved."""
    from sparktop.observe import prometheus as vllm_metrics

    monkeypatch.setattr(vllm_metrics, "_LINE_CACHE", {})
    before, after = real("metrics-idle.txt"), real()
    first = Scrape.parse(before, 0.0, VLLM, histograms=histograms)
    assert first.samples == _uncached(before, histograms)
    parsed = []
    real_parser = vllm_metrics.text_string_to_metric_families
    monkeypatch.setattr(vllm_metrics, "text_string_to_metric_families",
                        lambda text: parsed.append(text.count("\n")) or real_parser(text))
    again = Scrape.parse(before, 1.0, VLLM, histograms=histograms)
    assert again.samples == first.samples and parsed == []  # nothing parsed twice
    later = Scrape.parse(after, 2.0, VLLM, histograms=histograms)
    assert later.samples == _uncached(after, histograms)
    changed = set(relevant_lines(after, VLLM, histograms).splitlines()) - set(
        relevant_lines(before, VLLM, histograms).splitlines())
    assert parsed == [len(changed)]  # only the lines that changed went to the parser


def test_a_full_line_cache_starts_afresh_and_still_reads_right(monkeypatch):
    from sparktop.observe import prometheus as vllm_metrics

    monkeypatch.setattr(vllm_metrics, "_LINE_CACHE", {})
    monkeypatch.setattr(vllm_metrics, "_LINE_CACHE_MAX", 10)  # fewer than one scrape's lines
    for name in ("metrics-idle.txt", "metrics-after.txt", "metrics-idle.txt"):
        assert Scrape.parse(real(name), 0.0, VLLM).samples == _uncached(real(name), True)
        assert len(vllm_metrics._LINE_CACHE) <= len(relevant_lines(real(name), VLLM).splitlines())


def test_a_bad_line_is_still_a_metrics_error():
    from sparktop.observe.prometheus import MetricsError

    with pytest.raises(MetricsError):
        Scrape.parse('vllm:num_requests_running{engine="0"} not-a-number\n', 0.0, VLLM)
