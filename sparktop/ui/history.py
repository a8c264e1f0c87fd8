"""The history screen (`h`): what the history file says about the last 24
hours or the last 7 days, for the owner who was away.

Charts of tokens/s and KV cache per engine, and of unified memory and GPU
power per node, on a local-clock time axis; the serving sessions (which
engine served which model, when, how it ended, what it served); the totals
per day; and the event log, newest first. The same data `sparktop history`
prints as tables (`history/query.py` reads it for both).

The screen reads the file itself (synchronous SQLite: a day answers in
about 15 ms, a week of minutes for two nodes and two engines in under a
tenth of a second) when it opens, when the window changes and when `r`
asks again — never on a repaint: a resize only redraws the charts and the
sessions' table from what was read. It does not follow the cluster state, so it is a plain
`Screen`, not a `LiveScreen`.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Static

from sparktop.errors import SparktopError
from sparktop.history.query import Event, HistoryReader, Session, count_text, energy_text, short_key, when_text
from sparktop.history.store import history_error
from sparktop.settings import Preferences
from sparktop.ui.footer import KeyFooter
from sparktop.ui.screens import HEIGHTS, WIDTHS
from sparktop.units import ago

EMPTY = "no history yet: sparktop writes a row a minute while it is open, or run `sparktop collect`"
OPEN_GAP_S = 300.0  # an open session not seen for longer than this: sparktop was closed meanwhile
EVENTS_SHOWN = 200  # the newest; `sparktop history` lists them all

# A colour per engine and per node, the same in every chart: 256-colour
# numbers, which plotext and the legend's Rich styles both take.
PALETTE = (6, 3, 2, 5, 4, 1, 14, 11)
LEVEL_STYLE = {"error": "bold red", "warn": "yellow", "info": "green"}


@dataclass(frozen=True)
class Window:
    key: str
    name: str  # as the head line says it, after "last": "24 hours"
    seconds: float
    # One chart point per this many minutes: 288 points for a day, 336 for a
    # week, about what a braille line holds at 80 to 160 columns (two dots a
    # column), so no chart needs a width-dependent query.
    step_min: int


WINDOWS = {"24h": Window("24h", "24 hours", 86400.0, 5), "7d": Window("7d", "7 days", 7 * 86400.0, 30)}

Columns = tuple[tuple[str, str, bool], ...]  # (key, heading, right-aligned)
SESSION_COLUMNS: Columns = (
    ("engine", "engine", False), ("model", "model", False), ("node", "node", False), ("started", "started", False),
    ("ended", "ended", False), ("how", "how it ended", False), ("tokens", "tokens", True),
    ("requests", "requests", True), ("kv", "peak KV", True), ("energy", "energy", True),
)
DAY_COLUMNS: Columns = (
    ("day", "day", False), ("tokens", "tokens", True), ("requests", "requests", True), ("energy", "energy", True),
    ("cost", "cost", True), ("watched", "watched", True),
)


def short_model(model: str | None) -> str:
    """openai/gpt-oss-120b -> gpt-oss-120b (the organisation is in the sessions' wider view)."""
    return (model or "?").rsplit("/", 1)[-1]


# -- what is read ---------------------------------------------------------------------------

Series = tuple[list[float], list[float]]


@dataclass
class DayTotal:
    """One local day over every engine: what the cluster served that day."""

    day: str  # 2026-11-24
    gen_tokens: float = 0.0
    requests: float = 0.0
    energy_j: float = 0.0
    cost: float | None = None
    minutes: int = 0  # the most any engine was watched that day

    @property
    def label(self) -> str:
        return time.strftime("%a %m-%d", time.strptime(self.day, "%Y-%m-%d"))


@dataclass(eq=False)
class Found:
    """Everything the screen shows for one window, read at once."""

    window: Window
    since: float
    until: float
    span: tuple[float, float] | None  # the whole file's first and last minute
    engines: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    gen_tps: dict[str, Series] = field(default_factory=dict)
    kv: dict[str, Series] = field(default_factory=dict)
    mem_pct: dict[str, Series] = field(default_factory=dict)
    power: dict[str, Series] = field(default_factory=dict)
    sessions: list[Session] = field(default_factory=list)
    days: list[DayTotal] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Nothing at all in the window (the file may hold older rows)."""
        return not (any(ts for ts, _ in (*self.gen_tps.values(), *self.kv.values(), *self.mem_pct.values(),
                                         *self.power.values()))
                    or self.sessions or self.events)


def _local_midnight(t: float) -> float:
    lt = time.localtime(t)
    return time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, -1))


def gather(reader: HistoryReader, window: Window, now: float, price_per_kwh: float | None) -> Found:
    """Read one window: the charts' series, the sessions, the days and the events."""
    since, until = now - window.seconds, now
    found = Found(window, since, until, reader.span())
    if found.span is None:
        return found
    step = window.step_min
    found.engines = reader.keys("engine")
    found.nodes = reader.keys("node")
    for key in found.engines:
        found.gen_tps[key] = reader.series("engine", key, "gen_tps", since, until, step)
        # The highest KV use of each point, not the mean: a twenty-minute spike to 97 % is what a
        # week's chart must not average away.
        ts, kv = reader.series("engine", key, "kv_max", since, until, step, how="max")
        found.kv[key] = (ts, [v * 100 for v in kv])
    for key in found.nodes:
        used_t, used = reader.series("node", key, "mem_used", since, until, step)
        totals = dict(zip(*reader.series("node", key, "mem_total", since, until, step), strict=True))
        pts = [(t, 100 * u / totals[t]) for t, u in zip(used_t, used, strict=True) if totals.get(t)]
        found.mem_pct[key] = ([t for t, _ in pts], [v for _, v in pts])
        found.power[key] = reader.series("node", key, "power_w", since, until, step)
    found.sessions = reader.sessions(since, until)
    # Whole local days, from the midnight the window starts in: a day's row is that day's total,
    # not the part of it the window cuts.
    days: dict[str, DayTotal] = {}
    for d in reader.daily(_local_midnight(since), until, None, price_per_kwh):
        total = days.setdefault(d.day, DayTotal(d.day))
        total.gen_tokens += d.gen_tokens
        total.requests += d.requests
        total.energy_j += d.energy_j
        if d.cost is not None:
            total.cost = (total.cost or 0.0) + d.cost
        total.minutes = max(total.minutes, d.minutes)
    found.days = sorted(days.values(), key=lambda d: d.day, reverse=True)
    found.events = list(reversed(reader.events(since, until)))
    return found


# -- the charts -----------------------------------------------------------------------------


def time_ticks(since: float, until: float, width: int) -> tuple[list[float], list[str]]:
    """Ticks at whole local hours (a day) or local midnights (a week), as
    hours before `until`, labelled with the local clock (15:00, Fri 14), and
    the window's end labelled "now"."""
    ticks: list[float] = []
    labels: list[str] = []
    if until - since <= 2 * 86400:
        every = 3 if width >= 72 else 6  # nine labels of five characters need room between them
        t = since - since % 3600  # whole hours are whole local hours in every time zone but a few
        while t <= until:
            if t >= since and time.localtime(t).tm_hour % every == 0:
                ticks.append(t)
                labels.append(time.strftime("%H:%M", time.localtime(t)))
            t += 3600
    else:
        days = (until - since) / 86400
        every = 1 if width >= 9 * days else 2  # "Fri 14" and a gap per label
        t = _local_midnight(since)
        n = 0
        while t <= until:
            if t >= since:
                if n % every == 0:
                    ticks.append(t)
                    labels.append(time.strftime("%a %d", time.localtime(t)))
                n += 1
            lt = time.localtime(t)
            # The next local midnight (mktime normalises day 32 and the hour a DST change moves).
            t = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday + 1, 0, 0, 0, 0, 0, -1))
    # "now" at the right end, and no clock label so close to it that the two would run together.
    room = (until - since) * 7 / max(1, width)  # about seven columns
    kept = [(t, label) for t, label in zip(ticks, labels, strict=True) if until - t > room]
    kept.append((until, "now"))
    return [(t - until) / 3600 for t, _ in kept], [label for _, label in kept]


