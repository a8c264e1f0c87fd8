"""The Prometheus exporter as a Prometheus user meets it: a cluster state filled by a recorded session of
two engines on two nodes (tests/fixtures/recording-engines-2.jsonl), with a last poll of each node that
adds what the recording lacks (a cabled ConnectX-7 link read from a real Spark's `ip -br addr`, the DMI
strings of a DGX Spark, an nvidia-smi clock event mask), exported, parsed back by prometheus-client's
own parser, and each figure checked against the snapshot it came from, in base units and with the
labels a query would use."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from sparktop.errors import SparktopError
from sparktop.history.exporter import (
    ENV_TOKEN,
    METRICS,
    TOKEN_FILE,
    parse_listen,
    registry_for,
    resolve_metrics_token,
    scrape_config,
)
from sparktop.observe.fabric import parse_ip_br_addr
from sparktop.observe.linkparse import LinkRate
from sparktop.observe.machine import THROTTLE_REASONS, identify, throttle_reasons
from sparktop.observe.record import Recording
from sparktop.observe.snapshot import EngineSnapshot, Memory, NodeSnapshot
from sparktop.observe.state import ClusterState

FIXTURES = Path(__file__).parent.parent / "fixtures"
DASHBOARD = Path(__file__).parent.parent.parent / "docs" / "grafana" / "sparktop-dashboard.json"
VLLM = "http://127.0.0.2:8000"  # the recording's vLLM, on spark-a
LLAMA = "http://127.0.0.3:8000"  # its llama.cpp, on spark-b
# A Spark's QSFP port is two RDMA devices (halves); the inner port is down.
HALVES = {"enp1s0f1np1": "rocep1s0f1", "enP2p1s0f1np1": "roceP2p1s0f1"}
# Gb/s (rx, tx) per half: what one node sends the other receives, so the pairs verify.
SENDS = {"spark-a": {"enp1s0f1np1": (4.0, 5.0), "enP2p1s0f1np1": (4.1, 5.1)},
         "spark-b": {"enp1s0f1np1": (5.0, 4.0), "enP2p1s0f1np1": (5.1, 4.1)}}
CAPTURES = {"spark-a": "ip-br-addr_dgx-spark-starsky_code-monkeys.txt",
            "spark-b": "ip-br-addr_dgx-spark-hutch_code-monkeys.txt"}


def recorded() -> ClusterState:
    state = ClusterState()
    for _, event in Recording.load(FIXTURES / "recording-engines-2.jsonl").rows:
        state.apply(event)
    return state


def populated(price_per_kwh: float | None = None) -> tuple[ClusterState, str]:
    """The recorded state with one more poll of each node, and its /metrics text."""
    state = recorded()
    for name in ("spark-a", "spark-b"):
        snap = copy.deepcopy(state.nodes[name])
        snap.t += 1.0
        interfaces = parse_ip_br_addr((FIXTURES / "fabric" / CAPTURES[name]).read_text())
        snap.links = [LinkRate(dev, net, True, 200000, "ethtool", *SENDS[name][net], 0.02, 0.01, 1.0)
                      for net, dev in HALVES.items()]
        snap.links.append(LinkRate("rocep1s0f0", "enp1s0f0np0", False, None, "ethtool", None, None, None, None, 1.0))
        snap.addresses = {net: interfaces[net].addresses for net in HALVES}
        snap.machine = identify("NVIDIA", "NVIDIA_DGX_Spark", "DGX Spark")
        assert snap.gpu is not None
        snap.gpu.throttle = throttle_reasons("0x0000000000000004")  # power cap
        state.apply(snap)
    return state, export(state, price_per_kwh)


def export(state: ClusterState, price_per_kwh: float | None = None) -> str:
    return generate_latest(registry_for(state, price_per_kwh=price_per_kwh, currency="EUR")).decode()


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)], as Prometheus stores them."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(text: str, metric: str, /, **labels: str) -> float:
    """The one sample of `metric` with these labels (among others)."""
    found = [v for got, v in samples(text).get(metric, []) if all(got.get(k) == x for k, x in labels.items())]
    assert len(found) == 1, f"{metric}{labels}: {len(found)} samples"
    return found[0]


@pytest.fixture(scope="module")
def exported() -> tuple[ClusterState, str]:
    return populated(price_per_kwh=0.32)


# -- nodes ----------------------------------------------------------------------------------------------


def test_a_nodes_unified_memory_is_exported_in_bytes_as_its_snapshot_holds(exported):
    state, text = exported
    mem = state.nodes["spark-a"].memory
    assert mem is not None
    assert value(text, "sparktop_node_memory_available_bytes", node="spark-a") == mem.available
    assert value(text, "sparktop_node_memory_total_bytes", node="spark-a") == mem.total
    assert value(text, "sparktop_node_memory_used_bytes", node="spark-a") == mem.total - mem.available
    assert value(text, "sparktop_node_memory_used_ratio", node="spark-a") == pytest.approx(mem.used / mem.total)
    assert value(text, "sparktop_node_swap_total_bytes", node="spark-a") == mem.swap_total
    # The vLLM worker's 85729 MiB, as nvidia-smi lists it, in bytes, with its process name.
    process = state.nodes["spark-a"].processes[0]
    assert value(text, "sparktop_gpu_process_memory_bytes", node="spark-a", pid=str(process.pid),
                 process=process.name) == (process.used_mib or 0) * 1024**2
    assert value(text, "sparktop_node_up", node="spark-a") == 1
    assert value(text, "sparktop_node_state", node="spark-a", state="ok") == 1
    assert value(text, "sparktop_node_state", node="spark-a", state="down") == 0


def test_gpu_figures_are_in_base_units_and_clock_reasons_are_a_labelled_zero_or_one(exported):
    state, text = exported
    gpu = state.nodes["spark-b"].gpu
    assert gpu is not None and gpu.util is not None and gpu.sm_clock is not None
    assert value(text, "sparktop_gpu_utilization_ratio", node="spark-b") == pytest.approx(gpu.util / 100)
    assert value(text, "sparktop_gpu_sm_clock_hertz", node="spark-b") == gpu.sm_clock * 1e6
    assert value(text, "sparktop_gpu_power_watts", node="spark-b") == gpu.power
    assert value(text, "sparktop_gpu_temperature_celsius", node="spark-b") == gpu.temp
    assert value(text, "sparktop_gpu_performance_state", node="spark-b") == 0  # P0
    cpu = state.nodes["spark-b"].cpu_pct
    assert cpu is not None and value(text, "sparktop_node_cpu_usage_ratio", node="spark-b") == pytest.approx(cpu / 100)
    reasons = {labels["reason"]: v for labels, v in samples(text)["sparktop_gpu_throttle_reason"]
               if labels["node"] == "spark-b"}
    assert reasons == {r: float(r == "power cap") for r in THROTTLE_REASONS.values()}
    assert value(text, "sparktop_gpu_clock_limited", node="spark-b") == 1
    assert value(text, "sparktop_gpu_info", node="spark-b", name="NVIDIA GB10") == 1


def test_the_machine_from_dmi_is_an_info_metric(exported):
    _, text = exported
    assert value(text, "sparktop_node_machine_info", node="spark-a", vendor="NVIDIA", variant="DGX Spark",
                 gb10="true") == 1


def test_the_link_is_exported_per_port_in_bytes_per_second_with_the_port_it_reaches(exported):
    _, text = exported
    at = {"node": "spark-a", "port": "rocep1s0f1"}
    assert value(text, "sparktop_link_rdma_rx_bytes_per_second", **at) == 4.0e9 / 8
    assert value(text, "sparktop_link_rdma_tx_bytes_per_second", **at) == 5.0e9 / 8
    assert value(text, "sparktop_link_kernel_rx_bytes_per_second", **at) == pytest.approx(0.02e9 / 8)
    assert value(text, "sparktop_link_speed_bytes_per_second", **at) == 200e9 / 8
    assert value(text, "sparktop_link_up", **at) == 1
    assert value(text, "sparktop_link_info", **at, netdev="enp1s0f1np1", source="ethtool") == 1
    # Paired by the 169.254.0.0/16 both halves share, and verified by what one sends the other receives.
    assert value(text, "sparktop_link_peer_info", **at, peer_node="spark-b", peer_port="rocep1s0f1") == 1
    assert value(text, "sparktop_link_peer_verified", **at) == 1
    # Two halves of ~100 Gb/s each (PCIe Gen5 x4), whatever the port's 200 Gb/s says.
    assert value(text, "sparktop_node_link_capacity_bytes_per_second", node="spark-a") == 200e9 / 8
    assert value(text, "sparktop_node_link_warning", node="spark-a", kind="nccl_on_sockets") == 0
    # The inner port is down: up 0, and no rate it never measured.
    down = {"node": "spark-a", "port": "rocep1s0f0"}
    assert value(text, "sparktop_link_up", **down) == 0
    assert not [x for x in samples(text)["sparktop_link_rdma_rx_bytes_per_second"] if x[0] == down]


def test_the_links_byte_counters_are_prometheus_counters(tmp_path):
    """What `rate(sparktop_link_rdma_rx_bytes_total[1m])` needs: the NIC's counter itself, read by the real
    link script from a captured sysfs tree (port counters in 4-byte words), not a rate turned back into bytes."""
    from sparktop.observe.linkparse import link_rates, parse_link_section
    from tests.unit.test_linkparse import make_sys, run_link_script

    make_sys(tmp_path / "sys")
    (tmp_path / "empty").mkdir()
    counters = parse_link_section(run_link_script(tmp_path / "sys", tmp_path / "empty"))
    up = next(c for c in counters if c.up)
    assert up.rdma_rx_bytes  # the capture's counters are not zero
    state = ClusterState()
    state.apply(NodeSnapshot(name="spark-a", t=1.0, state="ok", links=link_rates(counters, 0.0, counters, 1.0)))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry_for(state)).decode())}
    for way in ("rdma_rx", "rdma_tx", "kernel_rx", "kernel_tx"):
        family = families[f"sparktop_link_{way}_bytes"]
        assert family.type == "counter"
        total = next(x for x in family.samples if x.labels["port"] == up.rdma_device and x.name.endswith("_total"))
        assert total.value == getattr(up, f"{way}_bytes")


# -- engines --------------------------------------------------------------------------------------------


def test_an_engines_figures_carry_its_url_and_model_and_its_kv_is_a_ratio(exported):
    state, text = exported
    e = state.engines[VLLM]
    at = {"engine": VLLM, "model": "gpt-oss-120b"}
    assert e.kv_usage is not None and 0 < e.kv_usage < 1
    assert value(text, "sparktop_engine_kv_cache_usage_ratio", **at) == e.kv_usage
    assert value(text, "sparktop_engine_generation_tokens_per_second", **at) == e.gen_tps
    assert value(text, "sparktop_engine_requests_running", **at) == e.running
    assert value(text, "sparktop_engine_requests_waiting_by_reason", **at, reason="capacity") == 0
    assert value(text, "sparktop_engine_prefix_cache_hit_ratio", **at) == e.prefix_hit_rate
    # Whether it is there and how, by its URL alone; what it serves and is, in its info.
    assert value(text, "sparktop_engine_up", engine=VLLM) == 1
    assert value(text, "sparktop_engine_state", engine=VLLM, state="ready") == 1
    assert value(text, "sparktop_engine_info", **at, kind="vllm", name="vLLM", version="0.32.0", topology="solo",
                 node="spark-a") == 1
    assert value(text, "sparktop_engine_node_info", engine=VLLM, node="spark-a") == 1


def test_counters_end_in_total_and_hold_the_engines_own_counts(exported):
    state, text = exported
    e = state.engines[VLLM]
    at = {"engine": VLLM, "model": "gpt-oss-120b"}
    counters = [f for f in text_string_to_metric_families(text) if f.type == "counter"]
    assert counters
    for family in counters:
        assert {s.name for s in family.samples} <= {family.name + "_total", family.name + "_created"}
    assert {name for name, (kind, _) in METRICS.items() if kind == "counter"} == {
        name for name in METRICS if name.endswith("_total")}
    assert value(text, "sparktop_engine_generation_tokens_total", **at) == e.gen_tokens_total
    assert value(text, "sparktop_engine_prompt_tokens_total", **at) == e.prompt_tokens_total
    assert value(text, "sparktop_engine_requests_finished_total", **at) == e.requests
    assert value(text, "sparktop_engine_requests_finished_by_reason_total", **at, reason="length") == 10
    # The engine's start is the counters' creation: a restart is a new `_created`, not a drop to read as a reset.
    assert value(text, "sparktop_engine_generation_tokens_created", **at) == e.started_at


def test_latency_percentiles_are_summaries_in_seconds_with_a_quantile_label(exported):
    state, text = exported
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("sparktop_engine_time_to_first_token_seconds", "sparktop_engine_inter_token_latency_seconds",
                 "sparktop_engine_queue_time_seconds", "sparktop_engine_e2e_request_latency_seconds"):
        assert families[name].type == "summary", name
    e = state.engines[VLLM]
    at = {"engine": VLLM, "model": "gpt-oss-120b"}
    assert value(text, "sparktop_engine_time_to_first_token_seconds", **at, quantile="0.95",
                 window="recent") == e.pct("ttft", "p95")
    assert value(text, "sparktop_engine_inter_token_latency_seconds", **at, quantile="0.5",
                 window="recent") == e.itl_p50
    assert value(text, "sparktop_engine_e2e_request_latency_seconds", **at, quantile="0.99",
                 window="recent") == e.pct("e2e", "p99")
    assert value(text, "sparktop_engine_queue_time_seconds", **at, quantile="0.95",
                 window="1m") == e.pct("queue", "p95_1m")


def test_energy_per_token_is_the_states_own_for_engines_and_nodes(exported):
    state, text = exported
    energy = state.engine_energy(state.engines[VLLM])
    assert energy is not None and energy.j_per_token is not None and energy.wh_per_million is not None
    at = {"engine": VLLM, "model": "gpt-oss-120b"}
    assert value(text, "sparktop_engine_energy_joules_per_token", **at) == pytest.approx(energy.j_per_token)
    assert value(text, "sparktop_engine_energy_cost_per_million_tokens", **at, currency="EUR") == pytest.approx(
        energy.wh_per_million / 1000 * 0.32)
    node = state.node_energy("spark-b")
    assert node is not None and node.j_per_token is not None
    assert value(text, "sparktop_node_energy_joules_per_token", node="spark-b") == pytest.approx(node.j_per_token)
    summary = state.summary()
    assert value(text, "sparktop_cluster_generation_tokens_per_second") == pytest.approx(summary.gen_tps)
    assert summary.j_per_token is not None
    assert value(text, "sparktop_cluster_energy_joules_per_token") == pytest.approx(summary.j_per_token)


def test_figures_an_engine_does_not_export_are_absent_not_zero(exported):
    state, text = exported
    llama = state.engines[LLAMA]
    assert "ttft" in llama.not_exported and llama.latency is None and llama.preemptions is None
    got = samples(text)
    for name in ("sparktop_engine_time_to_first_token_seconds", "sparktop_engine_preemptions_total",
                 "sparktop_engine_requests_finished_total", "sparktop_engine_requests_waiting_by_reason",
                 "sparktop_engine_spec_decode_acceptance_ratio"):
        assert not [labels for labels, _ in got.get(name, []) if labels["engine"] == LLAMA], name
    # ... and said to be missing, so a panel can tell "not exported" from "no data".
    missing = {labels["figure"] for labels, _ in got["sparktop_engine_figure_not_exported"]
               if labels["engine"] == LLAMA}
    assert missing == set(llama.not_exported)
    # Nobody speculates in this recording, and no price: no series at all, not zeros.
    assert "sparktop_engine_spec_decode_acceptance_ratio" not in got
    assert "sparktop_engine_energy_cost_per_million_tokens" not in samples(export(state))
    # llama.cpp's own figures are there.
    assert value(text, "sparktop_engine_slots", engine=LLAMA, model="gpt-oss-120b") == llama.slots


def test_a_node_that_reports_little_exports_only_what_it_reports():
    state = recorded()
    state.apply(NodeSnapshot(name="spark-x", t=state.now + 1, state="ok",
                             memory=Memory(total=128 * 1024**3, available=100 * 1024**3)))
    got = samples(export(state))
    assert value(export(state), "sparktop_node_memory_available_bytes", node="spark-x") == 100 * 1024**3
    for name in ("sparktop_node_cpu_usage_ratio", "sparktop_gpu_power_watts", "sparktop_gpu_utilization_ratio",
                 "sparktop_gpu_throttle_reason", "sparktop_node_poll_duration_seconds", "sparktop_gpu_ok",
                 "sparktop_node_machine_info", "sparktop_link_up"):
        assert not [labels for labels, _ in got.get(name, []) if labels.get("node") == "spark-x"], name


def test_an_engine_that_stopped_answering_keeps_its_state_but_not_its_last_figures():
    state = recorded()
    gone = copy.copy(state.engines[VLLM])  # as the poller re-emits it: the last good copy, another state
    gone.state, gone.reason, gone.t = "unreachable", "connection refused", gone.t + 5
    state.apply(gone)
    down = copy.deepcopy(state.nodes["spark-b"])
    down.state = "down"
    state.apply(down)
    text = export(state)
    assert value(text, "sparktop_engine_up", engine=VLLM) == 0
    assert value(text, "sparktop_engine_state", engine=VLLM, state="unreachable") == 1
    assert value(text, "sparktop_engine_state", engine=VLLM, state="ready") == 0
    # What it is, it said before it stopped answering: its info stays as it was.
    assert value(text, "sparktop_engine_info", engine=VLLM, model="gpt-oss-120b", version="0.32.0") == 1
    got = samples(text)
    for name in ("sparktop_engine_kv_cache_usage_ratio", "sparktop_engine_generation_tokens_per_second",
                 "sparktop_engine_generation_tokens_total", "sparktop_engine_energy_joules_per_token"):
        assert not [labels for labels, _ in got.get(name, []) if labels["engine"] == VLLM], name
    assert value(text, "sparktop_node_up", node="spark-b") == 0
    assert not [labels for labels, _ in got["sparktop_node_memory_available_bytes"] if labels["node"] == "spark-b"]
    # The other engine goes on.
    assert value(text, "sparktop_engine_up", engine=LLAMA) == 1


def test_a_sleeping_engine_says_its_level():
    state = recorded()
    asleep = copy.copy(state.engines[VLLM])
    asleep.state, asleep.sleep_level, asleep.t = "sleeping", 1, asleep.t + 1
    state.apply(asleep)
    text = export(state)
    assert value(text, "sparktop_engine_sleep_level", engine=VLLM, model="gpt-oss-120b") == 1
    assert value(text, "sparktop_engine_up", engine=VLLM) == 1


def test_an_engine_starting_is_one_series_and_its_info_comes_once_it_says_what_it_is():
    """An address given before its engine listens: there, by its URL alone, from the first poll; what it
    is (kind, name, version, model) is exported once it answers, in one info series whose label names are
    those of every other engine's."""
    state = recorded()
    url = "http://127.0.0.9:8000"
    t = state.now
    series: dict[str, set[tuple]] = {}

    def scrape() -> str:
        text = export(state)
        for name, found in samples(text).items():
            for labels, _ in found:
                if labels.get("engine") == url and name in ("sparktop_engine_up", "sparktop_engine_info"):
                    series.setdefault(name, set()).add(tuple(sorted(labels.items())))
        return text

    for step, how in enumerate(("connecting", "unreachable", "unreachable")):  # no model, no kind yet
        state.apply(EngineSnapshot(key=url, url=url, t=t + step, state=how, kind=""))
        text = scrape()
        assert value(text, "sparktop_engine_up", engine=url) == 0
        assert value(text, "sparktop_engine_state", engine=url, state=how) == 1
    assert "sparktop_engine_info" not in series
    ready = copy.deepcopy(state.engines[VLLM])
    ready.key = ready.url = url
    for step in range(3):
        ready.t = t + 10 + step
        state.apply(copy.deepcopy(ready))
        text = scrape()
    assert value(text, "sparktop_engine_up", engine=url) == 1
    assert len(series["sparktop_engine_up"]) == 1 and len(series["sparktop_engine_info"]) == 1
    (info,) = series["sparktop_engine_info"]
    assert dict(info) == {"engine": url, "model": "gpt-oss-120b", "kind": "vllm", "name": "vLLM",
                          "version": "0.32.0", "topology": "solo", "node": "spark-a", "container": "sparktop-vllm"}
    # Every engine's info has the same label names, known or not.
    names = {tuple(sorted(labels)) for labels, _ in samples(text)["sparktop_engine_info"]}
    assert len(names) == 1


