"""The node and engine cards of the monitor screen.

A card is one focusable widget that renders its snapshot and history into
lines of Rich text; `Enter` on a focused card opens its detail view. Cards
use Textual's line API: each line becomes a Strip once per update, at the
card's width, and repaints draw those strips — the monitor repaints every
card every second, so this is most of what watching costs.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from sparktop.engine_ids import is_router
from sparktop.observe.alerts import DISK_FULL_B, DISK_LOW_B
from sparktop.observe.energy import Energy
from sparktop.observe.engines import name_of
from sparktop.observe.link import LinkView
from sparktop.observe.machine import limiting
from sparktop.observe.replicas import group_behind, group_latency
from sparktop.observe.snapshot import EngineSnapshot, NodeSnapshot, Notice
from sparktop.observe.state import ClusterState, History
from sparktop.ui import render as r

if TYPE_CHECKING:
    from sparktop.model.perf import PerfModel  # imported when first needed: it is slow to load

LOW_MEMORY_WARN = 0.20  # MemAvailable below this share of MemTotal: yellow
LOW_MEMORY_DANGER = 0.10  # ... below this: red (a GB10 freezes when it runs out)


def memory_level(snap: NodeSnapshot) -> str:
    mem = snap.memory
    if mem is None or mem.total == 0:
        return "ok"
    share = mem.available / mem.total
    if share < LOW_MEMORY_DANGER:
        return "danger"
    if share < LOW_MEMORY_WARN:
        return "warn"
    return "ok"


TALL_ROWS = 4  # a sparkline this many rows tall shows several polls per column:
ROWS_PER_STEP = 4  # one more for every this many rows (2 up to 8 rows, 3 up to 12)


def polls_per_column(rows: int) -> int:
    """How many polls a column of a sparkline `rows` tall stands for. Each
    time a column is added every row of the chart is redrawn: a taller
    chart moves less often (and shows that much more history), so the rows
    redrawn per second stay about the same whatever the screen's height."""
    if rows < TALL_ROWS:
        return 1
    return max(2, -(-rows // ROWS_PER_STEP))


def _columns(history: History, name: str, span: int, step: int) -> list[float]:
    """The last `span` columns of a series, `step` polls each (their highest),
    counted from the first poll so a column never changes once complete; the
    polls of the column still filling are left out."""
    if step == 1:
        return history.values(name, span)
    partial = history.pushed % step
    values = history.values(name, span * step + partial)
    if partial:
        values = values[:-partial]
    start = len(values) % step
    return [max(values[i:i + step]) for i in range(start, len(values), step)]


# How a line of text is cut into styled segments, by what decides it (the
# console, the card's style, the line's style, its length and its spans):
# the cuts and the style of each piece. From one second to the next a card's
# lines change their figures but rarely their styling. Emptied when full.
_SEGMENT_PLANS: dict[tuple, list[tuple[int, int, Style | None]]] = {}
_SEGMENT_PLANS_MAX = 2048


def line_segments(text: Text, console: Console, style: Style) -> list[Segment]:
    """The segments of one line of a card under the card's `style`: what
    `Segment.apply_style(text.render(console), style)` gives. Rich's render
    depends on where the spans are, not on the characters: the first line
    styled a way is rendered by Rich and its cuts kept, the next ones are
    cut the same way (every line that changes comes here, every second)."""
    plain = text.plain
    spans = text.spans
    if not spans:
        return [Segment(plain, style) if style else Segment(plain)]  # Rich leaves out the line's own style then
    key = (id(console), style, text.style, len(plain), tuple(spans))
    plan = _SEGMENT_PLANS.get(key)
    if plan is None:
        segments = list(Segment.apply_style(text.render(console), style))
        if any(segment.style is not None and segment.style.link for segment in segments):
            return segments  # Rich gives a link a new id every time: never kept
        plan = []
        at = 0
        for segment in segments:
            plan.append((at, at + len(segment.text), segment.style))
            at += len(segment.text)
        if len(_SEGMENT_PLANS) >= _SEGMENT_PLANS_MAX:
            _SEGMENT_PLANS.clear()
        _SEGMENT_PLANS[key] = plan
        return segments
    return [Segment(plain[start:end], segment_style) for start, end, segment_style in plan]


class Card(Widget, can_focus=True):
    kind = "card"

    def __init__(self, key: str, **kwargs):
        super().__init__(**kwargs)
        self.key = key
        self._drawn: tuple | None = None
        self.text = ""  # what the card shows, as plain text (tests, screen readers)
        self.spark_height = 1  # rows per sparkline; the screen raises it when there is room
        self._card_lines: list[Text] = []
        self._card_strips: list[Strip | None] | None = None  # cut lazily, per line
        self._card_strips_key: int | None = None  # the width they were cut to

    def _paint(self, title: str, subtitle: Text, lines: list[Text]) -> None:
        titles_changed = (title, subtitle) != self._titles
        if titles_changed:  # setting them repaints the border: only on change
            self._titles = (title, subtitle)
            self.border_title = title
            self.border_subtitle = subtitle
        self.text = "\n".join([f"{title} {subtitle.plain}", *(line.plain for line in lines)])
        relayout = len(lines) != len(self._card_lines)  # same height: a repaint is enough
        old_lines, old_strips = self._card_lines, self._card_strips
        self._card_lines = lines
        width = self.content_size.width
        if relayout or titles_changed or old_strips is None or self._card_strips_key != width:
            self._card_strips = None
            self.refresh(layout=relayout)
            return
        # Most of a card reads the same from one second to the next: cut and
        # repaint only the lines that changed (the compositor and the
        # terminal then redraw those rows alone).
        strips: list[Strip | None] = list(old_strips)
        changed = []
        for y, (before, after) in enumerate(zip(old_lines, lines, strict=True)):
            if before is not after and before != after:  # a sparkline row that did not move is the same Text
                strips[y] = None
                changed.append(Region(0, y, width, 1))
        self._card_strips = strips
        if changed:
            self.refresh(*changed)  # one refresh: each clears the widget's caches and asks for an idle

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, len(self._card_lines))

    def render_line(self, y: int) -> Strip:
        width = self.content_size.width
        if self._card_strips is None or self._card_strips_key != width:
            # The widget's style is looked up once per update, not per line: it walks the DOM.
            self._card_style = self.rich_style
            self._card_strips = [None] * len(self._card_lines)
            self._card_strips_key = width
        if y >= len(self._card_strips):
            return Strip.blank(width, self._card_style)
        strip = self._card_strips[y]
        if strip is None:
            # One Strip per line, cut to the width here: each Strip Textual
            # makes carries seven caches, and a line went through three.
            style = self._card_style or self.rich_style
            segments = line_segments(self._card_lines[y], self.app.console, style)
            strip = Strip(Segment.adjust_line_length(segments, width, style), width)
            self._card_strips[y] = strip
        return strip

    _card_style: Style | None = None
    _titles: tuple | None = None

    def _restyle(self) -> None:
        self._card_strips = None

    def on_focus(self) -> None:
        self._restyle()

    def on_blur(self) -> None:
        self._restyle()

    def inner_width(self) -> int:
        return max(20, self.content_size.width or 36)

    def on_resize(self) -> None:
        # The first paint can happen before layout; draw again at the real size.
        self.redraw()

    def show(self, snap, history: History | None, notice: Notice | None = None,
             energy: Energy | None = None) -> None:
        """Draw a snapshot, its history, its last notice (while recent) and
        its energy per token (each card kind draws its own)."""
        raise NotImplementedError

    def engines(self) -> list[EngineSnapshot]:
        """Every engine the app knows (a router's card and row show its replicas' figures), none outside an
        app."""
        try:
            state = getattr(self.app, "state", None)
        except Exception:  # noqa: BLE001 - no active app: a card drawn alone
            return []
        return list(state.engines.values()) if isinstance(state, ClusterState) else []

    def redraw(self) -> None:
        """Draw the last figures again (the size or the sparkline height changed)."""
        if self._last is not None:
            self.show(*self._last)

    _last: tuple | None = None


    def _sparks(self, left: tuple, right: tuple, width: int, history: History) -> list[Text]:
        """Two labelled sparklines side by side (label, series, top, style),
        `spark_height` rows tall; a tall one shows its scale (the top value)
        in its top-left corner.

        A tall sparkline puts several polls in a column (`polls_per_column`,
        their highest, so a spike stays) and moves once they are all in:
        every row of it is redrawn whenever it moves, and on a big screen
        that was most of what watching cost. It shows that much more
        history too."""
        rows = self.spark_height
        step = polls_per_column(rows)
        # Between moves nothing it draws can change: a History only grows, a
        # column is drawn once all its polls are in, and a series that appears
        # fills its past with gaps. Known without reading the series, while
        # the polls a chart shows fit in the history kept.
        moment = (history.pushed // step, left[1] in history.series, right[1] in history.series, width, rows, left,
                  right)
        drawn = self._sparks_drawn
        if drawn is not None and drawn[2] is history and drawn[3] == moment and width * step <= history.maxlen:
            return drawn[1]
        series = []
        for label, name, top, style in (left, right):
            pad = max(len(label), 5) if rows > 2 else len(label)
            span = (width - 1) // 2 - pad
            series.append((label, top, style, pad, span, _columns(history, name, max(0, span), step)))
        # The rows of a tall sparkline between its moves: the same Text
        # objects, which the paint then knows unchanged without comparing.
        key = (width, rows, [(label, top, style, pad, span) for label, top, style, pad, span, _ in series],
               [values for *_, values in series])
        if drawn is not None and drawn[0] == key:
            self._sparks_drawn = (key, drawn[1], history, moment)
            return drawn[1]
        sides = []
        for label, top, style, pad, span, values in series:
            shown = values[-span:] if span > 0 else []
            peak = top if top is not None else (max(shown) if shown else 0)
            scale = ("100%" if top in (1.0, 100.0) else r.rate(peak)) if rows > 2 else ""
            tags = [label if i == rows - 1 else scale if i == 0 else "" for i in range(max(1, rows))]
            sides.append((values, span, [f"{tag:<{pad}}"[:pad] for tag in tags], top, style))
        lines = r.labelled_sparks(sides[0], sides[1], rows)
        if drawn is not None and drawn[0][:3] == key[:3]:
            # A row that reads the same keeps its Text: while the history is
            # shorter than the chart, each move shifts where a row's blank
            # cells start, spaces that look the same whatever their colour,
            # and the rows above the line (most of a flat chart's) would be
            # redrawn for nothing. Same size, labels and colours: a row's
            # cells only take over its padding (spaces) or move their blocks,
            # which changes what it reads.
            lines = [before if before.plain == after.plain else after
                     for before, after in zip(drawn[1], lines, strict=True)]
        self._sparks_drawn = (key, lines, history, moment)
        return lines

    _sparks_drawn: tuple | None = None


def notice_line(notice: Notice | None, width: int) -> Text | None:
    """The card's last notice: "⚑ 16:02:11 KV cache above 90 % (93 %)"."""
    if notice is None:
        return None
    style = {"error": "bold red", "warn": "yellow"}.get(notice.level, "cyan")
    text = Text(f"⚑ {time.strftime('%H:%M:%S', time.localtime(notice.t))} ", style="dim")
    room = width - text.cell_len
    words = notice.text
    if len(words) > room and ": " in words:
        words = words.split(": ", 1)[0]  # "engine down: container … exited (137)" → "engine down"
    if len(words) > room:
        words = words[: max(1, room - 1)] + "…"
    text.append(words, style=style)
    return text


def link_of(state, node: str) -> tuple[LinkView, float | None] | None:
    """A node's link view and what NCCL should send over it (Gb/s each way), for its card."""
    view = state.links.get(node)
    if view is None:
        return None
    return view, expected_link_gbps(state.spread_engines(node)) if view.engines else None


def _link_busy(view: LinkView) -> bool:
    moved = [v for v in (view.rdma_rx_gbps, view.rdma_tx_gbps, view.kernel_rx_gbps, view.kernel_tx_gbps)
             if v is not None]
    return sum(moved) > 0.05


def _gb(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}" if value < 1 else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def link_lines(view: LinkView, expected: float | None, width: int) -> list[Text]:
    """"link ↓12.1 ↑12.3 of 200 Gb/s · NCCL ~12.0 · kernel 0.00", and its warning: RDMA each way, what
    the model says NCCL sends at the engines' token rates, the kernel's bytes (both ways)."""
    line = Text("link ", style="bold")
    line.append(f"↓{_gb(view.rdma_rx_gbps)} ↑{_gb(view.rdma_tx_gbps)}", style="cyan")
    line.append(f" of {view.capacity_gbps:.0f} Gb/s" if view.capacity_gbps else " Gb/s", style="dim")
    parts = []
    if expected is not None:
        parts.append(Text("NCCL ~", style="dim") + Text(_gb(expected)))
    kernel = None if view.kernel_rx_gbps is None and view.kernel_tx_gbps is None else (
        (view.kernel_rx_gbps or 0.0) + (view.kernel_tx_gbps or 0.0))
    parts.append(Text("kernel ", style="dim") + Text(_gb(kernel)))
    for part in parts:
        if line.cell_len + 3 + part.cell_len <= width:
            line.append(" · ", style="dim")
            line.append_text(part)
    out = [line]
    if view.warning:
        # A narrow card (80 columns) gives the warning a third line rather than cut what to check.
        out += r.wrap_words(Text(view.warning, style="bold yellow"), width, 2 if width >= 50 else 3)
    return out


def joules(energy: Energy | None) -> str | None:
    """"0.81 J/tok", or None when nothing is generated (no figure, not infinity)."""
    j = energy.j_per_token if energy is not None else None
    if j is None:
        return None
    return f"{j:.2f} J/tok" if j < 10 else f"{j:.0f} J/tok"


class NodeCard(Card):
    kind = "node"

    def show(self, snap: NodeSnapshot, history: History | None, notice: Notice | None = None,
             energy: Energy | None = None, link: tuple[LinkView, float | None] | None = None) -> None:
        self._last = (snap, history, notice, energy, link)
        width = self.inner_width()
        stamp = (snap.t, snap.state, snap.reason, width, self.spark_height, id(notice),
                 None if link is None else (link[0].warning, link[1]))
        if stamp == self._drawn:
            return
        self._drawn = stamp
        level = memory_level(snap)
        self.set_class(level == "warn", "-warn")
        self.set_class(level == "danger", "-danger")
        self.set_class(snap.state in ("stale", "down"), "-stale")
        title = snap.name if snap.machine is None else f"{snap.name} · {snap.machine.variant}"
        self._paint(title, r.state_badge(snap.state), self._lines(snap, history, width, notice, energy, link))

    def _lines(self, snap: NodeSnapshot, history: History | None, width: int, notice: Notice | None = None,
               energy: Energy | None = None, link: tuple[LinkView, float | None] | None = None) -> list[Text]:
        lines: list[Text] = []
        mem = snap.memory
        used_style = {"ok": "blue", "warn": "yellow", "danger": "red"}[memory_level(snap)]
        if mem:
            label = f" {r.gib(mem.used)}/{r.gib(mem.total)}G"
            line = Text("mem ", style="bold")
            line.append_text(r.memory_bar(mem.total, snap.engines_mib * 1024**2, mem.used, mem.page_cache,
                                          max(4, width - 4 - len(label)), used_style))
            line.append(label)
            lines.append(line)
            avail_style = "" if used_style == "blue" else used_style
            parts = [Text("   "), Text("avail ", style="dim") + Text(f"{r.gib(mem.available)}G", style=avail_style),
                     Text("engines ", style="dim") + Text(f"{snap.engines_mib / 1024:.1f}G", style="magenta"),
                     Text("cache ", style="dim") + Text(f"{r.gib(mem.page_cache)}G")]
            if mem.swap_used:
                parts.append(Text(f"swap {r.gib(mem.swap_used)}G", style="yellow"))
            flowed = r.flow(parts[1:], width - 4)
            lines.append(Text("    ") + flowed[0])
        else:
            lines.append(Text("mem  —", style="dim"))
        gpu = snap.gpu
        line = Text("gpu ", style="bold")
        if gpu is not None:
            line.append(f"{r.num(gpu.util, '{:.0f}%'):>4}")
            line.append(f"  {r.num(gpu.temp, '{:.0f}°C')}  {r.num(gpu.power, '{:.0f}W')}  "
                        f"{r.num(gpu.sm_clock, '{:.0f}MHz')} {gpu.pstate or ''}")
            per_token = joules(energy)
            if per_token and line.cell_len + 2 + len(per_token) <= width:
                line.append(f"  {per_token}", style="green")
            held = " ".join(limiting(gpu.throttle or []))
            if held:
                # On the same line (a card that grows and shrinks as the GPU brushes its cap would jump).
                room = width - line.cell_len - 2
                if room >= 6:
                    line.append("  " + (held if len(held) <= room else held[: room - 1] + "…"), style="yellow")
        else:
            line.append(" no nvidia-smi" if snap.gpu_status == "missing" else f" {snap.gpu_status}", style="dim")
        lines.append(line)
        line = Text("cpu ", style="bold")
        line.append(f"{r.num(snap.cpu_pct, '{:.0f}%'):>4}")
        line.append("  ")
        running = [c for c in snap.containers if c.state == "running"]
        if snap.docker_status == "ok":
            line.append(f"{len(running)} container{'s' if len(running) != 1 else ''}", style="dim")
        elif snap.docker_status == "missing":
            line.append("no docker", style="dim")
        else:
            line.append(f"docker: {snap.docker_status}", style="yellow")
        lines.append(line)
        # A disk only once it runs short (the alerts' thresholds): the fullest filesystem, in one short line.
        short = min((d for d in snap.disks if d.free < DISK_LOW_B), key=lambda d: d.free, default=None)
        if short is not None:
            text = f"{short.free / 1e9:.0f} GB free on {short.mount}"
            lines.append(Text("disk ", style="bold") + Text(text[: max(0, width - 5)],
                                                            style="red" if short.free < DISK_FULL_B else "yellow"))
        # The link's line where it is in use (an engine spread over this node, traffic, a warning): a solo
        # node's idle cable is the detail screen's to show, not a line on every card.
        if link is not None and (link[0].engines or link[0].warning or _link_busy(link[0])):
            lines += link_lines(*link, width)
        for c in running[:2]:
            status = c.status.replace(" seconds", "s").replace(" minutes", "m").replace(" hours", "h")
            room = max(8, width - 4 - len(status) - 2)
            name = c.name if len(c.name) <= room else c.name[: room - 1] + "…"
            row = Text("  ▸ ", style="dim")
            row.append(name)
            row.append(" " * max(2, width - 4 - len(name) - len(status)))
            row.append(status, style="dim")
            lines.append(row)
        if history is not None:
            lines += self._sparks(("mem ", "mem_frac", 1.0, "blue"), ("gpu ", "gpu_util", 100.0, "green"), width,
                                  history)
        if snap.state != "ok" and snap.reason:
            lines.append(Text(snap.reason[: width], style="red" if snap.state == "down" else "yellow"))
        latest = notice_line(notice, width)
        if latest is not None:
            lines.append(latest)
        return lines


_ROOFLINE_CACHE: dict[tuple, PerfModel | None] = {}  # the model's byte counts walk every layer: once per engine
_ROOFLINE_TPS: dict[tuple, float] = {}


def _engine_key(snap, inventory=None) -> tuple:
    return (snap.model, snap.topology, snap.kind, getattr(snap, "image", None), tuple(getattr(snap, "argv", ())),
            None if inventory is None else (inventory.defaults.image, inventory.defaults.twin_speed,
                                            tuple(n.name for n in inventory.nodes)))


def perf_for(snap, inventory=None) -> PerfModel | None:
    """The performance model of an engine's model in its own layout, as `sparktop predict` resolves it (its
    card as its runtime lays the weights out, the stack its image names, the inventory's fit), or None for a
    model sparktop has no card for."""
    key = _engine_key(snap, inventory)
    if key in _ROOFLINE_CACHE:
        return _ROOFLINE_CACHE[key]
    from sparktop.errors import SparktopError
    from sparktop.launch.prediction import engine_topology, subject_for_engine
    from sparktop.model.forecast import resolve

    topology = engine_topology(snap)
    perf = None
    with contextlib.suppress(SparktopError):
        subject = subject_for_engine(snap, inventory)
        if subject is not None:
            perf = resolve(subject, topology).perf(topology, subject.serving_for(topology))
    _ROOFLINE_CACHE[key] = perf
    return perf


def expected_link_gbps(engines) -> float | None:
    """What NCCL should send each way over a node's link, Gb/s: every engine spread over it, its all-reduce
    bytes per token (the model) at the rate it computes tokens now. None when no engine has a model card."""
    total = None
    for e in engines:
        if e.state != "ready" or not e.model:
            continue
        perf = perf_for(e)
        if perf is None:
            continue
        # Prompt tokens served from the prefix cache are not computed again: no all-reduce moves them.
        computed_prompt = (e.prompt_tps or 0.0) * (1.0 - min(1.0, max(0.0, e.prefix_hit_rate or 0.0)))
        tokens = (e.gen_tps or 0.0) + computed_prompt
        total = (total or 0.0) + perf.link_bytes_per_token() * tokens * 8 / 1e9
    return total


# Above this share of the roofline a reading is a measurement problem, not a figure (rounding and the
# roofline's own 1,024-token context leave a few percent).
ROOFLINE_SLACK = 1.05


def roofline_share(snap, inventory=None) -> float | None:
    """Generation tokens/s as a fraction of the bandwidth roofline for the
    batch running now (every weight and KV byte read once per step at the
    full 273 GB/s): how close the engine runs to what the memory allows; on
    twins at ×S (`defaults.twin_speed`), of S times the roofline."""
    if not snap.gen_tps or not snap.running or not snap.model:
        return None
    perf = perf_for(snap, inventory)
    if perf is None:
        return None
    speed = _twin_speed(snap) or (inventory.defaults.twin_speed if inventory is not None else 1.0)
    key = _engine_key(snap, inventory)
    batch = max(1, round(snap.running))
    roof = _ROOFLINE_TPS.get((key, batch))
    if roof is None:  # the model's byte count walks every layer: once per batch size, not every second
        roof = _ROOFLINE_TPS[(key, batch)] = perf.roofline_decode_tps(batch, ctx=1024)
    return snap.gen_tps / (roof * speed)


def _twin_speed(snap) -> float | None:
    """A twin's own pace where its command line gives one (`sparktop twin serve --speed 5`, started by hand
    beside the inventory's twins): no engine of the real ones takes a --speed."""
    from sparktop.observe.argv import flag_value

    argv = snap.argv or []
    if "twin" not in argv:
        return None
    try:
        value = float(flag_value(argv, "--speed") or 0)
    except ValueError:
        return None
    return value if value > 0 else None


def bandwidth_roofline_gbs() -> float:
    """A node's memory bandwidth, GB/s: the figure the roofline above is
    drawn at (`PerfModel.hw`, GB10 unless told otherwise)."""
    from sparktop.model.hardware import GB10  # imported when first needed, like the roofline's model

    return GB10.bandwidth_gbs


def _gbs(bytes_per_s: float) -> str:
    gbs = bytes_per_s / 1e9
    return f"{gbs:.1f}" if gbs < 10 else f"{gbs:.0f}"


SLEEP_MEANING = {1: "weights offloaded, KV cache freed", 2: "weights and KV cache discarded",
                 None: "KV cache released"}
SLEEP_SHORT = {1: "weights offloaded", 2: "weights discarded", None: "KV cache released"}  # fits a 36-cell card


def sleep_badge(snap: EngineSnapshot) -> Text:
    """The state word of a sleeping engine: "sleeping L1"."""
    level = f" L{snap.sleep_level}" if snap.sleep_level is not None else ""
    return Text(f"● sleeping{level}", style="bold sky_blue1")


def rejected_field(snap: EngineSnapshot) -> Text | None:
    """Requests vLLM refused (a queue limit was reached): an error each
    client got, so in red while the rate is nonzero and for the 30 s after."""
    if snap.rejection_rate:
        return r.field("rejected", f"{r.rate(snap.rejection_rate)}/s", "bold red")
    if snap.rejections_recent:
        return r.field("rejected", f"{snap.rejections_recent:.0f} in {_span(snap)}", "red")
    return None


def _span(snap: EngineSnapshot) -> str:
    """The time the recent rejections were counted over: 30 s once watched that long."""
    return f"{snap.rejections_span:.0f}s" if snap.rejections_span is not None else "30s"


def engine_facts(snap: EngineSnapshot) -> list[Text]:
    """What the detail view says in words above its charts: the sleep state,
    the queue by reason, admission rejections and the memory bandwidth vLLM
    estimates, each only when the engine reports it (vLLM 0.32 and later)."""
    facts: list[Text] = []
    if snap.state == "sleeping":
        facts.append(Text(f"{snap.sleep_text}: {SLEEP_MEANING.get(snap.sleep_level, '')}; "
                          "it serves nothing until woken up", style="bold sky_blue1"))
    if snap.waiting_by_reason is not None:
        reasons = ", ".join(f"{value:.0f} {reason}" for reason, value in sorted(snap.waiting_by_reason.items()))
        facts.append(Text(f"waiting {r.num(snap.waiting)}: {reasons}",
                          style="yellow" if snap.deferred > 0 else ""))
    if snap.rejections is not None:
        line = Text(f"admission rejections: {snap.rejections:.0f} since the server started")
        if snap.rejections_by_reason and snap.rejections:
            line.append(" (" + ", ".join(f"{reason} {value:.0f}" for reason, value
                                          in sorted(snap.rejections_by_reason.items()) if value) + ")")
        if snap.rejection_rate or snap.rejections_recent:
            line.append(f"; {r.rate(snap.rejection_rate or 0)}/s now, {snap.rejections_recent or 0:.0f} "
                        f"in the last {_span(snap)}", style="bold red")
        facts.append(line)
    bw = snap.mem_bw
    if bw is not None:
        roof = bandwidth_roofline_gbs()
        line = Text(f"memory bandwidth: {_gbs(bw)} of {roof:.0f} GB/s ({bw / 1e9 / roof:.0%}), vLLM's estimate "
                    f"per GPU")
        if snap.mem_read_bps is not None and snap.mem_write_bps is not None:
            line.append(f"; read {_gbs(snap.mem_read_bps)}, write {_gbs(snap.mem_write_bps)} GB/s")
        facts.append(line)
    return facts


# The figures a card shows, in the order its "not exported by" line names the missing ones (KV has its own line).
SHOWN_FIGURES = ("running", "waiting", "gen_tps", "prompt_tps", "ttft", "itl", "queue", "e2e", "finished",
                 "preemptions")


# The card's own words for them, so the line names what a vLLM card shows in their place.
CARD_WORDS = {"running": "run", "waiting": "wait", "gen_tps": "gen", "prompt_tps": "prompt", "ttft": "TTFT",
              "itl": "ITL", "queue": "queue", "e2e": "e2e", "finished": "done", "preemptions": "preempt"}


def not_exported_line(snap: EngineSnapshot) -> str:
    """"TTFT, ITL, queue, e2e, done, preempt: not exported by llama.cpp"."""
    names = [CARD_WORDS[f] for f in SHOWN_FIGURES if f in snap.not_exported]
    return f"{', '.join(names)}: not exported by {snap.engine or snap.kind}" if names else ""


def engine_word(snap: EngineSnapshot) -> str:
    """"SGLang 0.5.23", "llama.cpp b11434", "router": what answers, as the card's head says it."""
    if is_router(snap.kind):
        return "router"
    name = snap.engine or (name_of(snap.kind) if snap.kind else "")  # a recording made before engines had names
    version = snap.version or ""
    if version and len(version) > 16:
        version = version[:15] + "…"
    return f"{name} {version}".strip()


def spec_text(snap: EngineSnapshot) -> str:
    """Speculative decoding: "72% acc, 2.9 tok/step"."""
    parts = []
    if snap.spec_acceptance is not None:
        parts.append(f"{snap.spec_acceptance:.0%} acc")
    if snap.spec_accept_len is not None:
        parts.append(f"{snap.spec_accept_len:.1f} tok/step")
    return ", ".join(parts)


def replicas_text(router: EngineSnapshot, engines: list[EngineSnapshot], width: int) -> str:
    """"TTFT p95 840ms · ITL p95 21ms (all)": the p95s of every request a router's replicas served over the
    window, from their histograms summed (`replicas.group_latency`; "(1 of 2)" while one has none), as many
    as fit in `width`; "" when there are none. The card and the row both say it from here."""
    group = group_behind(engines, router) if is_router(router.kind) else None
    if group is None:
        return ""
    merged = group_latency(group)
    shown = [(f"{word} p95 {r.ms(p95)}", merged.latency[name].replicas)
             for name, word in (("ttft", "TTFT"), ("itl", "ITL")) if (p95 := merged.p95(name)) is not None]
    if not shown:
        return ""
    counted = min(n for _, n in shown)
    tail = " (all)" if counted == len(group) else f" ({counted} of {len(group)})"
    while shown and len(" · ".join(t for t, _ in shown)) + len(tail) > width:
        shown.pop()
    return " · ".join(t for t, _ in shown) + tail if shown else ""


class EngineCard(Card):
    kind = "engine"

    def _router_lines(self, snap: EngineSnapshot, width: int, notice: Notice | None) -> list[Text]:
        """A router holds no KV cache and its tokens are its engines' (their cards count them)."""
        from sparktop.layouts import layout_of

        layout = layout_of(snap.topology)
        lines = [Text(f"routes to {layout.replicas} engines" if layout and layout.replicas > 1 else
                      "routes requests to its engines", style="cyan")]
        together = replicas_text(snap, self.engines(), width) if layout and layout.replicas > 1 else ""
        if together:
            lines.append(Text(together, style="cyan"))
        if snap.backends:  # as its health checks see them: one taken out is what matters
            line = Text("replicas ", style="bold")
            for i, (name, state) in enumerate(snap.backends.items()):
                line.append((" · " if i else "") + f"{name} {state}", style="green" if state == "UP" else "bold red")
            lines.append(line if line.cell_len <= width else Text(line.plain[:width - 1] + "…", style="red"
                                                                 if any(s != "UP" for s in snap.backends.values())
                                                                 else "green"))
        lines.append(Text("its figures are its engines'"[:width], style="dim"))
        if snap.state != "ready" and snap.reason:
            lines.append(Text(snap.reason[:width], style="red" if snap.state in ("unreachable", "failed")
                              else "yellow"))
        latest = notice_line(notice, width)
        if latest is not None:
            lines.append(latest)
        return lines

    def show(self, snap: EngineSnapshot, history: History | None, notice: Notice | None = None,
             energy: Energy | None = None, nodes: list[str] | None = None, mixed: bool = False) -> None:
        self._last = (snap, history, notice, energy, nodes)
        width = self.inner_width()
        stamp = (snap.t, snap.state, snap.stage, snap.reason, snap.error, width, self.spark_height, id(notice),
                 tuple(nodes or ()))
        if stamp == self._drawn:
            return
        self._drawn = stamp
        title = snap.model or "engine"
        if snap.topology:
            title += f" · {snap.topology}"
        badge = r.state_badge(snap.state)
        if snap.state == "starting" and snap.stage:
            badge = r.state_badge(f"starting: {snap.stage}")
        elif snap.state == "sleeping":
            badge = sleep_badge(snap)
        self.set_class(snap.state in ("stale", "unreachable", "failed"), "-stale")
        self.set_class(snap.state == "hung", "-danger")  # it answers, so nothing else would say it
        self.set_class(snap.state == "starting", "-starting")
        self._paint(title, badge, self._lines(snap, history, width, notice, energy, nodes))

    def _inventory(self):
        """The app's inventory (its nodes' pace), None outside an app."""
        try:
            return getattr(self.app, "inventory", None)
        except Exception:  # noqa: BLE001 - no active app: a card drawn alone
            return None

    def _lines(self, snap: EngineSnapshot, history: History | None, width: int, notice: Notice | None = None,
               energy: Energy | None = None, nodes: list[str] | None = None) -> list[Text]:
        lines = []
        where = snap.url.removeprefix("http://").removeprefix("https://")
        head = Text(where, style="dim")
        # An engine over several nodes names them all (the head first) where they fit.
        spread = (nodes if nodes and len(nodes) > 1 else [snap.node]) if snap.node else []
        on = f"  on {r.nodes_named(spread, width - len(where) - 5)}" if spread else ""
        # What answers, with its version where that fits, else its name alone; on a narrow card the
        # engine's name is kept before its nodes (the address says where it is).
        name = engine_word(snap) if is_router(snap.kind) else snap.engine or (name_of(snap.kind) if snap.kind else "")
        for text, what in ((on, engine_word(snap)), (on, name), ("", name), (on, "")):
            if len(where) + len(text) + (2 + len(what) if what else 0) <= width:
                head.append(text, style="dim")
                if what:
                    head.append(f"  {what}", style="cyan")
                break
        lines.append(head)
        if snap.state == "starting":
            lines.append(Text(f"starting: {snap.stage or '…'}", style="yellow"))
            return lines
        if snap.state == "failed" and snap.error:
            # Why it died, first: the rest are its last figures.
            lines += r.wrap(Text(snap.error, style="bold red"), width, 3)
        if snap.state == "hung":
            # It answers, and its figures read like a busy engine's: say first that nothing moves.
            lines += r.wrap(Text(f"hung: {snap.reason or 'no tokens while requests wait'}", style="bold red"),
                            width, 2)
        if snap.state == "sleeping":
            # Its figures read like an idle engine's: say first that it serves nothing.
            level = f" L{snap.sleep_level}" if snap.sleep_level is not None else ""
            lines.append(Text(f"sleeping{level}: {SLEEP_SHORT.get(snap.sleep_level, '')}"[:width], style="sky_blue1"))
        if is_router(snap.kind):
            lines += self._router_lines(snap, width, notice)
            return lines
        kv_style = "green" if (snap.kv_usage or 0) < 0.8 else "yellow" if (snap.kv_usage or 0) < 0.95 else "red"
        if snap.exports("kv"):
            kv_label = f" {r.pct(snap.kv_usage)}"
            line = Text("KV  ", style="bold")
            line.append_text(r.bar(snap.kv_usage, max(4, width - 4 - len(kv_label) - 10), style=kv_style))
            line.append(kv_label)
            if history is not None:
                line.append(" ")
                line.append_text(r.spark(history.values("kv", 8), 8, top=1.0, style=kv_style))
        else:
            line = Text("KV  ", style="bold") + Text(f"not exported by {snap.engine or snap.kind}"[:width - 4],
                                                     style="dim")
        lines.append(line)
        parts = []
        if snap.exports("running"):
            parts.append(r.field("run", r.num(snap.running)))
        if snap.exports("waiting"):
            waiting_style = "yellow" if (snap.waiting or 0) > 0 else ""
            wait = r.field("wait", r.num(snap.waiting), waiting_style)
            if snap.deferred > 0:  # held back by LoRA budget or KV transfer, not by capacity
                wait.append(f" ({snap.deferred:.0f} deferred)", style=waiting_style)
            if history is not None:
                queue = [a + b for a, b in
                         zip(history.values("running", 6), history.values("waiting", 6), strict=False)]
                wait.append(" ")
                wait.append_text(r.spark(queue, 6, style="yellow"))
            parts.append(wait)
        rejected = rejected_field(snap)
        if rejected is not None:
            parts.append(rejected)
        if snap.finished_rate is not None:
            parts.append(r.field("done", f"{r.rate(snap.finished_rate)}/s"))
            if snap.errors_rate > 0:  # requests that ended in error or were aborted: someone got no answer
                by = snap.finished_rate_by_reason or {}
                what = "err" if by.get("error") else "abort"
                parts.append(r.field(what, f"{r.rate(snap.errors_rate)}/s", "bold red"))
        if snap.exports("preemptions"):
            parts.append(r.field("preempt", r.num(snap.preemptions), "red" if (snap.preemptions or 0) > 0 else ""))
        if snap.prefix_hit_rate is not None:
            parts.append(r.field("prefix", r.pct(snap.prefix_hit_rate, 0)))
        if snap.spec_acceptance is not None or snap.spec_accept_len is not None:
            parts.append(r.field("spec", spec_text(snap)))
        if parts:
            lines += r.flow(parts, width)
        rate_parts = [r.field(label, f"{r.rate(value)} t/s", "cyan") for label, value, figure in
                      (("gen", snap.gen_tps, "gen_tps"), ("prompt", snap.prompt_tps, "prompt_tps"))
                      if snap.exports(figure)]
        per_token = joules(energy)
        if per_token:
            rate_parts.append(Text(per_token, style="green"))
        rates = r.flow(rate_parts, width) if rate_parts else [Text()]
        # After the rates: the bandwidth vLLM estimates, against the node's
        # (on a line of its own only in a card too narrow for it); then the
        # model's roofline share where there is room, never on a line of its own.
        bw = snap.mem_bw
        if bw is not None:
            shown = Text("bw ", style="dim")
            shown.append(_gbs(bw), style="cyan")
            shown.append(f"/{bandwidth_roofline_gbs():.0f} GB/s", style="dim")
            if rates[-1].cell_len + 2 + shown.cell_len <= width:
                rates[-1].append("  ")
                rates[-1].append_text(shown)
            else:
                rates.append(shown)
        share = roofline_share(snap, self._inventory())
        roof, style = (f"  {share:.0%} of roofline", "dim") if share is not None else ("", "dim")
        if share is not None and share > ROOFLINE_SLACK:
            # Not physics but the reading: the rate averages its window, the batch is the count now (one that
            # just fell makes the window's tokens look impossible), or the nodes' pace is not the inventory's.
            roof, style = "  above roofline: rate window vs batch now", "yellow"
        if roof and rates[-1].cell_len + len(roof) <= width:
            rates[-1].append(roof, style=style)
        if rates[-1].cell_len:
            lines += rates
        latency_parts = [r.field(label, f"{r.ms(p50)}/{r.ms(p95)}") for label, p50, p95 in
                         (("TTFT", snap.ttft_p50, snap.ttft_p95), ("ITL", snap.itl_p50, snap.itl_p95))
                         if snap.exports(label.lower())]
        if snap.latency is not None:
            for label, name in (("queue", "queue"), ("e2e", "e2e")):
                if not snap.exports(name):
                    continue
                slow = name == "queue" and (snap.queue_slow or 0) > 0
                latency_parts.append(r.field(label, f"{r.ms(snap.pct(name, 'p50'))}/{r.ms(snap.pct(name, 'p95'))}",
                                             "yellow" if slow else ""))
        if latency_parts:
            latency = r.flow(latency_parts, width)
            if latency[-1].cell_len + len("  p50/p95") <= width:
                latency[-1].append("  p50/p95", style="dim")
            lines += latency
        missing = not_exported_line(snap)
        if missing and snap.state in ("ready", "sleeping", "stale"):
            lines += r.wrap_words(Text(missing, style="dim"), width, 2)
        if history is not None and (snap.exports("gen_tps") or snap.exports("prompt_tps")):
            lines += self._sparks(("gen ", "gen_now", None, "cyan"), ("prompt ", "prompt_now", None, "blue"), width,
                                  history)
        if snap.state not in ("ready", "hung") and snap.reason:  # a hung engine's reason is said first
            lines.append(Text(snap.reason[:width], style="red" if snap.state in ("unreachable", "failed")
                              else "yellow"))
        latest = notice_line(notice, width)
        if latest is not None:
            lines.append(latest)
        return lines