def value_ticks(top: float, rows: int) -> list[float]:
    """0 and round steps (1, 2, 2.5, 5 x 10^n) up to at least `top`, one
    every other row at most."""
    top = top if top > 0 else 1.0
    most = max(2, rows // 2)
    magnitude = 10 ** math.floor(math.log10(top / most))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10, 20) if top / (m * magnitude) <= most)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def _tick_label(v: float) -> str:
    return f"{v / 1000:g}k" if v >= 1000 else f"{v:g}"


def _segments(ts: list[float], values: list[float], gap_s: float) -> list[Series]:
    """A series cut where points are missing: a night sparktop was closed is
    a gap in the line, not a straight line across it."""
    out: list[Series] = []
    for t, v in zip(ts, values, strict=True):
        if not out or t - out[-1][0][-1] > gap_s:
            out.append(([], []))
        out[-1][0].append(t)
        out[-1][1].append(v)
    return out


def time_chart(title: str, series: list[tuple[str, Series, int]], since: float, until: float, step_s: float,
               width: int, height: int, ymax: float | None = None) -> Text:
    """A title line with the legend, then the chart: `series` is (label,
    (t, values), colour); x is the local clock over [since, until], the
    whole window whatever the data covers. The legend is above the chart,
    not in it, where plotext's would hide the top left of the lines."""
    import plotext as plt  # only the charts need it

    head = Text.assemble((title, "bold"))
    legend = Text()
    for label, _, colour in series:
        legend.append("  ")
        legend.append("━━", style=f"color({colour})")
        legend.append(f" {label}")
    if head.cell_len + legend.cell_len <= width:
        head.append_text(legend)
    else:  # a narrow chart: the legend on a line of its own
        head = Text("\n").join([head, legend])
        height -= 1
    plt.clear_figure()
    plt.limit_size(False, False)  # the box's size, not the process's terminal (80x24 headless)
    plt.plotsize(max(20, width), max(5, height - 1))
    plt.theme("pro")
    for _, (ts, values), colour in series:
        for seg_t, seg_v in _segments(ts, values, 2.5 * step_s):
            plt.plot([(t - until) / 3600 for t in seg_t], seg_v, marker="braille", color=colour)
    plt.xlim(-(until - since) / 3600, 0)
    top = ymax if ymax is not None else max((max(v) for _, (_, v), _ in series if v), default=1.0)
    yticks = value_ticks(top, height - 4)  # the frame and the x labels take three rows
    plt.ylim(0, yticks[-1])
    plt.yticks(yticks, [_tick_label(v) for v in yticks])
    ticks, labels = time_ticks(since, until, width)
    plt.xticks(ticks, labels)
    chart = Text.from_ansi(plt.build())
    chart.rstrip()
    return Text("\n").join([head, chart])