def test_credentials_in_an_engines_url_never_reach_a_label():
    state = recorded()
    snap = copy.deepcopy(state.engines[VLLM])
    snap.key = snap.url = "http://admin:hunter2@127.0.0.9:8000"
    state.apply(snap)
    text = export(state)
    assert "hunter2" not in text and "admin" not in text
    assert value(text, "sparktop_engine_up", engine="http://127.0.0.9:8000") == 1


def test_a_hung_engine_is_a_state_of_its_own():
    state = recorded()
    assert value(export(state), "sparktop_engine_state", engine=VLLM, state="hung") == 0  # a series to alert on
    hung = copy.copy(state.engines[VLLM])
    hung.state, hung.t = "hung", hung.t + 1
    state.apply(hung)
    text = export(state)
    assert value(text, "sparktop_engine_state", engine=VLLM, state="hung") == 1
    assert value(text, "sparktop_engine_state", engine=VLLM, state="ready") == 0


def test_a_paused_history_is_exported_as_its_writer_says(tmp_path):
    from sparktop.history.store import HistoryStore
    from sparktop.history.writer import HistoryWriter

    state = recorded()
    writer = HistoryWriter(HistoryStore.open(tmp_path / "history.sqlite"))
    try:
        registry = registry_for(state, history=writer)
        assert value(generate_latest(registry).decode(), "sparktop_history_paused") == 0
        writer.paused = "history paused: disk full"  # what a full disk makes it say
        assert value(generate_latest(registry).decode(), "sparktop_history_paused") == 1
    finally:
        writer.paused = None
        writer.close()
    # Without a history (the app's own /metrics, a writer that cannot say), no series: not a 0.
    assert "sparktop_history_paused" not in samples(export(state))


