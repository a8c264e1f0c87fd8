"""The words above the detail screen's charts: what a card has no room for.

For an engine: requests finished by reason, latency percentiles (p50, p95,
p99 over 30 s and p95 over the last minute), the session's peaks, its
lifetime counters, energy and cost per token, how it was found, and its
event log (with its nodes'). For a node: its energy per token and its
event log. Plain Rich text, drawn from the cluster state.
"""

from __future__ import annotations

import time

from rich.text import Text

from sparktop.observe.energy import POWER_SHORT, Energy
from sparktop.observe.snapshot import EngineSnapshot, Notice
from sparktop.observe.state import ClusterState
from sparktop.settings import Preferences
from sparktop.ui import render as r
from sparktop.units import ago

LATENCY_ROWS = (("TTFT", "ttft"), ("ITL", "itl"), ("queue", "queue"), ("e2e", "e2e"))
REASON_STYLE = {"error": "bold red", "abort": "red"}
NOTICE_STYLE = {"error": "bold red", "warn": "yellow", "info": "cyan"}


def _count(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1e6:
        return f"{value / 1e6:.1f}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    return f"{value:,.0f}"


LABEL = 9  # the width of the labels on the left, as the latency table's first column


def _cut(line: Text, width: int | None) -> Text:
    if width is not None and line.cell_len > width:
        line.truncate(width, overflow="ellipsis")
    return line


def _gbps(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def label(name: str) -> Text:
    return Text(f"{name:<{LABEL}}", style="bold")


def requests_line(e: EngineSnapshot) -> Text | None:
    """"finished 3.2/s: stop 2.9, length 0.2, abort 0.1" (errors and aborts in colour)."""
    if e.finished_rate_by_reason is None:
        return None
    line = label("finished")
    line.append(f"{r.rate(e.finished_rate)}/s")
    shown = [(k, v) for k, v in sorted(e.finished_rate_by_reason.items()) if v > 0]
    if shown:
        line.append(": ")
        for i, (reason, value) in enumerate(shown):
            if i:
                line.append(", ")
            line.append(f"{reason} {r.rate(value)}", style=REASON_STYLE.get(reason, ""))
    return line


def lifetime_lines(e: EngineSnapshot, now: float) -> list[Text]:
    """Requests and tokens over the engine's life; when it started."""
    if e.requests is None and e.gen_tokens_total is None:
        return []
    line = label("lifetime")
    line.append(f"{_count(e.requests)} requests")
    by = {k: v for k, v in sorted((e.finished_by_reason or {}).items()) if v}
    if by:
        line.append(" (")
        for i, (reason, value) in enumerate(by.items()):
            if i:
                line.append(", ")
            line.append(f"{reason} {_count(value)}", style=REASON_STYLE.get(reason, ""))
        line.append(")")
    line.append(f" · {_count(e.prompt_tokens_total)} prompt · {_count(e.gen_tokens_total)} generated tokens")
    lines = [line]
    if e.started_at is not None:
        started = label("started")
        started.append(f"{time.strftime('%H:%M:%S', time.localtime(e.started_at))}, {ago(now - e.started_at)} ago")
        lines.append(started)
    return lines


def latency_table(e: EngineSnapshot) -> list[Text]:
    """TTFT, ITL, queue time and end to end: p50, p95, p99 over the last minute
    and p95 over the last minute, one row each under a header."""
    if e.latency is None and e.ttft_p50 is None:
        return []
    rows = [Text(f"{'latency':<9}{'p50':>8}{'p95':>8}{'p99':>8}{'p95 1m':>9}", style="bold")]
    for label, name in LATENCY_ROWS:
        row = Text(f"{label:<9}", style="bold")
        values = [r.ms(e.pct(name, which)) for which in ("p50", "p95", "p99")]
        row.append("".join(f"{v:>8}" for v in values))
        slow = name == "queue" and (e.queue_slow or 0) > 0
        row.append(f"{r.ms(e.pct(name, 'p95_1m')):>9}", style="yellow" if slow else "")
        rows.append(row)
    if e.latency is None:  # an engine older than these histograms: TTFT and ITL from the fields
        rows = rows[:1] + [Text(f"{'TTFT':<9}{r.ms(e.ttft_p50):>8}{r.ms(e.ttft_p95):>8}"),
                           Text(f"{'ITL':<9}{r.ms(e.itl_p50):>8}{r.ms(e.itl_p95):>8}")]
    return rows


def peaks_line(peaks: dict[str, float] | None) -> Text | None:
    if not peaks:
        return None
    line = label("peaks")
    parts = []
    if "running" in peaks:
        parts.append(f"running {peaks['running']:.0f}")
    if "waiting" in peaks:
        parts.append(f"waiting {peaks['waiting']:.0f}")
    if "kv_usage" in peaks:
        parts.append(f"KV {r.pct(peaks['kv_usage'], 0)}")
    if "prompt_tps" in peaks:
        parts.append(f"prompt {r.rate(peaks['prompt_tps'])} t/s")
    if "gen_tps" in peaks:
        parts.append(f"gen {r.rate(peaks['gen_tps'])} t/s")
    line.append(" · ".join(parts))  # since sparktop started (the help says so): 80 columns hold the line
    return line


def energy_lines(energy: Energy | None, prefs: Preferences | None) -> list[Text]:
    """J per token, Wh and cost per million; then the power and rate it comes from."""
    if energy is None:
        return []
    line = label("energy")
    j = energy.j_per_token
    where = " + ".join(energy.nodes)
    if j is None:
        line.append(f"{energy.watts:.0f} W on {where}, no tokens generated", style="dim")
        return [line]
    line.append(f"{j:.2f} J/token", style="green")
    line.append(f" · {energy.wh_per_million:.0f} Wh/Mtok")
    price = prefs.energy_price_per_kwh if prefs else None
    if price is not None and prefs is not None:
        line.append(f" · {prefs.money(energy.cost_per_million(price))}/Mtok", style="green")
    source = Text(" " * LABEL)
    source.append(f"{energy.watts:.0f} W on {where} ÷ {r.rate(energy.tokens_per_s)} t/s ({POWER_SHORT})",
                  style="dim")
    return [line, source]


def notice_rows(notices: list[Notice], limit: int) -> list[Text]:
    """The newest `limit` notices, newest first."""
    rows = []
    for n in reversed(notices[-limit:] if limit else []):
        row = Text(time.strftime("%H:%M:%S ", time.localtime(n.t)), style="dim")
        if n.subject == "node":
            row.append(f"{n.key}: ", style="dim")
        row.append(n.text, style=NOTICE_STYLE.get(n.level, ""))
        rows.append(row)
    return rows


def engine_details(state: ClusterState, e: EngineSnapshot, prefs: Preferences | None,
                   log_lines: int) -> list[Text]:
    """Everything above the charts, in order, as lines."""
    now = state.now or time.time()  # a replay's clock in a replay
    out: list[Text] = []
    if e.engine:
        what = Text(f"{e.engine} {e.version or ''}".strip(), style="cyan")
        if e.recognised:
            what.append(f", recognised by {e.recognised}", style="dim")
        out.append(label("engine") + what)
    if e.found:
        out.append(label("found") + Text(e.found, style="dim"))
    if e.not_exported:
        # Wider than the label column: a space of its own rather than words run together.
        names = e.not_exported_text().split(": not exported")[0]
        out.append(Text("not exported ", style="bold") + Text(names, style="dim"))
    if e.spec_acceptance is not None or e.spec_accept_len is not None:
        parts = ([f"{e.spec_acceptance:.0%} of drafted tokens accepted"] if e.spec_acceptance is not None else []) + (
            [f"{e.spec_accept_len:.2f} tokens per step"] if e.spec_accept_len is not None else [])
        out.append(label("speculative") + Text(", ".join(parts) + " (last minute)"))
    finished = requests_line(e)
    if finished is not None:
        out.append(finished)
    out += lifetime_lines(e, now)
    peaks = peaks_line(state.peaks.get(e.key))
    if peaks is not None:
        out.append(peaks)
    out += energy_lines(state.engine_energy(e), prefs)
    out += latency_table(e)
    log = state.log(e.key, *state.engine_nodes(e))
    out.append(Text(f"events ({len(log)})" if log else "events: none yet", style="bold"))
    out += notice_rows(log, log_lines)
    return out


def node_details(state: ClusterState, name: str, prefs: Preferences | None, log_lines: int,
                 width: int | None = None) -> list[Text]:
    """Everything above a node's charts, as lines; the facts a line each, cut at `width` (a container's
    long name must not push the charts down a line)."""
    out: list[Text] = []
    snap = state.nodes.get(name)
    if snap is not None and snap.machine is not None:
        m = snap.machine
        out.append(_cut(label("machine") + Text(m.variant, style="cyan") + Text(
            f"  ({', '.join(x for x in (m.vendor, m.product, m.family) if x)}, from DMI)", style="dim"), width))
    if snap is not None and snap.processes:
        for proc in sorted(snap.processes, key=lambda proc: -(proc.used_mib or 0))[:4]:
            holder = proc.container(snap.containers)
            where = f", container {holder.name}" if holder is not None else (
                ", in a container docker does not list" if proc.container_id else "")
            out.append(_cut(label("gpu mem") + Text(f"{(proc.used_mib or 0) / 1024:.1f} GiB ", style="magenta")
                            + Text(f"{proc.name} (pid {proc.pid}{where})", style="dim"), width))
    view = state.links.get(name)
    if view is not None:
        for p in view.ports:
            line = label("link") + Text(f"{p.rdma_device}", style="cyan")
            line.append(f" ↓{_gbps(p.rdma_rx_gbps)} ↑{_gbps(p.rdma_tx_gbps)} Gb/s")
            line.append(f" · kernel ↓{_gbps(p.kernel_rx_gbps)} ↑{_gbps(p.kernel_tx_gbps)}", style="dim")
            line.append(f" · {p.netdev or '?'}, {p.source}", style="dim")
            out.append(_cut(line, width))
            peer = state.peer_of(name, p.rdma_device)
            if peer is not None:
                other, device, pair = peer
                seen = {True: "verified by traffic", False: "counters disagree", None: "no traffic yet"}[pair.verified]
                out.append(_cut(label("") + Text(f"→ {other} {device} ({pair.how}; {seen})",
                                                 style="bold yellow" if pair.verified is False else "dim"), width))
        if view.warning:
            out.append(Text(view.warning, style="bold yellow"))
        for pair in state.link_pairs:
            if pair.note and name in (pair.a_node, pair.b_node):
                out.append(Text(pair.note, style="yellow"))
        for note in state.link_notes:
            out.append(Text(note, style="dim"))
    out += energy_lines(state.node_energy(name), prefs)
    log = state.log(name)
    out.append(Text(f"events ({len(log)})" if log else "events: none yet", style="bold"))
    out += notice_rows(log, log_lines)
    return out
