"""Prometheus metrics of what sparktop reads and derives, for a fleet watched by Prometheus and Grafana.

`sparktop collect --serve-metrics 127.0.0.1:9109` serves `/metrics` from the same `ClusterState` the
collector fills. Prometheus' own exporters cannot give these figures: GB10's memory is unified (there is
no GPU memory to read, only /proc/meminfo), the RoCE link's RDMA bytes bypass the kernel's counters, and
J/token, a queue by reason or latency percentiles over a window are sparktop's own derivations.

- `SparktopCollector`: a prometheus-client custom collector. At every scrape it reads the state and
  yields metric families named in Prometheus' conventions: base units (bytes, seconds, joules, hertz,
  ratios 0..1), `_total` on counters, `_info` for identities, summaries for latency percentiles (a
  `quantile` label, over a `window`), labels `node`, `engine` (the engine's URL, sparktop's key for it:
  one name per engine however it was given, never its credentials), `model`, `port` (the RDMA device).
  `METRICS` lists every name it can export. A figure that is unknown is left out, never exported as 0;
  a node or engine that stopped answering keeps its `_up`, `_state` and `_info` series but not its last
  figures (the poller re-emits a stale copy of them, which Prometheus would take for current values).
  Series do not multiply while an engine starts: its `_up` and `_state` are labelled by `engine` alone
  (its model may be known only once it answers), its figures by `engine` and `model` (they exist only
  once it answers); an `_info` series has the same label names always, "" for a value not known, and an
  engine's appears once it has answered (what it is, it says itself), not once per value learnt.
  `promtool check metrics` passes it clean (tests/integration/test_prometheus.py); the alerting rules
  beside the dashboard (docs/grafana/sparktop-alerts.yml) query it.
- `start_metrics` (returns the running server) and `serve_metrics` (serves until cancelled): the aiohttp
  server of `/metrics`, behind `sparktop web`'s token rules: a loopback bind needs no token, any other
  needs one (Prometheus sends it as `Authorization: Bearer`).
- `parse_listen`, `resolve_metrics_token`, `scrape_config`: the `--serve-metrics` value, the token,
  and the lines a user adds to prometheus.yml.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import secrets
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from sparktop import __version__
from sparktop.errors import SparktopError
from sparktop.masking import without_credentials
from sparktop.observe.energy import Energy
from sparktop.observe.link import LinkView
from sparktop.observe.machine import THROTTLE_REASONS, is_clock_limited
from sparktop.observe.prometheus import QUEUE_WAIT_S
from sparktop.observe.snapshot import EngineSnapshot, NodeSnapshot
from sparktop.observe.state import ClusterState
from sparktop.web import MIN_TOKEN, is_loopback, token_gate

log = logging.getLogger(__name__)

OPTION = "--serve-metrics"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9109  # next to node_exporter's 9100 in the range Prometheus' wiki hands out to exporters
ENV_TOKEN = "SPARKTOP_METRICS_TOKEN"
TOKEN_FILE = "/etc/prometheus/sparktop-metrics.token"  # where the scrape config says Prometheus reads it

MIB = 1024**2

# The states an engine and a node can be in (`EngineSnapshot.state`, `NodeSnapshot.state`): each gets a
# 0/1 series so a panel can count them without knowing the current one.
ENGINE_STATES = ("connecting", "starting", "ready", "sleeping", "hung", "unreachable", "stale", "failed")
NODE_STATES = ("connecting", "ok", "stale", "down")
# An engine whose figures are current: asleep it answers (at zero), as the state's charts go on.
ENGINE_LIVE = ("ready", "sleeping")

# `EngineSnapshot.latency`'s keys, with the summary each becomes, and its percentiles' names with their
# quantile and window labels: p50/p95/p99 over the monitor's latency window, p95 also over the last minute.
# Summaries of quantiles alone: the engine's own histograms hold its counts and sums.
LATENCIES = {
    "ttft": "sparktop_engine_time_to_first_token_seconds",
    "itl": "sparktop_engine_inter_token_latency_seconds",
    "queue": "sparktop_engine_queue_time_seconds",
    "e2e": "sparktop_engine_e2e_request_latency_seconds",
}
PERCENTILES = {"p50": ("0.5", "recent"), "p95": ("0.95", "recent"), "p99": ("0.99", "recent"),
               "p95_1m": ("0.95", "1m")}

# Every metric this module can export: name -> (type, help). The families in a scrape are those with at
# least one known value. Counters' names end in `_total`, as their samples do.
METRICS: dict[str, tuple[str, str]] = {
    # -- the exporter and the cluster ---------------------------------------------------------------
    "sparktop_exporter_info": ("info", "The sparktop that serves these metrics"),
    "sparktop_state_last_update_timestamp_seconds": (
        "gauge", "Unix time of the newest node or engine snapshot sparktop holds"),
    "sparktop_cluster_nodes": ("gauge", "Nodes watched"),
    "sparktop_cluster_nodes_up": ("gauge", "Nodes whose last poll succeeded"),
    "sparktop_cluster_memory_used_bytes": ("gauge", "Unified memory in use, over the nodes that report it"),
    "sparktop_cluster_memory_total_bytes": ("gauge", "Unified memory, over the nodes that report it"),
    "sparktop_cluster_engines": ("gauge", "Engines watched (routers left out: their tokens are their engines')"),
    "sparktop_cluster_engines_ready": ("gauge", "Engines ready or sleeping (routers left out)"),
    "sparktop_cluster_generation_tokens_per_second": ("gauge", "Tokens generated per second, every engine"),
    "sparktop_cluster_prompt_tokens_per_second": ("gauge", "Prompt tokens processed per second, every engine"),
    "sparktop_cluster_requests_running": ("gauge", "Requests running, every engine"),
    "sparktop_cluster_requests_waiting": ("gauge", "Requests waiting in a queue, every engine"),
    "sparktop_cluster_power_watts": (
        "gauge", "Every node's GPU power (nvidia-smi), averaged over the energy window; absent when a node has "
        "none"),
    "sparktop_cluster_energy_joules_per_token": (
        "gauge", "The cluster's GPU power over its generated tokens per second"),
    # -- nodes -----------------------------------------------------------------------------------------
    "sparktop_node_up": ("gauge", "1 when the node's last poll succeeded, 0 while connecting, stale or down"),
    "sparktop_node_state": ("gauge", "1 for the node's current state (connecting, ok, stale, down), else 0"),
    "sparktop_node_last_poll_timestamp_seconds": ("gauge", "Unix time of the node's last snapshot"),
    "sparktop_node_poll_duration_seconds": ("gauge", "How long the node's last poll took"),
    "sparktop_node_machine_info": ("info", "The machine, from DMI (vendor, product, family, what sparktop "
                                           "calls it, whether it is a GB10)"),
    "sparktop_node_memory_total_bytes": ("gauge", "Unified memory (MemTotal)"),
    "sparktop_node_memory_available_bytes": ("gauge", "Unified memory the kernel can give (MemAvailable)"),
    "sparktop_node_memory_used_bytes": (
        "gauge", "Unified memory in use: total minus available (GB10 has no separate GPU memory)"),
    "sparktop_node_memory_free_bytes": ("gauge", "Unified memory unused (MemFree)"),
    "sparktop_node_memory_page_cache_bytes": ("gauge", "Buffers and page cache"),
    "sparktop_node_memory_used_ratio": ("gauge", "Unified memory in use over total, 0..1"),
    "sparktop_node_swap_total_bytes": ("gauge", "Swap space"),
    "sparktop_node_swap_used_bytes": ("gauge", "Swap in use"),
    "sparktop_node_cpu_usage_ratio": ("gauge", "CPU busy, 0..1 over every core"),
    "sparktop_node_engines_memory_bytes": (
        "gauge", "Memory held by GPU processes (every engine's workers), or by the engine processes where "
        "nvidia-smi lists none"),
    "sparktop_node_engine_processes_resident_bytes": (
        "gauge", "Resident memory of the engines started outside Docker"),
    "sparktop_node_containers": ("gauge", "Containers on the node (docker ps -a), by state"),
    "sparktop_node_disk_info": ("info", "A filesystem the node's work lives on: its device and what it holds (root, "
                                        "hf_cache, docker)"),
    "sparktop_node_disk_total_bytes": ("gauge", "The filesystem's size (df)"),
    "sparktop_node_disk_free_bytes": ("gauge", "Space a user can still write on the filesystem (df's Available)"),
    "sparktop_node_docker_ok": ("gauge", "1 when docker answered, 0 when it is missing or failed"),
    "sparktop_node_energy_joules_per_token": (
        "gauge", "GPU energy per token generated on the node (an engine on k nodes counts 1/k of its tokens)"),
    "sparktop_node_energy_cost_per_million_tokens": (
        "gauge", "The same at the energy price of settings.yaml, in its currency"),
    "sparktop_node_energy_power_watts": ("gauge", "The node's GPU power averaged over the energy window"),
    "sparktop_node_energy_generation_tokens_per_second": (
        "gauge", "The tokens per second generated on the node that its energy is divided by"),
    # -- the GPU ---------------------------------------------------------------------------------------
    "sparktop_gpu_info": ("info", "The node's GPU as nvidia-smi names it"),
    "sparktop_gpu_ok": ("gauge", "1 when nvidia-smi answered, 0 when it is missing or failed"),
    "sparktop_gpu_utilization_ratio": ("gauge", "GPU busy, 0..1 (nvidia-smi utilization.gpu)"),
    "sparktop_gpu_temperature_celsius": ("gauge", "GPU temperature"),
    "sparktop_gpu_power_watts": (
        "gauge", "GPU power (nvidia-smi power.draw: GB10's GPU only, not its CPU, memory, NIC or fans)"),
    "sparktop_gpu_sm_clock_hertz": ("gauge", "GPU SM clock"),
    "sparktop_gpu_sm_clock_max_hertz": ("gauge", "The GPU's highest SM clock (nvidia-smi clocks.max.sm)"),
    "sparktop_gpu_performance_state": ("gauge", "GPU performance state: 0 for P0 (fastest) to 12"),
    "sparktop_gpu_throttle_reason": (
        "gauge", "1 for each NVML clock event reason holding the GPU's clocks now, 0 for the others"),
    "sparktop_gpu_clock_limited": ("gauge", "1 when a reason other than idling or a clock setting holds the clock"),
    "sparktop_gpu_process_memory_bytes": ("gauge", "GPU memory of one process (nvidia-smi), with its container"),
    # -- the ConnectX-7 link ---------------------------------------------------------------------------
    "sparktop_link_info": ("info", "An RDMA port: its netdev and where its RDMA bytes are read (ethtool or "
                                   "port counters)"),
    "sparktop_link_up": ("gauge", "1 when the RDMA port is active"),
    "sparktop_link_speed_bytes_per_second": ("gauge", "The port's link speed, each way"),
    "sparktop_link_rdma_rx_bytes_per_second": ("gauge", "RDMA (RoCE) bytes received per second, NCCL's traffic"),
    "sparktop_link_rdma_tx_bytes_per_second": ("gauge", "RDMA (RoCE) bytes sent per second"),
    "sparktop_link_kernel_rx_bytes_per_second": ("gauge", "Bytes received per second through the kernel"),
    "sparktop_link_kernel_tx_bytes_per_second": ("gauge", "Bytes sent per second through the kernel"),
    "sparktop_link_rdma_rx_bytes_total": ("counter", "RDMA (RoCE) bytes received, the NIC's own counter (vport RDMA "
                                                     "bytes, or the port counters x4)"),
    "sparktop_link_rdma_tx_bytes_total": ("counter", "RDMA (RoCE) bytes sent, the NIC's own counter"),
    "sparktop_link_kernel_rx_bytes_total": ("counter", "Bytes received through the kernel (/proc/net/dev)"),
    "sparktop_link_kernel_tx_bytes_total": ("counter", "Bytes sent through the kernel (/proc/net/dev)"),
    "sparktop_link_rate_interval_seconds": ("gauge", "The interval the port's rates were measured over"),
    "sparktop_link_peer_info": ("info", "The node and port this RDMA port reaches, and how that was found"),
    "sparktop_link_peer_verified": (
        "gauge", "1 when what one side sends the other receives, 0 when the counters disagree"),
    "sparktop_node_link_capacity_bytes_per_second": (
        "gauge", "The link's capacity each way over the ports that are up (a Spark's halves: ~100 Gb/s each)"),
    "sparktop_node_link_warning": (
        "gauge", "1 while a warning has held: NCCL on TCP sockets (nccl_on_sockets), one half of the cable "
        "carrying everything (one_half), another (other)"),
    # -- engines ---------------------------------------------------------------------------------------
    "sparktop_engine_info": ("info", "An engine once it has answered: its kind, name, version, layout, node and "
                                     "container (\"\" where not known)"),
    "sparktop_engine_node_info": ("info", "A node an engine runs on (several for tensor or pipeline parallel)"),
    "sparktop_engine_up": ("gauge", "1 when the engine answers with its model loaded (ready or sleeping); by "
                                    "engine alone, as its state (its model: sparktop_engine_info)"),
    "sparktop_engine_state": (
        "gauge", "1 for the engine's current state (connecting, starting, ready, sleeping, hung, unreachable, "
        "stale, failed), else 0"),
    "sparktop_engine_last_poll_timestamp_seconds": ("gauge", "Unix time of the engine's last snapshot"),
    "sparktop_engine_poll_duration_seconds": ("gauge", "How long the engine's last read took"),
    "sparktop_engine_start_time_seconds": ("gauge", "Unix time the engine started (its counters' creation)"),
    "sparktop_engine_sleep_level": ("gauge", "While sleeping: 1 weights offloaded, 2 everything discarded"),
    "sparktop_engine_figure_not_exported": (
        "gauge", "1 for each figure the engine does not export (its series are absent, not zero)"),
    "sparktop_engine_max_model_len_tokens": ("gauge", "The engine's context length"),
    "sparktop_engine_kv_cache_usage_ratio": ("gauge", "KV cache in use, 0..1"),
    "sparktop_engine_requests_running": ("gauge", "Requests running"),
    "sparktop_engine_requests_waiting": ("gauge", "Requests waiting in the queue"),
    "sparktop_engine_requests_waiting_by_reason": (
        "gauge", "Requests waiting, by reason: capacity, or deferred by a transient constraint"),
    "sparktop_engine_slots": ("gauge", "llama.cpp's parallel slots (its largest batch)"),
    "sparktop_engine_prompt_tokens_per_second": ("gauge", "Prompt tokens processed per second over the rate window"),
    "sparktop_engine_generation_tokens_per_second": ("gauge", "Tokens generated per second over the rate window"),
    "sparktop_engine_prompt_tokens_total": ("counter", "Prompt tokens processed since the engine started"),
    "sparktop_engine_generation_tokens_total": ("counter", "Tokens generated since the engine started"),
    "sparktop_engine_requests_finished_total": ("counter", "Requests finished since the engine started"),
    "sparktop_engine_requests_finished_by_reason_total": (
        "counter", "Requests finished since the engine started, by reason (stop, length, abort, error, ...)"),
    "sparktop_engine_requests_finished_per_second": ("gauge", "Requests finished per second, last few seconds"),
    "sparktop_engine_requests_finished_by_reason_per_second": (
        "gauge", "Requests finished per second by reason, last few seconds"),
    "sparktop_engine_preemptions_total": ("counter", "Requests preempted since the engine started"),
    "sparktop_engine_rejections_total": (
        "counter", "Requests refused by a queue limit since the API server started"),
    "sparktop_engine_rejections_by_reason_total": (
        "counter", "Requests refused by a queue limit, by the limit (max_num_queued_reqs, max_num_queued_tokens)"),
    "sparktop_engine_rejections_per_second": ("gauge", "Requests refused per second, last few seconds"),
    "sparktop_engine_recent_rejections": ("gauge", "Requests refused over the recent window"),
    "sparktop_engine_recent_rejections_window_seconds": ("gauge", "The window recent rejections cover"),
    **{name: ("summary", f"{what}: percentiles (quantile) over the monitor's latency window (window=recent) "
                         "or the last minute (window=1m)")
       for name, what in zip(LATENCIES.values(), ("Time to first token", "Inter-token latency",
                                                  "Time waiting in the queue", "Request latency end to end"),
                             strict=True)},
    "sparktop_engine_slow_queue_requests": (
        "gauge", f"Requests in the latency window that waited over {QUEUE_WAIT_S:g} s in the queue"),
    "sparktop_engine_prefix_cache_hit_ratio": ("gauge", "Prefix cache hits over queries, 0..1, over the window"),
    "sparktop_engine_spec_decode_acceptance_ratio": (
        "gauge", "Speculative decoding: drafted tokens accepted, 0..1, over the window"),
    "sparktop_engine_spec_decode_mean_accepted_tokens": (
        "gauge", "Speculative decoding: tokens accepted per draft step, mean"),
    "sparktop_engine_memory_read_bytes_per_second": ("gauge", "Memory read per second per GPU, vLLM's estimate"),
    "sparktop_engine_memory_write_bytes_per_second": ("gauge", "Memory written per second per GPU, vLLM's estimate"),
    "sparktop_engine_energy_joules_per_token": (
        "gauge", "GPU energy per generated token: its nodes' GPU power over its tokens per second"),
    "sparktop_engine_energy_cost_per_million_tokens": (
        "gauge", "The same at the energy price of settings.yaml, in its currency"),
    "sparktop_engine_energy_power_watts": ("gauge", "The engine's nodes' GPU power over the energy window"),
    # -- the history ----------------------------------------------------------------------------------
    "sparktop_history_paused": (
        "gauge", "1 while the history writes nothing (a full disk: its rows wait in memory), else 0"),
}

# The base unit a metric's name ends in, declared to OpenMetrics scrapers (prometheus-client appends
# nothing: every name here already ends in it).
_UNITS = ("bytes", "seconds", "watts", "celsius", "hertz", "ratio", "joules")


def _unit(name: str) -> str:
    base = name.removesuffix("_total")
    return next((u for u in _UNITS if base.endswith("_" + u)), "")


_M = TypeVar("_M", bound=Metric)


class _Families:
    """The families of one scrape, made on their first value: a figure nobody has is not exported."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}

    def _family(self, name: str, labels: Mapping[str, str], kind: type[_M]) -> _M:
        family = self.families.get(name)
        if family is None:
            declared, doc = METRICS[name]
            if declared == "counter":
                family = CounterMetricFamily(name, doc, labels=list(labels), unit=_unit(name))
            elif declared == "info":
                family = InfoMetricFamily(name.removesuffix("_info"), doc, labels=list(labels))
            elif declared == "summary":
                family = Metric(name, doc, "summary", unit=_unit(name))
            else:
                family = GaugeMetricFamily(name, doc, labels=list(labels), unit=_unit(name))
            self.families[name] = family
        if not isinstance(family, kind):
            raise TypeError(f"{name} is declared a {METRICS[name][0]} in METRICS")
        return family

    def gauge(self, name: str, labels: Mapping[str, str], value: float | None) -> None:
        if value is None or math.isnan(value):
            return
        self._family(name, labels, GaugeMetricFamily).add_metric(list(labels.values()), float(value))

    def quantile(self, name: str, labels: Mapping[str, str], quantile: str, value: float | None) -> None:
        """One quantile of a summary (its count and sum are left out: sparktop has only the percentiles)."""
        if value is None or math.isnan(value):
            return
        family = self._family(name, labels, Metric)
        if family.type != "summary":
            raise TypeError(f"{name} is declared a {METRICS[name][0]} in METRICS")
        family.add_sample(name, {**labels, "quantile": quantile}, float(value))

    def counter(self, name: str, labels: Mapping[str, str], value: float | None,
                created: float | None = None) -> None:
        if value is None or math.isnan(value):
            return
        self._family(name, labels, CounterMetricFamily).add_metric(list(labels.values()), float(value),
                                                                   created=created)

    def info(self, name: str, labels: Mapping[str, str], value: Mapping[str, str | None]) -> None:
        # An unknown value is an empty label, which Prometheus treats as no label at all.
        self._family(name, labels, InfoMetricFamily).add_metric(list(labels.values()),
                                                                {k: v or "" for k, v in value.items()})

    def by_label(self, name: str, labels: Mapping[str, str], label: str,
                 values: Mapping[str, float] | None) -> None:
        for key, value in sorted((values or {}).items()):
            self.gauge(name, {**labels, label: key}, value)

    def counters_by_label(self, name: str, labels: Mapping[str, str], label: str,
                          values: Mapping[str, float] | None, created: float | None = None) -> None:
        for key, value in sorted((values or {}).items()):
            self.counter(name, {**labels, label: key}, value, created)

    def one_of(self, name: str, labels: Mapping[str, str], label: str, known: tuple[str, ...],
               current: str) -> None:
        """A 0/1 series per known value, 1 for the current one (kept too when it is not a known one)."""
        for value in dict.fromkeys((*known, current)):
            self.gauge(name, {**labels, label: value}, 1.0 if value == current else 0.0)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _gbps(value: float | None) -> float | None:
    """Gb/s (10^9 bit/s, as the link's rates are held) to bytes per second."""
    return _scaled(value, 1e9 / 8)


