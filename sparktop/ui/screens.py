"""The monitor screen, the detail view of one card, and the help overlay."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Awaitable

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Span, Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.geometry import Size
from textual.screen import ModalScreen, Screen
from textual.strip import Strip
from textual.widgets import Static

from sparktop.engine_ids import KNOWN_ENGINES, is_router, listing
from sparktop.observe.snapshot import EngineSnapshot
from sparktop.observe.state import ClusterState
from sparktop.ui import charts
from sparktop.ui import render as r
from sparktop.ui.cards import Card, EngineCard, NodeCard, engine_facts, line_segments, link_of
from sparktop.ui.detail_text import engine_details, node_details
from sparktop.ui.footer import KeyFooter
from sparktop.ui.messages import RepaintRequested, StateChanged
from sparktop.ui.rows import EngineRow, NodeRow, summary_line

CARD_WIDTH = 40  # two nodes: their two cards side by side from 80 columns on
MANY_CARD_WIDTH = 54  # three nodes or more: 2 columns at 160, 3 at 200, 4 from 216


def card_columns(width: int, many: bool) -> int:
    """How many cards side by side a screen this wide holds."""
    return max(1, width // (MANY_CARD_WIDTH if many else CARD_WIDTH))

# Every screen carries one width class and one height class; sparktop.tcss
# lays the screens out by them (80x24 is -narrow -short, 120x40 -medium
# -tall, 160x48 and wider -wide -tall).
WIDTHS = [(0, "-narrow"), (110, "-medium"), (150, "-wide")]
HEIGHTS = [(0, "-short"), (32, "-tall")]


class StatusLine(Static):
    """One line of status. Repainted every second (its clock), and through
    Textual's visuals that one line cost more than a card's changed lines:
    a Text that fits is drawn here as the card lines are, the same cells in
    the same styles; anything else (a line too long for the screen, which
    Textual wraps at a word) goes Textual's way."""

    _line: Text | None = None
    _line_strip: Strip | None = None
    _line_key: tuple | None = None

    def update(self, content="", *, layout: bool = False) -> None:
        # One line that never changes size: repaint it, never relayout the screen.
        super().update(content, layout=layout)
        self._line = content if isinstance(content, Text) else None
        self._line_strip = None

    def render_line(self, y: int) -> Strip:
        text = self._line
        width = self.size.width
        if text is None or y != 0 or self.size.height != 1 or text.cell_len > width or "\n" in text.plain \
                or self.text_selection is not None:  # Textual draws a selection
            return super().render_line(y)
        style = self.rich_style
        key = (width, style)
        if self._line_strip is None or self._line_key != key:
            # As Textual shows a Text: its own style under all of it, its spans over that, and all of it
            # over the widget's.
            line = Text(text.plain, spans=[Span(0, len(text), text.style), *text.spans] if text.style else
                        list(text.spans))
            # Not padded: the rest of the line is the background's, as Textual pads it. Each piece says
            # where it starts in the text, as Textual's do, for a selection made with the mouse.
            self._line_strip = Strip(line_segments(line, self.app.console, style), text.cell_len).apply_offsets(0, 0)
            self._line_key = key
        return self._line_strip


class LiveScreen(Screen):
    """A screen drawn from the cluster state (`StateChanged` messages),
    painted as soon as it shows, not at the next event."""

    HORIZONTAL_BREAKPOINTS = WIDTHS
    VERTICAL_BREAKPOINTS = HEIGHTS

    def on_screen_resume(self) -> None:
        self.post_message(RepaintRequested())  # bubbles to the app

    def on_state_changed(self, message: StateChanged) -> None:
        with contextlib.suppress(NoMatches):  # composing or being torn down: the next change paints it
            self.show_state(message.state, message.status)

    def show_state(self, state: ClusterState, status: Text) -> None:
        """Draw the screen from the state (the status line at least)."""
        self.query_one(StatusLine).update(status)


NODE_CARD_LINES = 9  # a node card's height with one container and a one-row sparkline
ENGINE_CARD_LINES = 13  # an engine card's
MANY_NODES = 3  # from this many nodes on, the cluster gets a summary line
CHART_EVERY_S = 2.0  # the cluster chart under the lines is drawn at most this often


