"""Writing the history: the monitor's events folded into a row per minute
per node and engine, serving sessions and the event log.

`HistoryWriter.observe(event, state)` is called with every event the poller
yields, after `ClusterState.apply` (the state gives the derived figures:
an engine's power over its nodes). It only adds numbers in memory; once a
minute (on the data's own clock) the finished minutes, the sessions that
changed and the new events go to SQLite in one transaction, and the minute
in progress goes too every `PARTIAL_EVERY_S` (on the monotonic clock), so a
killed process loses a few seconds of samples and a slow disk costs a few
commits a minute, not one per poll. A minute written twice (a restart or a
handover within it, the minute in progress written early) is merged into
the row already there. The tokens an engine served between the last commit
and the next writer's first poll (a kill, a restart, a handover) go into
that first minute: a day's tokens are the engine's own count. So do the
tokens an engine served between its start and its first poll, when it
started within `SESSION_GAP_S` of it: a session's tokens and its minutes'
agree. Only what an engine served while nobody watched for longer (sparktop
closed for hours, an engine first seen long after it started) is in its
session and in no minute: `query` says how much.

A serving session is one engine serving one model without a break: it
starts the first time the engine answers ready, and ends when the engine
restarts (its counters start again), serves another model, or has not
answered for `SESSION_GAP_S` (stopped, failed or lost: the reason is what
the poller last said). An engine the poller says is gone (its container
removed) ends its session at once: "stopped". When the writer closes, a
session whose engine was last seen down ends as the poller said
("unreachable", "failed: ..."), and one still serving ends as "watch ended"
at its last answer: the file never says "serving" for an engine nobody
watches. A session the last sparktop left open, or ended as "watch ended",
goes on if the engine is the same process (its start time) or came back
within the gap; a new start time is "restarted".

When the file cannot be written (a full disk; a damaged file; one that
could not be opened at all, `HistoryWriter.open`), the writer keeps the
rows in memory (the newest `PENDING_MAX`), says so once (`paused`, its
`pause_reason`, the `say` line, and a "history paused (...)" event written
with the rows), tries again every `RETRY_S`, and says "history resumed"
when the rows are written; the monitor is not disturbed. A damaged file is
never written into: once it has been moved aside, a new one is started.

Time. Rows are stamped with the events' own (wall) times, which is what
people read. What the writer measures (when to prune, retry, ask for the
lock) is its own time: anchored once, when it becomes the writer, at the
file's newest row, and moved on by the time that passes, which is the data
clock's steps where they agree with the monotonic clock within
`CLOCK_JUMP_S` (so a simulation may compress days), and the monotonic
clock's where they do not (a jump of the wall clock, which is logged).
So a clock set ahead, at start or while running, never prunes anything:
retention counts the time sparktop wrote, and the days before a start age
only as time passes after it. A start whose clock reads far before the
file's newest row, or implausibly far after it (`START_AHEAD_S`), and an
engine that says it started in this clock's future, are logged as clock
events.

Credentials never reach the file: engine URLs are kept without them, and
so is every text written (events, how a session ended).
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparktop.clock import SYSTEM, Clock
from sparktop.engine_ids import is_router
from sparktop.history.store import (
    ENGINE_FIGURES,
    NODE_FIGURES,
    HistoryError,
    HistoryStore,
    history_error,
    minute_upsert,
    resolve_path,
    set_aside_journal,
    writer_pid,
)
from sparktop.masking import strip_url_credentials
from sparktop.observe.snapshot import LIVE_STATES, EngineGone, EngineSnapshot, NodeSnapshot, Notice
from sparktop.observe.state import ClusterState

SESSION_GAP_S = 300.0  # an engine silent this long has ended its session
WATCH_ENDED = "watch ended"  # how a session ends that was serving when the writer closed
UNWATCHED_END = "gone while sparktop was closed"  # a carried session whose engine is another process now
STOPPED = "stopped"  # how a session ends whose engine the poller says is gone (its container removed)
MAX_DT_S = 30.0  # a poll further from the one before adds no energy (a gap is not a measurement)
PRUNE_EVERY_S = 600.0
RETENTION_DAYS = 30.0
PENDING_MAX = 20_000  # rows held while the disk is full (two weeks of a minute row for two nodes, two engines)
CLOCK_JUMP_S = 120.0  # the data's clock moved this much more (or less) than the monotonic clock: say so
START_AHEAD_S = 2 * 86400.0  # a start this long after the file's newest row: a clock set ahead, or a long gap
LOADED_GRACE_S = 60.0  # a session the last sparktop left open waits this long for its engine to answer
RETAKE_EVERY_S = 60.0  # a reader asks for the writer's lock again this often
RETRY_S = 60.0  # while paused: how often to try writing (or opening the file) again
PARTIAL_EVERY_S = 15.0  # the minute in progress goes to the file this often (monotonic seconds)
READY = LIVE_STATES  # a hung engine still serves a session: its minutes (no tokens) are written


@dataclass
class _Minute:
    """One subject's figures over one minute: sums and counts for means,
    extremes, and additive figures (tokens, energy)."""

    minute: int
    samples: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    highs: dict[str, float] = field(default_factory=dict)
    lows: dict[str, float] = field(default_factory=dict)
    lasts: dict[str, float] = field(default_factory=dict)
    adds: dict[str, float] = field(default_factory=dict)
    session: _Session | None = None  # an engine's: its row id is known once the session is written

    def mean(self, name: str, value: float | None) -> None:
        if value is not None and math.isfinite(value):
            self.sums[name] = self.sums.get(name, 0.0) + value
            self.counts[name] = self.counts.get(name, 0) + 1

    def high(self, name: str, value: float | None) -> None:
        if value is not None and math.isfinite(value) and value > self.highs.get(name, -math.inf):
            self.highs[name] = value

    def low(self, name: str, value: float | None) -> None:
        if value is not None and math.isfinite(value) and value < self.lows.get(name, math.inf):
            self.lows[name] = value

    def last(self, name: str, value: float | None) -> None:
        if value is not None and math.isfinite(value):
            self.lasts[name] = value

    def add(self, name: str, value: float | None) -> None:
        if value is not None and math.isfinite(value) and value > 0:
            self.adds[name] = self.adds.get(name, 0.0) + value

    def row(self, figures: tuple[str, ...]) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for name in figures:
            if name in self.counts:
                out[name] = self.sums[name] / self.counts[name]
            else:
                out[name] = self.highs.get(name, self.lows.get(name, self.lasts.get(name, self.adds.get(name))))
        return out


@dataclass
class _Session:
    key: str  # the engine's URL
    model: str | None
    engine: str | None
    node: str | None
    topology: str | None
    started: float
    last_seen: float
    engine_started: float | None = None
    id: int | None = None
    gen_tokens: float = 0.0
    prompt_tokens: float = 0.0
    requests: float = 0.0
    energy_j: float = 0.0
    peak_kv: float | None = None
    peak_running: float | None = None
    peak_waiting: float | None = None
    peak_gen_tps: float | None = None
    gen_counter: float | None = None
    prompt_counter: float | None = None
    requests_counter: float | None = None
    ended: float | None = None
    end_reason: str | None = None
    down: str | None = None  # what the poller said when it stopped answering
    changed: bool = True
    before_watch: tuple[float, float, float] | None = None  # a fresh session's counters at its first poll
    # Carried over from the last writer: between its close and this writer's first poll nobody watched, so a
    # new process then is "gone while sparktop was closed" (stopped, or restarted: nobody saw which).
    carried: bool = False

    def peak(self, name: str, value: float | None) -> None:
        if value is not None and (getattr(self, name) is None or value > getattr(self, name)):
            setattr(self, name, value)


def _delta(counter: float | None, before: float | None) -> float | None:
    """What a monotonic counter added since `before` (None: unknown, or it went back)."""
    if counter is None or before is None or counter < before:
        return None
    return counter - before


def _key(key: str) -> str:
    """An engine's key as the history keeps it: its URL without credentials."""
    return strip_url_credentials(key)