# -- naming ---------------------------------------------------------------------------------------------

NOT_BASE_UNITS = re.compile(r"_(milliseconds|ms|mib|gib|kib|percent|pct|mhz|gbps|mbps|gb|kwh|minutes|hours)(_|$)")


def test_every_name_follows_prometheus_conventions(exported):
    _, text = exported
    for name, (kind, doc) in METRICS.items():
        assert re.fullmatch(r"sparktop_[a-z0-9_]+", name), name
        assert not NOT_BASE_UNITS.search(name), name
        assert doc and kind in ("gauge", "counter", "info", "summary"), name
        assert (kind == "info") == name.endswith("_info"), name
        assert (kind == "counter") == name.endswith("_total"), name
    assert "quantile" not in {label for f in text_string_to_metric_families(text) if f.type != "summary"
                              for s in f.samples for label in s.labels}
    families = {f.name for f in text_string_to_metric_families(text)}
    # Every family exported is one listed (counters' `_created` companions aside).
    listed = {n.removesuffix("_total") for n in METRICS}
    assert {f for f in families if not f.endswith("_created")} <= listed
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert set(s.labels) <= {"node", "engine", "model", "port", "netdev", "source", "peer_node", "peer_port",
                                     "how", "state", "reason", "quantile", "window", "figure", "kind", "name",
                                     "version", "topology", "container", "pid", "process", "vendor", "product",
                                     "family", "variant", "gb10", "currency"}, s


