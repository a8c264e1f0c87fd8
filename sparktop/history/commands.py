"""`sparktop history`: sessions, daily totals, peaks and events from the
history file, as tables, JSON or CSV."""

from __future__ import annotations

import csv
import json
import sqlite3
import sys
import time
from typing import TextIO

from rich.console import Console
from rich.table import Table

from sparktop.errors import SparktopError
from sparktop.history.query import (
    Day,
    Event,
    HistoryReader,
    Peak,
    Session,
    count_text,
    energy_text,
    parse_since,
    short_key,
    when_text,
)
from sparktop.history.store import HistoryStore, history_error
from sparktop.settings import Preferences, load_preferences

GIB = 1024**3


def _peak_text(p: Peak) -> str:
    if p.figure == "kv":
        return f"KV cache {p.value:.0%}"
    if p.figure == "waiting":
        return f"{p.value:.0f} waiting"
    if p.figure == "running":
        return f"{p.value:.0f} running"
    if p.figure == "gen_tps":
        return f"{p.value:,.0f} tokens/s"
    if p.figure == "mem_available_min":
        share = f" ({p.value / p.total:.0%})" if p.total else ""
        return f"lowest available memory {p.value / GIB:.1f} GiB{share}"
    if p.figure == "power_w":
        return f"GPU power {p.value:.0f} W"
    if p.figure == "temp_c":
        return f"GPU {p.value:.0f} °C"
    return f"{p.figure} {p.value:g}"


def gather(reader: HistoryReader, since: float, until: float, engine: str | None,
           prefs: Preferences) -> dict:
    return {
        "sessions": reader.sessions(since, until, engine),
        "daily": reader.daily(since, until, engine, prefs.energy_price_per_kwh),
        "peaks": reader.peaks(since, until, engine),
        "events": reader.events(since, until, engine),
    }


def as_json(found: dict, since: float, until: float, path: str, prefs: Preferences) -> dict:
    return {"file": path, "since": since, "until": until, "currency": prefs.currency or None,
            **{k: [x.to_dict() for x in v] for k, v in found.items()}}


def write_csv(found: dict, out: TextIO) -> None:
    """One CSV of rows `section,...`: each section's own columns after its name (a spreadsheet splits them)."""
    w = csv.writer(out)
    for section in ("sessions", "daily", "peaks", "events"):
        rows = [x.to_dict() for x in found[section]]
        if not rows:
            continue
        columns = [c for c in rows[0] if not isinstance(rows[0][c], list)] + \
                  [c for c in rows[0] if isinstance(rows[0][c], list)]
        w.writerow(["section", *columns])
        for r in rows:
            w.writerow([section, *(";".join(r[c]) if isinstance(r[c], list) else
                                   ("" if r[c] is None else r[c]) for c in columns)])


def _table(title: str, columns: list[tuple[str, str]]) -> Table:
    """A borderless table (it reads at 80 columns); `columns`: (header, "l" | "r" | "w": left, right, or left
    and wrapped — the one column of free text; the others never wrap)."""
    t = Table(title=title, title_justify="left", header_style="bold underline", box=None, pad_edge=False)
    for head, justify in columns:
        t.add_column(head, justify="right" if justify == "r" else "left", no_wrap=justify != "w")
    return t


