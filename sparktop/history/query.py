"""Reading the history back: the questions a Spark owner asks the next
morning, as plain data for `sparktop history`, its JSON and CSV, and the
history screen.

- `sessions`: which engine served which model, from when to when, how it
  ended, what it served (tokens, requests, energy) and its peaks;
- `daily`: tokens, requests, energy and cost per engine per (local) day;
- `peaks`: the highest KV use, queue and token rate per engine, the lowest
  available memory and the highest power and temperature per node, each
  with when it happened;
- `events`: the event log (engines down and back, restarts, memory low, KV
  high, ...);
- `series`: one figure per minute (or per `step` minutes) for a chart.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from datetime import datetime

from sparktop.errors import SparktopError
from sparktop.history.store import ENGINE_FIGURES, NODE_FIGURES, HistoryStore

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)$")
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float | None = None, option: str = "--since") -> float:
    """`24h`, `7d`, `90m`, `2w` before now, or a local date/time (`2026-11-20`, `2026-11-20 08:00`)."""
    now = time.time() if now is None else now
    text = text.strip()
    found = _DURATION.match(text.lower())
    if found:
        return now - float(found.group(1)) * _UNIT_S[found.group(2)]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise SparktopError(f"{option}: {text!r} is neither a duration (24h, 7d, 90m, 2w) nor a date "
                            "(2026-11-20, 2026-11-20 08:00)") from None


# -- how history's figures read (the CLI's tables and the history screen alike) ----------------


def when_text(t: float) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(t))


def count_text(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f}G"
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e4:
        return f"{n / 1e3:.1f}k"
    return f"{n:,.0f}"


def short_key(key: str) -> str:
    """An engine's URL as a legend and a table cell have room for: spark-a:8000."""
    for scheme in ("http://", "https://"):
        if key.startswith(scheme):
            key = key[len(scheme):]
    return key.rstrip("/")


def energy_text(joules: float | None) -> str:
    """Wh (kWh from 1000 Wh); "—" when nothing was measured (no GPU power on the engine's nodes: a node
    without nvidia-smi), never a zero that reads as "it drew nothing"."""
    if joules is None or joules <= 0:
        return "—"
    wh = joules / 3600.0
    return f"{wh / 1000:.2f} kWh" if wh >= 1000 else f"{wh:.1f} Wh"


@dataclass
class Session:
    id: int
    url: str
    model: str | None
    engine: str | None
    node: str | None
    topology: str | None
    started: float
    last_seen: float
    ended: float | None
    end_reason: str | None
    gen_tokens: float
    prompt_tokens: float
    requests: float
    energy_j: float
    peak_kv: float | None
    peak_running: float | None
    peak_waiting: float | None
    peak_gen_tps: float | None
    # Of `gen_tokens`, those in no minute row: served while nobody watched (sparktop closed for longer than
    # a session's gap, an engine first seen long after it started). Per-day totals count minutes only.
    unwatched_tokens: float = 0.0

    @property
    def open(self) -> bool:
        return self.ended is None

    @property
    def duration_s(self) -> float:
        return (self.ended if self.ended is not None else self.last_seen) - self.started

    @property
    def j_per_token(self) -> float | None:
        return self.energy_j / self.gen_tokens if self.gen_tokens > 0 and self.energy_j > 0 else None

    def to_dict(self) -> dict:
        out = asdict(self)
        out["open"] = self.open
        out["duration_s"] = round(self.duration_s, 1)
        out["j_per_token"] = self.j_per_token
        out["energy_j"] = self.energy_j if self.energy_j > 0 else None  # None: not measured (no GPU power)
        return out


@dataclass
class Day:
    day: str  # local date, 2026-11-24
    url: str
    models: list[str]
    gen_tokens: float
    prompt_tokens: float
    requests: float
    energy_j: float
    cost: float | None  # energy at the price in settings.yaml (None: no price set)
    minutes: int  # minutes with samples: how much of the day was watched

    @property
    def wh(self) -> float:
        return self.energy_j / 3600.0

    def to_dict(self) -> dict:
        measured = self.energy_j > 0  # else: no GPU power on its nodes (no nvidia-smi): unknown, not zero
        return {**asdict(self), "energy_j": self.energy_j if measured else None,
                "wh": round(self.wh, 3) if measured else None, "cost": self.cost if measured else None}