def test_the_openmetrics_form_parses_with_units_declared(exported):
    state, _ = exported
    encoder, content_type = choose_encoder("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    families = {f.name: f for f in openmetrics_families(encoder(registry_for(state)).decode())}
    assert families["sparktop_node_memory_available_bytes"].unit == "bytes"
    assert families["sparktop_engine_time_to_first_token_seconds"].unit == "seconds"
    assert families["sparktop_engine_generation_tokens"].type == "counter"
    assert families["sparktop_engine"].type == "info"


# -- the dashboard --------------------------------------------------------------------------------------


def dashboard_exprs(node: dict) -> list[str]:
    out = [t["expr"] for t in node.get("targets", [])]
    for child in node.get("panels", []):
        out += dashboard_exprs(child)
    return out


def test_the_grafana_dashboard_queries_only_names_the_exporter_exports(exported):
    _, text = exported
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) >= 20
    names = {n for expr in exprs for n in re.findall(r"\bsparktop_[a-z0-9_]+", expr)}
    assert names - set(samples(text)) == set()
    # The figures the issue asks it to chart, per node and per engine.
    for wanted in ("sparktop_node_memory_used_bytes", "sparktop_node_memory_available_bytes",
                   "sparktop_gpu_power_watts", "sparktop_gpu_utilization_ratio",
                   "sparktop_link_rdma_rx_bytes_per_second", "sparktop_engine_generation_tokens_per_second",
                   "sparktop_engine_kv_cache_usage_ratio", "sparktop_engine_requests_running",
                   "sparktop_engine_requests_waiting", "sparktop_engine_time_to_first_token_seconds",
                   "sparktop_engine_inter_token_latency_seconds", "sparktop_engine_energy_joules_per_token"):
        assert wanted in names, wanted