def summary_line(found: Found) -> Text:
    """The window in a line above the charts, what a short terminal shows
    before any scrolling: sessions 2 serving · 1 ended   events 1 error · 2 warnings."""
    ended = sum(1 for s in found.sessions if not s.open)
    line = Text.assemble(("sessions ", "bold"), f"{len(found.sessions) - ended} serving · {ended} ended",
                         ("   events ", "bold"))
    levels = [e.level for e in found.events]
    errors, warnings = levels.count("error"), levels.count("warn")
    counts = [(errors, "error", "errors", LEVEL_STYLE["error"]), (warnings, "warning", "warnings", LEVEL_STYLE["warn"]),
              (len(levels) - errors - warnings, "info", "info", "")]
    for i, (n, one, many, style) in enumerate(counts):
        if i:
            line.append(" · ")
        line.append(f"{n} {one if n == 1 else many}", style=style if n else "")
    return line


# -- the sessions' table --------------------------------------------------------------------

NARROW = WIDTHS[1][0]  # below this, a session takes two lines
NARROW_SESSION_COLUMNS: Columns = (  # two-line headings over two-line cells
    ("engine", "engine\nmodel", False), ("when", "started\nended", False), ("how", "how it\nended", False),
    ("tokens", "tokens\nrequests", True), ("kv", "peak\nKV", True), ("energy", "energy", True),
)


def session_cells(s: Session, now: float) -> dict[str, Text]:
    """A session's cells by column key, in the words of `sparktop history`."""
    if s.open:
        seen = now - s.last_seen
        ended = Text("serving" if seen <= OPEN_GAP_S else f"serving? seen {ago(seen)} ago", style="green")
    else:
        ended = Text(when_text(s.ended or 0))
    how = s.end_reason or ""
    return {
        "engine": Text(short_key(s.url)), "model": Text(short_model(s.model)), "node": Text(s.node or ""),
        "started": Text(when_text(s.started)), "ended": ended,
        "how": Text(how, style="" if not how else "yellow" if how == "restarted" else "red"),
        "tokens": Text(count_text(s.gen_tokens), justify="right"),
        "requests": Text(count_text(s.requests), justify="right"),
        "kv": Text("" if s.peak_kv is None else f"{s.peak_kv:.0%}", justify="right",
                   style="yellow" if (s.peak_kv or 0) > 0.9 else ""),
        "energy": Text(energy_text(s.energy_j) if s.energy_j > 0 else "—", justify="right"),
    }