@dataclass
class Peak:
    subject: str  # "engine" | "node"
    key: str  # the engine's URL or the node's name
    figure: str  # kv | waiting | gen_tps | running | mem_available_min | power_w | temp_c
    value: float
    t: float  # the minute it happened (unix time of its start)
    total: float | None = None  # for memory: the node's total, so the value reads as a share

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Event:
    t: float
    subject: str
    key: str
    kind: str
    level: str
    text: str

    def to_dict(self) -> dict:
        return asdict(self)


class HistoryReader:
    def __init__(self, store: HistoryStore):
        self.store = store
        self.db = store.db

    # -- what there is -----------------------------------------------------------------

    def span(self) -> tuple[float, float] | None:
        """The first and last minute with any sample (unix time), or None for an empty file."""
        rows = [self.db.execute(f"SELECT MIN(minute), MAX(minute) FROM {t}_minutes").fetchone()
                for t in ("node", "engine")]
        lows = [r[0] for r in rows if r[0] is not None]
        highs = [r[1] for r in rows if r[1] is not None]
        return (min(lows) * 60.0, max(highs) * 60.0 + 60.0) if lows else None

    def keys(self, kind: str) -> list[str]:
        return sorted(self.store.subjects(kind).values())

    def engine_ids(self, pattern: str | None) -> dict[int, str]:
        """Engines whose URL, model or engine name contains `pattern` (every engine without one)."""
        engines = self.store.subjects("engine")
        if not pattern:
            return engines
        p = pattern.lower()
        by_session = {row[0] for row in self.db.execute(
            "SELECT DISTINCT subject FROM sessions WHERE lower(coalesce(model, '')) LIKE ? "
            "OR lower(coalesce(engine, '')) LIKE ?", (f"%{p}%", f"%{p}%"))}
        return {i: key for i, key in engines.items() if p in key.lower() or i in by_session}

    # -- the questions ---------------------------------------------------------------------

    def sessions(self, since: float, until: float | None = None, engine: str | None = None) -> list[Session]:
        """Sessions that overlap [since, until], oldest first."""
        until = time.time() if until is None else until
        ids = self.engine_ids(engine)
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = self.db.execute(
            "SELECT id, subject, model, engine, node, topology, started, last_seen, ended, end_reason, gen_tokens, "
            "prompt_tokens, requests, energy_j, peak_kv, peak_running, peak_waiting, peak_gen_tps FROM sessions "
            f"WHERE subject IN ({marks}) AND coalesce(ended, last_seen) >= ? AND started <= ? ORDER BY started",
            [*ids, since, until]).fetchall()
        found = [Session(r[0], ids[r[1]], *r[2:]) for r in rows]
        if found:
            # The same minutes `daily` adds up: what a session counts beyond them was served unwatched.
            in_minutes = dict(self.db.execute(
                f"SELECT session, sum(gen_tokens) FROM engine_minutes WHERE session IN "
                f"({','.join('?' * len(found))}) GROUP BY session", [s.id for s in found]).fetchall())
            # A minute in which one session ended and the next began is one row, the next session's: what
            # the next counts beyond its own tokens is the one before's (newest first, handed back).
            handed: dict[str, float] = {}
            for s in reversed(found):
                left = s.gen_tokens - (in_minutes.get(s.id) or 0.0) + handed.pop(s.url, 0.0)
                if left < 0:
                    handed[s.url] = left
                s.unwatched_tokens = left if left >= 0.5 else 0.0
        return found

    def daily(self, since: float, until: float | None = None, engine: str | None = None,
              price_per_kwh: float | None = None) -> list[Day]:
        until = time.time() if until is None else until
        ids = self.engine_ids(engine)
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = self.db.execute(
            "SELECT date(m.minute * 60, 'unixepoch', 'localtime') AS day, m.subject, "
            "group_concat(DISTINCT s.model), sum(m.gen_tokens), sum(m.prompt_tokens), sum(m.requests), "
            "sum(m.energy_j), count(*) FROM engine_minutes m LEFT JOIN sessions s ON s.id = m.session "
            f"WHERE m.minute >= ? AND m.minute < ? AND m.subject IN ({marks}) GROUP BY day, m.subject "
            "ORDER BY day, m.subject", [int(since // 60), int(until // 60) + 1, *ids]).fetchall()
        out = []
        for day, subject, models, gen, prompt, requests, energy, minutes in rows:
            energy = energy or 0.0
            out.append(Day(day, ids[subject], sorted(set((models or "").split(","))) if models else [], gen or 0.0,
                           prompt or 0.0, requests or 0.0, energy,
                           None if price_per_kwh is None else energy / 3.6e6 * price_per_kwh, minutes))
        return out

    def peaks(self, since: float, until: float | None = None, engine: str | None = None) -> list[Peak]:
        """Each engine's highest KV use, queue, running and token rate; each node's lowest available
        memory and highest power and temperature (nodes only without an engine filter)."""
        until = time.time() if until is None else until
        span = (int(since // 60), int(until // 60) + 1)
        out: list[Peak] = []
        ids = self.engine_ids(engine)
        for figure, column in (("kv", "kv_max"), ("waiting", "waiting_max"), ("running", "running_max"),
                               ("gen_tps", "gen_tps_max")):
            # SQLite gives the other columns of the row MAX() chose: the minute of the peak.
            for subject, value, minute in self.db.execute(
                    f"SELECT subject, MAX({column}), minute FROM engine_minutes WHERE minute >= ? AND minute < ? "
                    f"AND {column} IS NOT NULL GROUP BY subject", span):
                if subject in ids:
                    out.append(Peak("engine", ids[subject], figure, value, minute * 60.0))
        if engine:
            return out
        nodes = self.store.subjects("node")
        for subject, value, minute, total in self.db.execute(
                "SELECT subject, MIN(mem_available_min), minute, mem_total FROM node_minutes WHERE minute >= ? "
                "AND minute < ? AND mem_available_min IS NOT NULL GROUP BY subject", span):
            out.append(Peak("node", nodes.get(subject, "?"), "mem_available_min", value, minute * 60.0, total))
        for figure, column in (("power_w", "power_max_w"), ("temp_c", "temp_max_c")):
            for subject, value, minute in self.db.execute(
                    f"SELECT subject, MAX({column}), minute FROM node_minutes WHERE minute >= ? AND minute < ? "
                    f"AND {column} IS NOT NULL GROUP BY subject", span):
                out.append(Peak("node", nodes.get(subject, "?"), figure, value, minute * 60.0))
        return out

    def events(self, since: float, until: float | None = None, engine: str | None = None) -> list[Event]:
        until = time.time() if until is None else until
        names = {**{i: ("node", k) for i, k in self.store.subjects("node").items()},
                 **{i: ("engine", k) for i, k in self.store.subjects("engine").items()},
                 **{i: ("sparktop", k) for i, k in self.store.subjects("sparktop").items()}}
        ids = self.engine_ids(engine) if engine else None
        out = []
        for t, subject, kind, level, text in self.db.execute(
                "SELECT t, subject, kind, level, text FROM events WHERE t >= ? AND t <= ? ORDER BY t",
                (since, until)):
            if ids is not None and subject not in ids:
                continue
            what, key = names.get(subject, ("?", "?"))
            out.append(Event(t, what, key, kind, level, text))
        return out

    def series(self, kind: str, key: str, figure: str, since: float, until: float | None = None,
               step_min: int = 1, how: str = "avg") -> tuple[list[float], list[float]]:
        """(t, value) of one figure, one point per `step_min` minutes (averaged, or `how`="max"/"sum")."""
        figures = NODE_FIGURES if kind == "node" else ENGINE_FIGURES
        if figure not in figures or how not in ("avg", "max", "min", "sum"):
            raise ValueError(f"no {kind} figure {figure!r} ({how})")
        until = time.time() if until is None else until
        subject = self.store.subject(kind, key)
        rows = self.db.execute(
            f"SELECT (minute / ?) * ? AS bucket, {how}({figure}) FROM {kind}_minutes WHERE subject = ? AND "
            f"minute >= ? AND minute < ? AND {figure} IS NOT NULL GROUP BY bucket ORDER BY bucket",
            (step_min, step_min, subject, int(since // 60), int(until // 60) + 1)).fetchall()
        return [b * 60.0 for b, _ in rows], [float(v) for _, v in rows]

    def cluster_series(self, kind: str, figure: str, since: float, until: float | None = None,
                       step_min: int = 1) -> dict[str, tuple[list[float], list[float]]]:
        """`series` for every node or engine."""
        return {key: self.series(kind, key, figure, since, until, step_min) for key in self.keys(kind)}
