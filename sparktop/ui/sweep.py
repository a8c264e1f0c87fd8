"""The sweep screen (`s`), the past runs (`r` there) and their comparison.

The screen only draws: the sweep itself is `sparktop.bench.sweep.Sweep`
(lockstep concurrency) or `sparktop.bench.load.RateSweep` (requests per
second, goodput under an SLO, the search for the highest rate meeting it),
run as a worker whose events arrive here as messages. Every request is on
disk the moment it finishes, so closing or cancelling loses nothing.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import replace

from rich.cells import cell_len
from rich.markdown import Markdown
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, DataTable, Input, ProgressBar, Select, Sparkline, Static
from textual.widgets._select import SelectCurrent

from sparktop.bench import compare as cmp
from sparktop.bench.events import (
    EngineSample,
    LevelContaminated,
    LevelDone,
    LevelStarted,
    MaxRateFound,
    RateLevelDone,
    RateLevelStarted,
    RequestDone,
    SweepFinished,
    SweepStarted,
    WaitingForIdle,
)
from sparktop.bench.export import COLUMNS, cell
from sparktop.bench.levels import parse_levels
from sparktop.bench.load import MaxRate, RateSweep, parse_rates, rate_texts
from sparktop.bench.results import list_runs, load_run
from sparktop.bench.run import Run
from sparktop.bench.stats import LevelStats, RateLevelStats, knee
from sparktop.bench.sweep import Sweep, SweepSettings, parse_extra_body
from sparktop.errors import SparktopError
from sparktop.observe.state import ClusterState
from sparktop.tables import fit_columns
from sparktop.ui.charts import empty_chart
from sparktop.ui.footer import KeyFooter
from sparktop.ui.messages import SweepProgress, pump
from sparktop.ui.screens import LiveScreen, StatusLine
from sparktop.units import eta_text, fmt

CHARTS = (("tg_tps_total", "decode t/s (total)"), ("pp_tps_total", "prefill t/s (total)"),
          ("ttft_ms_mean", "TTFT ms (mean)"))
# A rate sweep's charts, in the same three boxes: what was served, how fast the first token came, what met the
# SLO (the request throughput when there is no SLO), each against the rate offered.
RATE_CHARTS = (("output_tps", "output t/s"), ("ttft_p95_ms", "TTFT p95 ms"), ("goodput", "goodput req/s"))

# The modes of the form's mode select: (label, value).
MODES = (("concurrency", "concurrency"), ("rate poisson", "poisson"), ("rate constant", "constant"),
         ("max rate", "max-rate"))
# The rate table's columns: load.rate_texts' keys (times in ms), then the SLO verdict.
RATE_COLUMNS = ("rate", "sent/s", "req/s", "tok/s", "TTFT50", "TTFT95", "ITL50", "ITL95", "busy", "good/s", "met",
                "SLO")
# The lockstep table's: bench.export's (key, header), the prediction beside the measurement, the energy.
LOCKSTEP_COLUMNS = (*((key, head) for key, head, _ in COLUMNS), ("predicted", "pred tg"), ("j_per_token", "J/tok"))
# What a table too narrow for all its columns keeps, longest first (tables.fit_columns): the level, what was
# served and how fast the first token came; the client's own figures (sent/s, busy) and the figures another
# column nearly says (peak beside tg t/s, p50 beside the mean) go first. At 80 columns the rate table keeps its
# verdict, the lockstep table its decode, TTFT, the prediction and the errors.
RATE_KEEP = ("rate", "SLO", "met", "good/s", "req/s", "tok/s", "TTFT95", "ITL95", "TTFT50", "ITL50", "busy", "sent/s")
LOCKSTEP_KEEP = ("concurrency", "tg_tps_total", "ttft_ms_mean", "pp_tps_total", "tg_tps_req", "predicted",
                 "ttft_ms_p95", "kv_cache_usage_max", "errors", "j_per_token", "waiting_max", "pp_tps_req",
                 "peak_tps", "ttft_ms_p50")


# The form's boxes: the label in each box's top edge (the long one where it fits, else the short one), and its
# tooltip. The levels box's follow the mode.
FIELDS = {
    "runs": ("runs per level", "runs", "measured batches per concurrency level (after one warm-up batch)"),
    "seconds": ("seconds per level", "s/level", "seconds each rate level sends requests for"),
    "pp": ("prompt tokens", "prompt", "prompt tokens per request (pp1024: a 1024-token prompt)"),
    "tg": ("output tokens", "output", "tokens generated per request (tg128: 128 tokens out)"),
    "extra": ("extra request body", "extra body", "JSON fields added to every request, e.g. reasoning_effort=low"),
    "slo": ("SLO", "SLO", "what a request must meet to count as good, e.g. ttft_p95=2s,itl_p95=100ms"),
}
LEVELS_FIELD = {
    "concurrency": ("concurrency levels", "concurrency", "concurrent requests per level, e.g. 1,2,4,8"),
    "rate": ("rates (requests/s)", "rates", "requests per second per level, e.g. 1,2,4,8"),
    "max-rate": ("start rate (requests/s)", "start rate",
                 "the rate the search starts from (it doubles, then halves the bracket)"),
}
# The free-text boxes' placeholders, longest first: the first that fits the box is shown.
PLACEHOLDERS = {
    "extra": ("e.g. reasoning_effort=low", "reasoning_effort=low", "key=value"),
    "slo": ("ttft_p95=2s,itl_p95=100ms", "ttft_p95=2s"),
}
TITLE_EDGE = 6  # a box's border title leaves this many of its cells to the edge


def endpoint_text(engine) -> str:
    """An endpoint as the form's select shows it: where it answers first (what tells two engines of one model
    apart, and what a narrow box keeps), then what it serves and how."""
    where = engine.url.removeprefix("http://").removeprefix("https://").rstrip("/")
    return f"{where} · {engine.model or '?'} · {engine.topology or engine.kind}"


def endpoint_fits(engine, room: int) -> str:
    """The endpoint as its box has room for: all of it, or its address and the model's short name, or its
    address alone (what tells two engines apart; the open list shows all of it)."""
    full = endpoint_text(engine)
    where = engine.url.removeprefix("http://").removeprefix("https://").rstrip("/")
    model = (engine.model or "?").rsplit("/", 1)[-1]
    for text in (full, f"{where} · {model}", where):
        if cell_len(text) <= room:
            return text
    return where


# What the idle guard says while it waits, longest first: the first that fits the progress line's two rows is
# shown, so the explanation of ⚠ is not cut off and, at 80 columns, the running count and the timer stay.
GUARD_TEXTS = (
    "waiting for the engine to finish what it serves ({running} running, {waiting} waiting) · {waited} of "
    "{timeout} s; then it measures anyway, and a level with other traffic is marked ⚠",
    "waiting for the engine to go idle: {running} running, {waiting} waiting · {waited} of {timeout} s; then "
    "it measures anyway (other traffic marks the level ⚠)",
    "waiting for idle: {running} running · {waited} of {timeout} s, then measures anyway (busy: ⚠)",
    "waiting: {running} running · {waited} of {timeout} s",
)
GUARD_ROWS = 2  # the progress line grows to two rows for it


def guard_text(e: WaitingForIdle, width: int, console=None) -> Text:
    """The guard's wait as the longest of GUARD_TEXTS that fits `width` columns in GUARD_ROWS rows."""
    head = (f"c{e.concurrency} ", "bold yellow")
    values = dict(running=f"{e.running:.0f}", waiting=f"{e.waiting:.0f}", waited=f"{e.waited_s:.0f}",
                  timeout=f"{e.timeout_s:.0f}")
    text = Text()
    for form in GUARD_TEXTS:
        text = Text.assemble(head, form.format(**values))
        if width <= 0 or console is None or len(text.wrap(console, width)) <= GUARD_ROWS:
            return text
    return text