def _pstate(text: str | None) -> float | None:
    match = re.fullmatch(r"P(\d+)", (text or "").strip(), re.IGNORECASE)
    return float(match.group(1)) if match else None


def _status_ok(status: str) -> float | None:
    """`gpu_status`/`docker_status`: ok | missing | an error's text | unknown (not read yet: no value)."""
    return None if status == "unknown" else float(status == "ok")


def _warning_kind(text: str) -> str:
    # LinkView.warning is a sentence for people; a label needs a word that does not move with its figures.
    if "TCP sockets" in text:
        return "nccl_on_sockets"
    if text.startswith("only ") and "half the cable" in text:
        return "one_half"
    return "other"


class SparktopCollector(Collector):
    """Reads a `ClusterState` at every scrape (in the event loop that applies its events, so a scrape
    never sees half an update) and yields one family per figure that some node or engine has."""

    def __init__(self, state: ClusterState, *, price_per_kwh: float | None = None, currency: str = "",
                 history: object | None = None):
        """`history`: the `HistoryWriter` beside the state, whose `paused` says why it writes nothing."""
        self.state = state
        self.price_per_kwh = price_per_kwh
        self.currency = currency
        self.history = history

    def collect(self) -> Iterator[Metric]:
        out = _Families()
        out.info("sparktop_exporter_info", {}, {"version": __version__})
        if self.state.now:
            out.gauge("sparktop_state_last_update_timestamp_seconds", {}, self.state.now)
        self._cluster(out)
        for node in self.state.ordered_nodes():
            self._node(out, node)
        for engine in self.state.ordered_engines():
            self._engine(out, engine)
        if self.history is not None and hasattr(self.history, "paused"):
            out.gauge("sparktop_history_paused", {}, float(bool(self.history.paused)))
        yield from out.families.values()

    # -- the cluster ----------------------------------------------------------------------------------

    def _cluster(self, out: _Families) -> None:
        s = self.state.summary()
        out.gauge("sparktop_cluster_nodes", {}, s.nodes)
        out.gauge("sparktop_cluster_nodes_up", {}, s.nodes_ok)
        out.gauge("sparktop_cluster_engines", {}, s.engines)
        out.gauge("sparktop_cluster_engines_ready", {}, s.engines_ready)
        if s.mem_total:
            out.gauge("sparktop_cluster_memory_used_bytes", {}, s.mem_used)
            out.gauge("sparktop_cluster_memory_total_bytes", {}, s.mem_total)
        if s.engines_ready:
            out.gauge("sparktop_cluster_generation_tokens_per_second", {}, s.gen_tps)
            out.gauge("sparktop_cluster_prompt_tokens_per_second", {}, s.prompt_tps)
            out.gauge("sparktop_cluster_requests_running", {}, s.running)
            out.gauge("sparktop_cluster_requests_waiting", {}, s.waiting)
        out.gauge("sparktop_cluster_power_watts", {}, s.watts)
        out.gauge("sparktop_cluster_energy_joules_per_token", {}, s.j_per_token)

    # -- a node ---------------------------------------------------------------------------------------

    def _node(self, out: _Families, n: NodeSnapshot) -> None:
        at = {"node": n.name}
        out.gauge("sparktop_node_up", at, float(n.state == "ok"))
        out.one_of("sparktop_node_state", at, "state", NODE_STATES, n.state)
        out.gauge("sparktop_node_last_poll_timestamp_seconds", at, n.t)
        if n.machine is not None:  # read once from DMI: it does not go stale
            m = n.machine
            out.info("sparktop_node_machine_info", at, {"vendor": m.vendor, "product": m.product,
                                                        "family": m.family, "variant": m.variant,
                                                        "gb10": "true" if m.gb10 else "false"})
        if n.state != "ok":
            return  # what follows would be the last good poll's figures, re-emitted
        out.gauge("sparktop_node_poll_duration_seconds", at, _scaled(n.poll_ms, 1e-3))
        mem = n.memory
        if mem is not None:
            out.gauge("sparktop_node_memory_total_bytes", at, mem.total)
            out.gauge("sparktop_node_memory_available_bytes", at, mem.available)
            out.gauge("sparktop_node_memory_used_bytes", at, mem.used)
            out.gauge("sparktop_node_memory_free_bytes", at, mem.free)
            out.gauge("sparktop_node_memory_page_cache_bytes", at, mem.page_cache)
            if mem.total:
                out.gauge("sparktop_node_memory_used_ratio", at, mem.used_fraction)
            out.gauge("sparktop_node_swap_total_bytes", at, mem.swap_total)
            out.gauge("sparktop_node_swap_used_bytes", at, mem.swap_used)
        out.gauge("sparktop_node_cpu_usage_ratio", at, _scaled(n.cpu_pct, 0.01))
        if n.processes or n.servers_rss_mib is not None:
            out.gauge("sparktop_node_engines_memory_bytes", at, n.engines_mib * MIB)
        out.gauge("sparktop_node_engine_processes_resident_bytes", at, _scaled(n.servers_rss_mib, MIB))
        out.gauge("sparktop_node_docker_ok", at, _status_ok(n.docker_status))
        counts: dict[str, float] = {}
        for c in n.containers:
            counts[c.state] = counts.get(c.state, 0.0) + 1
        out.by_label("sparktop_node_containers", at, "state", counts)
        shown: set[str] = set()
        for d in n.disks:
            if d.mount in shown:  # a series per mount: a second one would be a duplicate sample, and fail the scrape
                continue
            shown.add(d.mount)
            disk = {**at, "mount": d.mount}
            out.info("sparktop_node_disk_info", disk, {"device": d.device, "holds": ",".join(d.holds)})
            out.gauge("sparktop_node_disk_total_bytes", disk, d.total)
            out.gauge("sparktop_node_disk_free_bytes", disk, d.free)
        self._gpu(out, n)
        self._links(out, n)
        self._energy(out, "node", at, self.state.node_energy(n.name))

    def _gpu(self, out: _Families, n: NodeSnapshot) -> None:
        at = {"node": n.name}
        out.gauge("sparktop_gpu_ok", at, _status_ok(n.gpu_status))
        g = n.gpu
        if g is not None:
            if g.name:
                out.info("sparktop_gpu_info", at, {"name": g.name})
            out.gauge("sparktop_gpu_utilization_ratio", at, _scaled(g.util, 0.01))
            out.gauge("sparktop_gpu_temperature_celsius", at, g.temp)
            out.gauge("sparktop_gpu_power_watts", at, g.power)
            out.gauge("sparktop_gpu_sm_clock_hertz", at, _scaled(g.sm_clock, 1e6))
            out.gauge("sparktop_gpu_sm_clock_max_hertz", at, _scaled(g.max_sm_clock, 1e6))
            out.gauge("sparktop_gpu_performance_state", at, _pstate(g.pstate))
            if g.throttle is not None:  # None: not read (an old driver, no GPU); [] is "nothing holds it"
                for reason in dict.fromkeys((*THROTTLE_REASONS.values(), *g.throttle)):
                    out.gauge("sparktop_gpu_throttle_reason", {**at, "reason": reason},
                              float(reason in g.throttle))
                out.gauge("sparktop_gpu_clock_limited", at, float(is_clock_limited(g.throttle)))
        # Summed per process: nvidia-smi lists a process once per GPU (or MIG instance) it holds, and two
        # samples with the same labels would make Prometheus drop them.
        held: dict[tuple[str, str, str], float] = {}
        for p in n.processes:
            if p.used_mib is None:
                continue
            container = p.container(n.containers)
            key = (str(p.pid), p.name, container.name if container else "")
            held[key] = held.get(key, 0.0) + p.used_mib * MIB
        for (pid, process, container_name), used in held.items():
            out.gauge("sparktop_gpu_process_memory_bytes",
                      {**at, "pid": pid, "process": process, "container": container_name}, used)

    def _links(self, out: _Families, n: NodeSnapshot) -> None:
        for p in n.links:
            at = {"node": n.name, "port": p.rdma_device}
            out.info("sparktop_link_info", at, {"netdev": p.netdev, "source": p.source})
            out.gauge("sparktop_link_up", at, float(p.up))
            out.gauge("sparktop_link_speed_bytes_per_second", at, _scaled(p.speed_mbps, 1e6 / 8))
            out.gauge("sparktop_link_rdma_rx_bytes_per_second", at, _gbps(p.rdma_rx_gbps))
            out.gauge("sparktop_link_rdma_tx_bytes_per_second", at, _gbps(p.rdma_tx_gbps))
            out.gauge("sparktop_link_kernel_rx_bytes_per_second", at, _gbps(p.kernel_rx_gbps))
            out.gauge("sparktop_link_kernel_tx_bytes_per_second", at, _gbps(p.kernel_tx_gbps))
            out.gauge("sparktop_link_rate_interval_seconds", at, p.seconds)
            # The counters as the NIC keeps them, for rate() over any window Prometheus likes.
            for way in ("rdma_rx", "rdma_tx", "kernel_rx", "kernel_tx"):
                out.counter(f"sparktop_link_{way}_bytes_total", at, getattr(p, f"{way}_bytes"))
            peer = self.state.peer_of(n.name, p.rdma_device)
            if peer is not None:
                peer_node, peer_port, pair = peer
                out.info("sparktop_link_peer_info", at, {"peer_node": peer_node, "peer_port": peer_port,
                                                         "how": pair.how})
                if pair.verified is not None:
                    out.gauge("sparktop_link_peer_verified", at, float(pair.verified))
        view: LinkView | None = self.state.links.get(n.name)
        if view is not None:
            at = {"node": n.name}
            out.gauge("sparktop_node_link_capacity_bytes_per_second", at, _gbps(view.capacity_gbps))
            current = _warning_kind(view.warning) if view.warning else ""
            for kind in ("nccl_on_sockets", "one_half", "other"):
                out.gauge("sparktop_node_link_warning", {**at, "kind": kind}, float(kind == current))

    # -- an engine ------------------------------------------------------------------------------------

    def _engine(self, out: _Families, e: EngineSnapshot) -> None:
        # Its key has no credentials (the poller's `targets.engine_key`); a recording or a key made elsewhere
        # may, and a label is the last place a password may reach.
        engine = {"engine": without_credentials(e.key)}
        at = {**engine, "model": e.model or ""}
        if e.recognised is not None or e.state in ENGINE_LIVE:
            # Once it has answered: before, its kind, name and version are not its own yet, and each value
            # learnt would be another series.
            out.info("sparktop_engine_info", at, {"kind": e.kind, "name": e.engine, "version": e.version,
                                                  "topology": e.topology, "node": e.node,
                                                  "container": e.container})
        for node in self.state.engine_nodes(e):
            out.info("sparktop_engine_node_info", {**engine, "node": node}, {})
        # Whether it is there, by its name alone: the same series from its first poll, before its model is
        # known (an address given answers it only once started), to after it has gone.
        out.gauge("sparktop_engine_up", engine, float(e.state in ENGINE_LIVE))
        out.one_of("sparktop_engine_state", engine, "state", ENGINE_STATES, e.state)
        out.gauge("sparktop_engine_last_poll_timestamp_seconds", engine, e.t)
        for figure in e.not_exported:
            out.gauge("sparktop_engine_figure_not_exported", {**at, "figure": figure}, 1.0)
        if e.state not in ENGINE_LIVE:
            return  # a stale copy of its last figures: not current, so not exported as such
        out.gauge("sparktop_engine_poll_duration_seconds", at, _scaled(e.poll_ms, 1e-3))
        out.gauge("sparktop_engine_start_time_seconds", at, e.started_at)
        if e.state == "sleeping":
            out.gauge("sparktop_engine_sleep_level", at, e.sleep_level)
        out.gauge("sparktop_engine_max_model_len_tokens", at, e.max_model_len)
        out.gauge("sparktop_engine_kv_cache_usage_ratio", at, e.kv_usage)
        out.gauge("sparktop_engine_requests_running", at, e.running)
        out.gauge("sparktop_engine_requests_waiting", at, e.waiting)
        out.by_label("sparktop_engine_requests_waiting_by_reason", at, "reason", e.waiting_by_reason)
        out.gauge("sparktop_engine_slots", at, e.slots)
        out.gauge("sparktop_engine_prompt_tokens_per_second", at, e.prompt_tps)
        out.gauge("sparktop_engine_generation_tokens_per_second", at, e.gen_tps)
        # The engine's counters, with their start as `_created`, so Prometheus' rate() sees a restart.
        created = e.started_at
        out.counter("sparktop_engine_prompt_tokens_total", at, e.prompt_tokens_total, created)
        out.counter("sparktop_engine_generation_tokens_total", at, e.gen_tokens_total, created)
        out.counter("sparktop_engine_requests_finished_total", at, e.requests, created)
        out.counters_by_label("sparktop_engine_requests_finished_by_reason_total", at, "reason",
                              e.finished_by_reason, created)
        out.gauge("sparktop_engine_requests_finished_per_second", at, e.finished_rate)
        out.by_label("sparktop_engine_requests_finished_by_reason_per_second", at, "reason",
                     e.finished_rate_by_reason)
        out.counter("sparktop_engine_preemptions_total", at, e.preemptions, created)
        out.counter("sparktop_engine_rejections_total", at, e.rejections)
        out.counters_by_label("sparktop_engine_rejections_by_reason_total", at, "reason", e.rejections_by_reason)
        out.gauge("sparktop_engine_rejections_per_second", at, e.rejection_rate)
        out.gauge("sparktop_engine_recent_rejections", at, e.rejections_recent)
        out.gauge("sparktop_engine_recent_rejections_window_seconds", at, e.rejections_span)
        self._latency(out, at, e)
        out.gauge("sparktop_engine_slow_queue_requests", at, e.queue_slow)
        out.gauge("sparktop_engine_prefix_cache_hit_ratio", at, e.prefix_hit_rate)
        out.gauge("sparktop_engine_spec_decode_acceptance_ratio", at, e.spec_acceptance)
        out.gauge("sparktop_engine_spec_decode_mean_accepted_tokens", at, e.spec_accept_len)
        out.gauge("sparktop_engine_memory_read_bytes_per_second", at, e.mem_read_bps)
        out.gauge("sparktop_engine_memory_write_bytes_per_second", at, e.mem_write_bps)
        self._energy(out, "engine", at, self.state.engine_energy(e))

    @staticmethod
    def _latency(out: _Families, at: dict[str, str], e: EngineSnapshot) -> None:
        latency = dict(e.latency or {})
        # The percentiles an engine last had outlive a window with no request in it (the card keeps showing
        # them): where the window's dict has none, the snapshot's own TTFT and ITL fields still do.
        for short in ("ttft", "itl"):
            if short not in latency:
                latency[short] = {"p50": getattr(e, f"{short}_p50"), "p95": getattr(e, f"{short}_p95")}
        for short, name in LATENCIES.items():
            for key, value in (latency.get(short) or {}).items():
                if key in PERCENTILES:
                    quantile, window = PERCENTILES[key]
                    out.quantile(name, {**at, "window": window}, quantile, value)

    def _energy(self, out: _Families, subject: str, at: dict[str, str], energy: Energy | None) -> None:
        if energy is None:
            return
        out.gauge(f"sparktop_{subject}_energy_joules_per_token", at, energy.j_per_token)
        out.gauge(f"sparktop_{subject}_energy_power_watts", at, energy.watts)
        if subject == "node":
            out.gauge("sparktop_node_energy_generation_tokens_per_second", at, energy.tokens_per_s)
        cost = energy.cost_per_million(self.price_per_kwh)
        if cost is not None:
            out.gauge(f"sparktop_{subject}_energy_cost_per_million_tokens", {**at, "currency": self.currency}, cost)