def test_the_dashboard_is_a_grafana_model_on_a_prometheus_input():
    dashboard = json.loads(DASHBOARD.read_text())
    assert [(i["name"], i["type"], i["pluginId"]) for i in dashboard["__inputs"]] == [
        ("DS_PROMETHEUS", "datasource", "prometheus")]
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"node", "engine"}
    for p in panels:
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] == "row":
            assert p.get("repeat") in (None, *variables)
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" and t["refId"] for t in p["targets"])


# -- the option, the token and prometheus.yml --------------------------------------------------------------


@pytest.mark.parametrize(("given", "expected"), [
    ("127.0.0.1:9109", ("127.0.0.1", 9109)),
    ("0.0.0.0:9200", ("0.0.0.0", 9200)),
    ("[::1]:9109", ("::1", 9109)),
    ("localhost:9109", ("localhost", 9109)),
    ("spark-a.lan:9109", ("spark-a.lan", 9109)),
    (":9109", ("127.0.0.1", 9109)),
    ("9109", ("127.0.0.1", 9109)),
    ("127.0.0.1", ("127.0.0.1", 9109)),
])
def test_parse_listen(given, expected):
    assert parse_listen(given) == expected


@pytest.mark.parametrize(("given", "says"), [
    ("", "empty"),
    ("127.0.0.1:", "port ''"),
    ("127.0.0.1:http", "port 'http'"),
    ("127.0.0.1:70000", "1 to 65535"),
    ("127.0.0.1:0", "1 to 65535"),
    ("::1:9109", "brackets"),
    ("[::1", "[ADDRESS]:PORT"),
    ("http://host:9109", "not a URL"),
    ("my host:9109", "not a host name"),
])
def test_parse_listen_refuses_bad_values_in_one_line_naming_the_option(given, says):
    with pytest.raises(SparktopError) as raised:
        parse_listen(given)
    message = str(raised.value)
    assert message.startswith("--serve-metrics: ") and says in message and "\n" not in message