def duration_text(seconds: float, minutes: bool = False) -> str:
    """45s, 6m14s (or 6m, to the minute), 1h05m."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{round(seconds / 60)}m" if minutes else f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


# How a batch's time grows with its concurrency, time ∝ c**k, when only one level has been measured: decode is
# bandwidth-bound (k near 0.5) until the engine saturates (k near 1). Two measured levels give k itself.
GROWTH_UNKNOWN = (0.5, 1.0)
GROWTH_BOUNDS = (0.0, 1.5)


def remaining_seconds(cells: list[tuple[int, int]], runs: int, warmup: bool, at: int, batches_left_here: int,
                      batch_secs: dict[tuple[int, int], float]) -> tuple[float, float] | None:
    """What is left of a lockstep sweep, (low, high) seconds: the batches left of the level at index `at` of
    `cells` ((depth, concurrency) in the order they run) and every batch of the levels after it. A level
    measured takes its batch time; one not yet measured, the batch time of the nearest measured level at its
    depth grown by (c / c0)**k, k from the last two measured levels (a range while only one is). None before
    any batch is measured."""
    if not batch_secs:
        return None
    per_level = runs + (1 if warmup else 0)
    low = high = 0.0
    for i, level in enumerate(cells[at:], start=at):
        batches = batches_left_here if i == at else per_level
        if not batches:
            continue
        lo, hi = _batch_estimate(level, batch_secs)
        low += lo * batches
        high += hi * batches
    return low, high


def _batch_estimate(cell: tuple[int, int], batch_secs: dict[tuple[int, int], float]) -> tuple[float, float]:
    if cell in batch_secs:
        return batch_secs[cell], batch_secs[cell]
    depth, c = cell
    same = sorted((cc, b) for (d, cc), b in batch_secs.items() if d == depth) or \
        sorted((cc, b) for (_, cc), b in batch_secs.items())
    below = [(cc, b) for cc, b in same if cc <= c] or same[:1]
    c0, b0 = below[-1]
    if len(same) >= 2:
        (c1, b1), (c2, b2) = same[-2], same[-1]
        if c2 > c1 and b1 > 0 and b2 > 0:
            k = min(max(math.log(b2 / b1) / math.log(c2 / c1), GROWTH_BOUNDS[0]), GROWTH_BOUNDS[1])
            return b0 * (c / c0) ** k, b0 * (c / c0) ** k
    ratio = c / c0
    return b0 * ratio ** GROWTH_UNKNOWN[0], b0 * ratio ** GROWTH_UNKNOWN[1]


def eta_words(span: tuple[float, float] | None) -> str:
    """"ETA …" before a batch is measured, "ETA ~6m–19m" (to the minute) while the rest is a range, else
    "ETA ~9m40s"."""
    if span is None:
        return "ETA …"
    low, high = span
    if high - low <= max(10.0, 0.15 * high):
        return f"ETA ~{duration_text(high)}"
    return f"ETA ~{duration_text(low, True)}–{duration_text(high, True)}"


def rate_value(lv: RateLevelStats, key: str) -> float | None:
    """A rate level's figure as a rate chart draws it."""
    if key == "ttft_p95_ms":
        return None if lv.ttft_p95 is None else lv.ttft_p95 * 1000
    if key == "goodput":
        return lv.goodput if lv.slo else lv.request_throughput
    return getattr(lv, key)