def registry_for(state: ClusterState, *, price_per_kwh: float | None = None, currency: str = "",
                 history: object | None = None) -> CollectorRegistry:
    """A registry holding only sparktop's collector (not prometheus-client's process and GC metrics:
    this process's own are not what a fleet is watched for)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SparktopCollector(state, price_per_kwh=price_per_kwh, currency=currency, history=history))
    return registry


# -- the --serve-metrics value and the token -------------------------------------------------------------


def parse_listen(value: str) -> tuple[str, int]:
    """`127.0.0.1:9109`, `[::1]:9109`, `0.0.0.0:9109`, `:9109` or `9109` (loopback), `localhost`
    (port 9109) -> (host, port)."""
    text = value.strip()
    if not text:
        raise SparktopError(f"{OPTION}: empty; give HOST:PORT, e.g. {DEFAULT_HOST}:{DEFAULT_PORT}")
    if "://" in text or "/" in text:
        raise SparktopError(f"{OPTION}: {value!r} is not a URL: give HOST:PORT (e.g. {DEFAULT_HOST}:{DEFAULT_PORT}; "
                            "the path is /metrics)")
    if text.isdigit():
        host, port_text = DEFAULT_HOST, text
    elif text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket or not inside or (rest and not rest.startswith(":")):
            raise SparktopError(f"{OPTION}: {value!r} is not [ADDRESS]:PORT (e.g. [::1]:{DEFAULT_PORT})")
        host, port_text = inside, rest[1:] if rest else str(DEFAULT_PORT)
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
        if ":" in host:
            raise SparktopError(f"{OPTION}: {value!r}: an IPv6 address goes in brackets, "
                                f"e.g. [::1]:{DEFAULT_PORT}")
        host = host or DEFAULT_HOST
    else:
        host, port_text = text, str(DEFAULT_PORT)
    if any(c.isspace() or c in "/?#@" for c in host):
        raise SparktopError(f"{OPTION}: {host!r} is not a host name or address")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise SparktopError(f"{OPTION}: port {port_text!r} is not a number from 1 to 65535 (e.g. {DEFAULT_HOST}:"
                            f"{DEFAULT_PORT})")
    return host, int(port_text)


def check_token(host: str, token: str | None) -> None:
    """`sparktop web`'s rule: an address other machines reach is served only behind a long enough token."""
    if is_loopback(host):
        return
    if token is None:
        raise SparktopError(f"{OPTION} {host}: not a loopback address, and without a token anyone who reaches "
                            f"it could read the nodes' metrics: refused (set {ENV_TOKEN}, at least {MIN_TOKEN} "
                            f"characters, or serve on {DEFAULT_HOST} and scrape through an ssh tunnel)")
    if len(token) < MIN_TOKEN:
        raise SparktopError(f"{OPTION} {host}: the token has {len(token)} characters, too few to guard an address "
                            f"other machines reach: use at least {MIN_TOKEN}")


