"""History that never loses or leaks (issue 38), on a real SQLite file through
the real writer: a start with a wrong clock prunes nothing and says so, a
handover or a restart within a minute merges it, a damaged file and a full
disk are one line that says what to do (and the writer holds its rows
until it can write them), two paths to one file are one writer, and no
engine's credentials reach the file. The collector's own runs (real
`faketime`, a real full tmpfs, kill -9) are tests/integration/test_history_faults.py."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from sparktop.cli import main
from sparktop.history.collect import unit_text
from sparktop.history.store import HistoryStore
from sparktop.history.writer import HistoryWriter
from sparktop.observe.snapshot import EngineSnapshot, NodeSnapshot, Notice
from sparktop.observe.state import ClusterState
from tests.helpers.history_sim import Scenario, Truth, damage, events, fill, row_counts, run, url, write_days
from tests.helpers.small_disk import small_tmpfs

DAY = 86400.0


def texts(path: Path, kind: str | None = None) -> list[str]:
    with HistoryStore.open(path, write=False) as s:
        rows = s.db.execute("SELECT text FROM events" + (" WHERE kind = ?" if kind else "") + " ORDER BY t",
                            (kind,) if kind else ()).fetchall()
    return [t for (t,) in rows]


# -- a wrong clock at start ---------------------------------------------------------------


@pytest.mark.parametrize(("offset", "said"), [(40 * DAY, "40 days after"), (-3600.0, "min before")])
def test_a_start_with_a_wrong_clock_prunes_nothing_and_says_so(tmp_path, offset, said):
    """Two days of history ending now; then a writer whose clock is 40 days ahead (retention 30 days: the
    old writer's first prune emptied the file) or an hour behind. Every row is still there, and the
    history says the clock disagreed with it."""
    path = tmp_path / "h.sqlite"
    before = write_days(path)
    assert before["engine_minutes"] > 2000 and before["events"] > 0
    then = int(time.time() // 60)
    lines: list[str] = []
    writer = HistoryWriter(HistoryStore.open(path), retention_days=30.0, say=lines.append)
    run(Scenario(start=time.time() + offset, days=0.02, step=10.0), writer.observe)  # half an hour, pruned once
    writer.close()
    with HistoryStore.open(path, write=False) as s:
        old = {t: s.db.execute(f"SELECT count(*) FROM {t} WHERE minute <= ?", (then,)).fetchone()[0]
               for t in ("node_minutes", "engine_minutes")}
    after = row_counts(path)
    # Every row there was is there (an hour behind, the new minutes merge into rows of an hour ago).
    assert old == {"node_minutes": before["node_minutes"], "engine_minutes": before["engine_minutes"]}
    assert after["events"] > before["events"] and after["sessions"] >= before["sessions"]
    clock = texts(path, "clock")
    assert [t for t in clock if said in t and "history's newest row" in t], clock
    assert any(said in line for line in lines), lines


def test_a_clock_set_ahead_while_running_prunes_nothing_either(tmp_path):
    """Retention counts the time the writer measured: a jump of a year while running ages nothing."""
    path = tmp_path / "h.sqlite"
    before = write_days(path)
    writer = HistoryWriter(HistoryStore.open(path), retention_days=30.0)
    now = time.time()
    run(Scenario(start=now, days=0.01, step=10.0), writer.observe)
    run(Scenario(start=now + 365 * DAY, days=0.02, step=10.0), writer.observe)
    writer.close()
    with HistoryStore.open(path, write=False) as s:
        kept = s.db.execute("SELECT count(*) FROM engine_minutes WHERE minute < ?", (int(now // 60),)).fetchone()[0]
    assert kept == before["engine_minutes"]
    assert any("jumped forward" in t for t in texts(path, "clock"))


def test_retention_still_prunes_as_time_passes(tmp_path):
    """Four days written with a retention of two: the oldest go as the days pass, a gap or not."""
    path = tmp_path / "h.sqlite"
    start = time.time() - 4 * DAY
    writer = HistoryWriter(HistoryStore.open(path), retention_days=2.0)
    run(Scenario(start=start, days=4.0, step=60.0), writer.observe)
    writer.close()
    with HistoryStore.open(path, write=False) as s:
        oldest = s.db.execute("SELECT MIN(minute) FROM engine_minutes").fetchone()[0] * 60
    assert start + 2 * DAY - 1800 <= oldest <= start + 2 * DAY + 1800


# -- restarts and handovers within a minute --------------------------------------------------


def test_a_handover_within_a_minute_merges_it_and_the_day_holds_every_token(tmp_path):
    """One writer stops half-way through a minute (the minute in progress written), the next one takes
    the file and goes on in that minute: the minute's row holds both halves' samples, and the day's
    tokens are what the engines served while watched, to the token."""
    path = tmp_path / "h.sqlite"
    start = (time.time() - DAY) // 60 * 60
    split = start + 30 * 60 + 30  # half-way through the 31st minute
    truth = Truth()
    state = ClusterState(history=64)
    first = HistoryWriter(HistoryStore.open(path))
    second: HistoryWriter | None = None
    for event in events(Scenario(start=start, days=3600 / DAY, step=5.0), truth):
        state.apply(event)
        if second is None and event.t >= split:
            first.close()
            second = HistoryWriter(HistoryStore.open(path))
            assert second.store is not None and second.store.writer
        (second or first).observe(event, state)
    assert second is not None
    second.close()
    minute = int(split // 60)
    with HistoryStore.open(path, write=False) as s:
        samples = s.db.execute("SELECT m.samples FROM node_minutes m JOIN subjects n ON n.id = m.subject "
                               "WHERE n.key = 'spark-a' AND m.minute = ?", (minute,)).fetchone()[0]
        tokens = dict(s.db.execute("SELECT n.key, sum(m.gen_tokens) FROM engine_minutes m JOIN subjects n "
                                   "ON n.id = m.subject GROUP BY n.key").fetchall())
        sessions = s.db.execute("SELECT count(*) FROM sessions").fetchone()[0]
    assert samples == 12  # a poll every 5 s: six from each writer
    assert tokens == {url(0): pytest.approx(truth.gen_tokens[url(0)]),
                      url(1): pytest.approx(truth.gen_tokens[url(1)])}
    assert sessions == 2  # one per engine, not one per writer


def test_a_killed_writer_loses_seconds_not_its_minute(tmp_path):
    """The minute in progress goes to the file every few seconds (the monotonic clock's): a writer that
    is never closed (killed) has written it but for the last seconds, and the next one adds the rest."""
    path = tmp_path / "h.sqlite"
    mono = [0.0]
    from dataclasses import replace

    from sparktop.clock import SYSTEM

    clock = replace(SYSTEM, now=lambda: mono[0])
    start = (time.time() - DAY) // 60 * 60
    truth = Truth()
    state = ClusterState(history=64)
    first = HistoryWriter(HistoryStore.open(path), clock=clock)
    second: HistoryWriter | None = None
    kill_at = start + 20 * 60 + 40
    for event in events(Scenario(start=start, days=1800 / DAY, step=5.0), truth):
        mono[0] = event.t - start
        state.apply(event)
        if second is None and event.t >= kill_at:
            first.store.close()  # the kernel releases the lock of a killed process; nothing else is written
            second = HistoryWriter(HistoryStore.open(path), clock=clock)
        (second or first).observe(event, state)
    assert second is not None
    second.close()
    with HistoryStore.open(path, write=False) as s:
        samples = s.db.execute("SELECT m.samples FROM node_minutes m JOIN subjects n ON n.id = m.subject "
                               "WHERE n.key = 'spark-a' AND m.minute = ?", (int(kill_at // 60),)).fetchone()[0]
        tokens = s.db.execute("SELECT sum(gen_tokens) FROM engine_minutes").fetchone()[0]
    assert 12 - 3 <= samples < 12  # at most 15 s of samples lost, the minute not
    assert tokens == pytest.approx(sum(truth.gen_tokens.values()))  # not a token lost


# -- a damaged file ------------------------------------------------------------------------------


def test_history_of_a_damaged_file_is_one_line_that_says_to_move_it_aside(tmp_path, capsys):
    path = tmp_path / "h.sqlite"
    write_days(path, days=1.0)
    damage(path)
    with pytest.raises(sqlite3.DatabaseError), sqlite3.connect(path) as db:  # the damage is real
        db.execute("SELECT count(*), sum(gen_tokens) FROM engine_minutes").fetchone()
    code = main(["history", "--file", str(path), "--since", "3d"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{path} is damaged" in err
    assert f"move it aside: mv {path} {path}.damaged; sparktop starts a new one" in err


def test_a_damaged_file_is_never_written_and_a_new_one_starts_once_it_is_moved_aside(tmp_path):
    path = tmp_path / "h.sqlite"
    write_days(path, days=1.0, end=time.time() - 3600)
    damaged = damage(path)
    lines: list[str] = []
    writer = HistoryWriter.open(path, say=lines.append)
    assert writer.paused == "history paused (damaged file)" and writer.pause_reason == "damaged file"
    assert len(lines) == 1 and f"mv {path} {path}.damaged" in lines[0]
    start = (time.time() // 60 + 1) * 60  # from the next minute on: the pause, said at open, comes first
    run(Scenario(start=start, days=600 / DAY, step=10.0), writer.observe)  # ten minutes held in memory
    assert writer.paused and writer._rows
    path.rename(f"{path}.damaged")
    run(Scenario(start=start + 600, days=300 / DAY, step=10.0), writer.observe)  # a retry a minute on
    assert writer.paused is None
    assert lines[-1].startswith("history resumed")
    writer.close()
    assert Path(f"{path}.damaged").read_bytes() == damaged  # never written into
    with HistoryStore.open(path, write=False) as s:
        assert s.db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        minutes = [m for (m,) in s.db.execute("SELECT DISTINCT minute FROM node_minutes ORDER BY minute")]
    assert minutes == list(range(int(start // 60), int((start + 900) // 60)))  # the held ten minutes too
    assert texts(path, "history") == ["history paused (damaged file)", "history resumed"]


# -- two paths to one file -----------------------------------------------------------------------


def test_a_symlinked_file_has_one_writer(tmp_path):
    real = tmp_path / "data" / "h.sqlite"
    real.parent.mkdir()
    link = tmp_path / "h.sqlite"
    link.symlink_to(real)
    first = HistoryStore.open(link)
    second = HistoryStore.open(real)
    try:
        assert first.writer and not second.writer
        assert first.path == second.path == real
    finally:
        first.close()
        second.close()
    assert not Path(f"{link}.lock").exists()  # the lock is beside the real file


# -- credentials ------------------------------------------------------------------------------


def raw(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*") if p.is_file())


def test_an_engine_s_credentials_never_reach_the_file(tmp_path):
    path = tmp_path / "h.sqlite"
    key = "http://admin:hunter2-secret@spark-a:8000"
    t = time.time() - 600
    writer = HistoryWriter(HistoryStore.open(path))
    state = ClusterState(history=64)
    for i in range(30):
        e = EngineSnapshot(key=key, url=key, t=t + 5 * i, state="ready", model="m", engine="vLLM",
                           gen_tokens_total=100.0 * i, started_at=t - 60)
        state.apply(e)
        writer.observe(e, state)
        writer.observe(NodeSnapshot(name="spark-a", t=t + 5 * i, state="ok"), state)
    writer.observe(Notice(t=t + 160, subject="engine", key=key, kind="down", level="error",
                          text=f"engine failed: 401 for url '{key}/metrics'"), state)
    writer.observe(EngineSnapshot(key=key, url=key, t=t + 165, state="failed", error=f"401 for {key}/metrics"),
                   state)
    writer.observe(NodeSnapshot(name="spark-a", t=t + 500, state="ok"), state)  # its session ends, failed
    writer.close()
    assert b"hunter2" not in raw(path) and b"admin" not in raw(path)
    with HistoryStore.open(path, write=False) as s:
        assert list(s.subjects("engine").values()) == ["http://spark-a:8000"]
        (reason,) = s.db.execute("SELECT end_reason FROM sessions").fetchone()
    assert reason == "failed: 401 for http://spark-a:8000/metrics"
    assert "engine failed: 401 for url 'http://spark-a:8000/metrics'" in texts(path)


def test_credentials_an_older_sparktop_kept_are_scrubbed_when_the_file_is_opened(tmp_path):
    path = tmp_path / "h.sqlite"
    write_days(path, days=0.05)
    with sqlite3.connect(path) as db:  # as an older sparktop wrote them
        db.execute("UPDATE subjects SET key = 'http://admin:hunter2-secret@spark-a:8000' "
                   "WHERE key = 'http://spark-a:8000'")
        db.execute("INSERT INTO events (t, subject, kind, level, text) VALUES (1, 1, 'down', 'error', "
                   "'401 for http://admin:hunter2-secret@spark-a:8000/metrics')")
    assert b"hunter2" in raw(path)
    before = row_counts(path)
    HistoryStore.open(path).close()
    assert b"hunter2" not in raw(path)
    assert row_counts(path) == before  # nothing else changed
    with HistoryStore.open(path, write=False) as s:
        assert "http://spark-a:8000" in s.subjects("engine").values()


# -- a full disk at start --------------------------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path):
    """A real 1 MiB tmpfs, filled up (needs root to mount; skipped without); the filler's path."""
    with small_tmpfs(tmp_path / "small", "1m") as where:
        yield where


@pytest.mark.parametrize("existing", [False, True], ids=["new file", "existing file"])
def test_a_full_disk_at_start_pauses_history_and_writes_it_when_there_is_room(full_disk, existing):
    path = full_disk / "h.sqlite"
    before = write_days(path, days=0.01, end=time.time() - 3600) if existing else None
    filler = fill(full_disk)
    lines: list[str] = []
    writer = HistoryWriter.open(path, say=lines.append)  # no exception: a paused writer
    assert writer.paused == "history paused (disk full)" and writer.pause_reason == "disk full"
    assert len(lines) == 1 and str(path) in lines[0] and "free space" in lines[0]
    start = (time.time() // 60 + 1) * 60  # from the next minute on: the pause, said at open, comes first
    run(Scenario(start=start, days=600 / DAY, step=10.0), writer.observe)
    assert writer.paused
    filler.unlink()
    run(Scenario(start=start + 600, days=300 / DAY, step=10.0), writer.observe)
    assert writer.paused is None and lines[-1].startswith("history resumed")
    writer.close()
    assert writer.unwritten == 0
    after = row_counts(path)
    if before is not None:
        assert after["node_minutes"] == before["node_minutes"] + 30  # the old rows, and the new half hour's
    with HistoryStore.open(path, write=False) as s:
        minutes = [m for (m,) in s.db.execute("SELECT DISTINCT minute FROM node_minutes WHERE minute >= ? "
                                              "ORDER BY minute", (int(start // 60),))]
    assert minutes == list(range(int(start // 60), int((start + 900) // 60)))  # the minutes held, written
    assert texts(path, "history") == ["history paused (disk full)", "history resumed"]


def test_sessions_gathered_before_the_file_could_be_opened_are_the_file_s_sessions(full_disk):
    """The engines the last writer left serving are still the same processes when a writer that started
    on a full disk can finally open the file: one session each, not one per writer."""
    path = full_disk / "h.sqlite"
    engines_started = time.time() - 7200
    first = HistoryWriter(HistoryStore.open(path))
    run(Scenario(start=time.time() - 1800, days=600 / DAY, step=10.0, engines_started=engines_started),
        first.observe)
    first.close()
    before = row_counts(path)
    with HistoryStore.open(path, write=False) as s:
        started = dict(s.db.execute("SELECT id, started FROM sessions WHERE end_reason = 'watch ended'").fetchall())
    filler = fill(full_disk)
    writer = HistoryWriter.open(path)
    start = (time.time() // 60 + 1) * 60
    run(Scenario(start=start, days=300 / DAY, step=10.0, engines_started=engines_started, initial_tokens=1e6),
        writer.observe)
    filler.unlink()
    run(Scenario(start=start + 300, days=300 / DAY, step=10.0, engines_started=engines_started,
                 initial_tokens=2e6), writer.observe)
    writer.close()
    assert writer.paused is None
    with HistoryStore.open(path, write=False) as s:
        now_open = dict(s.db.execute("SELECT id, started FROM sessions WHERE end_reason = 'watch ended'").fetchall())
        tokens = [t for (t,) in s.db.execute("SELECT gen_tokens FROM sessions WHERE end_reason = 'watch ended'")]
    assert row_counts(path)["sessions"] == before["sessions"]
    assert now_open == started  # the same rows, from when the engines started
    assert all(t >= 2e6 for t in tokens)


def test_a_writer_that_stops_paused_says_what_it_could_not_write(full_disk):
    path = full_disk / "h.sqlite"
    fill(full_disk)
    lines: list[str] = []
    writer = HistoryWriter.open(path, say=lines.append)
    run(Scenario(start=time.time() - 600, days=300 / DAY, step=10.0), writer.observe)
    writer.close()
    assert writer.unwritten > 0
    assert lines[-1] == f"history: {writer.unwritten} minute rows held in memory were not written (disk full): " \
                        "they are lost"


# -- the systemd unit ----------------------------------------------------------------------------


def test_the_unit_fits_a_user_manager_and_carries_the_directories_it_was_installed_with():
    home = Path.home()
    text = unit_text(["/usr/bin/sparktop", "collect"],
                     {"XDG_DATA_HOME": str(home / "data"), "XDG_CONFIG_HOME": "/etc/xdg-alice",
                      "XDG_STATE_HOME": str(home / "my state"), "PATH": "/x"})
    lines = text.splitlines()
    assert not [line for line in lines if "network-online" in line or "docker" in line]  # not a user unit's
    assert "WantedBy=default.target" in lines
    assert "Environment=XDG_DATA_HOME=%h/data" in lines
    assert "Environment=XDG_CONFIG_HOME=/etc/xdg-alice" in lines
    assert 'Environment="XDG_STATE_HOME=%h/my state"' in lines
    assert "EnvironmentFile=-/etc/xdg-alice/sparktop/collect.env" in lines
    assert not [line for line in lines if "PATH" in line]
    plain = unit_text(["/usr/bin/sparktop", "collect"], {})
    assert "EnvironmentFile=-%h/.config/sparktop/collect.env" in plain.splitlines()
    assert "Environment=" not in plain