def _lines(first: Text, second: Text) -> Text:
    return Text("\n", justify=first.justify).join([first, second])


def _width(text: Text) -> int:
    return max((line.cell_len for line in text.split("\n")), default=0)


def _fit_columns(columns: Columns, rows: list[dict[str, Text]], width: int,
                 shrink: tuple[str, ...]) -> dict[str, Callable[[Text], Text]]:
    """Each column's cell maker: the columns in `shrink` (long names) cut
    with "…", the longest first, until the table fits `width`."""
    widths = {key: max([_width(Text(heading)), *(_width(r[key]) for r in rows)]) for key, heading, _ in columns}
    over = sum(widths.values()) + 2 * len(columns) - width
    while over > 0:
        key = max((k for k in shrink if k in widths and widths[k] > 12), key=lambda k: widths[k], default=None)
        if key is None:
            break  # as narrow as it reads: the table scrolls sideways
        cut = min(over, widths[key] - 12)
        widths[key] -= cut
        over -= cut

    def maker(key: str) -> Callable[[Text], Text]:
        def make(text: Text) -> Text:
            lines = []
            for line in text.split("\n"):
                if line.cell_len > widths[key]:
                    line.truncate(widths[key] - 1)
                    line.append("…")
                lines.append(line)
            return Text("\n", justify=text.justify).join(lines)
        return make

    return {key: maker(key) for key, _, _ in columns}


# -- the screen -----------------------------------------------------------------------------

CHARTS = (  # (id, title, what, per)
    ("gen", "generation tokens/s", "gen_tps", "engine"),
    ("kv", "KV cache used (%)", "kv", "engine"),
    ("mem", "unified memory used (%)", "mem_pct", "node"),
    ("power", "GPU power (W)", "power", "node"),
)


class HistoryChart(Static):
    """One chart of the window that was read, drawn to its box's size
    (plotext draws to the size it is given; a wider chart would wrap) when
    the data changes or the box does: a resize draws, it never reads."""

    def __init__(self, key: str, title: str, what: str, per: str):
        super().__init__(id=f"history-{key}", classes="history-chart")
        self.title, self.what, self.per = title, what, per
        self.found: Found | None = None
        self.colours: dict[str, int] = {}
        self._drawn: tuple[int, int] | None = None  # the size last drawn at

    def show(self, found: Found, colours: dict[str, int]) -> None:
        self.found, self.colours, self._drawn = found, colours, None
        self.draw()

    def on_resize(self) -> None:
        self.draw()

    def draw(self) -> None:
        found = self.found
        width, height = self.content_size
        if found is None or width < 20 or height < 6:
            return  # not laid out yet: the resize draws it
        stamp = (width, height)
        if stamp == self._drawn:
            return
        self._drawn = stamp
        data: dict[str, Series] = getattr(found, self.what)
        keys = found.engines if self.per == "engine" else found.nodes
        series = [(short_key(k), data[k], self.colours.get(k, 7)) for k in keys if data.get(k) and data[k][0]]
        if not series:
            self.update(Text(f"{self.title}: no {self.per} reported it in the last {found.window.name}",
                             style="dim"))
            return
        ymax = 100.0 if self.what in ("kv", "mem_pct") else None
        self.update(time_chart(self.title, series, found.since, found.until,
                               found.window.step_min * 60.0, width, height, ymax))