def resolve_metrics_token(host: str, environ: Mapping[str, str] = os.environ) -> tuple[str | None, bool]:
    """(token, generated): `SPARKTOP_METRICS_TOKEN` if set; none on a loopback address; else a new one,
    which the user has to be shown once (in `scrape_config`) since Prometheus must send it."""
    token = environ.get(ENV_TOKEN, "").strip()
    if token:
        check_token(host, token)
        return token, False
    if is_loopback(host):
        return None, False
    return secrets.token_urlsafe(24), True


def _target_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()  # every address: the name other machines know it by
    return f"[{host}]" if ":" in host else host


def scrape_config(host: str, port: int, token: str | None, *, show_token: bool = False) -> list[str]:
    """The lines to add to prometheus.yml. The token itself only with `show_token` (a generated one, which
    the user cannot learn elsewhere); otherwise Prometheus reads it from a file the user writes."""
    lines = [
        "scrape_configs:",
        "  - job_name: sparktop",
        "    static_configs:",
        f"      - targets: [\"{_target_host(host)}:{port}\"]",
    ]
    if token is not None:
        lines += ["    authorization:", "      type: Bearer"]
        if show_token:
            lines.append(f"      credentials: \"{token}\"  # generated: set {ENV_TOKEN} to keep it across restarts")
        else:
            lines.append(f"      credentials_file: {TOKEN_FILE}  # holds the value of {ENV_TOKEN}")
    return lines


