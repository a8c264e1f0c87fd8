"""`sparktop history`: sessions, daily totals, peaks and events from the
history file, as tables, JSON or CSV."""

from __future__ import annotations

import csv
import json
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
    when_text,
)
from sparktop.history.store import HistoryStore
from sparktop.settings import Preferences, load_preferences
from sparktop.units import ago

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


def print_tables(found: dict, console: Console, prefs: Preferences, since: float, until: float, path: str) -> None:
    console.print(f"history from {when_text(since)} to {when_text(until)} ([dim]{path}[/])")
    sessions: list[Session] = found["sessions"]
    if sessions:
        t = Table(title="serving sessions", title_justify="left")
        for col in ("engine", "model", "node", "started", "ended", "how it ended", "tokens", "requests", "peak KV",
                    "peak waiting", "energy", "J/token"):
            t.add_column(col, justify="right" if col in ("tokens", "requests", "peak KV", "peak waiting",
                                                         "energy", "J/token") else "left")
        for s in sessions:
            ended = f"serving ({ago(time.time() - s.last_seen)} ago)" if s.open else when_text(s.ended or 0)
            t.add_row(s.url, s.model or "?", s.node or "", when_text(s.started), ended, s.end_reason or "",
                      count_text(s.gen_tokens), count_text(s.requests),
                      "" if s.peak_kv is None else f"{s.peak_kv:.0%}",
                      "" if s.peak_waiting is None else f"{s.peak_waiting:.0f}", energy_text(s.energy_j),
                      "" if s.j_per_token is None else f"{s.j_per_token:.2f}")
        console.print(t)
    else:
        console.print("no serving sessions in this window")
    days: list[Day] = found["daily"]
    if days:
        t = Table(title="per day", title_justify="left")
        for col in ("day", "engine", "models", "tokens", "prompt tokens", "requests", "energy", "cost", "watched"):
            t.add_column(col, justify="left" if col in ("day", "engine", "models") else "right")
        for d in days:
            t.add_row(d.day, d.url, ", ".join(d.models), count_text(d.gen_tokens), count_text(d.prompt_tokens),
                      count_text(d.requests), energy_text(d.energy_j),
                      prefs.money(d.cost) if d.cost is not None else "", f"{d.minutes / 60:.1f} h")
        console.print(t)
    peaks: list[Peak] = found["peaks"]
    if peaks:
        t = Table(title="peaks", title_justify="left")
        for col in ("engine or node", "what", "when"):
            t.add_column(col)
        for p in peaks:
            t.add_row(p.key, _peak_text(p), when_text(p.t))
        console.print(t)
    events: list[Event] = found["events"]
    if events:
        t = Table(title="events", title_justify="left")
        for col in ("when", "engine or node", "what"):
            t.add_column(col)
        style = {"error": "red", "warn": "yellow"}
        for e in events:
            t.add_row(when_text(e.t), e.key, f"[{style[e.level]}]{e.text}[/]" if e.level in style else e.text)
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
        found = gather(reader, start, end, engine, prefs)
        if engine and not reader.engine_ids(engine):
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