def compact_view(width: int, height: int, nodes: int, engines: int) -> tuple[bool, bool]:
    """Whether nodes, and engines, show as one line each: only with three
    nodes or more, and only what does not fit the screen as cards — nodes
    first (their cards say least that a line cannot), then engines, when
    there are three or more of them."""
    if nodes < MANY_NODES:
        return False, False
    fit = card_columns(width, True)
    room = height - 3  # the status, summary and footer lines

    def card_lines(count: int, lines: int) -> int:
        return -(-count // min(fit, count)) * lines if count else 0

    if card_lines(nodes, NODE_CARD_LINES) + card_lines(engines, ENGINE_CARD_LINES) <= room:
        return False, False
    room -= 1  # the line between the nodes' lines and the engines
    if nodes + card_lines(engines, ENGINE_CARD_LINES) <= room or engines < MANY_NODES:
        return True, False
    return True, True


class MonitorScreen(LiveScreen):
    BINDINGS = [
        Binding("enter", "open_detail", "Detail"),
        Binding("right,tab", "app.focus_next", "Next", show=False),
        Binding("left,shift+tab", "app.focus_previous", "Prev", show=False),
    ]

    compact: tuple[bool, bool] = (False, False)  # (nodes, engines) shown one line each

    def compose(self) -> ComposeResult:
        with Vertical(id="head"):  # docked as one: two docked lines would overlap
            yield StatusLine(id="status")
            yield StatusLine(id="cluster")
        # Cards sit straight in the screen (which scrolls): every container
        # between a card and the screen is one more render per card update.
        yield Grid(id="nodes")
        yield Grid(id="engines")
        yield Static("", id="cluster-chart")  # under the lines of a big cluster, where the screen has room
        yield Static("", id="empty")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#cluster").display = False
        self.query_one("#cluster-chart").display = False
        self._layout_columns()

    def on_resize(self) -> None:
        self._layout_columns()
        self.post_message(RepaintRequested())  # the view (cards or lines) may change with the size

    def _layout_columns(self) -> None:
        many = self.query_one("#cluster").display  # three nodes or more: the summary line shows
        fit = card_columns(self.size.width, many)
        rows = 0
        used = 2 + many  # the status line (and the summary), the footer
        for grid in self.query(Grid):
            count = len(grid.children)
            if grid.has_class("-rows"):  # one line each, one under the other, and a line after
                grid.styles.grid_size_columns = 1
                used += count + 1
                continue
            # Two cards share a wide screen; many cards wrap (see card_columns).
            columns = max(1, min(fit, count or 1))
            grid.styles.grid_size_columns = columns
            grid_rows = -(-count // columns) if count else 0
            rows += grid_rows
            # A card's height with one-row sparklines (two nodes keep the rough 10 they always had).
            used += grid_rows * ((ENGINE_CARD_LINES if grid.id == "engines" else NODE_CARD_LINES) if many else 10)
        # Spare height goes to taller sparklines (an 80x24 screen keeps one row).
        spare = self.size.height - used
        height = max(1, min(12, 1 + spare // max(1, rows)))
        for card in self.query(Card):
            if card.spark_height != height:
                card.spark_height = height
                card.redraw()

    def show_state(self, state: ClusterState, status: Text) -> None:
        self.query_one("#status", StatusLine).update(status)
        now = state.now or time.time()  # a replay's clock, not the wall's
        nodes = {n.name: n for n in state.ordered_nodes()}
        engines = {e.key: e for e in state.ordered_engines()}
        self.compact = compact_view(self.size.width, self.size.height, len(nodes), len(engines))
        many = len(nodes) >= MANY_NODES
        cluster = self.query_one("#cluster", StatusLine)
        if many:
            cluster.update(summary_line(state.summary(), max(1, self.size.width)))
        if cluster.display != many:
            cluster.display = many
            self.call_after_refresh(self._layout_columns)
        self._sync(self.query_one("#nodes", Grid), NodeRow if self.compact[0] else NodeCard, nodes,
                   state.node_history, lambda key: (state.last_notice(key, now), state.node_energy(key),
                                                    link_of(state, key)))
        # Engines of several kinds on screen: each row names its engine (a card always does, where it fits).
        mixed = len({e.kind for e in engines.values() if not is_router(e.kind)}) > 1
        self._sync(self.query_one("#engines", Grid), EngineRow if self.compact[1] else EngineCard, engines,
                   state.engine_history,
                   lambda key: (state.last_notice(key, now), state.engine_energy(engines[key]),
                                state.engine_nodes(engines[key]), mixed))
        self._cluster_chart(state, len(nodes), len(engines))
        empty = self.query_one("#empty", Static)
        if not state.engines:
            empty.update(Text(f"No engines yet: sparktop looks for {listing([e.name for e in KNOWN_ENGINES])} "
                              "in every node's containers and processes, and on port 8000; add one "
                              "with --engine URL.", style="dim"))
            empty.display = True
        else:
            empty.display = False

    _chart_drawn: tuple = ()

    def _cluster_chart(self, state: ClusterState, nodes: int, engines: int) -> None:
        """When every node and engine is a line and the screen has rows to
        spare (eight Sparks at 160x48), the cluster's generation rate and
        memory over the last five minutes fill them."""
        chart = self.query_one("#cluster-chart", Static)
        room = self.size.height - 3 - (nodes + 1) - (engines + 1) - 1  # the head, the footer, lines and gaps
        show = self.compact == (True, True) and room >= 8
        if chart.display != show:
            chart.display = show
        if not show:
            return
        stamp = (state.version, self.size)
        if stamp == self._chart_drawn:
            return
        wait = CHART_EVERY_S - (time.monotonic() - self._chart_at)
        if self._chart_drawn and self._chart_drawn[1] == self.size and wait > 0:
            # A chart every two seconds is enough (plotext takes ~15 ms); the change is drawn then,
            # even when nothing else changes by then (a paused replay).
            if not self._chart_due:
                self._chart_due = True
                self.set_timer(wait, self._chart_timer)
            return
        self._chart_drawn, self._chart_at = stamp, time.monotonic()
        width = max(40, self.size.width - 2)
        two = room >= 17
        height = (room - 1) // 2 if two else room
        gen_t, gen = state.cluster_points("gen_tps")
        parts = [charts.line_chart(f"cluster: generation tokens/s ({engines} engines, routers left out)",
                                   [("generation", gen_t, gen)], width, height, ymin=0)]
        if two:
            mem_t, mem = state.cluster_points("mem_used_gib", nodes=True)
            total = state.summary().mem_total / 1024**3 or None
            parts.append(charts.line_chart(f"cluster: unified memory used (GiB, {nodes} nodes)",
                                           [("used", mem_t, mem)], width, height, ymin=0, ymax=total))
        for part in parts:
            part.rstrip()
        chart.update(Text("\n").join(parts))

    _chart_at: float = 0.0
    _chart_due = False

    def _chart_timer(self) -> None:
        self._chart_due = False
        self.post_message(RepaintRequested())

    def _sync(self, grid: Grid, cls, items: dict, histories: dict, extras) -> None:
        # Its children, not a query: a selector walk every second for what sits straight in the grid.
        cards = {card.key: card for card in grid.children if isinstance(card, cls)}
        if list(cards) != list(items):
            # Membership, order or view changed: rebuild in order (rare; keeps focus simple).
            focused = self.focused.key if isinstance(self.focused, Card) else None
            removed = grid.remove_children()
            rows = cls in (NodeRow, EngineRow)
            grid.set_class(rows, "-rows")
            new = [cls(key, classes="row" if rows else "card") for key in items]
            mounted = grid.mount_all(new)
            # Laid out as a resize lays it out, once the old cards are gone and the new ones in: a card
            # removed is pruned later, and counted before that it kept the columns of the cards that were.
            self.call_after_refresh(self._relayout, removed, mounted)
            for card in new:
                self.call_after_refresh(card.show, items[card.key], histories.get(card.key), *extras(card.key))
                if card.key == focused:
                    self.call_after_refresh(card.focus)
            return
        for key, snap in items.items():
            cards[key].show(snap, histories.get(key), *extras(key))

    async def _relayout(self, *changes: Awaitable) -> None:
        """The columns and sparkline heights for the cards now in the grids, once `changes` (a removal, a
        mount) are done: what a resize does."""
        for change in changes:
            await change
        if self.is_mounted:
            self._layout_columns()

    def action_open_detail(self) -> None:
        focused = self.focused
        if isinstance(focused, Card):
            self.app.push_screen(DetailScreen(focused.kind, focused.key))


class DetailScreen(LiveScreen):
    """Longer history charts for one node or engine."""

    BINDINGS = [Binding("escape,q,enter", "app.pop_screen", "Back")]

    def __init__(self, kind: str, key: str):
        super().__init__()
        self.kind = kind
        self.key = key
        self._drawn_version = -1

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        with VerticalScroll(id="detail"):
            yield Static(id="charts")
        yield KeyFooter()

    def show_state(self, state: ClusterState, status: Text) -> None:
        self.query_one(StatusLine).update(status)
        if state.version == self._drawn_version and self._drawn_size == self.size:
            return
        self._drawn_version = state.version
        self._drawn_size = self.size
        width = max(40, self.size.width - 2)
        avail = self.size.height - 2  # the status line and the footer
        tall = self.size.height >= 32
        prefs = getattr(self.app, "preferences", None)
        parts: list[Text] = []
        facts: list[Text] = []
        charted: list[tuple[str, list, float | None]] = []
        if self.kind == "node":
            history = state.node_history.get(self.key)
            snap = state.nodes.get(self.key)
            facts = node_details(state, self.key, prefs, 6 if tall else 2, width)
            title = f"{self.key}"
            if snap and snap.memory:
                title += f" · {snap.memory.total / 1024**3:.1f} GiB unified memory"
            if history:
                total = (snap.memory.total / 1024**3) if snap and snap.memory else None
                charted = [(f"{title}: memory used (GiB)", [("used", *history.points("mem_used_gib"))], total),
                           ("GPU and CPU utilisation (%)",
                            [("gpu", *history.points("gpu_util")), ("cpu", *history.points("cpu"))], 100),
                           ("GPU power (W)", [("power", *history.points("power"))], None)]
                if "rdma_tx" in history.series:
                    view = state.links.get(self.key)
                    cap = view.capacity_gbps if view is not None else None
                    charted.append((f"link (Gb/s{f' of {cap:.0f}' if cap else ''} each way): RDMA and the kernel's",
                                    [("RDMA ↑", *history.points("rdma_tx")), ("RDMA ↓", *history.points("rdma_rx")),
                                     ("kernel ↑", *history.points("kernel_tx")),
                                     ("kernel ↓", *history.points("kernel_rx"))], None))
        else:
            history = state.engine_history.get(self.key)
            engine = state.engines.get(self.key)
            title = f"{engine.model if engine else self.key} at {self.key}"
            if engine:
                facts = [_engine_headline(engine)] + engine_facts(engine) + engine_details(
                    state, engine, prefs, 8 if tall else 3)
            if history:
                kv_t, kv = history.points("kv")
                ttft_t, ttft = history.points("ttft_p50")
                itl_t, itl = history.points("itl_p50")
                charted = [("generation tokens/s" if engine else f"{title}: generation tokens/s",
                            [("generation", *history.points("gen_tps"))], None),
                           ("KV cache (%) and requests", [("kv %", kv_t, [v * 100 for v in kv]),
                                                          ("running", *history.points("running")),
                                                          ("waiting", *history.points("waiting"))], None),
                           ("prompt tokens/s", [("prompt", *history.points("prompt_tps"))], None),
                           ("latency p50 (ms)", [("TTFT", ttft_t, [v * 1000 for v in ttft]),
                                                 ("ITL", itl_t, [v * 1000 for v in itl])], None)]
        facts_rows = sum(_rows(fact, width) for fact in facts)
        if facts:
            parts += facts
        # The charts share what the words leave, one blank line apart, at
        # least 6 rows each: fewer charts in view on a short screen rather
        # than charts too flat to read (the rest are below, to scroll to).
        room = avail - facts_rows - (1 if facts else 0)
        count = max(1, min(len(charted), room // 7)) if charted else 0
        height = max(6, (room - count + 1) // count) if count else 0
        for i, (name, series, ymax) in enumerate(charted):
            if i or facts:
                parts.append(Text(""))  # one blank line between blocks
            parts.append(charts.line_chart(name, series, width, height, ymin=0, ymax=ymax))
        if not charted:
            if facts:
                parts.append(Text(""))
            parts.append(Text("No history yet.", style="dim"))
        for part in parts:
            part.rstrip()  # plotext ends with a newline; the separator is the only gap
        self.query_one("#charts", Static).update(Text("\n").join(parts))

    _drawn_size: Size | None = None


def _engine_headline(e: EngineSnapshot) -> Text:
    """What the card said at a glance, kept on top of the detail: which engine
    serves what where, its state, and its figures now."""
    line = Text(f"{e.model or e.key}", style="bold")
    line.append(f" at {e.url}", style="dim")
    if e.node:
        line.append(f" on {e.node}", style="dim")
    line.append("  ")
    line.append_text(r.state_badge(e.state))
    figures = [("KV", r.pct(e.kv_usage)), ("run", r.num(e.running)), ("wait", r.num(e.waiting)),
               ("gen", f"{r.rate(e.gen_tps)} t/s"), ("prompt", f"{r.rate(e.prompt_tps)} t/s")]
    shown = [f"{name} {value}" for name, value in figures if not value.startswith("—")]
    if shown:
        line.append("  " + " · ".join(shown))
    return line


def _rows(part: Text, width: int) -> int:
    """Rows a detail line takes at `width`."""
    return sum(-(-max(1, line.cell_len) // width) for line in part.split("\n"))


HELP = """\
[b]sparktop[/b] — keys

  [b]q[/b]        quit
  [b]?[/b]        this help
  [b]ctrl+p[/b]   the command palette: every action by its name (its key is
           in the footer from 100 columns on)
  [b]p[/b]        pause or resume (polling; in a replay, playback)
  [b]+ / -[/b]    poll (in a replay, play) faster or slower
  [b]← / →[/b]    move between cards (in a replay, [b][ / ][/b] seek 10 s)
  [b]Enter[/b]    the focused card's history charts (Esc goes back)
  [b]l[/b]        launch a recipe: ↑/↓ picks one, Tab reaches the topology,
           node and overrides; the plan and preflight follow them;
           Enter launches (or shows the launch under way)
  [b]x[/b]        stop something sparktop launched (asks first)
  [b]s[/b]        run a concurrency sweep (ctrl+r there: past runs)
  [b]b[/b]        in the launcher: study the recipe, every topology in turn
  [b]y[/b]        the study under way (Esc there cancels it, after asking;
           m leaves it running); sparktop --study ID shows one
           started elsewhere
  [b]h[/b]        history: the last 24 hours or 7 days charted, the serving
           sessions, daily totals and events (1/7/w switch, r refresh)
  [b]c[/b]        what each node has cached: models in its Hugging Face
           cache and its docker images (r refresh; sparktop sync
           copies one to the nodes that lack it)

Memory is unified on a GB10: the bar shows the engines' share (magenta), other \
used memory, page cache (▒) and free memory (░). A node card turns yellow \
when MemAvailable falls below 20 % and red below 10 %: a Spark that runs \
out of memory freezes rather than swapping.

Engine figures: KV-cache usage, running and waiting requests, preemptions \
since the engine started, prefix-cache hit rate, requests finished per \
second (errors and aborts in red), generation and prompt tokens/s (10 s \
average, or --rate-window / rate_window_s in settings.yaml; the sparkline poll by poll), energy per generated token (the nodes' GPU power from \
nvidia-smi over the token rate), TTFT, inter-token, queue and end-to-end \
latency p50/p95 over the last minute (latency_window_s). The detail view adds p99 and a p95 \
over the last minute, peaks since sparktop started, lifetime counters, Wh and cost per \
million tokens (energy_price_per_kwh in settings.yaml) and the event log; \
a card shows its newest event for 90 s.

Every engine is recognised by what it answers (vLLM, SGLang, llama.cpp, \
TensorRT-LLM, Ollama, TGI, LiteLLM, or any other OpenAI-compatible server), \
named on its card with its version, and shows what it exports: a figure it \
does not export is said to be so on its card ("TTFT, ITL: not exported by \
llama.cpp"), and is [b]n/e[/b] in the one-line rows of a big cluster.
"""


HELP_KEY = re.compile(r"^ {2}\[b\](.+?)\[/b\] +(.*)$")  # a key's line: "  [b]q[/b]        quit"


def help_text(text: str = HELP) -> Group:
    """The help laid out for any width: each key beside what it does, its
    description wrapped under itself (in the text, a key's indented lines
    continue its description), the paragraphs wrapped as they are; a blank
    line between blocks, as in the text."""
    blocks: list[list] = []  # each a paragraph's lines, or a list of [key, description] pairs
    kinds: list[str] = []
    block_open = False
    for line in text.rstrip("\n").split("\n"):
        key = HELP_KEY.match(line)
        if not line.strip():
            block_open = False
        elif key:
            if not (block_open and kinds[-1] == "keys"):
                blocks.append([])
                kinds.append("keys")
            blocks[-1].append([key.group(1), key.group(2)])
            block_open = True
        elif block_open and kinds[-1] == "keys" and line.startswith("   "):
            blocks[-1][-1][1] += " " + line.strip()
        elif block_open and kinds[-1] == "text":
            blocks[-1].append(line)
        else:
            blocks.append([line])
            kinds.append("text")
            block_open = True
    parts: list[RenderableType] = []
    for kind, block in zip(kinds, blocks, strict=True):
        if parts:
            parts.append(Text(""))
        if kind == "text":
            parts.append(Text.from_markup("\n".join(block)))
            continue
        keys = Table.grid(padding=(0, 2))
        keys.add_column(no_wrap=True)
        keys.add_column()
        for name, description in block:
            keys.add_row(Text.from_markup(name, style="bold"), Text.from_markup(description))
        parts.append(Padding(keys, (0, 0, 0, 2)))
    return Group(*parts)


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "Close")]
    HORIZONTAL_BREAKPOINTS = WIDTHS
    VERTICAL_BREAKPOINTS = HEIGHTS

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):  # scrolls when the terminal is shorter than the help
            yield Static(help_text())


def clock(t: float | None = None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t or time.time()))