def print_tables(found: dict, console: Console, prefs: Preferences, since: float, until: float, path: str) -> None:
    # Under 120 columns what the other tables also say, or a glance needs least, goes (model, node, peak
    # waiting, energy and J/token of a session; models and prompt tokens of a day): nothing wraps at 80.
    wide = console.width >= 120
    console.print(f"history from {when_text(since)} to {when_text(until)} ([dim]{path}[/])")
    sessions: list[Session] = found["sessions"]
    if sessions:
        cols = [("engine", "l"), ("model", "l"), ("node", "l"), ("started", "l"), ("ended", "l"), ("how", "l"),
                ("tokens", "r"), ("requests", "r"), ("peak KV", "r"), ("peak wait", "r"), ("energy", "r"),
                ("J/tok", "r")]
        if not wide:
            cols = [c for c in cols if c[0] not in ("model", "node", "peak wait", "energy", "J/tok")]
        t = _table("serving sessions", cols)
        for s in sessions:
            ended = "serving" if s.open else when_text(s.ended or 0)
            cells = {"engine": short_key(s.url), "model": (s.model or "?").split("/")[-1], "node": s.node or "",
                     "started": when_text(s.started), "ended": ended, "how": s.end_reason or "",
                     "tokens": count_text(s.gen_tokens), "requests": count_text(s.requests),
                     "peak KV": "" if s.peak_kv is None else f"{s.peak_kv:.0%}",
                     "peak wait": "" if s.peak_waiting is None else f"{s.peak_waiting:.0f}",
                     "energy": energy_text(s.energy_j),
                     "J/tok": "" if s.j_per_token is None else f"{s.j_per_token:.2f}"}
            t.add_row(*(cells[c] for c, _ in cols))
        console.print(t)
        unwatched: dict[str, float] = {}
        for s in sessions:
            if s.unwatched_tokens > 0:
                unwatched[short_key(s.url)] = unwatched.get(short_key(s.url), 0.0) + s.unwatched_tokens
        if unwatched:
            # The one legitimate difference between a session's tokens and the days': the rest is one count.
            console.print("[dim]sessions' tokens include what was served while nobody watched ("
                          + ", ".join(f"{k}: {count_text(v)}" for k, v in unwatched.items())
                          + "); per-day tokens count the watched minutes only[/]")
    else:
        console.print("no serving sessions in this window")
    days: list[Day] = found["daily"]
    if days:
        cols = [("day", "l"), ("engine", "l"), ("models", "l"), ("tokens", "r"), ("prompt", "r"),
                ("requests", "r"), ("energy", "r"), ("cost", "r"), ("watched", "r")]
        if not wide:
            cols = [c for c in cols if c[0] not in ("models", "prompt")]
        t = _table("per day", cols)
        for d in days:
            cells = {"day": d.day, "engine": short_key(d.url), "models": ", ".join(m.split("/")[-1] for m in d.models),
                     "tokens": count_text(d.gen_tokens), "prompt": count_text(d.prompt_tokens),
                     "requests": count_text(d.requests), "energy": energy_text(d.energy_j),
                     "cost": prefs.money(d.cost) if d.cost is not None and d.energy_j > 0 else "",
                     "watched": f"{d.minutes / 60:.1f} h"}
            t.add_row(*(cells[c] for c, _ in cols))
        console.print(t)
    peaks: list[Peak] = found["peaks"]
    if peaks:
        t = _table("peaks", [("engine or node", "l"), ("what", "w"), ("when", "l")])
        for p in peaks:
            t.add_row(short_key(p.key), _peak_text(p), when_text(p.t))
        console.print(t)
    events: list[Event] = found["events"]
    if events:
        t = _table("events", [("when", "l"), ("engine or node", "l"), ("what", "w")])
        style = {"error": "red", "warn": "yellow"}
        for e in events:
            t.add_row(when_text(e.t), short_key(e.key),
                      f"[{style[e.level]}]{e.text}[/]" if e.level in style else e.text)
        console.print(t)
    if not prefs.energy_price_per_kwh and days:
        console.print("[dim]costs: set energy_price_per_kwh in settings.yaml[/]")


def main_history(since: str, until: str | None, engine: str | None, fmt: str, path: str | None) -> int:
    prefs = load_preferences()
    now = time.time()
    start = parse_since(since, now)
    end = parse_since(until, now, "--until") if until else now
    if end <= start:
        raise SparktopError(f"--until ({when_text(end)}) is not after --since ({when_text(start)})")
    store = HistoryStore.open(path, write=False)
    try:
        reader = HistoryReader(store)
        try:
            found = gather(reader, start, end, engine, prefs)
            known_engines = reader.engine_ids(engine) if engine else None
        except sqlite3.DatabaseError as exc:  # a damaged page met on the way: one line, and what to do
            raise history_error(exc, store.path) from None
        if engine and not known_engines:
            known = ", ".join(reader.keys("engine")) or "none yet"
            raise SparktopError(f"--engine {engine!r}: no engine in the history matches (engines: {known})")
        if fmt == "json":
            json.dump(as_json(found, start, end, str(store.path), prefs), sys.stdout, indent=2)
            sys.stdout.write("\n")
        elif fmt == "csv":
            write_csv(found, sys.stdout)
        else:
            print_tables(found, Console(), prefs, start, end, str(store.path))
    finally:
        store.close()
    return 0
