"""Writing the history: the monitor's events folded into a row per minute
per node and engine, serving sessions and the event log.

`HistoryWriter.observe(event, state)` is called with every event the poller
yields, after `ClusterState.apply` (the state gives the derived figures:
an engine's power over its nodes). It only adds numbers in memory; once a
minute (on the data's own clock) the finished minutes, the sessions that
changed and the new events go to SQLite in one transaction, so a killed
process loses at most the minute in progress and a slow disk costs one
commit a minute, not one per poll.

A serving session is one engine serving one model without a break: it
starts the first time the engine answers ready, and ends when the engine
restarts (its counters start again), serves another model, or has not
answered for `SESSION_GAP_S` (stopped, failed or lost: the reason is what
the poller last said). A session the last sparktop left open goes on if the
engine is the same process (its start time) or came back within the gap.

When the disk is full (or the file cannot be written), the writer keeps the
rows in memory (the newest `PENDING_MAX`), says `history paused: ...` in
`status`, and tries again a minute later; the monitor is not disturbed.

Its own time is the `Clock` it is given (`sparktop.clock`, the system's by
default): its `now()` paces asking for the writer's lock again and tells a
jump of the data's clock from time passing; its `wall()` stamps what it says
itself. Minutes, sessions and pruning follow the events' own times.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from sparktop.clock import SYSTEM, Clock
from sparktop.engine_ids import is_router
from sparktop.history.store import ENGINE_FIGURES, NODE_FIGURES, HistoryStore, writer_pid
from sparktop.observe.snapshot import EngineGone, EngineSnapshot, NodeSnapshot, Notice
from sparktop.observe.state import ClusterState

SESSION_GAP_S = 300.0  # an engine silent this long has ended its session
MAX_DT_S = 30.0  # a poll further from the one before adds no energy (a gap is not a measurement)
PRUNE_EVERY_S = 600.0
RETENTION_DAYS = 30.0
PENDING_MAX = 20_000  # rows held while the disk is full (two weeks of a minute row for two nodes, two engines)
CLOCK_JUMP_S = 120.0  # the data's clock moved this much more (or less) than the monotonic clock: say so
LOADED_GRACE_S = 60.0  # a session the last sparktop left open waits this long for its engine to answer
RETAKE_EVERY_S = 60.0  # a reader asks for the writer's lock again this often
READY = ("ready", "sleeping")


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

    def peak(self, name: str, value: float | None) -> None:
        if value is not None and (getattr(self, name) is None or value > getattr(self, name)):
            setattr(self, name, value)


def _delta(counter: float | None, before: float | None) -> float | None:
    """What a monotonic counter added since `before` (None: unknown, or it went back)."""
    if counter is None or before is None or counter < before:
        return None
    return counter - before


class HistoryWriter:
    """Folds observe events into the history file. One per process; only the
    store's writer writes (a second sparktop on the same file reads)."""

    def __init__(self, store: HistoryStore, retention_days: float = RETENTION_DAYS, clock: Clock = SYSTEM):
        self.store = store
        self.retention_s = retention_days * 86400.0
        self.clock = clock
        self._nodes: dict[str, _Minute] = {}
        self._engines: dict[str, _Minute] = {}
        self._node_t: dict[str, float] = {}
        self._engine_t: dict[str, float] = {}
        self._sessions: dict[str, _Session] = {}
        self._ended: list[_Session] = []
        self._rows: list[tuple[str, str, _Minute]] = []  # (kind, key, minute) finished, not yet written
        self._counters: dict[str, dict[str, float]] = {}  # per engine: preemptions, rejections last seen
        self._last_end: dict[str, float] = {}  # per engine: when its last session ended
        self._first_t: float | None = None  # the data time of the first event this writer saw
        self._events: list[tuple[float, str, str, str, str, str]] = []
        self._minute: int | None = None
        self._seen: tuple[float, float] | None = None  # (data time, the clock's now()) at the last event
        self._pruned_at: float | None = None  # data time of the last prune
        self._cutoff: float | None = None
        self._retake_at = 0.0
        self._retry_at: float | None = None  # while paused: when to try writing again
        self.paused: str | None = None  # why nothing is written now (disk full), for the status line
        self.rows_written = 0
        if store.writer:
            self._load_open_sessions()

    # -- what the screen says ------------------------------------------------------

    @property
    def status(self) -> str | None:
        """A few words for the status line when history is not being written as usual."""
        if self.paused:
            return self.paused
        if not self.store.writer:
            pid = writer_pid(self.store.path)
            return f"history written by pid {pid}" if pid else "history written by another sparktop"
        return None

    @property
    def path(self) -> Path:
        return self.store.path

    # -- events ---------------------------------------------------------------------

    def observe(self, event, state: ClusterState) -> None:
        if not self.store.writer:
            now = self.clock.now()
            if now >= self._retake_at:
                self._retake_at = now + RETAKE_EVERY_S
                if self.store.try_take_writer():
                    self._load_open_sessions()
            if not self.store.writer:
                return
        if isinstance(event, NodeSnapshot):
            self._tick(event.t)
            if event.state == "ok":
                self._node(event)
        elif isinstance(event, EngineSnapshot):
            self._tick(event.t)
            self._engine(event, state)
        elif isinstance(event, EngineGone):
            s = self._sessions.get(event.key)
            if s is not None and s.down is None:
                s.down = "stopped"
        elif isinstance(event, Notice):
            self._tick(event.t)
            self._events.append((event.t, event.subject, event.key, event.kind, event.level, event.text))

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
                self._end(key, s.last_seen, "gone while sparktop was closed")
        self.flush(t)

    def _watch_clock(self, t: float) -> None:
        now = self.clock.now()
        if self._seen is not None:
            then_t, then_mono = self._seen
            drift = (t - then_t) - (now - then_mono)
            if abs(drift) > CLOCK_JUMP_S:
                way = "forward" if drift > 0 else "back"
                self._events.append((t, "sparktop", "clock", "clock", "warn",
                                     f"the clock jumped {way} by {abs(drift) / 60:.0f} min"))
                if drift > 0 and self._cutoff is not None:
                    # Pruning follows the data's clock, but not a jump of it: a clock set a year ahead
                    # must not empty the file. The cutoff moves on from where it was.
                    self._pruned_at = t
        self._seen = (t, now)

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
        s = self._sessions.get(e.key)
        if e.state not in READY:
            if s is not None and e.state in ("unreachable", "failed"):
                s.down = f"failed: {e.error}" if e.state == "failed" and e.error else e.state
            return
        s = self._session_for(e, s)
        before = self._engine_t.get(e.key)
        dt = e.t - before if before is not None and 0 < e.t - before <= MAX_DT_S else None
        # Tokens served while sparktop was closed count in the session (its counters say so) but not
        # in any minute: they would all land in the first minute after the gap.
        watched = before is not None and 0 < e.t - before <= SESSION_GAP_S
        self._engine_t[e.key] = e.t
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
        s.peak("peak_kv", e.kv_usage)
        s.peak("peak_running", e.running)
        s.peak("peak_waiting", e.waiting)
        s.peak("peak_gen_tps", e.gen_tps)
        s.last_seen, s.down, s.changed = e.t, None, True

        m = self._minute_of("engine", e.key, e.t)
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
        self._counter_deltas(e, m)

    def _counter_deltas(self, e: EngineSnapshot, m: _Minute) -> None:
        """Preemptions and rejections added this poll (the counters since the engine started)."""
        last = self._counters.setdefault(e.key, {})
        for name, value in (("preemptions", e.preemptions), ("rejections", e.rejections)):
            m.add(name, _delta(value, last.get(name)))
            if value is not None:
                last[name] = value

    def _session_for(self, e: EngineSnapshot, s: _Session | None) -> _Session:
        if s is not None:
            reason = None
            if e.model and s.model and e.model != s.model:
                reason = f"now serves {e.model}"
            elif (e.started_at is not None and s.engine_started is not None
                  and abs(e.started_at - s.engine_started) > 1.0):
                reason = "restarted"
            elif e.gen_tokens_total is not None and s.gen_counter is not None and e.gen_tokens_total < s.gen_counter:
                reason = "restarted"  # its counters started again
            elif e.t - s.last_seen > SESSION_GAP_S and not (
                    e.started_at is not None and s.engine_started is not None):
                reason = s.down or "lost (no answer)"
            if reason is None:
                if s.engine_started is None:
                    s.engine_started = e.started_at
                return s
            self._end(e.key, s.last_seen, reason)
        # An engine process seen for the first time: its session began when it started, and its counters
        # hold what it served since. One that was there before (back after a gap): from now, and from now on.
        previous = self._last_end.get(e.key)
        fresh = e.started_at is not None and e.started_at <= e.t and (previous is None or e.started_at > previous)
        s = _Session(key=e.key, model=e.model, engine=e.engine or e.kind, node=e.node, topology=e.topology,
                     started=e.started_at if fresh and e.started_at is not None else e.t, last_seen=e.t,
                     engine_started=e.started_at, gen_counter=e.gen_tokens_total,
                     prompt_counter=e.prompt_tokens_total, requests_counter=e.requests)
        if fresh:
            s.gen_tokens, s.prompt_tokens, s.requests = (e.gen_tokens_total or 0.0, e.prompt_tokens_total or 0.0,
                                                         e.requests or 0.0)
        self._sessions[e.key] = s
        return s

    def _end(self, key: str, at: float, reason: str) -> None:
        s = self._sessions.pop(key)
        s.ended, s.end_reason, s.changed = at, reason, True
        self._last_end[key] = at
        self._ended.append(s)

    # -- writing ----------------------------------------------------------------------

    def flush(self, now: float | None = None) -> None:
        """Write what is finished (and, at close, the minutes in progress)."""
        if not self.store.writer:
            return
        if self.paused and now is not None and self._retry_at is not None and now < self._retry_at:
            return  # a full disk stays full for a while: once a minute at most
        inserted: list[_Session] = []
        try:
            with self.store.transaction() as db:
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
                                   [(t, self.store.subject(subject, key), kind, level, text)
                                    for t, subject, key, kind, level, text in self._events])
                if now is not None and (self._pruned_at is None or now - self._pruned_at >= PRUNE_EVERY_S):
                    self._prune(db, now)
        except sqlite3.Error as exc:
            for s in inserted:
                s.id = None  # its row went with the rolled-back transaction
            self.store.forget_subjects()  # ... and so may have the names it added
            self._pause(exc, now)
            return
        self.rows_written += len(self._rows)
        for s in [*self._ended, *self._sessions.values()]:
            s.changed = False
        self._rows, self._ended, self._events = [], [], []
        if self.paused:
            self.paused = None
            self._events.append((now if now is not None else self.clock.wall(), "sparktop", "history", "history",
                                 "info", "history resumed"))

    def _pause(self, exc: sqlite3.Error, now: float | None) -> None:
        text = str(exc)
        self.paused = "history paused: disk full" if "full" in text else f"history paused: {text}"
        self._retry_at = (now if now is not None else self.clock.wall()) + 60.0
        if len(self._rows) > PENDING_MAX:
            del self._rows[: len(self._rows) - PENDING_MAX]  # the oldest go first
        if len(self._events) > PENDING_MAX:
            del self._events[: len(self._events) - PENDING_MAX]

    def _write_minute(self, db: sqlite3.Connection, kind: str, key: str, m: _Minute) -> None:
        figures = NODE_FIGURES if kind == "node" else ENGINE_FIGURES
        columns = ["subject", "minute", "samples", *figures]
        values: list = [self.store.subject(kind, key), m.minute, m.samples, *m.row(figures).values()]
        if kind == "engine":
            columns.insert(3, "session")
            values.insert(3, m.session.id if m.session is not None else None)
        # A minute written twice (the clock went back, or sparktop restarted within it): the later wins.
        db.execute(f"INSERT OR REPLACE INTO {kind}_minutes ({', '.join(columns)}) "
                   f"VALUES ({', '.join('?' * len(columns))})", values)

    _SESSION_FIELDS = ("model", "engine", "node", "topology", "started", "last_seen", "ended", "end_reason",
                       "gen_tokens", "prompt_tokens", "requests", "energy_j", "peak_kv", "peak_running",
                       "peak_waiting", "peak_gen_tps", "engine_started", "gen_counter", "prompt_counter",
                       "requests_counter")

    def _write_session(self, db: sqlite3.Connection, s: _Session) -> None:
        fields = self._SESSION_FIELDS
        values = [getattr(s, f) for f in fields]
        if s.id is None:
            s.id = db.execute(f"INSERT INTO sessions (subject, {', '.join(fields)}) "
                              f"VALUES ({', '.join('?' * (len(fields) + 1))})",
                              [self.store.subject("engine", s.key), *values]).lastrowid
        else:
            db.execute(f"UPDATE sessions SET {', '.join(f + ' = ?' for f in fields)} WHERE id = ?", [*values, s.id])

    def _prune(self, db: sqlite3.Connection, now: float) -> None:
        cutoff = now - self.retention_s
        if self._cutoff is not None and self._pruned_at is not None:
            # Never further than the time that passed since the last prune (plus a prune period):
            # a jump of the clock is not time passing.
            cutoff = min(cutoff, self._cutoff + max(0.0, now - self._pruned_at) + PRUNE_EVERY_S)
        minute = int(cutoff // 60)
        db.execute("DELETE FROM node_minutes WHERE minute < ?", (minute,))
        db.execute("DELETE FROM engine_minutes WHERE minute < ?", (minute,))
        db.execute("DELETE FROM events WHERE t < ?", (cutoff,))
        db.execute("DELETE FROM sessions WHERE ended IS NOT NULL AND ended < ?", (cutoff,))
        self._cutoff, self._pruned_at = cutoff, now

    def _load_open_sessions(self) -> None:
        """Sessions the last writer left open: they go on if their engine answers as the same process."""
        db = self.store.db
        keys = self.store.subjects("engine")
        names = ("id", "subject", "model", "engine", "node", "topology", "started", "last_seen", "engine_started",
                 "gen_tokens", "prompt_tokens", "requests", "energy_j", "peak_kv", "peak_running", "peak_waiting",
                 "peak_gen_tps", "gen_counter", "prompt_counter", "requests_counter")
        for row in db.execute(f"SELECT {', '.join(names)} FROM sessions WHERE ended IS NULL"):
            values = dict(zip(names, row, strict=True))
            key = keys.get(values.pop("subject"))
            if key is None:
                continue
            s = _Session(key=key, **values)
            s.changed = False
            self._sessions[key] = s
        for subject, ended in db.execute("SELECT subject, MAX(ended) FROM sessions WHERE ended IS NOT NULL "
                                         "GROUP BY subject"):
            if subject in keys:
                self._last_end[keys[subject]] = ended

    def close(self) -> None:
        """Write the minutes in progress (sessions stay open: the next writer decides how they went on)."""
        if self.store.writer:
            for kind, table in (("node", self._nodes), ("engine", self._engines)):
                self._rows += [(kind, key, m) for key, m in table.items()]
                table.clear()
            self._retry_at = None
            self.flush(None)
        self.store.close()
