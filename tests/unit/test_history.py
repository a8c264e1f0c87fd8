"""The history store, on a real SQLite file through the real writer and
reader: a simulated week of a twin cluster answers the questions a Spark
owner asks the next morning, and the file survives what a monitor meets
(a second sparktop, a full disk, a clock that jumps, a newer schema)."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import time
from dataclasses import replace

import pytest

from sparktop.cli import main
from sparktop.clock import SYSTEM
from sparktop.history import store as store_mod
from sparktop.history.query import HistoryReader, parse_since
from sparktop.history.store import HistoryError, HistoryStore, default_path
from sparktop.history.writer import HistoryWriter
from tests.helpers.history_sim import NODES, Scenario, Truth, load, run, url
from tests.helpers.small_disk import small_tmpfs

DAY = 86400.0


@pytest.fixture(scope="module")
def week(tmp_path_factory):
    """A week ending now: engine 0 restarts on day 3, node 1 runs low on
    memory on the night of day 4, engine 1's KV cache spikes on day 5 and
    it stops answering for half an hour on day 6."""
    path = tmp_path_factory.mktemp("history") / "history.sqlite"
    now = time.time()
    start = now - 7 * DAY
    sc = Scenario(start=start, restart_at=start + 3 * DAY + 10 * 3600,
                  memory_low=(start + 4 * DAY + 2 * 3600, start + 4 * DAY + 4 * 3600),
                  kv_spike=(start + 5 * DAY + 14 * 3600, start + 5 * DAY + 14 * 3600 + 600),
                  idle_gap=(start + 6 * DAY, start + 6 * DAY + 1800))
    truth = Truth()
    writer = HistoryWriter(HistoryStore.open(path))
    run(sc, writer.observe, truth)
    writer.close()
    return path, sc, truth


def history_json(capsys, path, *args) -> dict:
    assert main(["history", "--file", str(path), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_did_the_engine_restart_last_night(week, capsys):
    path, sc, _ = week
    found = history_json(capsys, path, "--since", "8d", "--engine", NODES[0])
    sessions = found["sessions"]
    assert [s["url"] for s in sessions] == [url(0), url(0)]
    before, after = sessions
    assert before["end_reason"] == "restarted"
    assert abs(before["ended"] - sc.restart_at) <= sc.step  # its last answer before the restart
    assert abs(after["started"] - sc.restart_at) <= sc.step
    assert after["end_reason"] == "watch ended"  # serving when the writer closed: not left "serving"
    restarts = [e for e in found["events"] if e["kind"] == "restarted"]
    assert len(restarts) == 1 and restarts[0]["key"] == url(0)
    assert abs(restarts[0]["t"] - sc.restart_at) <= sc.step


def test_the_peak_kv_use_of_that_day(week, capsys):
    path, sc, truth = week
    spike_start = sc.kv_spike[0]
    day = time.strftime("%Y-%m-%d", time.localtime(spike_start))
    found = history_json(capsys, path, "--since", day, "--until", time.strftime(
        "%Y-%m-%d", time.localtime(spike_start + DAY)))
    kv = {p["key"]: p for p in found["peaks"] if p["figure"] == "kv"}
    value, when = truth.kv_peak[url(1)]
    assert kv[url(1)]["value"] == pytest.approx(value)
    assert int(kv[url(1)]["t"] // 60) == int(when // 60)
    assert kv[url(0)]["value"] < 0.9  # the other engine had no spike
    assert any(e["kind"] == "kv_high" and e["key"] == url(1) for e in found["events"])


def test_tokens_and_energy_served_this_week(week, capsys):
    path, sc, truth = week
    found = history_json(capsys, path, "--since", "8d")
    # Engine 0 restarted: what it served between its start and its first poll (5 s before) is in that
    # minute too (the simulation's truth counts from the first poll on).
    first = sc.start + sc.step * -(-(sc.restart_at - sc.start) // sc.step)
    before_first_poll = {url(0): 400 * load(first) * sc.step, url(1): 0.0}
    for i in range(2):
        days = [d for d in found["daily"] if d["url"] == url(i)]
        assert len(days) in (7, 8)  # a week, split at local midnights
        assert sum(d["gen_tokens"] for d in days) == pytest.approx(
            truth.gen_tokens[url(i)] + before_first_poll[url(i)], rel=1e-6)
        # The sessions say the same, but for what they say was served unwatched (before the first poll of an
        # engine that had run for an hour).
        sessions = [s for s in found["sessions"] if s["url"] == url(i)]
        assert sum(s["gen_tokens"] - s["unwatched_tokens"] for s in sessions) == pytest.approx(
            sum(d["gen_tokens"] for d in days), rel=1e-9)
    # Energy: each engine's node power over the polls it was watched answering (30 s apart).
    energy = sum(d["energy_j"] for d in found["daily"] if d["url"] == url(0))
    expected = 0.0
    t = sc.start + sc.step
    while t < sc.start + sc.days * DAY:
        expected += (sc.watts_idle + (sc.watts_busy - sc.watts_idle) * load(t)) * sc.step
        t += sc.step
    assert energy == pytest.approx(expected, rel=0.01)
    assert all(d["cost"] is None for d in found["daily"])  # no price set


def test_costs_follow_the_price_in_settings(week, capsys, tmp_path, monkeypatch):
    path, _, _ = week
    settings = tmp_path / "settings.yaml"
    settings.write_text("energy_price_per_kwh: 0.40\ncurrency: EUR\n")
    monkeypatch.setenv("SPARKTOP_SETTINGS", str(settings))
    found = history_json(capsys, path, "--since", "8d")
    for d in found["daily"]:
        assert d["cost"] == pytest.approx(d["energy_j"] / 3.6e6 * 0.40)
    assert main(["history", "--file", str(path), "--since", "8d"]) == 0
    assert "EUR" in capsys.readouterr().out


def test_when_memory_ran_low(week, capsys):
    path, sc, truth = week
    found = history_json(capsys, path, "--since", "7d")
    low = [e for e in found["events"] if e["kind"] == "memory_low"]
    assert [e["key"] for e in low] == [NODES[1]]
    assert sc.memory_low[0] <= low[0]["t"] <= sc.memory_low[0] + sc.step
    assert any(e["kind"] == "memory_ok" and e["t"] >= sc.memory_low[1] for e in found["events"])
    lowest = next(p for p in found["peaks"] if p["figure"] == "mem_available_min" and p["key"] == NODES[1])
    assert lowest["value"] == pytest.approx(truth.mem_low[0], rel=1e-6)
    assert sc.memory_low[0] - 60 <= lowest["t"] <= sc.memory_low[1]


def test_an_engine_silent_for_half_an_hour_ends_its_session(week, capsys):
    path, sc, _ = week
    found = history_json(capsys, path, "--since", "8d", "--engine", NODES[1])
    first, second = found["sessions"]
    assert first["end_reason"] == "unreachable"
    assert abs(first["ended"] - sc.idle_gap[0]) <= sc.step
    assert abs(second["started"] - sc.idle_gap[1]) <= sc.step


def test_tables_and_csv_say_the_same(week, capsys):
    path, _, _ = week
    assert main(["history", "--file", str(path), "--since", "8d"]) == 0
    text = capsys.readouterr().out
    for words in ("serving sessions", "restarted", "per day", "peaks", "memory low", "KV cache above 90%"):
        assert words in text
    assert main(["history", "--file", str(path), "--since", "8d", "--csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    sections = {r[0] for r in rows}
    assert {"sessions", "daily", "peaks", "events"} <= sections | {"section"}
    header = next(r for r in rows if r[:2] == ["section", "id"])
    assert "end_reason" in header


def test_a_week_reads_fast_enough_to_chart(week):
    """Not a timing test: the query plan uses the (minute, subject) key, not a scan of every row."""
    path, _, _ = week
    with HistoryStore.open(path, write=False) as s:
        plan = " ".join(str(r) for r in s.db.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM engine_minutes WHERE minute >= 1 AND minute < 2"))
        assert "PRIMARY KEY" in plan or "USING" in plan, plan


def test_bad_input_is_one_line(week, capsys, tmp_path):
    path, _, _ = week
    assert main(["history", "--file", str(path), "--since", "yesterday"]) != 0
    err = capsys.readouterr().err
    assert "--since" in err and "yesterday" in err and "Traceback" not in err
    assert main(["history", "--file", str(path), "--engine", "nosuch"]) != 0
    err = capsys.readouterr().err
    assert "nosuch" in err and url(0) in err
    assert main(["history", "--file", str(tmp_path / "none.sqlite")]) != 0
    assert "no history yet" in capsys.readouterr().err
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database at all" * 100)
    assert main(["history", "--file", str(garbage)]) != 0
    err = capsys.readouterr().err.strip()
    assert str(garbage) in err and len(err.splitlines()) == 1


def test_since_reads_durations_and_dates():
    now = 1_800_000_000.0
    assert parse_since("24h", now) == now - DAY
    assert parse_since("7d", now) == now - 7 * DAY
    assert parse_since("90m", now) == now - 5400
    assert parse_since("2026-11-20", now) == time.mktime((2026, 11, 20, 0, 0, 0, 0, 0, -1))


# -- what a monitor meets ---------------------------------------------------------------------------


def short(start: float, days: float = 0.1, **kw) -> Scenario:
    return Scenario(start=start, days=days, step=10.0, **kw)


def test_the_default_file_lives_in_the_data_dir(tmp_path):
    assert default_path() == tmp_path / "xdg" / "data" / "sparktop" / "history.sqlite"


def test_a_second_sparktop_reads_and_takes_over_when_the_first_stops(tmp_path):
    path = tmp_path / "h.sqlite"
    first = HistoryWriter(HistoryStore.open(path))
    clock = [0.0]
    second = HistoryWriter(HistoryStore.open(path), clock=replace(SYSTEM, now=lambda: clock[0]))
    assert first.store.writer and not second.store.writer
    assert "pid" in (second.status or "")
    start = time.time() - 3600
    run(short(start, days=600 / DAY), first.observe)
    run(short(start, days=600 / DAY), second.observe)  # the reader writes nothing
    first.close()
    with HistoryStore.open(path, write=False) as s:
        rows = s.db.execute("SELECT count(*) FROM node_minutes").fetchone()[0]
    assert rows > 0
    clock[0] = 120.0  # a minute on: the reader asks for the lock again, and gets it
    run(short(start + 600, days=600 / DAY), second.observe)
    assert second.store.writer
    second.close()
    with HistoryStore.open(path, write=False) as s:
        assert s.db.execute("SELECT count(*) FROM node_minutes").fetchone()[0] > rows
        assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_full_disk_pauses_history_and_loses_nothing_once_space_returns(tmp_path):
    path = tmp_path / "h.sqlite"
    writer = HistoryWriter(HistoryStore.open(path))
    start = time.time() - DAY
    run(short(start, days=0.02), writer.observe)
    db = writer.store.db
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own "database or disk is full"
    run(short(start + 0.02 * DAY, days=0.05), writer.observe)
    assert writer.paused == "history paused (disk full)"
    held = len(writer._rows)
    assert held > 0
    db.execute("PRAGMA max_page_count = 1073741823")
    run(short(start + 0.07 * DAY, days=0.02), writer.observe)
    assert writer.paused is None
    writer.close()
    with HistoryStore.open(path, write=False) as s:
        minutes = [m for (m,) in s.db.execute("SELECT DISTINCT minute FROM node_minutes ORDER BY minute")]
        texts = [t for (t,) in s.db.execute("SELECT text FROM events")]
    # Every minute of the simulation is there, those written after the disk had room again included.
    assert minutes == list(range(minutes[0], minutes[0] + len(minutes)))
    assert len(minutes) >= int(0.09 * DAY / 60) - 1
    assert "history resumed" in texts


def test_the_app_says_history_is_paused(tmp_path):
    writer = HistoryWriter(HistoryStore.open(tmp_path / "h.sqlite"))
    writer.paused = "history paused (disk full)"
    assert writer.status == "history paused (disk full)"


def test_a_clock_that_jumps_ahead_does_not_empty_the_file(tmp_path):
    path = tmp_path / "h.sqlite"
    mono = [0.0]
    writer = HistoryWriter(HistoryStore.open(path), retention_days=1.0, clock=replace(SYSTEM, now=lambda: mono[0]))
    start = time.time() - 0.5 * DAY

    def sink(event, state):
        mono[0] = event.t - start  # the monotonic clock runs with the data ...
        writer.observe(event, state)

    run(short(start, days=0.05), sink)
    jump = 400 * DAY

    def jumped(event, state):
        mono[0] = event.t - jump - start  # ... until the wall clock leaps a year ahead
        writer.observe(event, state)

    run(short(start + 0.05 * DAY + jump, days=0.05), jumped)
    writer.close()
    with HistoryStore.open(path, write=False) as s:
        old = s.db.execute("SELECT count(*) FROM node_minutes WHERE minute < ?",
                           (int((start + DAY) // 60),)).fetchone()[0]
        texts = [t for (t,) in s.db.execute("SELECT text FROM events WHERE kind = 'clock'")]
    assert old > 0  # the day before the jump is still there
    assert texts and "forward" in texts[0]


def test_a_clock_that_goes_back_rewrites_its_minutes_without_harm(tmp_path):
    path = tmp_path / "h.sqlite"
    writer = HistoryWriter(HistoryStore.open(path))
    start = time.time() - DAY
    run(short(start, days=0.02), writer.observe)
    run(short(start - 0.01 * DAY, days=0.02), writer.observe)  # back by a quarter of an hour
    writer.close()
    with HistoryStore.open(path, write=False) as s:
        assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        kinds = [k for (k,) in s.db.execute("SELECT kind FROM events")]
    assert "clock" in kinds


def test_retention_keeps_the_file_at_a_steady_size(tmp_path):
    path = tmp_path / "h.sqlite"
    writer = HistoryWriter(HistoryStore.open(path), retention_days=2.0)
    start = time.time() - 8 * DAY
    sizes = []
    for day in range(8):
        run(Scenario(start=start + day * DAY, days=1.0, step=60.0), writer.observe)
        writer.store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        sizes.append(path.stat().st_size)
    writer.close()
    with HistoryStore.open(path, write=False) as s:
        oldest = s.db.execute("SELECT MIN(minute) FROM engine_minutes").fetchone()[0] * 60
    assert oldest >= start + 8 * DAY - 2 * DAY - 1800  # two days kept (a prune every ten minutes)
    assert sizes[-1] <= sizes[3] * 1.1, sizes  # freed pages are reused: the file stops growing


def test_a_file_from_a_newer_sparktop_is_refused_in_one_line(tmp_path):
    path = tmp_path / "h.sqlite"
    HistoryStore.open(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with pytest.raises(HistoryError, match="newer sparktop"):
        HistoryStore.open(path)


def test_an_older_file_is_migrated_on_open_and_keeps_its_rows(tmp_path, monkeypatch):
    path = tmp_path / "h.sqlite"
    writer = HistoryWriter(HistoryStore.open(path))
    run(short(time.time() - DAY, days=0.01), writer.observe)
    writer.close()

    def v2(db):
        db.execute("ALTER TABLE sessions ADD COLUMN note TEXT")

    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, v2])
    with HistoryStore.open(path) as s:
        assert s.db.execute("SELECT value FROM meta").fetchone()[0] == "2"
        assert s.db.execute("SELECT count(*) FROM node_minutes").fetchone()[0] > 0
        assert "note" in [r[1] for r in s.db.execute("PRAGMA table_info(sessions)")]

    def broken(db):
        db.execute("ALTER TABLE sessions ADD COLUMN other TEXT")
        raise sqlite3.OperationalError("a step that fails")

    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, broken])
    with pytest.raises(HistoryError, match="a step that fails"):
        HistoryStore.open(path)
    monkeypatch.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:-1])
    with HistoryStore.open(path, write=False) as s:  # as it was: version 2, no half-made column
        assert s.db.execute("SELECT value FROM meta").fetchone()[0] == "2"
        assert "other" not in [r[1] for r in s.db.execute("PRAGMA table_info(sessions)")]


def test_a_session_left_open_goes_on_when_its_engine_is_the_same_process(tmp_path):
    path = tmp_path / "h.sqlite"
    start = time.time() - DAY
    writer = HistoryWriter(HistoryStore.open(path))
    run(short(start, days=0.02, engines_started=start - 60), writer.observe)
    writer.close()  # sparktop closed for an hour; the engines went on
    writer = HistoryWriter(HistoryStore.open(path))
    # The same processes an hour on: their counters went on meanwhile.
    run(short(start + 0.02 * DAY + 3600, days=0.02, initial_tokens=1e9, engines_started=start - 60),
        writer.observe)
    writer.close()
    with HistoryStore.open(path, write=False) as s:
        sessions = HistoryReader(s).sessions(start - 10, time.time())
    # One per engine, not one per sparktop: the first writer's "watch ended" went on in the second.
    assert len(sessions) == 2 and all(x.end_reason == "watch ended" for x in sessions)
    assert all(x.gen_tokens >= 1e9 for x in sessions)  # what they served while nobody watched included


def test_retention_and_history_are_settings(tmp_path, monkeypatch):
    from sparktop.errors import ConfigError
    from sparktop.settings import load_preferences

    f = tmp_path / "settings.yaml"
    f.write_text("history: false\nhistory_retention_days: 14\n")
    prefs = load_preferences(f)
    assert prefs.history is False and prefs.history_retention_days == 14
    f.write_text("currency: EUR\nhistory_retention_days: -3\n")
    with pytest.raises(ConfigError) as exc:
        load_preferences(f)
    assert "history_retention_days" in str(exc.value) and ":2" in str(exc.value)


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem that fills up: a 384 KiB tmpfs (needs root to mount; skipped without)."""
    with small_tmpfs(tmp_path / "small", "384k") as where:
        yield where


def test_a_real_full_disk_pauses_history_until_there_is_room(small_disk):
    import subprocess

    path = small_disk / "h.sqlite"
    writer = HistoryWriter(HistoryStore.open(path))
    start = time.time() - 10 * DAY
    day = 0
    while writer.paused is None and day < 30:
        run(Scenario(start=start + day * DAY / 4, days=0.25, step=60.0), writer.observe)
        day += 1
    assert writer.paused == "history paused (disk full)"
    held = len(writer._rows)
    assert held > 0
    run(Scenario(start=start + day * DAY / 4, days=0.05, step=60.0), writer.observe)  # the monitor goes on
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
    run(Scenario(start=start + day * DAY / 4 + 0.05 * DAY, days=0.05, step=60.0), writer.observe)
    assert writer.paused is None
    writer.close()
    with HistoryStore.open(path, write=False) as s:
        assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        minutes = [m for (m,) in s.db.execute("SELECT DISTINCT minute FROM node_minutes ORDER BY minute")]
    assert minutes == list(range(minutes[0], minutes[0] + len(minutes)))  # no minute lost