def test_the_token_is_needed_off_loopback_only_and_shown_only_when_generated():
    assert resolve_metrics_token("127.0.0.1", {}) == (None, False)
    token, generated = resolve_metrics_token("0.0.0.0", {})
    assert generated and token is not None and len(token) >= 16
    assert resolve_metrics_token("0.0.0.0", {ENV_TOKEN: "s3cret-but-long-enough"}) == ("s3cret-but-long-enough", False)
    with pytest.raises(SparktopError, match="too few"):
        resolve_metrics_token("0.0.0.0", {ENV_TOKEN: "short"})
    # Prometheus reads a token the user set from a file; a generated one is printed where it is needed.
    known = "\n".join(scrape_config("0.0.0.0", 9109, "s3cret-but-long-enough"))
    assert "s3cret" not in known and f"credentials_file: {TOKEN_FILE}" in known and "type: Bearer" in known
    assert f"credentials: \"{token}\"" in "\n".join(scrape_config("0.0.0.0", 9109, token, show_token=True))
    loopback = scrape_config("127.0.0.1", 9109, None)
    assert 'targets: ["127.0.0.1:9109"]' in "\n".join(loopback) and "authorization" not in "\n".join(loopback)


def test_values_equal_status_json_at_the_same_moment(exported):
    """One state, two outputs: what Prometheus scrapes is what `sparktop status --json` prints (each
    in its own units and rounding)."""
    from sparktop.settings import Preferences
    from sparktop.status import status_json

    state, text = exported
    doc = status_json(state, [], Preferences(energy_price_per_kwh=0.32), window_s=10.0)
    assert doc["nodes"] and doc["engines"]
    for n in doc["nodes"]:
        at = {"node": n["name"]}
        gib = 1024**3
        assert value(text, "sparktop_node_memory_available_bytes", **at) / gib == pytest.approx(
            n["memory_gib"]["available"], abs=0.006)
        assert value(text, "sparktop_node_memory_total_bytes", **at) / gib == pytest.approx(
            n["memory_gib"]["total"], abs=0.006)
        for port in n["link"]["ports"]:
            rx = value(text, "sparktop_link_rdma_rx_bytes_per_second", **at, port=port["rdma_device"])
            assert rx * 8 / 1e9 == pytest.approx(port["rdma_rx_gbps"], abs=0.051)
    def same(metric: str, at: dict, expected, abs_: float = 0.0) -> None:
        got = [v for labels, v in samples(text).get(metric, []) if all(labels.get(k) == x for k, x in at.items())]
        if expected is None:
            assert got == [], f"{metric}{at}: status says unknown, the exporter says {got}"
        else:
            assert got == [pytest.approx(expected, abs=abs_)], f"{metric}{at}"

    for e in doc["engines"]:
        at = {"engine": e["url"]}
        same("sparktop_engine_kv_cache_usage_ratio", at, e["kv_cache_usage"], 5e-5)
        same("sparktop_engine_requests_running", at, e["running"])
        same("sparktop_engine_requests_waiting", at, e["waiting"])
        same("sparktop_engine_generation_tokens_per_second", at, e["gen_tps"], 0.051)
        same("sparktop_engine_generation_tokens_total", at, e["gen_tokens_total"])
        same("sparktop_engine_requests_finished_total", at, e["requests_total"])
        same("sparktop_engine_time_to_first_token_seconds", {**at, "quantile": "0.5", "window": "recent"},
             None if e["ttft_p50_ms"] is None else e["ttft_p50_ms"] / 1000, 5e-5)
        same("sparktop_engine_energy_joules_per_token", at, (e.get("energy") or {}).get("j_per_token"), 5e-5)
