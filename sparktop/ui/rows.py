"""The monitor's compact view: one line per node or engine, and the cluster's
summary line, for clusters whose cards do not fit the screen (eight Sparks
in an 80x24 terminal).

A row is a `Card` without a border: it is focused, opened with Enter and
painted like a card, so the detail screens and the key bindings are the
same whichever view shows it.
"""

from __future__ import annotations

from dataclasses import replace

from rich.text import Text

from sparktop.engine_ids import is_router
from sparktop.layouts import layout_of
from sparktop.observe.energy import Energy
from sparktop.observe.engines import name_of
from sparktop.observe.snapshot import EngineSnapshot, NodeSnapshot, Notice
from sparktop.observe.state import ClusterSummary, History
from sparktop.ui import render as r
from sparktop.ui.cards import Card, joules, memory_level, replicas_text
from sparktop.ui.render import nodes_named

NAME_WIDTH = 12  # a node's name, cut beyond this ("spark-a" fits with room)


def _dot(state: str) -> Text:
    dot = Text()  # not Text(style=): a base style would colour all the row
    dot.append("● ", style=r.STATE_STYLES.get(state, "white"))
    return dot


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


class NodeRow(Card):
    """A node in one line: state, memory bar and figures, GPU, CPU, containers."""

    kind = "node"

    def show(self, snap: NodeSnapshot, history: History | None, notice: Notice | None = None,
             energy: Energy | None = None, link=None) -> None:
        self._last = (snap, history, notice, energy, link)
        width = self.inner_width()
        stamp = (snap.t, snap.state, width, id(notice))
        if stamp == self._drawn:
            return
        self._drawn = stamp
        self.set_class(snap.state in ("stale", "down"), "-stale")
        self._paint(snap.name, r.state_badge(snap.state), [node_line(snap, width, energy, history)])


SPARK_MIN = 8  # cells a row's trailing sparkline needs to be worth showing
SPARK_MAX = 40


def _trailing_spark(line: Text, width: int, history: History | None, series: str, top: float | None,
                    style: str) -> None:
    """What a wide screen has left of a row: the series' recent history."""
    room = min(SPARK_MAX, width - line.cell_len - 2)
    if history is None or room < SPARK_MIN:
        return
    line.append("  ")
    line.append_text(r.spark(history.values(series, room), room, top=top, style=style))


def node_line(snap: NodeSnapshot, width: int, energy: Energy | None = None,
              history: History | None = None) -> Text:
    line = _dot(snap.state)
    line.append(f"{_cut(snap.name, NAME_WIDTH):<{NAME_WIDTH}} ", style="bold")
    if snap.state in ("down",) and snap.reason:
        line.append(_cut(snap.reason, max(1, width - line.cell_len)), style="red")
        return line
    mem = snap.memory
    gpu = snap.gpu
    tail = Text()
    if gpu is not None:
        tail.append("  gpu ", style="bold")
        tail.append(f"{r.num(gpu.util, '{:.0f}%'):>4} {r.num(gpu.temp, '{:.0f}°C'):>4} "
                    f"{r.num(gpu.power, '{:.0f}W'):>4}")
    else:
        tail.append("  gpu ", style="bold")
        tail.append("—", style="dim")
    tail.append("  cpu ", style="bold")
    tail.append(f"{r.num(snap.cpu_pct, '{:.0f}%'):>4}")
    running = sum(1 for c in snap.containers if c.state == "running")
    extra = Text()
    if snap.docker_status == "ok":
        extra.append(f"  {running} ctr", style="dim")
    per_token = joules(energy)
    if per_token:
        extra.append(f"  {per_token}", style="green")
    if mem is not None and mem.total:
        used_style = {"ok": "blue", "warn": "yellow", "danger": "red"}[memory_level(snap)]
        label = f" {r.gib(mem.used)}/{r.gib(mem.total, 0)}G"
        # The bar takes what the figures leave, between 6 and 30 cells.
        room = width - line.cell_len - 4 - len(label) - tail.cell_len
        if room - extra.cell_len >= 10:
            room -= extra.cell_len
            tail.append_text(extra)
        line.append("mem ", style="bold")
        line.append_text(r.memory_bar(mem.total, snap.engines_mib * 1024**2, mem.used, mem.page_cache,
                                      max(6, min(30, room)), used_style))
        line.append(label)
    else:
        line.append("mem —", style="dim")
    line.append_text(tail)
    _trailing_spark(line, width, history, "gpu_util", 100.0, "green")
    return line


class EngineRow(Card):
    """An engine in one line: model and layout, nodes, KV, queue, rates, TTFT."""

    kind = "engine"

    def show(self, snap: EngineSnapshot, history: History | None, notice: Notice | None = None,
             energy: Energy | None = None, nodes: list[str] | None = None, mixed: bool = False) -> None:
        self._last = (snap, history, notice, energy, nodes, mixed)
        width = self.inner_width()
        stamp = (snap.t, snap.state, snap.stage, width, id(notice), tuple(nodes or ()), mixed)
        if stamp == self._drawn:
            return
        self._drawn = stamp
        self.set_class(snap.state in ("stale", "unreachable", "failed"), "-stale")
        self._paint(snap.model or "engine", r.state_badge(snap.state),
                    [engine_line(snap, width, nodes, history, mixed,
                                 self.engines() if is_router(snap.kind) else None)])


NOT_EXPORTED = "n/e"  # a figure the engine does not export (the help screen says so)