def _span(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 60:.0f} min"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


class HistoryWriter:
    """Folds observe events into the history file. One per process; only the
    store's writer writes (a second sparktop on the same file reads).

    `store` None: the file could not be opened (`HistoryWriter.open`); the
    writer holds what it gathers and opens it when it can. `say`: where the
    one-line news goes (paused, resumed, a wrong clock): the collector's
    output; the app shows `status` instead."""

    def __init__(self, store: HistoryStore | None, retention_days: float = RETENTION_DAYS, clock: Clock = SYSTEM,
                 *, path: str | Path | None = None, say: Callable[[str], None] | None = None,
                 check: bool = False):
        self.store = store
        self._path = store.path if store is not None else resolve_path(path)
        self.retention_s = retention_days * 86400.0
        self.clock = clock
        self._say = say
        self._check = check  # reopening: read the whole file first, as the collector's open does
        self._nodes: dict[str, _Minute] = {}
        self._engines: dict[str, _Minute] = {}
        self._node_t: dict[str, float] = {}
        self._engine_t: dict[str, float] = {}
        self._sessions: dict[str, _Session] = {}
        self._ended: list[_Session] = []
        self._rows: list[tuple[str, str, _Minute]] = []  # (kind, key, minute) finished, not yet written
        self._counters: dict[str, dict[str, float]] = {}  # per engine: preemptions, rejections last seen
        self._last_end: dict[str, float] = {}  # per engine: when its last session ended
        self._carried: dict[str, float] = {}  # per engine: when the last writer last saw its open session
        self._clock_said: set[str] = set()  # engines whose start time was found in this clock's future
        self._first_t: float | None = None  # the data time of the first event this writer saw
        self._events: list[tuple[float, str, str, str, str, str]] = []
        self._minute: int | None = None
        self._seen: tuple[float, float] | None = None  # (data time, the clock's now()) at the last event
        self._measured: float | None = None  # the writer's own time (see the module's docstring)
        self._latest: float | None = None  # the newest data time since the last jump
        self._anchor: float | None = None  # set when the writer starts writing a file: its newest row's time
        self._anchor_due = False
        self._pruned_at: float | None = None  # the writer's own time at the last prune
        self._retake_at = 0.0
        self._partial_at: float | None = None  # the monotonic time to write the minute in progress
        self._new_session = False  # a session began: written at once, so the next writer counts on from it
        self._retry_at: float | None = None  # while paused: the writer's own time to try again
        self.paused: str | None = None  # "history paused (disk full)": nothing is written now, for the status line
        self.pause_reason: str | None = None  # why, in a word (store.REASONS), for a metric
        self.rows_written = 0
        self.unwritten = 0  # rows that were never written, when it closed paused
        if store is not None and store.writer:
            try:
                self._start_writing()
            except (sqlite3.Error, OSError, HistoryError) as exc:
                self._fault(exc, None)

    @classmethod
    def open(cls, path: str | Path | None = None, retention_days: float = RETENTION_DAYS, clock: Clock = SYSTEM,
             *, say: Callable[[str], None] | None = None, check: bool = True) -> HistoryWriter:
        """A writer on the history file, whatever state the file is in: one that cannot be opened (a full
        disk, a damaged file, a newer sparktop's) gives a paused writer that said why and opens it when it
        can. `check`: look for damage in the whole file first."""
        try:
            store = HistoryStore.open(path, check=check)
        except HistoryError as exc:
            writer = cls(None, retention_days, clock, path=path, say=say, check=check)
            writer._fault(exc, None)
            return writer
        return cls(store, retention_days, clock, say=say, check=check)

    # -- what the screen says ------------------------------------------------------

    @property
    def status(self) -> str | None:
        """A few words for the status line when history is not being written as usual."""
        if self.paused:
            return self.paused
        if self.store is not None and not self.store.writer:
            pid = writer_pid(self.store.path)
            return f"history written by pid {pid}" if pid else "history written by another sparktop"
        return None

    @property
    def path(self) -> Path:
        return self.store.path if self.store is not None else self._path

    @property
    def writing(self) -> bool:
        """Whether this writer gathers (and writes, when it can): it holds the lock, or holds what it
        gathers until it can open the file."""
        return self.store is None or self.store.writer

    # -- events ---------------------------------------------------------------------

    def observe(self, event, state: ClusterState) -> None:
        if not self.writing:
            now = self.clock.now()
            if now >= self._retake_at:
                self._retake_at = now + RETAKE_EVERY_S
                self._try_take_over(getattr(event, "t", None))
            if not self.writing:
                return
        if isinstance(event, NodeSnapshot):
            self._tick(event.t)
            if event.state == "ok":
                self._node(event)
        elif isinstance(event, EngineSnapshot):
            self._tick(event.t)
            self._engine(event, state)
        elif isinstance(event, EngineGone):
            # Its container was removed: the session ends at its last answer, now, not a gap later.
            key = _key(event.key)
            s = self._sessions.get(key)
            if s is not None:
                self._end(key, s.last_seen, s.down if s.down and s.down.startswith("failed") else STOPPED)
        elif isinstance(event, Notice):
            self._tick(event.t)
            key = _key(event.key) if event.subject == "engine" else event.key
            self._note(event.t, event.subject, key, event.kind, event.level, event.text)
        else:
            return
        self._write_partial(getattr(event, "t", None))

    def _try_take_over(self, t: float | None) -> None:
        """A reader asks for the lock again: the writer before it may have gone."""
        assert self.store is not None
        try:
            took = self.store.try_take_writer()
        except HistoryError as exc:
            # The file it would take over cannot be written (damaged, say): gather and hold, as a writer
            # that could not open it.
            self.store.close()
            self.store = None
            self._fault(exc, t)
            return
        if took:
            try:
                self._start_writing()
            except (sqlite3.Error, OSError, HistoryError) as exc:
                self._fault(exc, t)
                return
            self._tell(f"writing history to {self.store.path}: the sparktop that wrote it stopped")

    def _note(self, t: float, subject: str, key: str, kind: str, level: str, text: str) -> None:
        self._events.append((t, subject, key, kind, level, text))

    def _tell(self, line: str) -> None:
        if self._say is not None:
            self._say(line)

    def _tick(self, t: float) -> None:
        if self._first_t is None:
            self._first_t = t
        self._watch_clock(t)
        minute = int(t // 60)
        if self._minute is None:
            self._minute = minute
            return
        if minute == self._minute:
            return
        # A new minute (or the clock went back): what was gathered before it is complete.
        self._minute = minute
        for kind, table in (("node", self._nodes), ("engine", self._engines)):
            for key in [k for k, m in table.items() if m.minute != minute]:
                self._rows.append((kind, key, table.pop(key)))
        for key, s in list(self._sessions.items()):
            if t - s.last_seen <= SESSION_GAP_S:
                continue
            if key in self._engine_t:
                self._end(key, s.last_seen, s.down or "lost (no answer)")
            elif self._first_t is not None and t - self._first_t > LOADED_GRACE_S:
                # Left open by the last sparktop and not answering since this one started.
                self._end(key, s.last_seen, UNWATCHED_END)
        self.flush(t)

    def _watch_clock(self, t: float) -> None:
        now = self.clock.now()
        if self._seen is None or self._measured is None or self._latest is None:
            self._measured = self._latest = t
        else:
            then_t, then_mono = self._seen
            drift = (t - then_t) - (now - then_mono)
            if abs(drift) > CLOCK_JUMP_S:
                way = "forward" if drift > 0 else "back"
                self._note(t, "sparktop", "clock", "clock", "warn",
                           f"the clock jumped {way} by {abs(drift) / 60:.0f} min")
                # Not time passing: the writer's own time moves on by what the monotonic clock measured.
                self._measured += max(0.0, now - then_mono)
                self._latest = t
            elif t > self._latest:
                self._measured += t - self._latest
                self._latest = t
        self._seen = (t, now)
        if self._anchor_due:
            self._anchor_due = False
            self._check_start(t)

    def _check_start(self, t: float) -> None:
        """A writer starting on a file: its clock against the file's newest row, and its own time from it."""
        newest = self._anchor
        if newest is None:
            return
        self._measured, self._pruned_at = newest, None  # retention counts from the file's newest row on
        if t < newest - CLOCK_JUMP_S:
            text = (f"the clock reads {_span(newest - t)} before the history's newest row ({_when(newest)}): it is "
                    "behind, or the last writer's was ahead; nothing is pruned for the difference")
        elif t > newest + START_AHEAD_S:
            text = (f"the clock reads {_span(t - newest)} after the history's newest row ({_when(newest)}): it is "
                    "ahead, or nothing was written for that long; the rows before are not pruned for that gap")
        else:
            return
        self._note(t, "sparktop", "clock", "clock", "warn", text)
        self._tell(f"{self.path}: {text}")

    def _minute_of(self, kind: str, key: str, t: float) -> _Minute:
        """The subject's minute of `t`; the one before it, when `t` starts another, goes to be written."""
        table = self._nodes if kind == "node" else self._engines
        m = table.get(key)
        minute = int(t // 60)
        if m is None or m.minute != minute:
            if m is not None:
                self._rows.append((kind, key, m))
            m = table[key] = _Minute(minute)
        m.samples += 1
        return m

    def _node(self, s: NodeSnapshot) -> None:
        m = self._minute_of("node", s.name, s.t)
        mem, gpu = s.memory, s.gpu
        if mem is not None:
            m.mean("mem_used", float(mem.used))
            m.low("mem_available_min", float(mem.available))
            m.last("mem_total", float(mem.total))
        if gpu is not None:
            m.mean("gpu_util", gpu.util)
            m.high("gpu_util_max", gpu.util)
            m.mean("power_w", gpu.power)
            m.high("power_max_w", gpu.power)
            m.mean("temp_c", gpu.temp)
            m.high("temp_max_c", gpu.temp)
            before = self._node_t.get(s.name)
            if gpu.power is not None and before is not None and 0 < s.t - before <= MAX_DT_S:
                m.add("energy_j", gpu.power * (s.t - before))
        self._node_t[s.name] = s.t
        m.mean("cpu_pct", s.cpu_pct)
        up = [p for p in s.links if p.up]
        for name, attr in (("rdma_rx_gbps", "rdma_rx_gbps"), ("rdma_tx_gbps", "rdma_tx_gbps"),
                           ("kernel_rx_gbps", "kernel_rx_gbps"), ("kernel_tx_gbps", "kernel_tx_gbps")):
            values = [getattr(p, attr) for p in up if getattr(p, attr) is not None]
            if values:
                m.mean(name, sum(values))
        for p in up:
            m.high("link_max_gbps", max(p.rdma_rx_gbps or 0.0, p.rdma_tx_gbps or 0.0))

    def _engine(self, e: EngineSnapshot, state: ClusterState) -> None:
        if is_router(e.kind):
            return  # a router's tokens are its engines'
        key = _key(e.key)
        s = self._sessions.get(key)
        if e.state not in READY:
            if s is not None and e.state in ("unreachable", "failed"):
                s.down = f"failed: {e.error}" if e.state == "failed" and e.error else e.state
            return
        s = self._session_for(e, s)
        before = self._engine_t.get(key)
        dt = e.t - before if before is not None and 0 < e.t - before <= MAX_DT_S else None
        # Tokens served while sparktop was closed count in the session (its counters say so) but not
        # in any minute: they would all land in the first minute after the gap. A short gap (the last
        # writer killed or stopped, this one started or taking over) is no such gap: what was served since
        # the last writer's last commit (its session's counters) goes into this minute.
        carried = self._carried.pop(key, None) if before is None else None
        watched = (before is not None and 0 < e.t - before <= SESSION_GAP_S) or (
            carried is not None and -CLOCK_JUMP_S <= e.t - carried <= SESSION_GAP_S)
        self._engine_t[key] = e.t
        gen = _delta(e.gen_tokens_total, s.gen_counter)
        prompt = _delta(e.prompt_tokens_total, s.prompt_counter)
        requests = _delta(e.requests, s.requests_counter)
        if gen is None and e.gen_tokens_total is None and e.gen_tps is not None and dt is not None:
            gen = e.gen_tps * dt  # an engine without a token counter: its rate over the poll
        if prompt is None and e.prompt_tokens_total is None and e.prompt_tps is not None and dt is not None:
            prompt = e.prompt_tps * dt
        s.gen_counter = e.gen_tokens_total if e.gen_tokens_total is not None else s.gen_counter
        s.prompt_counter = e.prompt_tokens_total if e.prompt_tokens_total is not None else s.prompt_counter
        s.requests_counter = e.requests if e.requests is not None else s.requests_counter
        energy = state.engine_energy(e)
        joules = energy.watts * dt if energy is not None and dt is not None else None
        s.gen_tokens += gen or 0.0
        s.prompt_tokens += prompt or 0.0
        s.requests += requests or 0.0
        s.energy_j += joules or 0.0
        if not watched:
            gen = prompt = requests = None
        if s.before_watch is not None:
            # A fresh session's first poll: what the engine served since it started goes into this minute
            # when it started within the gap (a demo's load, an engine started as sparktop watched), as its
            # session counts it; an engine first seen long after its start keeps it in the session only.
            if e.started_at is not None and 0 <= e.t - e.started_at <= SESSION_GAP_S:
                gen, prompt, requests = s.before_watch
            s.before_watch = None
        s.peak("peak_kv", e.kv_usage)
        s.peak("peak_running", e.running)
        s.peak("peak_waiting", e.waiting)
        s.peak("peak_gen_tps", e.gen_tps)
        s.last_seen, s.down, s.changed = e.t, None, True

        m = self._minute_of("engine", key, e.t)
        m.session = s
        m.mean("kv", e.kv_usage)
        m.high("kv_max", e.kv_usage)
        m.mean("running", e.running)
        m.high("running_max", e.running)
        m.mean("waiting", e.waiting)
        m.high("waiting_max", e.waiting)
        m.mean("gen_tps", e.gen_tps)
        m.high("gen_tps_max", e.gen_tps)
        m.mean("prompt_tps", e.prompt_tps)
        m.add("gen_tokens", gen)
        m.add("prompt_tokens", prompt)
        m.add("requests", requests)
        m.add("energy_j", joules)
        m.last("ttft_p50", e.pct("ttft", "p50"))
        m.last("ttft_p95", e.pct("ttft", "p95_1m") or e.pct("ttft", "p95"))
        m.last("itl_p50", e.pct("itl", "p50"))
        m.last("itl_p95", e.pct("itl", "p95_1m") or e.pct("itl", "p95"))
        m.last("e2e_p95", e.pct("e2e", "p95_1m") or e.pct("e2e", "p95"))
        m.last("queue_p95", e.pct("queue", "p95_1m") or e.pct("queue", "p95"))
        self._counter_deltas(key, e, m)

    def _counter_deltas(self, key: str, e: EngineSnapshot, m: _Minute) -> None:
        """Preemptions and rejections added this poll (the counters since the engine started)."""
        last = self._counters.setdefault(key, {})
        for name, value in (("preemptions", e.preemptions), ("rejections", e.rejections)):
            m.add(name, _delta(value, last.get(name)))
            if value is not None:
                last[name] = value

    def _session_for(self, e: EngineSnapshot, s: _Session | None) -> _Session:
        key = _key(e.key)
        if e.started_at is not None and e.started_at - e.t > CLOCK_JUMP_S and key not in self._clock_said:
            self._clock_said.add(key)
            self._note(e.t, "engine", key, "clock", "warn",
                       f"the engine says it started {_span(e.started_at - e.t)} after this clock's time: this "
                       "clock (or the engine's node's) is behind")
        if s is not None:
            reason = None
            if e.model and s.model and e.model != s.model:
                reason = f"now serves {e.model}"
            elif (e.started_at is not None and s.engine_started is not None
                  and abs(e.started_at - s.engine_started) > 1.0):
                reason = UNWATCHED_END if s.carried else "restarted"
            elif e.gen_tokens_total is not None and s.gen_counter is not None and e.gen_tokens_total < s.gen_counter:
                reason = UNWATCHED_END if s.carried else "restarted"  # its counters started again
            elif e.t - s.last_seen > SESSION_GAP_S and not (
                    e.started_at is not None and s.engine_started is not None):
                reason = s.down or "lost (no answer)"
            if reason is None:
                if s.engine_started is None:
                    s.engine_started = e.started_at
                s.carried = False  # the same process, watched again: what follows is seen
                return s
            self._end(key, s.last_seen, reason)
        # An engine process seen for the first time: its session began when it started, and its counters
        # hold what it served since. One that was there before (back after a gap): from now, and from now on.
        previous = self._last_end.get(key)
        fresh = e.started_at is not None and e.started_at <= e.t and (previous is None or e.started_at > previous)
        s = _Session(key=key, model=e.model, engine=e.engine or e.kind, node=e.node, topology=e.topology,
                     started=e.started_at if fresh and e.started_at is not None else e.t, last_seen=e.t,
                     engine_started=e.started_at, gen_counter=e.gen_tokens_total,
                     prompt_counter=e.prompt_tokens_total, requests_counter=e.requests)
        if fresh:
            s.gen_tokens, s.prompt_tokens, s.requests = (e.gen_tokens_total or 0.0, e.prompt_tokens_total or 0.0,
                                                         e.requests or 0.0)
            s.before_watch = (s.gen_tokens, s.prompt_tokens, s.requests)
        self._sessions[key] = s
        self._new_session = True
        return s

    def _end(self, key: str, at: float, reason: str) -> None:
        s = self._sessions.pop(key)
        s.ended, s.end_reason, s.changed = at, reason, True
        self._last_end[key] = at
        self._ended.append(s)

    # -- writing ----------------------------------------------------------------------

    def _write_partial(self, t: float | None) -> None:
        """Every `PARTIAL_EVERY_S` the minutes in progress go to the file too (merged into their rows later),
        so a killed writer loses seconds, not its minute."""
        if self.store is None or not self.store.writer or self.paused or t is None:
            return
        now = self.clock.now()
        if self._partial_at is None:
            self._partial_at = now + PARTIAL_EVERY_S
        if now < self._partial_at and not self._new_session:
            return
        self._new_session = False
        self._partial_at = now + PARTIAL_EVERY_S
        for kind, table in (("node", self._nodes), ("engine", self._engines)):
            self._rows += [(kind, key, m) for key, m in table.items()]
            table.clear()
        self.flush(t)

    def flush(self, now: float | None = None) -> None:
        """Write what is finished (and, at close, the minutes in progress). `now`: the data time (None at
        close: no pruning, and a paused writer tries once more whatever the time)."""
        if self.paused is not None:
            if now is not None and self._retry_at is not None and (self._measured or 0.0) < self._retry_at:
                self._hold()
                return  # a full disk stays full for a while: once a minute at most
            self._retry_at = None if self._measured is None else self._measured + RETRY_S
            if not self._reopen():
                self._hold()
                return
        store = self.store
        if store is None or not store.writer:
            return
        inserted: list[_Session] = []
        try:
            with store.transaction() as db:
                # Sessions first: a minute row names its session's id.
                for s in [*self._ended, *self._sessions.values()]:
                    if s.changed:
                        if s.id is None:
                            inserted.append(s)
                        self._write_session(db, s)
                for kind, key, m in self._rows:
                    self._write_minute(db, kind, key, m)
                if self._events:
                    db.executemany("INSERT INTO events (t, subject, kind, level, text) VALUES (?, ?, ?, ?, ?)",
                                   [(t, store.subject(subject, key), kind, level, strip_url_credentials(text))
                                    for t, subject, key, kind, level, text in self._events])
                measured = self._measured
                if now is not None and measured is not None and (
                        self._pruned_at is None or measured - self._pruned_at >= PRUNE_EVERY_S):
                    # The writer's own time, never ahead of the data's: a jump of the clock is not time passing.
                    self._prune(db, min(now, measured))
                    self._pruned_at = measured
        except (sqlite3.Error, OSError) as exc:
            for s in inserted:
                s.id = None  # its row went with the rolled-back transaction
            store.forget_subjects()  # ... and so may have the names it added
            self._fault(exc, now)
            return
        written = len(self._rows)
        self.rows_written += written
        for s in [*self._ended, *self._sessions.values()]:
            s.changed = False
        self._rows, self._ended, self._events = [], [], []
        if self.paused:
            self.paused = self.pause_reason = None
            self._retry_at = None
            self._note(now if now is not None else self.clock.wall(), "sparktop", "history", "history", "info",
                       "history resumed")
            self._tell(f"history resumed: {written} minute rows held in memory written to {store.path}")

    def _fault(self, exc: BaseException, now: float | None) -> None:
        """The file could not be opened or written: pause (saying so once), hold the rows, try again later."""
        error = history_error(exc, self.path)
        reason = error.reason
        self._retry_at = None if self._measured is None else self._measured + RETRY_S  # None: at the next minute
        if reason != self.pause_reason:
            self.paused, self.pause_reason = f"history paused ({reason})", reason
            level = "error" if reason == "damaged file" else "warn"
            self._note(now if now is not None else self.clock.wall(), "sparktop", "history", "history", level,
                       self.paused)
            self._tell(f"history paused ({reason}): {error}")
        self._hold()

    def _hold(self) -> None:
        if len(self._rows) > PENDING_MAX:
            del self._rows[: len(self._rows) - PENDING_MAX]  # the oldest go first
        if len(self._events) > PENDING_MAX:
            del self._events[: len(self._events) - PENDING_MAX]

    def _reopen(self) -> bool:
        """Before a paused writer tries again: open the file if it never was, or a new one where a damaged
        one was moved aside (a damaged file is not written into). False: nothing to write to yet."""
        store = self.store
        if store is not None and self.pause_reason != "damaged file":
            return store.writer  # the same file, written again (a full disk may have room now)
        if store is not None:
            if store.same_file():
                return False  # still the damaged file: it waits to be moved aside
            store.close()
            self.store = None
        set_aside_journal(self._path)
        try:
            new = HistoryStore.open(self._path, check=self._check)
        except HistoryError as exc:
            self._fault(exc, None)
            return False
        self.store = new
        if not new.writer:  # another sparktop writes it now: what this one held is its to write
            self._rows, self._events, self._ended = [], [], []
            self._sessions.clear()
            self.paused = self.pause_reason = None
            self._tell(f"{new.path} is written by {writer_pid(new.path) or 'another sparktop'} now")
            return False
        for s in [*self._ended, *self._sessions.values()]:
            s.id, s.changed = None, True  # a new file: every session is written anew
        try:
            self._start_writing()
        except (sqlite3.Error, OSError, HistoryError) as exc:
            self._fault(exc, None)
            return False
        return True

    def _start_writing(self) -> None:
        """This writer has the file to itself now: the sessions the last one left open, and the time the
        writer's own clock starts from (checked at the next event)."""
        assert self.store is not None
        self._load_open_sessions()
        self._anchor = self.store.newest()
        self._anchor_due = True
        self._partial_at = None

    def _write_minute(self, db: sqlite3.Connection, kind: str, key: str, m: _Minute) -> None:
        assert self.store is not None
        figures = NODE_FIGURES if kind == "node" else ENGINE_FIGURES
        columns = ["subject", "minute", "samples", *figures]
        values: list = [self.store.subject(kind, key), m.minute, m.samples, *m.row(figures).values()]
        if kind == "engine":
            columns.insert(3, "session")
            values.insert(3, m.session.id if m.session is not None else None)
        # A minute written twice (the minute in progress written early, a restart or a handover within it,
        # the clock set back): merged into the row there, never replacing it.
        db.execute(minute_upsert(kind, columns), values)

    _SESSION_FIELDS = ("model", "engine", "node", "topology", "started", "last_seen", "ended", "end_reason",
                       "gen_tokens", "prompt_tokens", "requests", "energy_j", "peak_kv", "peak_running",
                       "peak_waiting", "peak_gen_tps", "engine_started", "gen_counter", "prompt_counter",
                       "requests_counter")

    def _write_session(self, db: sqlite3.Connection, s: _Session) -> None:
        assert self.store is not None
        fields = self._SESSION_FIELDS
        values = [strip_url_credentials(v) if isinstance(v, str) else v for v in (getattr(s, f) for f in fields)]
        if s.id is None:
            s.id = db.execute(f"INSERT INTO sessions (subject, {', '.join(fields)}) "
                              f"VALUES ({', '.join('?' * (len(fields) + 1))})",
                              [self.store.subject("engine", s.key), *values]).lastrowid
        else:
            db.execute(f"UPDATE sessions SET {', '.join(f + ' = ?' for f in fields)} WHERE id = ?", [*values, s.id])

    def _prune(self, db: sqlite3.Connection, now: float) -> None:
        cutoff = now - self.retention_s
        minute = int(cutoff // 60)
        db.execute("DELETE FROM node_minutes WHERE minute < ?", (minute,))
        db.execute("DELETE FROM engine_minutes WHERE minute < ?", (minute,))
        db.execute("DELETE FROM events WHERE t < ?", (cutoff,))
        db.execute("DELETE FROM sessions WHERE ended IS NOT NULL AND ended < ?", (cutoff,))

    _LOADED = ("id", "subject", "model", "engine", "node", "topology", "started", "last_seen", "engine_started",
               "gen_tokens", "prompt_tokens", "requests", "energy_j", "peak_kv", "peak_running", "peak_waiting",
               "peak_gen_tps", "gen_counter", "prompt_counter", "requests_counter")

    def _load_open_sessions(self) -> None:
        """Sessions the last writer left open, or ended as "watch ended" when it closed (an engine's newest
        session only): they go on if their engine answers as the same process. One this writer already
        follows (it gathered before it could open the file) is the same session when its engine is the same
        process, else the file's ended when the writer before last saw it."""
        assert self.store is not None
        db = self.store.db
        keys = self.store.subjects("engine")
        reopened: list[int] = []
        for row in db.execute(
                f"SELECT {', '.join(self._LOADED)} FROM sessions AS s WHERE ended IS NULL OR (end_reason = ? AND "
                "id = (SELECT MAX(id) FROM sessions AS t WHERE t.subject = s.subject))", (WATCH_ENDED,)).fetchall():
            values = dict(zip(self._LOADED, row, strict=True))
            reopened.append(values["id"])
            key = keys.get(values.pop("subject"))
            if key is None:
                continue
            s = _Session(key=key, **values)
            s.changed, s.carried = False, True
            mine = self._sessions.get(key)
            if mine is None:
                self._sessions[key] = s
                if key not in self._engine_t:
                    self._carried[key] = s.last_seen
            elif (mine.engine_started is not None and s.engine_started is not None
                  and abs(mine.engine_started - s.engine_started) <= 1.0):
                _adopt(mine, s)
            else:
                s.ended, s.end_reason, s.changed = s.last_seen, UNWATCHED_END, True
                self._ended.append(s)
        marks = ",".join("?" * len(reopened))
        for subject, ended in db.execute("SELECT subject, MAX(ended) FROM sessions WHERE ended IS NOT NULL "
                                         f"AND id NOT IN ({marks}) GROUP BY subject", reopened).fetchall():
            if subject in keys:
                self._last_end[keys[subject]] = max(ended, self._last_end.get(keys[subject], ended))

    def close(self) -> None:
        """Write the minutes in progress, and end the open sessions: as the poller last said for an engine
        seen down, else "watch ended" at its last answer (the next writer goes on with it if its engine is
        the same process). What could not be written is counted in `unwritten` and said."""
        if self.writing:
            for key, s in list(self._sessions.items()):
                self._end(key, s.last_seen, s.down or WATCH_ENDED)
            for kind, table in (("node", self._nodes), ("engine", self._engines)):
                self._rows += [(kind, key, m) for key, m in table.items()]
                table.clear()
            self._retry_at = None
            self.flush(None)
            if self.paused:
                self.unwritten = len(self._rows)
                if self.unwritten:
                    self._tell(f"history: {self.unwritten} minute rows held in memory were not written "
                               f"({self.pause_reason}): they are lost")
        if self.store is not None:
            self.store.close()


def _adopt(mine: _Session, file: _Session) -> None:
    """The file's open session and the one this writer started before it could open the file are one
    engine process's: one row (the file's), with what both counted."""
    mine.id, mine.started, mine.changed = file.id, min(mine.started, file.started), True
    for total, counter in (("gen_tokens", "gen_counter"), ("prompt_tokens", "prompt_counter"),
                           ("requests", "requests_counter")):
        here, there = getattr(mine, counter), getattr(file, counter)
        if here is not None and there is not None and here >= there:
            setattr(mine, total, getattr(file, total) + here - there)
        else:
            setattr(mine, total, max(getattr(mine, total), getattr(file, total)))
    mine.energy_j += file.energy_j
    for name in ("peak_kv", "peak_running", "peak_waiting", "peak_gen_tps"):
        mine.peak(name, getattr(file, name))
