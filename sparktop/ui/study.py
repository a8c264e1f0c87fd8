"""The study screen: every topology of a recipe launched, swept and stopped in turn.

`b` on the launcher plans a study (`StudyPlanScreen`: topologies, levels,
runs, the estimate) and the app runs it in an app worker, so it goes on
when this screen is closed; `y` (or `b`) shows it again. `sparktop --study
ID` follows a study another process runs (`sparktop.study.follow`), with
the same events. Either way the events are folded into a `StudyRun` (here,
like `LaunchRun` for a launch) and arrive as `StudyProgress` messages; the
screen draws the fold: a matrix of topologies × concurrency levels filling
in, the stage and the time left, the live sweep of the topology being
measured, and decode t/s against concurrency with a line per topology.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Label, Sparkline, Static

from sparktop.bench.events import (
    EngineSample,
    LevelContaminated,
    LevelDone,
    LevelStarted,
    RequestDone,
    SweepFinished,
    SweepStarted,
    WaitingForIdle,
)
from sparktop.bench.levels import parse_levels
from sparktop.bench.stats import LevelStats
from sparktop.errors import SparktopError
from sparktop.launch.events import LogLine
from sparktop.launch.recipe import Recipe
from sparktop.settings import Inventory
from sparktop.study.events import (
    LaunchUpdate,
    StageChanged,
    StudyEvent,
    StudyFinished,
    StudyStarted,
    SweepUpdate,
    TopologyFinished,
    TopologyStarted,
)
from sparktop.study.planning import Estimate, choose_topologies, new_study
from sparktop.study.state import CANCELLED, DONE, FAILED, PENDING, SWEEPING, Study
from sparktop.ui.charts import empty_chart
from sparktop.ui.footer import KeyFooter
from sparktop.ui.launcher import short_log_line
from sparktop.ui.messages import StudyCancelRequested, StudyProgress, StudyRequested, StudySeen
from sparktop.ui.screens import LiveScreen, StatusLine
from sparktop.units import ago, eta_text, fmt

INTERRUPTED = "interrupted"
ENDED = (DONE, FAILED, CANCELLED, INTERRUPTED)  # a topology that will not move on in this session
STAGES = ("preflight", "launching", "sweeping", "stopping")
DEFAULT_LEVELS = "1,2,4,8,16,32,64"
SIDE_MIN = 56  # columns the live sweep needs beside the matrix; fewer and it goes below
_SWEEP_LEVEL = re.compile(r"^sweeping c(\d+)")
ROW_MARK = {PENDING: ("·", "dim"), DONE: ("✓", "green"), FAILED: ("✗", "bold red"), CANCELLED: ("–", "dim"),
            INTERRUPTED: ("–", "dim")}


# -- the fold -----------------------------------------------------------------------


@dataclass
class TopologyRow:
    """One topology as the screen draws it."""

    name: str
    status: str = PENDING
    stage: str = ""
    reason: str | None = None
    lines: list[str] = field(default_factory=list)
    levels: dict[int, LevelStats] = field(default_factory=dict)
    level: int | None = None  # the level being measured now
    warmup: bool = False
    contaminated: set[int] = field(default_factory=set)
    started: float | None = None  # wall clock
    ended: float | None = None
    predicted: dict[str, dict[str, float | None]] = field(default_factory=dict)
    log: str = ""  # the launch's last log line

    @property
    def ended_here(self) -> bool:
        return self.status in ENDED

    @property
    def seconds(self) -> float | None:
        if self.started is None or self.ended is None:
            return None
        return max(0.0, self.ended - self.started)


@dataclass
class LiveSweep:
    """The sweep of the current topology, request by request (in this process only)."""

    topology: str
    done: int = 0
    total: int = 0
    batch: int | None = None
    level_done: int = 0
    level_total: int = 0
    eta_s: float | None = None
    tps: list[float] = field(default_factory=list)
    engine: str = ""
    note: str = ""
    errors: bool = False


class StudyRun:
    """One study as the app runs or follows it, built from its events."""

    def __init__(self, study: Study, estimates: dict[str, Estimate | None] | None = None, *,
                 attached: bool = False):
        self.study = study
        self.estimates = dict(estimates or {})
        self.attached = attached  # followed from its files: another process runs it
        self.pid = study.pid if attached else None
        self.status = "starting"  # starting | running | done | cancelled | interrupted | error
        self.cancelling = False
        self.error: str | None = None
        self.current: str | None = None
        self.stage = study.stage if attached else ""
        self.live: LiveSweep | None = None
        self.rows: dict[str, TopologyRow] = {}
        self.version = 0  # anything changed
        self.cells = 0  # the matrix or the chart changed (not every request)
        self._adopt(study)

    # -- what it is ------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.status in ("starting", "running")

    @property
    def total(self) -> int:
        return len(self.rows)

    def _adopt(self, study: Study) -> None:
        """What the study object says (its predictions, and for a study followed
        from files, where each topology had got to)."""
        self.study = study
        for t in study.topologies:
            row = self.rows.setdefault(t.name, TopologyRow(t.name))
            row.predicted = t.predicted or row.predicted
            row.started = row.started or t.started
            if t.finished:
                row.ended = row.ended or t.ended
            row.contaminated |= set(t.contaminated)
            if self.attached and row.status == PENDING and t.status != PENDING:
                row.status = t.status

    # -- folding -------------------------------------------------------------------

    def apply(self, event: StudyEvent) -> None:
        self.version += 1
        match event:
            case StudyStarted(study=study):
                self._adopt(study)
                if self.running:
                    self.status = "running"
                self.cells += 1
            case TopologyStarted(name=name):
                row = self.rows[name]
                if not row.ended_here:
                    row.status = row.status if row.status in STAGES else "preflight"
                    row.started = row.started or self._topology_field(name, "started") or time.time()
                    row.ended, row.reason, row.lines = None, None, []
                    self.current = name
                    self.live = None
                self.cells += 1
            case StageChanged(name=name, stage=stage):
                self._stage(self.rows[name], stage)
            case LaunchUpdate(name=name, event=LogLine(line=line)):
                self.rows[name].log = line
            case LaunchUpdate():
                pass
            case SweepUpdate(name=name, event=sweep_event):
                self._sweep(self.rows[name], sweep_event)
            case TopologyFinished(name=name, status=status, reason=reason, lines=lines):
                row = self.rows[name]
                row.status, row.reason, row.lines = status, reason, list(lines)
                row.level, row.warmup = None, False
                row.started = row.started or self._topology_field(name, "started")
                row.ended = self._topology_field(name, "ended") or time.time()
                if self.current == name:
                    self.current = None
                self.cells += 1
            case StudyFinished(study=study, status=status):
                self.finish(status, study)

    def finish(self, status: str, study: Study | None = None) -> None:
        """The study ended (its last event, or the worker found it ended without one)."""
        if study is not None:
            self._adopt(study)
        self.version += 1
        self.cells += 1
        self.status, self.cancelling, self.current, self.live = status, False, None, None
        for row in self.rows.values():
            row.level, row.warmup = None, False
            if row.status not in (PENDING, DONE, FAILED):
                row.status = CANCELLED if status == CANCELLED else INTERRUPTED
                row.ended = row.ended or self._topology_field(row.name, "ended") or self.study.ended or time.time()

    def fail(self, error: str) -> None:
        self.error = error
        self.finish("error")

    def _topology_field(self, name: str, key: str) -> float | None:
        try:
            return getattr(self.study.topology(name), key)
        except KeyError:
            return None

    def _stage(self, row: TopologyRow, stage: str) -> None:
        row.stage = stage
        word = stage.split(":")[0].split(" ")[0]
        if row.ended_here or word not in STAGES:
            return  # a followed study's finished topology says "done", "failed" or "interrupted"
        row.status = word
        m = _SWEEP_LEVEL.match(stage)
        if m:
            row.level, row.warmup = int(m.group(1)), "warm-up" in stage
        elif word != SWEEPING:
            row.level, row.warmup = None, False
        self.current = row.name
        index = list(self.rows).index(row.name) + 1
        self.stage = f"{index}/{self.total} {row.name}: {stage}"
        self.cells += 1

    def _sweep(self, row: TopologyRow, event) -> None:
        live = self.live if self.live is not None and self.live.topology == row.name else LiveSweep(row.name)
        self.live = live
        match event:
            case SweepStarted(total_requests=total, resumed_requests=resumed):
                live.total, live.done = total, resumed
            case LevelStarted(concurrency=c, warmup=warmup):
                row.level, row.warmup = c, warmup
                live.level_done, live.level_total, live.batch, live.note, live.errors = 0, 0, None, "", False
                self.cells += 1
            case RequestDone() as e:
                live.done, live.total, live.eta_s = e.done, e.total, e.eta_s
                live.level_done, live.level_total, live.batch = e.level_done, e.level_total, e.record.run
                live.errors = live.errors or not e.record.ok
                if e.live_tps:
                    live.tps = (live.tps + [e.live_tps])[-120:]
            case EngineSample() as e:
                live.engine = e.describe()
            case WaitingForIdle() as e:
                live.note = (f"waiting for an idle engine ({e.running:.0f} running, {e.waiting:.0f} waiting; "
                             f"{e.waited_s:.0f}s of {e.timeout_s:.0f}s)")
            case LevelContaminated() as e:
                live.note = f"c{e.concurrency}: {e.reason}" + (" — measuring it again" if e.remeasuring else "")
            case LevelDone(stats=stats):
                row.levels[stats.concurrency] = stats
                if stats.contaminated:
                    row.contaminated.add(stats.concurrency)
                if row.level == stats.concurrency:
                    row.level = None
                self.cells += 1
            case SweepFinished(levels=levels):
                for lv in levels:
                    row.levels[lv.concurrency] = lv
                    if lv.contaminated:
                        row.contaminated.add(lv.concurrency)
                row.level = None
                self.cells += 1

    # -- time ----------------------------------------------------------------------

    def estimate(self, name: str) -> float | None:
        """The planned wall time of one topology (at GB10 speed)."""
        e = self.estimates.get(name)
        if e is not None:
            return e.total_s
        if not self.estimates and self.study.estimate_s and self.rows:
            return self.study.estimate_s / len(self.rows)  # followed: only the total was kept
        return None

    @property
    def began(self) -> float:
        started = [r.started for r in self.rows.values() if r.started]
        return min(started) if started else self.study.created

    def elapsed(self, now: float) -> float:
        end = now if self.running else (self.study.ended or max((r.ended or 0.0 for r in self.rows.values()),
                                                                default=now) or now)
        return max(0.0, end - self.began)

    def per_topology(self) -> dict[str, float] | None:
        """What each topology should take here: the plan's estimates scaled by
        how the finished ones compared with theirs (these nodes' own pace), or
        the measured mean when nothing was estimated."""
        planned = {name: self.estimate(name) for name in self.rows}
        done = [r for r in self.rows.values() if r.status == DONE and r.seconds is not None]
        if all(v is not None for v in planned.values()):
            pairs = [(r.seconds or 0.0, planned[r.name] or 0.0) for r in done if planned[r.name]]
            pace = sum(m for m, _ in pairs) / sum(e for _, e in pairs) if pairs else 1.0
            return {name: (v or 0.0) * pace for name, v in planned.items()}
        if done:
            mean = sum(r.seconds or 0.0 for r in done) / len(done)
            return dict.fromkeys(self.rows, mean)
        return None

    def left_s(self, now: float) -> float | None:
        """Seconds until the last topology is stopped (None: nothing to go by)."""
        if not self.running:
            return None
        per = self.per_topology()
        if per is None:
            return None
        left = 0.0
        for row in self.rows.values():
            if row.status == PENDING:
                left += per[row.name]
            elif not row.ended_here:
                left += max(0.0, per[row.name] - (now - (row.started or now)))
        return left

    # -- what it says ------------------------------------------------------------------

    def outcome(self) -> Text:
        measured = sum(1 for r in self.rows.values() if r.status == DONE)
        failed = sum(1 for r in self.rows.values() if r.status == FAILED)
        counts = f"{measured} measured, {failed} failed"
        took = ago(self.elapsed(time.time()))
        if self.status == DONE:
            return Text.assemble(("done", "bold green"), f" in {took}: {counts}")
        if self.status == "error":
            return Text.assemble(("stopped by an error: ", "bold red"), self.error or "", f" · {counts}")
        what = "cancelled" if self.status == CANCELLED else "interrupted"
        left = sum(1 for r in self.rows.values() if r.status not in (DONE, FAILED))
        return Text.assemble((what, "bold red" if self.status == CANCELLED else "bold yellow"),
                             f" after {took}: {counts}, {left} not measured")

    def status_text(self) -> Text:
        """The app's status line, while it runs or until its end was seen."""
        if self.running:
            where = f" (pid {self.pid})" if self.attached and self.pid else ""
            what = "cancelling" if self.cancelling else (self.stage or "starting")
            return Text(f" · study{where} {what} (y shows it)", style="bold magenta")
        return Text(f" · study {self.status} (y shows it)", style="bold red" if self.status != DONE else "green")


def decode_chart(runs: list[tuple[str, list[LevelStats]]], current: str | None, width: int, height: int) -> Text:
    """Decode t/s against concurrency, a line per topology (the one under way
    in half blocks). As `ui.sweep.level_chart` draws a sweep's runs, sized to
    the box rather than to the terminal plotext sees."""
    title = "decode t/s (total) by concurrency, a line per topology"
    levels = sorted({lv.concurrency for _, lvs in runs for lv in lvs})
    pos = {c: i for i, c in enumerate(levels)}
    lines = [(name, pts) for name, lvs in runs
             if (pts := [(pos[lv.concurrency], lv.tg_tps_total) for lv in lvs if lv.tg_tps_total is not None])]
    if not lines:
        return empty_chart(title, width, height, "no level measured yet")
    import plotext as plt

    plt.clear_figure()
    plt.limit_size(False, False)
    plt.plotsize(max(20, width), max(6, height))
    plt.theme("pro")
    plt.title(title)
    for name, pts in lines:
        plt.plot([x for x, _ in pts], [y for _, y in pts], label=name, marker="hd" if name == current else "braille")
    if levels:
        plt.xticks(list(range(len(levels))), [f"c{c}" for c in levels])
    return Text.from_ansi(plt.build())


def compact(value: float | None) -> str:
    """A matrix cell: 1,328 · 412 · 16.3."""
    if value is None:
        return "—"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def cell_text(row: TopologyRow, c: int) -> Text:
    lv = row.levels.get(c)
    if lv is not None:
        if c in row.contaminated or lv.contaminated:
            return Text("⚠" + compact(lv.tg_tps_total), style="bold yellow", justify="right")
        return Text(compact(lv.tg_tps_total), style="red" if lv.errors else "", justify="right")
    if row.level == c and not row.ended_here:
        return Text("▶", style="bold yellow", justify="right")
    if row.status == FAILED:
        return Text("✗", style="red", justify="right")
    if row.status in (CANCELLED, INTERRUPTED):
        return Text("–", style="dim", justify="right")
    return Text("·", style="dim", justify="right")


def name_text(row: TopologyRow) -> Text:
    mark, style = ROW_MARK.get(row.status, ("▶", "bold yellow"))
    return Text.assemble((mark + " ", style), (row.name, "bold" if row.status not in ROW_MARK else ""))


def time_text(run: StudyRun, row: TopologyRow, now: float) -> Text:
    if row.status == PENDING:
        est = (run.per_topology() or {}).get(row.name) if run.running else None
        return Text(f"~{ago(est)}" if est else "", style="dim", justify="right")
    if row.seconds is not None:
        return Text(ago(row.seconds), justify="right")
    if row.started is not None and run.running:
        return Text(ago(now - row.started), style="yellow", justify="right")
    return Text("", justify="right")


# -- the screen ----------------------------------------------------------------------


class StudyScreen(LiveScreen):
    """A study filling in: the matrix, the stage and the time left, the live sweep, the chart."""

    BINDINGS = [
        Binding("escape", "leave", "Back / cancel"),
        Binding("m", "app.pop_screen", "Monitor"),
    ]

    def __init__(self, run: StudyRun):
        super().__init__()
        self.run = run
        self._cells = -1
        self._chart_key: tuple | None = None
        self._levels_key: tuple | None = None

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield Static(id="study-head")
        with VerticalScroll(id="study-body"):
            with Horizontal(id="study-top"):
                yield DataTable(id="study-matrix", cursor_type="none", zebra_stripes=True)
                with Vertical(id="study-side"):
                    with Vertical(id="study-live"):
                        yield Static(id="study-now")
                        yield Sparkline([], id="study-tps")
                        yield DataTable(id="study-levels", cursor_type="none")
                    yield Static(id="study-notes")
            yield Static(id="study-chart")
        yield KeyFooter()

    def on_mount(self) -> None:
        study = self.run.study
        matrix = self.query_one("#study-matrix", DataTable)
        matrix.border_title = "decode t/s"
        matrix.add_column("topology", key="topology")
        for c in study.levels:
            matrix.add_column(Text(f"c{c}", justify="right"), key=f"c{c}")
        matrix.add_column(Text("time", justify="right"), key="time")
        for name in self.run.rows:
            matrix.add_row(*self._row_cells(self.run.rows[name], time.time()), key=name)
        levels = self.query_one("#study-levels", DataTable)
        for key, head in (("c", "c"), ("tg", "decode"), ("tg_req", "per req"), ("pp", "prefill"),
                          ("ttft", "TTFT ms"), ("pred", "predicted")):
            levels.add_column(Text(head, justify="right"), key=key)
        self.query_one("#study-tps", Sparkline).border_title = "decode t/s as requests finish"
        self.set_interval(1.0, self._tick)  # a clock: the elapsed time and the time left move between events
        self.draw()

    def on_study_progress(self, message: StudyProgress) -> None:
        if message.run is self.run:
            self.draw()

    def on_resize(self) -> None:
        self._chart_key = None
        self.call_after_refresh(self._place)

    def _place(self) -> None:
        """The live sweep and the notes beside the matrix when they fit, else below it."""
        matrix = self.query_one("#study-matrix", DataTable)
        side = self.size.width - matrix.outer_size.width >= SIDE_MIN
        if side != self.has_class("-side"):
            self.set_class(side, "-side")
            self._chart_key = None
        self.call_after_refresh(self._draw_chart)

    # -- drawing -----------------------------------------------------------------

    def draw(self) -> None:
        run = self.run
        self._draw_head()
        live = self.query_one("#study-live")
        live.display = run.running
        if run.running:
            self._draw_live()
        if run.cells != self._cells:
            self._cells = run.cells
            self._draw_matrix()
            self._draw_notes()
            self._draw_chart()
            self.call_after_refresh(self._place)  # the matrix may have grown
        if not run.running:
            self.app.post_message(StudySeen(run))

    def _tick(self) -> None:
        if self.run.running:
            self._draw_head()
            now = time.time()
            matrix = self.query_one("#study-matrix", DataTable)
            for name, row in self.run.rows.items():
                matrix.update_cell(name, "time", time_text(self.run, row, now))

    def _draw_head(self) -> None:
        run, study = self.run, self.run.study
        now = time.time()
        head = Text()
        head.append(f"study {study.id}", style="bold")
        if study.recipe not in study.id:
            head.append(f" · {study.recipe}")
        head.append(f" · c{','.join(map(str, study.levels))} · {study.runs} run{'s' if study.runs != 1 else ''}"
                    f" · pp{study.pp} tg{study.tg}", style="dim")
        head.append("\n")
        if run.attached:
            if run.running:
                head.append(f"attached: running in pid {run.pid}", style="bold cyan")
                head.append(" · Esc leaves, the study goes on · ", style="dim")
            else:
                head.append("attached · ", style="bold cyan")
        if run.running:
            if run.cancelling:
                head.append("cancelling: stopping what runs, checking every node…", style="bold red")
            else:
                head.append(run.stage or "starting…", style="bold yellow")
            head.append("\n")
            head.append(f"elapsed {ago(run.elapsed(now))}")
            left = run.left_s(now)
            if left is not None:
                finish = time.strftime("%H:%M", time.localtime(now + left))
                head.append(f" · about {ago(left)} left, done ≈ {finish}", style="bold")
            else:
                head.append(" · time left: known once a topology is measured", style="dim")
            if study.estimate_s:
                head.append(f" · planned {ago(study.estimate_s)} "
                            + ("at GB10 speed" if study.speed == 1 else f"with the twins at ×{study.speed:g}"),
                            style="dim")
        else:
            head.append_text(run.outcome())
        self.query_one("#study-head", Static).update(head)

    def _row_cells(self, row: TopologyRow, now: float) -> list[Text]:
        return [name_text(row), *(cell_text(row, c) for c in self.run.study.levels),
                time_text(self.run, row, now)]

    def _draw_matrix(self) -> None:
        matrix = self.query_one("#study-matrix", DataTable)
        now = time.time()
        keys = ["topology", *(f"c{c}" for c in self.run.study.levels), "time"]
        for name, row in self.run.rows.items():
            for key, value in zip(keys, self._row_cells(row, now), strict=True):
                matrix.update_cell(name, key, value, update_width=True)

    def _draw_live(self) -> None:
        run = self.run
        name = run.current
        row = run.rows.get(name) if name else None
        live = run.live if run.live is not None and run.live.topology == name else None
        now = Text()
        if row is None:
            now.append("between topologies…" if run.status == "running" else "starting…", style="dim")
        else:
            now.append(f"▶ {row.name}", style="bold yellow")
            now.append(f" · {row.stage or row.status}")
            if live is not None and row.status == SWEEPING and live.total:
                if live.level_total:
                    now.append(f" · batch {live.batch} · {live.level_done}/{live.level_total}")
                now.append(f" · sweep {live.done}/{live.total} · {eta_text(live.eta_s)}")
                if live.errors:
                    now.append(" · errors in this level", style="red")
            if live is not None and live.engine:
                now.append("\nengine  " + live.engine, style="cyan")
            if live is not None and live.note:
                now.append("\n" + live.note, style="yellow")
            if row.status == "launching" and row.log:
                now.append("\n")
                now.append_text(short_log_line(row.log))
        self.query_one("#study-now", Static).update(now)
        spark = self.query_one("#study-tps", Sparkline)
        spark.display = live is not None and bool(live.tps)
        if live is not None and list(spark.data or []) != live.tps:
            spark.data = list(live.tps)
        self._draw_levels(row)

    def _draw_levels(self, row: TopologyRow | None) -> None:
        """The measured levels of the topology under way, beside what was predicted."""
        table = self.query_one("#study-levels", DataTable)
        if row is None:
            table.display = False
            return
        table.display = True
        key = (row.name, tuple(sorted(row.levels)), tuple(sorted(row.contaminated)))
        if key == self._levels_key:
            return
        self._levels_key = key
        table.border_title = f"{row.name}: t/s so far · decode predicted"
        table.clear()
        for c in self.run.study.levels:
            lv = row.levels.get(c)
            pred = (row.predicted.get(str(c)) or {}).get("tg_tps_total")
            if lv is None:
                table.add_row(Text(f"c{c}", justify="right"), *(Text("·", style="dim", justify="right")
                                                                 for _ in range(4)),
                              Text(fmt(pred), style="cyan", justify="right"), key=str(c))
                continue
            style = "bold yellow" if c in row.contaminated else ""
            table.add_row(Text(f"c{c}", justify="right"),
                          *(Text(fmt(v, unit), style=style, justify="right") for v, unit in (
                              (lv.tg_tps_total, "t/s"), (lv.tg_tps_req, "t/s"), (lv.pp_tps_total, "t/s"),
                              (lv.ttft_ms_mean, "ms"))),
                          Text(fmt(pred), style="cyan", justify="right"), key=str(c))

    def _draw_notes(self) -> None:
        """Why each failed topology failed, which levels to read with care, what to do next."""
        box = self.query_one("#study-notes", Static)
        run, study = self.run, self.run.study
        failed = [r for r in run.rows.values() if r.status == FAILED]
        contaminated = [r for r in run.rows.values() if r.contaminated]
        text = Text()
        for r in failed:
            text.append(f"✗ {r.name}: ", style="bold red")
            text.append((r.reason or "failed") + "\n")
            for line in r.lines[-3:]:
                text.append(f"    {line}\n", style="dim")
        for r in contaminated:
            levels = ", ".join(f"c{c}" for c in sorted(r.contaminated))
            text.append(f"⚠ {r.name}: ", style="bold yellow")
            text.append(f"{levels} saw traffic besides the sweep; read those figures with care\n")
        if not run.running:
            text.append(f"sparktop report {study.id}", style="bold")
            text.append(" writes the report\n", style="dim")
            if run.status != DONE and any(r.status not in (DONE, FAILED) for r in run.rows.values()):
                text.append(f"sparktop study --resume {study.id}", style="bold")
                text.append(" measures the rest\n", style="dim")
        text.rstrip()
        box.display = bool(text.plain)
        box.update(text)

    def _draw_chart(self) -> None:
        try:
            box = self.query_one("#study-chart", Static)
        except NoMatches:
            return  # an event before the screen is composed (a study under way when `y` opens it): on_mount draws

        width, height = box.size.width - 1, box.size.height
        if width < 20 or height < 6:
            return  # not laid out yet: on_resize draws it
        runs = [(r.name, [r.levels[c] for c in sorted(r.levels)]) for r in self.run.rows.values() if r.levels]
        key = (width, height, self.run.current, tuple((name, tuple((lv.concurrency, lv.tg_tps_total) for lv in lvs))
                                                      for name, lvs in runs))
        if key == self._chart_key:
            return
        self._chart_key = key
        if not runs:
            box.update(Text("decode t/s against concurrency: a line for each topology as it is measured",
                            style="dim"))
            return
        chart = decode_chart(runs, self.run.current, width, height)
        chart.rstrip()
        box.update(chart)

    # -- leaving ------------------------------------------------------------------

    def action_leave(self) -> None:
        run = self.run
        if run.running and not run.attached and not run.cancelling:
            self.app.push_screen(ConfirmCancelStudy(run))
        else:
            self.app.pop_screen()


class ConfirmCancelStudy(ModalScreen):
    """Esc on a running study: cancel it?"""

    BINDINGS = [Binding("y", "yes", "Cancel the study"), Binding("n,escape", "app.pop_screen", "Keep it running")]

    def __init__(self, run: StudyRun, then_quit: bool = False):
        super().__init__()
        self.run = run
        self.then_quit = then_quit

    def compose(self) -> ComposeResult:
        first = "Quit? A study is running, and quitting cancels it." if self.then_quit else "Cancel the study?"
        yes = "quit" if self.then_quit else "cancel it"
        with Container(id="study-confirm-box"):
            yield Static(f"[b]{first}[/b]\nWhat was measured is kept; what is running is removed.\n"
                         f"[dim]now: {self.run.stage or 'starting'}[/dim]\n\n"
                         f"[b]y[/b] {yes}    [b]n[/b] keep it running")

    def action_yes(self) -> None:
        self.app.post_message(StudyCancelRequested(self.run, then_quit=self.then_quit))
        self.app.pop_screen()


# -- planning a study -----------------------------------------------------------------


def estimate_table(study: Study, estimates: dict[str, Estimate | None]) -> Group:
    table = Table(box=None, header_style="bold", pad_edge=False)
    first, last = study.levels[0], study.levels[-1]
    for col in ("topology", "start-up", "sweep", f"decode c{first} → c{last} (predicted)"):
        table.add_column(col, justify="left" if col == "topology" else "right", no_wrap=True)
    for t in study.topologies:
        e = estimates.get(t.name)
        a, b = (t.predicted.get(str(first)) or {}), (t.predicted.get(str(last)) or {})
        decode = f"{fmt(a.get('tg_tps_total'))} → {fmt(b.get('tg_tps_total'))} t/s" if t.predicted else "—"
        table.add_row(t.name, ago(e.startup_s) if e else "—", ago(e.sweep_s) if e else "—", decode)
    total = Text()
    if study.estimate_s:
        total.append(f"about {ago(study.estimate_s)}", style="bold")
        total.append((" at GB10 speed" if study.speed == 1 else f" with the twins at ×{study.speed:g}")
                     + " (each topology's start-up, sweep and stop)")
    else:
        total.append("no estimate: the recipe's model has no card for the performance model", style="dim")
    total.append(f"\nresults in {study.dir}", style="dim")
    return Group(table, total)


class StudyPlanScreen(ModalScreen):
    """`b` on the launcher: what a study of this recipe will do, and how long it should take."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("ctrl+s", "start", "Start")]

    def __init__(self, recipe: Recipe, inventory: Inventory, topologies: list[str], overrides: dict,
                 port: int | None = None):
        super().__init__()
        self.recipe = recipe
        self.inventory = inventory
        self.topologies = topologies
        self.overrides = overrides
        self.port = port
        self.estimated: Study | None = None  # the study the estimate on screen is for

    def compose(self) -> ComposeResult:
        with Container(id="study-plan-box"):
            yield Static(Text.assemble(("Study ", "bold"), (self.recipe.id, "bold"),
                                       ": every topology launched in turn, swept, stopped"), id="plan-title")
            with Horizontal(classes="form-row"):
                yield Label("topologies", classes="label")
                yield Input(",".join(self.topologies), id="plan-topologies")
            with Horizontal(classes="form-row"):
                yield Label("concurrency", classes="label")
                yield Input(DEFAULT_LEVELS, id="plan-levels")
                yield Label("runs", classes="label")
                yield Input("5", id="plan-runs", type="integer")
            yield Static(id="plan-estimate")
            yield Static(self._hint(), id="plan-hint")

    def _hint(self) -> Text:
        text = Text("Enter starts · Esc goes back", style="bold")
        changed = [f"{k}={v}" for k, v in self.overrides.items()] + ([f"port {self.port}"] if self.port else [])
        if changed:
            text.append(" · with " + ", ".join(changed), style="dim")
        return text

    def on_mount(self) -> None:
        self.query_one("#plan-levels", Input).focus()
        self._estimate()

    def fields(self) -> tuple[str, str, str]:
        def value(key: str) -> str:
            return self.query_one(f"#plan-{key}", Input).value

        return value("topologies"), value("levels"), value("runs")

    def plan(self, fields: tuple[str, str, str]) -> tuple[Study, dict[str, Estimate | None]]:
        """The study the fields describe (raises SparktopError on a bad field)."""
        topologies_text, levels_text, runs_text = fields
        topologies = choose_topologies(self.recipe, topologies_text, len(self.inventory.nodes))
        levels = parse_levels(levels_text)
        runs = runs_text.strip()
        if not runs.isdigit() or int(runs) < 1:
            raise SparktopError(f"runs: a whole number above 0, got {runs!r}")
        return new_study(self.recipe, self.inventory, topologies, levels=levels, runs=int(runs), pp=1024, tg=128,
                         extra_body={}, overrides=self.overrides, nodes=None,
                         inventory_path=str(self.inventory.path) if self.inventory.path else None)

    @on(Input.Changed)
    def _changed(self) -> None:
        self._estimate()

    @work(group="estimate", exclusive=True, exit_on_error=False)
    async def _estimate(self) -> None:
        await asyncio.sleep(0.2)  # typing settles first
        box = self.query_one("#plan-estimate", Static)
        try:
            study, estimates = await asyncio.to_thread(self.plan, self.fields())
        except SparktopError as exc:
            self.estimated = None
            box.update(Text(str(exc), style="bold red"))
            return
        self.estimated = study
        box.update(estimate_table(study, estimates))

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_start()

    def action_start(self) -> None:
        try:
            study, estimates = self.plan(self.fields())  # planned now: its id and clock start now
        except SparktopError as exc:
            self.notify(str(exc), title="cannot start the study", severity="error")
            return
        self.app.pop_screen()
        self.app.post_message(StudyRequested(study, self.recipe, estimates, self.port))