def engine_line(snap: EngineSnapshot, width: int, nodes: list[str] | None = None,
                history: History | None = None, mixed: bool = False,
                engines: list[EngineSnapshot] | None = None) -> Text:
    """`mixed`: the screen shows engines of several kinds, so each row names its own; `engines`: every
    engine, for a router's row to say its replicas' percentiles taken together."""
    line = _dot(snap.state)
    room = min(34, max(24, width - 54))  # the name takes what a wide screen spares, up to 34
    line.append(f"{row_name(snap, room, mixed):<{room}} ", style="bold")
    where = nodes_named(nodes or ([snap.node] if snap.node else []), 12)
    line.append(f"{_cut(where, 12):<12}", style="dim")
    if snap.state == "starting":
        line.append(f" starting: {snap.stage or '…'}", style="yellow")
        return line[:width]
    if snap.state != "ready" and snap.state != "sleeping":
        line.append(f" {snap.state}" + (f": {snap.reason}" if snap.reason else ""),
                    style="red" if snap.state in ("unreachable", "failed", "hung") else "yellow")
        return line[:width]
    kv_style = "green" if (snap.kv_usage or 0) < 0.8 else "yellow" if (snap.kv_usage or 0) < 0.95 else "red"
    def shown(figure: str, text: str) -> str:
        return text if snap.exports(figure) else f"{NOT_EXPORTED:>{len(text)}}"  # the help says what n/e is

    parts = [r.field(" KV", shown("kv", f"{r.pct(snap.kv_usage, 0):>4}"), kv_style),
             r.field("run", shown("running", f"{r.num(snap.running):>2}")),
             r.field("wait", shown("waiting", f"{r.num(snap.waiting):>2}"),
                     "yellow" if (snap.waiting or 0) > 0 else ""),
             r.field("gen", shown("gen_tps", f"{r.rate(snap.gen_tps):>5} t/s"), "cyan"),
             r.field("TTFT", shown("ttft", f"{r.ms(snap.ttft_p50):>5}"))]
    if is_router(snap.kind):
        # A router holds no KV cache and its tokens are its engines' (their rows count them):
        # it says where it sends requests and what it has in flight.
        layout = layout_of(snap.topology)
        parts = [Text(f" routes to {layout.replicas} engines" if layout and layout.replicas > 1 else " router",
                      style="cyan")]
        # Its replicas' percentiles taken together, before what it has in flight: the latency its clients see.
        together = replicas_text(snap, engines or [], width - line.cell_len - 1 - parts[0].cell_len - 3)
        if together:
            parts[0].append(f" · {together}", style="cyan")
        if snap.running is not None:
            parts.append(r.field("in flight", f"{r.num(snap.running):>2}"))
    for part in parts:  # as many as fit, in this order of importance
        if line.cell_len + 1 + part.cell_len > width:
            break
        line.append(" ")
        line.append_text(part)
    else:
        _trailing_spark(line, width, history, "gen_now", None, "cyan")
    return line


def row_name(snap: EngineSnapshot, room: int = 34, engine: bool = False) -> str:
    """"gpt-oss-120b · 2x tp=2" for a replica (the router's row names the
    router: "gpt-oss-120b · router least-busy"), the whole layout otherwise;
    with `engine`, the engine too ("gpt-oss-120b · llama.cpp", a solo layout
    left unsaid where both do not fit); in `room` cells, the model is cut
    before the layout is."""
    model = snap.model or "engine"
    layout = layout_of(snap.topology)
    what = snap.topology or ""
    if layout is not None and layout.router:
        what = f"router {layout.router}" if is_router(snap.kind) else replace(layout, router=None).text
    name = (snap.engine or name_of(snap.kind or "")) if engine and not is_router(snap.kind) else ""
    if name:
        both = f"{what} · {name}" if what else name
        what = both if len(model) + 3 + len(both) <= room or what != "solo" else name
    if not what:
        return _cut(model, room)
    if len(model) + 3 + len(what) <= room:
        return f"{model} · {what}"
    left = room - 3 - len(what)
    return f"{_cut(model, left)} · {what}" if left >= 4 else _cut(what, room)


def summary_line(s: ClusterSummary, width: int) -> Text:
    """"8 nodes ok · mem 745/957G (78%) · 8/8 engines ready · gen 682 t/s ·
    prompt 1.9k t/s · run 41 wait 0 · 412 W · 0.60 J/tok"."""
    line = Text("cluster ", style="bold")
    ok = f"{s.nodes} nodes ok" if s.nodes_ok == s.nodes else f"{s.nodes_ok}/{s.nodes} nodes ok"
    parts = [Text(ok, style="" if s.nodes_ok == s.nodes else "bold red")]
    if s.mem_total:
        share = s.mem_used / s.mem_total
        parts.append(Text(f"mem {r.gib(s.mem_used, 0)}/{r.gib(s.mem_total, 0)}G ({share:.0%})",
                          style="yellow" if share > 1 - 0.2 else ""))
    ready = f"{s.engines_ready}/{s.engines} engines ready"
    parts.append(Text(ready, style="" if s.engines_ready == s.engines else "yellow"))
    parts.append(Text("gen ") + Text(f"{r.rate(s.gen_tps)} t/s", style="cyan"))
    parts.append(Text("prompt ") + Text(f"{r.rate(s.prompt_tps)} t/s", style="cyan"))
    parts.append(Text(f"run {s.running:.0f} wait {s.waiting:.0f}", style="yellow" if s.waiting else ""))
    if s.watts is not None:
        parts.append(Text(f"{s.watts:.0f} W"))
    if s.j_per_token is not None:
        parts.append(Text(f"{s.j_per_token:.2f} J/tok", style="green"))
    for i, part in enumerate(parts):
        gap = " · " if i else ""
        if line.cell_len + len(gap) + part.cell_len > width:
            break
        line.append(gap, style="dim")
        line.append_text(part)
    return line