# -- the server ----------------------------------------------------------------------------------------

UNAUTHORIZED = (f"401: sparktop's metrics need the token: Prometheus sends it as `authorization: {{type: Bearer, "
                f"credentials_file: ...}}` (the value of {ENV_TOKEN}), a browser as ?token=...\n")
INDEX = "sparktop: Prometheus metrics at /metrics\n"


@web.middleware
async def _refusals(request: web.Request, handler):
    """The token gate's 401 says what `sparktop web` wants; here it says what Prometheus should send. Logged
    with the path only (a token may be in the query)."""
    response = await handler(request)
    if response.status == 401:
        log.warning("refused %s %s from %s: no valid token", request.method, request.path, request.remote)
        return web.Response(status=401, text=UNAUTHORIZED, headers={
            k: v for k, v in response.headers.items() if k in ("Cache-Control", "WWW-Authenticate")})
    return response


def make_app(registry: CollectorRegistry, token: str | None, cookie: str = "sparktop_metrics") -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        # In the event loop, not a thread: the state is changed by the same loop, so a scrape reads it whole.
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        if not content_type.startswith("application/openmetrics-text"):
            # The text format, whichever version was asked: every name here is a plain one (no UTF-8 to
            # escape), so 0.0.4's text and 1.0.0's are the same bytes.
            encoder, content_type = generate_latest, CONTENT_TYPE_LATEST
        return web.Response(body=encoder(registry), headers={"Content-Type": content_type})

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=INDEX)

    app = web.Application(middlewares=[_refusals, token_gate(token, cookie)])
    app.add_routes([web.get("/metrics", metrics), web.get("/", index)])
    return app