class HistoryScreen(Screen):
    """The last 24 hours or 7 days from the history file."""

    HORIZONTAL_BREAKPOINTS = WIDTHS
    VERTICAL_BREAKPOINTS = HEIGHTS
    BINDINGS = [
        Binding("escape,q,h", "app.pop_screen", "Back"),
        Binding("1", "window('24h')", "24 h"),
        Binding("7", "window('7d')", "7 days"),
        Binding("w", "toggle_window", "Switch"),
        Binding("r", "reread", "Refresh"),
    ]

    def __init__(self, reader: HistoryReader | None, preferences: Preferences, now: float | None = None,
                 note: str | None = None):
        """`now` fixes the clock (tests, snapshots); `note` says why history
        is off or paused, shown above everything."""
        super().__init__()
        self.reader = reader
        self.preferences = preferences
        self.fixed_now = now
        self.note = note
        self.window = WINDOWS["24h"]
        self.found: Found | None = None
        self.problem: str | None = None  # the file could not be read
        self.reads = 0  # how many times the file was read (the tests hold it to open, switch, r)
        self._narrow = False  # the sessions' table as laid out: two lines a session

    def compose(self) -> ComposeResult:
        yield Static(id="history-head")
        with VerticalScroll(id="history-body"):
            yield Static(id="history-note")
            yield Static(id="history-summary")
            with Grid(id="history-charts"):
                for spec in CHARTS:
                    yield HistoryChart(*spec)
            yield Static(id="history-sessions-title", classes="history-title")
            yield DataTable(id="history-sessions", cursor_type="none", zebra_stripes=True)
            yield Static(id="history-days-title", classes="history-title")
            yield DataTable(id="history-days", cursor_type="none", zebra_stripes=True)
            yield Static(id="history-cost-hint")
            yield Static(id="history-events-title", classes="history-title")
            yield Static(id="history-events")
        yield KeyFooter()

    def on_mount(self) -> None:
        for table in self.query(DataTable):
            table.can_focus = False  # the keys scroll the page, not a table's cursor
        self._read()
        self.query_one("#history-body").focus()

    # -- actions ----------------------------------------------------------------------

    def action_window(self, key: str) -> None:
        if WINDOWS[key] != self.window:
            self.window = WINDOWS[key]
            self._read()

    def action_toggle_window(self) -> None:
        self.action_window("7d" if self.window.key == "24h" else "24h")

    def action_reread(self) -> None:
        self._read()

    # -- reading and showing -----------------------------------------------------------

    def _read(self) -> None:
        now = self.fixed_now if self.fixed_now is not None else time.time()
        self.found, self.problem = None, None
        if self.reader is not None:
            self.reads += 1
            try:
                self.found = gather(self.reader, self.window, now, self.preferences.energy_price_per_kwh)
            except (sqlite3.Error, SparktopError) as exc:
                # The line the CLI gives for the same file (a damaged one says to move it aside, and how).
                self.problem = f"the history file could not be read: {history_error(exc, self.reader.store.path)}"
        self._show()

    def _show(self) -> None:
        found = self.found
        self.query_one("#history-head", Static).update(self._head())
        words = self._words()
        note = self.query_one("#history-note", Static)
        note.update(words or "")
        note.display = bool(words)
        shown = found is not None and not found.empty
        for widget in self.query_one("#history-body").children:
            if widget.id != "history-note":
                widget.display = shown
        if not shown or found is None:
            return
        self.query_one("#history-summary", Static).update(summary_line(found))
        self._sessions(found)
        self._days(found)
        self._events(found)
        self._draw_charts()

    def _head(self) -> Text:
        head = Text()
        head.append(" history ", style="bold reverse")
        head.append(f" last {self.window.name}", style="bold")
        found = self.found
        if found is not None:
            head.append(f" · {when_text(found.since)} to {when_text(found.until)}", style="dim")
        # The keys are in the footer too, where the app's own may crowd them out at 80 columns.
        head.append("   ")
        head.append("1 7 w", style="bold")
        head.append(" window  ", style="dim")
        head.append("r", style="bold")
        head.append(" refresh", style="dim")
        return head

    def _words(self) -> Text | None:
        """What the screen says instead of, or above, the data."""
        lines: list[Text] = []
        if self.note:
            lines.append(Text(self.note, style="bold yellow"))
        if self.problem:
            lines.append(Text(self.problem, style="bold red"))
        found = self.found
        if self.reader is None:
            if not self.note:
                lines.append(Text("history is off", style="bold yellow"))
        elif found is not None and found.span is None:
            lines.append(Text(EMPTY))
        elif found is not None and found.span is not None and found.empty:
            first, last = found.span
            other = "7 shows the last 7 days" if self.window.key == "24h" else "1 shows the last 24 hours"
            lines.append(Text(f"nothing in the last {self.window.name}: the history holds {when_text(first)} to "
                              f"{when_text(last)} ({other}, or `sparktop history --since` any time)"))
        return Text("\n").join(lines) if lines else None

    def _sessions(self, found: Found) -> None:
        self.query_one("#history-sessions-title", Static).update(
            Text(f"serving sessions ({len(found.sessions)}, newest first)" if found.sessions else
                 "no serving sessions in this window", style="bold"))
        table = self.query_one("#history-sessions", DataTable)
        table.clear(columns=True)
        table.display = bool(found.sessions)
        width = self.size.width - 4  # the table's margins and the body's scrollbar
        self._narrow = self.size.width < NARROW
        cells = [session_cells(s, found.until) for s in reversed(found.sessions)]  # newest first, as the events
        if self._narrow:
            # Two lines a session, so that every figure fits 80 columns with no sideways scrolling.
            columns = NARROW_SESSION_COLUMNS
            rows = [{"engine": _lines(c["engine"], c["model"]), "when": _lines(c["started"], c["ended"]),
                     "how": c["how"], "tokens": _lines(c["tokens"], c["requests"]), "kv": c["kv"],
                     "energy": c["energy"]} for c in cells]
        else:
            columns = SESSION_COLUMNS
            rows = cells
        fitted = _fit_columns(columns, rows, width, ("engine", "model", "how"))
        table.header_height = 2 if self._narrow else 1
        for key, heading, right in columns:
            table.add_column(Text(heading, justify="right" if right else "left"), key=key)
        for s, row in zip(reversed(found.sessions), rows, strict=True):
            table.add_row(*(fitted[key](row[key]) for key, _, _ in columns), key=f"session-{s.id}",
                          height=2 if self._narrow else 1)

    def on_resize(self) -> None:
        # The sessions' layout follows the width (one line or two a session): redrawn from what was read.
        if self.found is not None and not self.found.empty and (self.size.width < NARROW) != self._narrow:
            self._sessions(self.found)

    def _days(self, found: Found) -> None:
        self.query_one("#history-days-title", Static).update(Text("per day (every engine)", style="bold"))
        table = self.query_one("#history-days", DataTable)
        table.clear(columns=True)
        table.display = bool(found.days)
        for key, heading, right in DAY_COLUMNS:
            table.add_column(Text(heading, justify="right" if right else "left"), key=key)
        money = self.preferences.money
        for d in found.days:
            table.add_row(Text(d.label), Text(count_text(d.gen_tokens), justify="right"),
                          Text(count_text(d.requests), justify="right"),
                          Text(energy_text(d.energy_j) if d.energy_j > 0 else "—", justify="right"),
                          Text(money(d.cost) if d.cost is not None else "—", justify="right"),
                          Text(f"{d.minutes / 60:.1f} h", justify="right"), key=d.day)
        hint = self.query_one("#history-cost-hint", Static)
        hint.display = bool(found.days) and not self.preferences.energy_price_per_kwh
        hint.update(Text("costs: set energy_price_per_kwh in settings.yaml", style="dim"))

    def _events(self, found: Found) -> None:
        self.query_one("#history-events-title", Static).update(
            Text(f"events ({len(found.events)}, newest first)" if found.events else "no events in this window",
                 style="bold"))
        box = self.query_one("#history-events", Static)
        box.display = bool(found.events)
        # A grid, so that a long event wraps under its own words, not under the time.
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, style="dim")
        grid.add_column(no_wrap=True)
        grid.add_column(ratio=1)
        for e in found.events[:EVENTS_SHOWN]:
            grid.add_row(when_text(e.t), short_key(e.key), Text(e.text, style=LEVEL_STYLE.get(e.level, "")))
        if len(found.events) > EVENTS_SHOWN:
            grid.add_row("", "", Text(f"… and {len(found.events) - EVENTS_SHOWN} older (`sparktop history` lists "
                                      "them all)", style="dim"))
        box.update(grid)

    def _draw_charts(self) -> None:
        found = self.found
        if found is None or found.empty:
            return
        colours = {key: PALETTE[i % len(PALETTE)] for i, key in enumerate(found.engines)}
        colours.update({key: PALETTE[i % len(PALETTE)] for i, key in enumerate(found.nodes)})
        for chart in self.query(HistoryChart):
            chart.show(found, colours)