def rate_cells(lv: RateLevelStats, columns: tuple[str, ...] = RATE_COLUMNS) -> list[str | Text]:
    """A rate level as a row of `columns`: red where the client fell behind or the SLO was missed."""
    texts: dict[str, str | Text] = dict(rate_texts(lv))
    texts["rate"] = f"{texts['rate']} ⚠" if lv.behind or lv.saturated else texts["rate"]
    texts["SLO"] = Text("—") if not lv.slo else Text("yes", style="green") if lv.passes else Text("no", style="red")
    return [texts[c] for c in columns]


def level_chart(title: str, key: str, runs: list[tuple[str, list]], width: int, height: int,
                x=None, value=getattr) -> Text:
    """A metric against concurrency, the levels spaced evenly as the sweep chose them; or, given `x` (a
    level's request rate), against the rate offered on its own scale (a search's rates crowd where the SLO
    gives way). One line per run, this one first."""
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(max(20, width), max(6, height))
    plt.theme("pro")
    plt.title(title)
    if x is None:
        levels = sorted({lv.concurrency for _, lvs in runs for lv in lvs})
        pos = {c: float(i) for i, c in enumerate(levels)}

        def where(lv) -> float:
            return pos[lv.concurrency]
    else:
        where = x
    lines = [(label, pts) for label, lvs in reversed(runs)  # this run (first) drawn last, on top
             if (pts := sorted((where(lv), v) for lv in lvs if (v := value(lv, key)) is not None))]
    if not lines:
        return empty_chart(title, width, height, "no level measured yet")
    for label, pts in lines:
        plt.plot([p for p, _ in pts], [y for _, y in pts], label=label[:24],
                 marker="hd" if label == "this run" else "braille")
    if x is None and levels:
        plt.xticks(list(range(len(levels))), [f"c{c}" for c in levels])
    elif x is not None:
        plt.xlabel("requests/s offered")
    return Text.from_ansi(plt.build())


def monitored_power(state: ClusterState, engine) -> Callable[[], Awaitable[float | None]] | None:
    """The engine's nodes' GPU power as the monitor last read it (every
    interval): no command of the sweep's own on the nodes."""
    nodes = state.engine_nodes(engine)
    if not nodes:
        return None

    async def power() -> float | None:
        watts = [n.gpu.power if (n := state.nodes.get(name)) is not None and n.state == "ok" and n.gpu else None
                 for name in nodes]
        return None if any(w is None for w in watts) else sum(w for w in watts if w is not None)

    return power


class LevelsTable(DataTable):
    """The levels' table: says when its size changes, so its columns are fitted to its new width."""

    class Resized(Message):
        pass

    def on_resize(self) -> None:
        self.post_message(self.Resized())


class ChartBox(Static):
    """A chart's box: says when its size changes (a scrollbar appearing in the body narrows it without
    the screen resizing), so the chart is drawn again to fit."""

    class Resized(Message):
        pass

    def on_resize(self) -> None:
        self.post_message(self.Resized())