@dataclass
class MetricsServer:
    """A running `/metrics` server; `close()` stops it."""

    host: str
    port: int
    token: str | None
    runner: web.AppRunner

    @property
    def url(self) -> str:
        return f"http://{_target_host(self.host)}:{self.port}/metrics"

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_metrics(state: ClusterState, host: str, port: int, token: str | None, *,
                        price_per_kwh: float | None = None, currency: str = "",
                        history: object | None = None) -> MetricsServer:
    """Start serving `/metrics` of `state` on host:port (port 0: any free one, see `.port`) and return at
    once, so a refusal or a port in use is known before polling starts: the caller goes on polling into
    `state` in the same event loop, and closes the server at the end. Refused (SparktopError) on an
    address other machines reach without a long enough token. `history`: the writer beside the state."""
    check_token(host, token)
    registry = registry_for(state, price_per_kwh=price_per_kwh, currency=currency, history=history)
    # No access log: Prometheus scrapes every few seconds all day; refusals are logged by `_refusals`.
    runner = web.AppRunner(make_app(registry, token, cookie=f"sparktop_metrics_{port}"), access_log=None,
                           handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise SparktopError(f"{OPTION}: cannot listen on {host}:{port}: {exc.strerror or exc} (another port?)") \
            from None
    bound = next((a[1] for a in runner.addresses if isinstance(a, tuple) and len(a) >= 2), port)
    return MetricsServer(host=host, port=int(bound), token=token, runner=runner)


async def serve_metrics(state: ClusterState, host: str, port: int, token: str | None, *,
                        price_per_kwh: float | None = None, currency: str = "", history: object | None = None,
                        started: Callable[[MetricsServer], None] | None = None) -> None:
    """Serve `/metrics` of `state` until cancelled (run it as a task beside the poller); `started` is told
    the server once it listens. A refusal or a port in use raises from the task at once."""
    server = await start_metrics(state, host, port, token, price_per_kwh=price_per_kwh, currency=currency,
                                 history=history)
    try:
        if started is not None:
            started(server)
        await asyncio.get_running_loop().create_future()  # until cancelled
    finally:
        await server.close()