class SweepScreen(LiveScreen):
    """Settings, then the live sweep: progress, tokens/s, the table, the charts.

    The mode select chooses lockstep concurrency levels, request rates (Poisson or constant arrivals, each
    level `seconds` long, goodput under the SLO when one is given) or the search for the highest rate meeting
    the SLO; the levels box then holds concurrencies, rates, or the rate the search starts from."""

    BINDINGS = [
        # Escape says what it does now: cancels a running sweep, else goes back (check_action shows one).
        Binding("escape", "cancel", "Cancel sweep"),
        Binding("escape", "back", "Back"),
        Binding("enter", "start", "Start", show=True),
        Binding("ctrl+r", "runs", "Past runs"),
    ]

    def __init__(self, engines: list, results_root, default_url: str | None = None,
                 state: ClusterState | None = None):
        """`state`: the monitor's, whose node power the sweep's energy figures read."""
        super().__init__()
        self.engines = engines  # EngineSnapshot list (ready ones)
        self.cluster = state
        self.results_root = results_root
        self.default_url = default_url
        self.sweep: Sweep | None = None
        self.running = False
        self.levels: list = []
        self.model: str | None = None
        self.earlier: list[tuple[str, list]] = []
        self.tps: list[float] = []
        self.finished: SweepFinished | None = None
        self.mode = "concurrency"  # the table's columns: "concurrency" or "rate" (see _set_table_mode)
        self.rate_levels: list[RateLevelStats] = []
        self.max_rate: MaxRate | None = None
        self._charts_due = False  # a redraw is scheduled (three boxes resize at once: one redraw)
        self._predicted: dict[int, str] = {}  # the prediction beside each level, by concurrency
        self._aside = ""  # the demo's load stepping aside while this sweep runs, said beside the engine line
        self._engine_text = ""
        # A lockstep batch's requests, for the ETA: (depth, c, run, attempt) -> [first start, last end, count];
        # and each level's last whole batch in seconds, by (depth, c).
        self._batch_spans: dict[tuple[int, int, int, int], list[float]] = {}
        self._batch_secs: dict[tuple[int, int], float] = {}

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        with Horizontal(classes="form-row", id="sweep-form"):
            yield Select([], id="sweep-engine", allow_blank=True, prompt="endpoint")
            yield Select(MODES, id="sweep-mode", allow_blank=False, value="concurrency")
            yield Input(id="levels", value="1,2,4,8,16,32,64", placeholder="concurrency", classes="wide")
            yield Input(id="runs", value="5", placeholder="runs", type="integer", classes="small")
            yield Input(id="seconds", value="30", placeholder="s/level", type="number", classes="small rate-only")
            yield Input(id="pp", value="1024", placeholder="pp", type="integer", classes="small")
            yield Input(id="tg", value="128", placeholder="tg", type="integer", classes="small")
            yield Input(id="extra", placeholder="e.g. reasoning_effort=low", classes="wide")
            yield Input(id="slo", placeholder="ttft_p95=2s,itl_p95=100ms", classes="wide rate-only")
            yield Button("Start", id="start", variant="success")
        with Horizontal(id="sweep-progress-row"):
            yield Static("", id="sweep-progress")
            yield ProgressBar(id="overall", show_eta=False)
        with Horizontal(id="sweep-live"):
            yield Sparkline([], id="live-tps")
            yield Static("", id="engine-line")
        # Wide: the table on the left, the charts stacked beside it. Narrower:
        # the charts below the table (side by side when they fit), scrolling.
        with VerticalScroll(id="sweep-body"):
            with Vertical(id="sweep-left"):
                yield LevelsTable(id="levels-table", cursor_type="row", zebra_stripes=True)
                yield Static("", id="sweep-summary")
            with Container(id="sweep-charts"):
                for key, _ in CHARTS:
                    yield ChartBox("", id=f"chart-{key}", classes="chart")
        yield KeyFooter()

    def on_mount(self) -> None:
        self._set_table_mode("concurrency")
        options = [(endpoint_text(e), e.url) for e in self.engines]
        select = self.query_one("#sweep-engine", Select)
        select.set_options(options)
        if options:
            select.value = self.default_url if self.default_url in [u for _, u in options] else options[0][1]
        # Each box says what it holds in its top edge, filled or not (a placeholder goes once it is filled).
        select.query_one("SelectCurrent").border_title = "endpoint"
        self.query_one("#sweep-mode", Select).query_one("SelectCurrent").border_title = "mode"
        for wid, (_, _, tip) in FIELDS.items():
            self.query_one(f"#{wid}", Input).tooltip = tip
        self.query_one("#live-tps").border_title = "tokens/s as requests finish"
        self.query_one("#sweep-progress", Static).update(
            "Enter starts the sweep · Esc cancels it (finished requests are kept) · ctrl+r past runs")
        self._show_mode("concurrency")
        self.query_one("#start", Button).focus()

    # Each mode's own default levels, kept while the user switches modes back and forth.
    _LEVELS = {"concurrency": "1,2,4,8,16,32,64", "rate": "1,2,4,8", "max-rate": "1"}

    @on(Select.Changed, "#sweep-mode")
    def _mode_changed(self, event: Select.Changed) -> None:
        if event.value not in (Select.NULL, None) and not self.running:
            self._show_mode(str(event.value))

    def _show_mode(self, mode: str) -> None:
        """The form for `mode`: runs for lockstep levels, seconds per level and the SLO for rates."""
        rate = mode != "concurrency"
        for w in self.query(".rate-only"):
            w.display = rate
        self.query_one("#runs", Input).display = not rate
        levels = self.query_one("#levels", Input)
        kind = "max-rate" if mode == "max-rate" else "rate" if rate else "concurrency"
        if levels.value in self._LEVELS.values() or not levels.value.strip():
            levels.value = self._LEVELS[kind]  # the user's own list is kept
        levels.placeholder = {"concurrency": "concurrency", "rate": "requests/s",
                              "max-rate": "start at req/s"}[kind]
        levels.tooltip = LEVELS_FIELD[kind][2]
        self._label_boxes()
        self.call_after_refresh(self._label_boxes)  # the boxes shown moved: their widths too

    def _label_boxes(self) -> None:
        """Each box's label, as long as its width allows."""
        mode = self._mode()
        kind = "max-rate" if mode == "max-rate" else "rate" if mode != "concurrency" else "concurrency"
        for wid, (long, short, _) in [*FIELDS.items(), ("levels", LEVELS_FIELD[kind])]:
            box = self.query_one(f"#{wid}", Input)
            box.border_title = long if box.outer_size.width - TITLE_EDGE >= len(long) else short
        # A placeholder whole or a shorter one (at 80 columns the extra body's showed "e.g."); the tooltip
        # keeps the example.
        for wid, placeholders in PLACEHOLDERS.items():
            box = self.query_one(f"#{wid}", Input)
            room = box.content_size.width - 1  # the cursor's cell
            box.placeholder = next((p for p in placeholders if room <= 0 or cell_len(p) <= room), placeholders[-1])
        self._fit_endpoint()

    def _fit_endpoint(self) -> None:
        """The chosen endpoint as its box has room for, never "127.0.0.2:8000 · …" (`endpoint_fits`)."""
        select = self.query_one("#sweep-engine", Select)
        engine = next((e for e in self.engines if e.url == select.value), None)
        if engine is None:
            return
        label = select.query_one("SelectCurrent #label", Static)
        room = label.content_size.width
        if room > 0:
            select.query_one(SelectCurrent).update(endpoint_fits(engine, room))

    @on(Select.Changed, "#sweep-engine")
    def _endpoint_changed(self) -> None:
        self.call_after_refresh(self._fit_endpoint)

    def on_resize(self) -> None:
        self.call_after_refresh(self._label_boxes)

    # -- starting ----------------------------------------------------------------

    def _mode(self) -> str:
        value = self.query_one("#sweep-mode", Select).value
        return "concurrency" if value in (Select.NULL, None) else str(value)

    def _settings(self) -> SweepSettings:
        url = self.query_one("#sweep-engine", Select).value
        if url in (Select.NULL, None):
            raise SparktopError("no endpoint to sweep: start an engine first (l launches one)")
        engine = next((e for e in self.engines if e.url == url), None)
        self.swept_engine = engine  # what the prediction beside each level is of

        def number(wid: str) -> int:
            text = self.query_one(f"#{wid}", Input).value.strip()
            try:
                return int(text)
            except ValueError:
                raise SparktopError(f"{wid}: expected a whole number, got {text!r}") from None

        extra = self.query_one("#extra", Input).value.strip()
        common = SweepSettings(endpoint=str(url), pp=number("pp"), tg=number("tg"),
                               extra_body=parse_extra_body([extra] if extra else []),
                               topology=engine.topology if engine else None,
                               nodes=[engine.node] if engine and engine.node else [])
        mode = self._mode()
        if mode == "concurrency":
            return replace(common, levels=parse_levels(self.query_one("#levels", Input).value), runs=number("runs"))
        text = self.query_one("#seconds", Input).value.strip()
        try:
            seconds = float(text)
        except ValueError:
            raise SparktopError(f"s/level: expected seconds per rate level, got {text!r}") from None
        if not seconds > 0:
            raise SparktopError(f"s/level: a level must last more than 0 seconds, got {text!r}")
        slo = self.query_one("#slo", Input).value.strip() or None
        rates = parse_rates(self.query_one("#levels", Input).value)
        if mode == "max-rate":
            if slo is None:
                raise SparktopError("max rate: give the SLO it must meet, e.g. ttft_p95=2s,itl_p95=100ms")
            rates = rates[:1]
        return replace(common, rates=rates, arrivals="constant" if mode == "constant" else "poisson",
                       duration=seconds, slo=slo, find_max_rate=mode == "max-rate")

    @on(Button.Pressed, "#start")
    def _pressed(self) -> None:
        self.action_start()

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_start()

    def action_start(self) -> None:
        if self.running:
            return
        try:
            settings = self._settings()
            engine = next((e for e in self.engines if e.url.rstrip("/") == settings.endpoint.removesuffix("/v1")),
                          None)
            power = monitored_power(self.cluster, engine) if self.cluster is not None and engine else None
            rate = settings.rates is not None
            sweep = (RateSweep if rate else Sweep)(settings, self.results_root, power=power)
        except SparktopError as e:
            self.notify(str(e), title="Sweep", severity="error")
            return
        self.sweep, self.running, self.finished = sweep, True, None
        self.levels, self.tps, self.rate_levels, self.max_rate = [], [], [], None
        self._predicted = {}
        self._batch_spans, self._batch_secs = {}, {}
        self.refresh_bindings()
        # Off the form's boxes (which would take q, s, h... as typing): the footer shows the app's keys again.
        self.query_one("#levels-table", DataTable).focus()
        self._set_table_mode("rate" if rate else "concurrency")
        self.query_one("#sweep-summary", Static).update("")
        self.query_one("#start", Button).disabled = True
        self.query_one("#sweep-mode", Select).disabled = True
        self.query_one("#sweep-progress", Static).update("calibrating prompts…")
        self._run(sweep)

    @work(group="sweep", exclusive=True, exit_on_error=False)
    async def _run(self, sweep: Sweep) -> None:
        try:
            await pump(sweep.events(), self, SweepProgress)
        except SparktopError as e:
            self.notify(str(e), title="Sweep", severity="error", timeout=10)
            self.query_one("#sweep-progress", Static).update(Text(str(e), style="red"))
            self._ended()
        except BaseException:
            self._ended()  # cancelled: no SweepFinished will come
            raise
        # Ended normally: the SweepFinished message, still queued, ends it on screen.

    def _ended(self) -> None:
        self.running = False
        self.refresh_bindings()
        if isinstance(self.focused, Input):
            self.query_one("#levels-table", DataTable).focus()  # the results, and the app's keys in the footer
        if self._aside:
            self._aside = ""  # the demo's load is back once the sweep has ended
            self._show_engine_line()
        self.query_one("#start", Button).disabled = False
        self.query_one("#sweep-mode", Select).disabled = False

    def _set_table_mode(self, mode: str) -> None:
        """The table for lockstep levels or rate levels, empty (the first sweep of a mode changes its columns)."""
        self.mode = mode
        self._fill_table(force=True)

    def _table_rows(self) -> list[tuple[str, dict[str, str | Text]]]:
        """The table's rows as (key, cells by column key), in the order they came."""
        if self.mode == "rate":
            return [(lv.label, dict(zip(RATE_COLUMNS, rate_cells(lv), strict=True))) for lv in self.rate_levels]
        return [(str(lv.concurrency), self._lockstep_cells(lv)) for lv in self.levels]

    def _lockstep_cells(self, stats: LevelStats) -> dict[str, str | Text]:
        cells: dict[str, str | Text] = {key: cell(stats, key) for key, _, _ in COLUMNS}
        if stats.contaminated:  # foreign traffic on the engine during the level (bench.sweep's guard)
            cells["concurrency"] = f"{cells['concurrency']} ⚠"
        cells["predicted"] = self._predicted.get(stats.concurrency, "…")  # sparktop predict's decode for it
        cells["j_per_token"] = cell(stats, "j_per_token")  # the nodes' GPU power over the level's tokens/s
        return cells

    def _fitted_columns(self, table: DataTable, rows: list[tuple[str, dict[str, str | Text]]]) -> tuple[str, ...]:
        """The columns that fit the table's width (all of them before it is laid out)."""
        heads = dict.fromkeys(RATE_COLUMNS, "") if self.mode == "rate" else dict(LOCKSTEP_COLUMNS)
        room = table.scrollable_content_region.width
        if room <= 0:
            return tuple(heads)
        pad = 2 * table.cell_padding
        widths = {key: pad + max([cell_len(head or key), *(cell_len(c) if isinstance(c, str) else c.cell_len
                                                           for _, cells in rows if (c := cells[key]) is not None)])
                  for key, head in heads.items()}
        return fit_columns(widths, RATE_KEEP if self.mode == "rate" else LOCKSTEP_KEEP, room)

    def _fill_table(self, force: bool = False) -> None:
        """The table's rows, under the columns that fit its width now: the header built again when those
        change (a resize, a wider figure), else only the rows."""
        table = self.query_one("#levels-table", DataTable)
        rows = self._table_rows()
        columns = self._fitted_columns(table, rows)
        have = tuple(str(c.key.value) for c in table.columns.values())
        row = table.cursor_row  # where the user had it
        if force or columns != have:
            table.clear(columns=True)
            heads = dict(LOCKSTEP_COLUMNS)
            for key in columns:
                table.add_column(key if self.mode == "rate" else heads[key], key=key)
        else:
            table.clear()
        for key, cells in rows:
            table.add_row(*(cells[c] for c in columns), key=key)
        if 0 < row < table.row_count:
            table.move_cursor(row=row, animate=False)

    def on_levels_table_resized(self, message: LevelsTable.Resized) -> None:
        message.stop()
        self._fill_table()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            return self.running
        if action == "back":
            return not self.running
        return True

    def action_cancel(self) -> None:
        self.action_cancel_or_back()

    def action_back(self) -> None:
        self.action_cancel_or_back()

    def action_cancel_or_back(self) -> None:
        if self.running:
            self.workers.cancel_group(self, "sweep")
            self.notify("Sweep cancelled: every finished request is kept.", title="Sweep")
        else:
            self.app.pop_screen()

    def action_runs(self) -> None:
        self.app.push_screen(RunsScreen(self.results_root))

    # -- live ------------------------------------------------------------------

    def on_sweep_progress(self, message: SweepProgress) -> None:
        line = self.query_one("#sweep-progress", Static)
        match message.event:
            case SweepStarted() as e:
                self.model = e.model
                self._started_with = e.settings  # what each level's prediction is asked for
                self.query_one("#overall", ProgressBar).update(total=e.total_requests, progress=e.resumed_requests)
                self.earlier = self._earlier_runs(e.model, e.run_id)
                # The demo's background load runs with --step-aside (sparktop.measuring): say so, here and, as
                # this line is soon overwritten (the guard's wait, the requests), beside the engine line.
                demo = str(getattr(self.app, "label", "")).startswith("demo")
                line.update(Text.assemble(("sweeping ", "bold"), e.model, f" · {e.path.name}", (
                    " · the demo's load steps aside from this node until the sweep ends", "dim") if demo else ""))
                self._aside = "the demo's load steps aside from this node until the sweep ends" if demo else ""
                self._show_engine_line()
                self._draw_charts()
            case LevelStarted(concurrency=c, warmup=warmup):
                line.update(Text.assemble((f"c{c} ", "bold yellow"), "warm-up" if warmup else "measuring",
                                          f" · {self.model}"))
            case RateLevelStarted(rate=rate, requests=n):
                line.update(Text.assemble((f"{rate:g}/s " if rate is not None else "trace ", "bold yellow"),
                                          f"sending {n} requests · {self.model}"))
            case RateLevelDone(stats=stats):
                self._rate_level_done(stats)
            case MaxRateFound(result=result):
                self.max_rate = result
            case RequestDone() as e if e.record.scheduled is not None:
                self._rate_request_done(e, line)
            case RequestDone() as e:
                self._request_done(e, line)
            case EngineSample() as e:
                self._engine_sample(e)
            case WaitingForIdle() as e:
                # The guard waits for the engine to finish other work, live: what and how long, and what then.
                line.update(guard_text(e, line.content_size.width, self.app.console))
            case LevelContaminated() as e:
                line.update(Text.assemble((f"c{e.concurrency} ⚠ ", "bold yellow"), e.reason,
                                          " · measuring it again" if e.remeasuring else " · kept, marked ⚠"))
            case LevelDone(stats=stats):
                self._level_done(stats)
            case SweepFinished() as e:
                self._finished(e, line)

    def _request_done(self, e: RequestDone, line: Static) -> None:
        self.query_one("#overall", ProgressBar).update(progress=e.done)
        if e.live_tps:
            self.tps = (self.tps + [e.live_tps])[-200:]
            self.query_one("#live-tps", Sparkline).data = list(self.tps)
        err = " · errors in this level" if not e.record.ok else ""
        runs = self.sweep.s.runs if self.sweep is not None else None
        c = e.record.level
        line.update(Text.assemble(
            (f"c{c} ", "bold yellow"), f"batch {e.record.run}" + (f"/{runs}" if runs else "")
            + f" · requests {e.level_done}/{e.level_total} of c{c} · total {e.done}/{e.total} · "
            + self._eta(e), (f" · {e.live_tps:,.0f} t/s" if e.live_tps else ""), (err, "red")))

    def _eta(self, e: RequestDone) -> str:
        """The time left, from the batches measured so far (`remaining_seconds`): a range while a level not
        yet measured can only be guessed from one, never the sweep's own figure (it assumed every bigger level
        grows as the square root of its concurrency, and stayed minutes short)."""
        r = e.record
        depth = int(getattr(r, "depth", 0) or 0)
        span = self._batch_spans.setdefault((depth, int(r.level), int(r.run), int(getattr(r, "attempt", 0) or 0)),
                                            [math.inf, -math.inf, 0])
        span[0] = min(span[0], r.start)
        span[1] = max(span[1], r.end if r.end is not None else r.start)
        span[2] += 1
        if span[2] >= int(r.level) and span[1] > span[0]:
            self._batch_secs[(depth, int(r.level))] = span[1] - span[0]
        if self.sweep is None:
            return eta_text(e.eta_s)
        s = self.sweep.s
        cells = s.level_cells()
        at = cells.index((depth, int(r.level))) if (depth, int(r.level)) in cells else len(cells)
        # The batch under way is counted whole until its last request is in.
        left = s.runs - int(r.run) + (0 if span[2] >= int(r.level) else 1)
        return eta_words(remaining_seconds(cells, s.runs, s.warmup and not s.warmup_first_only, at, left,
                                           self._batch_secs))

    def _rate_request_done(self, e: RequestDone, line: Static) -> None:
        """A rate level's request: the progress, and its decode rate (tokens over its own decode time)."""
        r = e.record
        bar = self.query_one("#overall", ProgressBar)
        bar.update(total=max(e.total, e.done), progress=e.done)
        if r.ok and r.first_token is not None and r.end is not None and r.end > r.first_token \
                and r.completion_tokens > 1:
            self.tps = (self.tps + [(r.completion_tokens - 1) / (r.end - r.first_token)])[-200:]
            self.query_one("#live-tps", Sparkline).data = list(self.tps)
        rate = f"{r.rate:g}/s " if r.rate is not None else "trace "
        err = " · errors in this level" if not r.ok else ""
        line.update(Text.assemble((rate, "bold yellow"), f"requests {e.level_done}/{e.level_total} of {rate.strip()}"
                                  f" · total {e.done}/{max(e.total, e.done)}", (err, "red")))

    def _rate_level_done(self, stats: RateLevelStats) -> None:
        # A search may come back to a rate: its newest level replaces the row.
        # Rows in order of rate, as a search's levels come in any order.
        self.rate_levels = sorted([lv for lv in self.rate_levels if lv.rate != stats.rate] + [stats],
                                  key=lambda lv: lv.rate if lv.rate is not None else math.inf)
        self._fill_table()
        self._draw_charts()

    def _engine_sample(self, e: EngineSample) -> None:
        self._engine_text = "engine  " + e.describe()
        self._show_engine_line()

    def _show_engine_line(self) -> None:
        """The engine's figures, and under them the demo's load stepping aside while the sweep runs."""
        text = Text(self._engine_text, style="cyan")
        if self._aside:
            text = Text.assemble(text, "\n" if self._engine_text else "", (self._aside, "dim"))
        self.query_one("#engine-line", Static).update(text)

    def _level_done(self, stats: LevelStats) -> None:
        # A level measured again (the contamination guard) replaces its row, at the end.
        self.levels = [lv for lv in self.levels if lv.concurrency != stats.concurrency] + [stats]
        self._predicted.pop(stats.concurrency, None)
        self._fill_table()
        self._draw_charts()
        self._predict_level(stats.concurrency)

    def _finished(self, e: SweepFinished, line: Static) -> None:
        self._ended()
        self.finished = e
        if self.mode != "rate":
            self.levels = e.levels
        self._draw_charts()
        k = knee(e.levels)
        summary = [Text(f"{e.status}: {e.reason}" if e.reason else "done", style="green" if e.status == "done"
                        else "bold red")]
        if k and len(e.levels) > 1:
            summary.append(Text(k.describe("decode")))
        for lv in self.levels:
            if lv.contaminated:  # what the table's ⚠ means, level by level
                summary.append(Text(f"⚠ c{lv.concurrency}: measured with other traffic on the engine "
                                    f"({lv.contamination or 'the engine was busy before it'}); its figures are "
                                    "not the engine's alone", style="yellow"))
        for lv in self.rate_levels:
            if lv.behind:
                summary.append(Text(f"⚠ {lv.label}: the client fell behind its schedule ({lv.behind})",
                                    style="yellow"))
            elif lv.saturated:
                summary.append(Text(f"⚠ {lv.label}: {lv.saturated}", style="yellow"))
        if self.max_rate is not None:
            summary.append(Text(self.max_rate.text, style="bold"))
        summary.append(Text(f"saved in {e.path}", style="dim"))
        self.query_one("#sweep-summary", Static).update(Text("\n").join(summary))
        n = len(self.rate_levels) if self.mode == "rate" else len(e.levels)
        levels = f"{n} level{'s' if n != 1 else ''}"
        line.update(Text.assemble(("finished" if e.status == "done" else e.status, "bold green" if e.status == "done"
                                   else "bold red"), f" · {levels} · ctrl+r compares with past runs"))

    @work(group="predict", exit_on_error=False)
    async def _predict_level(self, c: int) -> None:
        """The prediction beside the measurement (the twin's model, fitted)."""
        import asyncio
        from types import SimpleNamespace

        from sparktop.launch.prediction import predicted_for_engine
        from sparktop.layouts import layout_of

        s = self.sweep.s if self.sweep is not None else getattr(self, "_started_with", None)
        if s is None:
            return
        table = self.query_one("#levels-table", DataTable)
        engine = getattr(self, "swept_engine", None)
        # The swept engine (its card, kind, image, flags); the served name where the engine is not known.
        snap = engine if engine is not None and getattr(engine, "model", None) else SimpleNamespace(
            model=self.model or "", kind=getattr(engine, "kind", None), image=None)
        topology = s.topology if s.topology and layout_of(s.topology) is not None else None
        row = await asyncio.to_thread(predicted_for_engine, snap, getattr(self.app, "inventory", None), c, s.pp,
                                      s.tg, topology)
        self._predicted[c] = fmt(row.decode_tps) if row is not None else "—"
        if str(c) in table.rows and any(str(col.key.value) == "predicted" for col in table.columns.values()):
            table.update_cell(str(c), "predicted", self._predicted[c])

    def _earlier_runs(self, model: str, run_id: str) -> list[tuple[str, list]]:
        """Up to three earlier runs of the same model and kind (rate runs beside a rate run), newest first."""
        out = []
        rate = self.mode == "rate"
        for run in reversed(list_runs(self.results_root)):
            if run.id == run_id or run.meta.get("model") != model or (run.meta.get("mode") == "rate") != rate:
                continue
            levels = [lv for lv in run.rate_levels() if lv.rate is not None] if rate else run.levels()
            if levels:
                out.append((run.label if run.label != run.id else run.id[:15], levels))
            if len(out) == 3:
                break
        return out

    def on_chart_box_resized(self, message: ChartBox.Resized) -> None:
        """The charts drawn again when their boxes change size (the screen's or a scrollbar's doing), once
        for the three, after the layout has given them their new size."""
        message.stop()
        if not self._charts_due:
            self._charts_due = True
            self.call_after_refresh(self._draw_charts)

    def _draw_charts(self) -> None:
        """Each chart drawn to exactly the size of its box (plotext draws to
        the size it is given; a wider chart would wrap)."""
        self._charts_due = False
        rate = self.mode == "rate"
        if rate:
            runs = [("this run", [lv for lv in self.rate_levels if lv.rate is not None]), *self.earlier]
        else:
            runs = [("this run", sorted(self.levels, key=lambda lv: lv.concurrency)), *self.earlier]
        for (box_key, _), (key, title) in zip(CHARTS, RATE_CHARTS if rate else CHARTS, strict=True):
            box = self.query_one(f"#chart-{box_key}", Static)
            width, height = box.content_size
            if width < 10 or height < 4:
                continue  # not laid out yet: the resize draws it
            if rate:
                if key == "goodput" and not (self.sweep is not None and self.sweep.s.slo):
                    title = "requests/s served"
                chart = level_chart(title, key, runs, width, height, x=lambda lv: lv.rate, value=rate_value)
            else:
                chart = level_chart(title, key, runs, width, height)
            chart.rstrip()
            box.update(chart)


class RunsScreen(Screen):
    """Past runs; space marks, Enter compares the marked (or the highlighted)."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("space", "mark", "Mark"),
                Binding("enter", "compare", "Compare")]

    def __init__(self, root) -> None:
        super().__init__()
        self.root = root
        self.runs: dict[str, Run] = {}
        self.marked: set[str] = set()

    def compose(self) -> ComposeResult:
        yield Static(Text(" past sweep runs · space marks · Enter compares ", style="bold reverse"))
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        yield KeyFooter()

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        for key in ("mark", "run", "model", "topology", "levels", "status"):
            t.add_column(key, key=key)
        for run in reversed(list_runs(self.root)):
            self.runs[run.id] = run
            t.add_row("", run.id, str(run.meta.get("model") or ""), str(run.meta.get("topology") or ""),
                      " ".join(f"c{lv.concurrency}" for lv in run.levels()), str(run.meta.get("status") or ""),
                      key=run.id)
        t.focus()

    def action_mark(self) -> None:
        t = self.query_one(DataTable)
        if not self.runs:
            return
        rid = str(t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value)
        self.marked ^= {rid}
        t.update_cell(rid, "mark", "✓" if rid in self.marked else "")

    @on(DataTable.RowSelected)
    def _selected(self) -> None:
        self.action_compare()

    def action_compare(self) -> None:
        t = self.query_one(DataTable)
        if not self.runs:
            return
        ids = [rid for rid in self.runs if rid in self.marked] or \
              [str(t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value)]
        self.app.push_screen(CompareScreen([load_run(path) for i in ids if (path := self.runs[i].path) is not None]))


class CompareScreen(Screen):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, runs: list[Run]) -> None:
        super().__init__()
        self.runs = runs

    def compose(self) -> ComposeResult:
        yield Static(Text(f" compare · {len(self.runs)} run(s) ", style="bold reverse"))
        with VerticalScroll():
            yield Static(Markdown(cmp.markdown(self.runs)), id="compare-text")
        yield KeyFooter()
