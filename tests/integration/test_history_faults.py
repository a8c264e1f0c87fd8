"""`sparktop collect` meeting what a collector left alone for weeks meets
(issue 38), for real: a twin engine in its own process counting its tokens
exactly, the collector in its own process under real `faketime` (a wrong
clock), on a real full tmpfs, killed with SIGKILL, on a damaged file,
through a symlink, given an engine URL with credentials. Each fault is one
line that says what to do, no traceback, and nothing is lost: the rows
there were are there, and the day's tokens are the engine's."""

from __future__ import annotations

import glob
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparktop.history.store import HistoryStore
from tests.conftest import free_port
from tests.helpers.collector import Collector, ask, collect_env, history_json, served, wait_served
from tests.helpers.history_sim import NODES, damage, fill, row_counts, url, write_days
from tests.helpers.small_disk import small_tmpfs
from tests.helpers.twin_process import start_twin_process

REQUESTS = "sparktop_engine_requests_finished_total"


@pytest.fixture
def engine():
    twin, url = start_twin_process("llama-3.1-8b", speed=8)
    yield url
    twin.terminate()
    twin.wait(10)


def event_texts(path: Path, kind: str) -> list[str]:
    with HistoryStore.open(path, write=False) as s:
        return [t for (t,) in s.db.execute("SELECT text FROM events WHERE kind = ? ORDER BY t", (kind,))]


def wait_written(path: Path, url: str, timeout: float = 60.0) -> None:
    """Until the collector has committed a minute row of `url` (the minute in progress goes every 15 s)."""
    deadline = time.monotonic() + timeout
    while True:
        with HistoryStore.open(path, write=False) as s:
            subject = s.subject("engine", url)
            if s.db.execute("SELECT 1 FROM engine_minutes WHERE subject = ?", (subject,)).fetchone():
                return
        assert time.monotonic() < deadline, f"the collector wrote no minute of {url} in {timeout:g} s"
        time.sleep(0.5)


def no_traceback(err: str) -> None:
    assert "Traceback" not in err, err


# -- a wrong clock at start --------------------------------------------------------------------------


def libfaketime() -> str:
    """faketime's library, preloaded into the collector itself (the `faketime` program would stand between
    the test and the collector's signals: it does not pass SIGTERM on)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")) + \
        sorted(glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    if not found:
        pytest.skip("needs faketime (apt-get install faketime)")
    return found[0]


@pytest.mark.parametrize(("offset", "said"), [("+40d", "40 days after"), ("-1h", "min before")])
def test_a_collector_started_with_a_wrong_clock_prunes_nothing_and_says_so(tmp_path, engine, offset, said):
    """Two days of history ending now; a collector started under `faketime` 40 days ahead (its first prune
    emptied the file: engine minute rows 53 -> 2 in the issue) or an hour behind. Every row there was is
    still there once it has written its own, and the clock's disagreement is an event and a line."""
    faketime = libfaketime()
    path = tmp_path / "history.sqlite"
    before = write_days(path)
    then = int(time.time() // 60)
    port = free_port()
    collect = Collector(tmp_path, "--engine", engine, "-i", "0.5", "--file", str(path), "--serve-metrics",
                        f"127.0.0.1:{port}", env=collect_env(LD_PRELOAD=faketime, FAKETIME=offset))
    try:
        line = collect.wait_for(said)
        ask(engine, 2)
        wait_served(port, REQUESTS, engine, 2)
        wait_written(path, engine)  # its first commit, and its first prune with it
        code, out, err = collect.stop()
    finally:
        collect.stop()
    assert code == 0, err
    no_traceback(err)
    assert line.startswith(f"{path}: the clock reads") and "history's newest row" in line
    with HistoryStore.open(path, write=False) as s:
        # The rows of the two days' nodes and engines (an hour behind, the collector writes its own engine's and
        # this machine's rows among them).
        old = {t: s.db.execute(f"SELECT count(*) FROM {t} WHERE minute <= ? AND subject IN (SELECT id FROM "
                               f"subjects WHERE key IN (?, ?, ?, ?))", (then, *NODES, url(0), url(1))).fetchone()[0]
               for t in ("node_minutes", "engine_minutes")}
    after = row_counts(path)
    assert old == {"node_minutes": before["node_minutes"], "engine_minutes": before["engine_minutes"]}
    assert after["events"] > before["events"] and after["sessions"] == before["sessions"] + 1
    assert [t for t in event_texts(path, "clock") if said in t and "history's newest row" in t]


# -- restarts -------------------------------------------------------------------------------------------


def test_kill_9_restarts_keep_every_token_in_the_day(tmp_path, engine):
    """Five collectors killed with SIGKILL one after another (some before they read the last requests,
    some after), a sixth stopped as systemd stops it: the day's tokens are the engine's count of what it
    served since it started (it started just before the first collector: what it served before that
    collector's first poll is in that minute), to the token, in one session, and the session says the same.
    (The issue: 89,062 of 125,801.)"""
    path = tmp_path / "history.sqlite"
    port = free_port()
    args = ("--engine", engine, "-i", "0.5", "--file", str(path), "--serve-metrics", f"127.0.0.1:{port}")
    before = ask(engine, 2)  # before any collector: in the session (the engine's counter) and the first minute
    served_total, requests = 0, 2
    for round_ in range(6):
        collect = Collector(tmp_path, *args, name=f"collect{round_}")
        try:
            collect.wait_for("writing history to")
            wait_served(port, REQUESTS, engine, requests)  # it has read the engine
            served_total += ask(engine, 3)
            requests += 3
            if round_ % 2 == 0:
                wait_served(port, REQUESTS, engine, requests)  # read, not yet committed (or partly)
            if round_ < 5:
                collect.kill()
                no_traceback(collect.stderr())
            else:
                wait_served(port, REQUESTS, engine, requests)
                code, _, err = collect.stop()
                assert code == 0, err
        finally:
            collect.stop()
    found = history_json(path)
    (session,) = [x for x in found["sessions"] if x["url"] == engine]
    assert session["gen_tokens"] == before + served_total
    days = [d for d in found["daily"] if d["url"] == engine]
    assert sum(d["gen_tokens"] for d in days) == before + served_total == session["gen_tokens"]
    assert sum(d["requests"] for d in days) == requests == 20


# -- two collectors, one file --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_collector_taking_over_keeps_every_token_of_the_minute_it_took_over(tmp_path, engine):
    """A second collector waits while the first writes; the first stops (its minute in progress written),
    requests are served while nobody writes, the second takes the file over (within a minute: often in the
    minute the first one left, which it merges): one session, and the day's tokens are the engine's count
    since the first collector read it (the issue: the second one's partial minute replaced the first
    one's); the day's and the session's tokens are one count (the engine started within a session's gap of
    the first poll: what it served before it is in the first minute). Slow: a waiting collector asks for the
    file once a minute."""
    path = tmp_path / "history.sqlite"
    port, port2 = free_port(), free_port()
    before = ask(engine, 2)
    first = Collector(tmp_path, "--engine", engine, "-i", "0.5", "--file", str(path), "--serve-metrics",
                      f"127.0.0.1:{port}", name="first")
    second = None
    try:
        first.wait_for("writing history to")
        wait_served(port, REQUESTS, engine, 2)
        second = Collector(tmp_path, "--engine", engine, "-i", "0.5", "--file", str(path), "--serve-metrics",
                           f"127.0.0.1:{port2}", name="second")
        second.wait_for("is written by")
        tokens = ask(engine, 3)
        wait_served(port, REQUESTS, engine, 5)
        code1, _, err1 = first.stop()
        tokens += ask(engine, 3)  # while nobody writes
        second.wait_for("the sparktop that wrote it stopped", timeout=120)
        tokens += ask(engine, 3)
        wait_served(port2, REQUESTS, engine, 11)
        code2, _, err2 = second.stop()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert (code1, code2) == (0, 0), err1 + err2
    found = history_json(path)
    (session,) = [x for x in found["sessions"] if x["url"] == engine]
    assert session["gen_tokens"] == before + tokens
    assert sum(d["gen_tokens"] for d in found["daily"] if d["url"] == engine) == before + tokens
    assert sum(d["requests"] for d in found["daily"] if d["url"] == engine) == 11


def test_two_collectors_through_a_symlink_are_one_writer(tmp_path, engine):
    real = tmp_path / "data" / "history.sqlite"
    real.parent.mkdir()
    link = tmp_path / "history.sqlite"
    link.symlink_to(real)
    port = free_port()
    first = Collector(tmp_path, "--engine", engine, "-i", "0.5", "--file", str(link), "--serve-metrics",
                      f"127.0.0.1:{port}", name="first")
    second = None
    try:
        first.wait_for("writing history to")
        second = Collector(tmp_path, "--engine", engine, "-i", "0.5", "--file", str(real), name="second")
        said = second.wait_for("is written by")
        ask(engine, 2)
        wait_served(port, REQUESTS, engine, 2)
        code2, _, err2 = second.stop()
        code1, _, err1 = first.stop()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert (code1, code2) == (0, 0), err1 + err2
    assert said.startswith(f"{real} is written by pid {first.proc.pid}")
    sessions = [x for x in history_json(real)["sessions"] if x["url"] == engine]
    assert len(sessions) == 1


# -- credentials ----------------------------------------------------------------------------------------


def test_an_engine_url_s_credentials_never_reach_the_file(tmp_path, engine):
    path = tmp_path / "history.sqlite"
    port = free_port()
    secret = engine.replace("http://", "http://watcher:s3cret-pw@")
    collect = Collector(tmp_path, "--engine", secret, "-i", "0.5", "--file", str(path), "--serve-metrics",
                        f"127.0.0.1:{port}")
    try:
        collect.wait_for("writing history to")
        ask(engine, 2)
        deadline = time.monotonic() + 60
        while 2 not in (served(port, REQUESTS, secret), served(port, REQUESTS, engine)):
            assert time.monotonic() < deadline, "the collector never read the engine"
            time.sleep(0.2)
        code, _, err = collect.stop()
    finally:
        collect.stop()
    assert code == 0, err
    files = [p for p in tmp_path.glob("history.sqlite*") if p.is_file()]
    assert files and not [p for p in files if b"s3cret-pw" in p.read_bytes()]
    # Named without its credentials; its two requests counted (in one session, or two where a poll under load
    # timed out and the engine read down for a moment: the split is the writer's, the file is what is checked).
    sessions = history_json(path)["sessions"]
    assert {x["url"] for x in sessions} == {engine} and sum(x["requests"] for x in sessions) == 2


# -- a damaged file --------------------------------------------------------------------------------------


def damaged_history(tmp_path: Path) -> tuple[Path, bytes]:
    path = tmp_path / "history.sqlite"
    write_days(path, days=1.0, end=time.time() - 3600)
    return path, damage(path)


def test_history_on_a_damaged_file_is_one_line_that_says_to_move_it_aside(tmp_path):
    path, _ = damaged_history(tmp_path)
    done = subprocess.run([sys.executable, "-m", "sparktop", "history", "--file", str(path), "--since", "3d"],
                          capture_output=True, text=True, timeout=60, env=collect_env())
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"sparktop: {path} is damaged (")
    assert done.stderr.rstrip().endswith(f"move it aside: mv {path} {path}.damaged; sparktop starts a new one")


@pytest.mark.slow
def test_a_collector_on_a_damaged_file_serves_metrics_and_starts_a_new_file_once_it_is_moved_aside(
        tmp_path, engine):
    """Slow: the collector looks for the file moved aside once a minute (the writer's RETRY_S)."""
    path, damaged = damaged_history(tmp_path)
    port = free_port()
    collect = Collector(tmp_path, "--engine", engine, "-i", "0.5", "--file", str(path), "--serve-metrics",
                        f"127.0.0.1:{port}")
    try:
        line = collect.wait_for("history paused (damaged file)")
        served_tokens = ask(engine, 3)
        wait_served(port, REQUESTS, engine, 3)  # metrics served, the engine read, while history is paused
        path.rename(f"{path}.damaged")  # as the line says
        resumed = collect.wait_for("history resumed", timeout=120)
        code, out, err = collect.stop()
    finally:
        collect.stop()
    assert code == 0, err
    no_traceback(err)
    assert line.rstrip().endswith(f"move it aside: mv {path} {path}.damaged; sparktop starts a new one")
    assert "writing history to" not in out
    assert resumed.startswith("history resumed: ") and str(path) in resumed
    assert hashlib.sha256(Path(f"{path}.damaged").read_bytes()).digest() == hashlib.sha256(damaged).digest()
    found = history_json(path)
    assert sum(d["gen_tokens"] for d in found["daily"] if d["url"] == engine) == served_tokens
    assert event_texts(path, "history") == ["history paused (damaged file)", "history resumed"]


# -- a full disk ----------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A real 2 MiB tmpfs (needs root to mount; skipped without)."""
    with small_tmpfs(tmp_path / "small", "2m") as where:
        yield where


def test_a_collector_started_on_a_full_disk_keeps_serving_metrics(tmp_path, small_disk, engine):
    """A new file on a full disk (the issue: a traceback, no metrics, a restart every 10 s under systemd):
    a line that says so, metrics served, and at a stop with the disk still full, one line that says what
    was not written and a non-zero exit."""
    path = small_disk / "history.sqlite"
    fill(small_disk)
    port = free_port()
    collect = Collector(tmp_path, "--engine", engine, "-i", "0.5", "--file", str(path), "--serve-metrics",
                        f"127.0.0.1:{port}")
    try:
        line = collect.wait_for("history paused (disk full)")
        collect.wait_for("serving Prometheus metrics")
        ask(engine, 2)
        wait_served(port, REQUESTS, engine, 2)
        assert collect.proc.poll() is None
        time.sleep(1.0)  # a few polls into a minute row held in memory
        code, out, err = collect.stop()
    finally:
        collect.stop()
    assert line.startswith(f"history paused (disk full): {path}: the disk is full") and "free space" in line
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"sparktop: {path}: ") and "minute rows were never written (disk full)" in err


@pytest.mark.slow
def test_a_collector_started_on_a_full_disk_writes_its_history_when_there_is_room(tmp_path, small_disk, engine):
    """An existing file on a full disk (the issue: "not a readable history file (disk I/O error)"): the
    collector serves metrics, holds its minutes, and writes them when space returns, with the pause and
    the resumption as events; the rows there were are kept. Slow: it tries again once a minute."""
    path = small_disk / "history.sqlite"
    before = write_days(path, days=0.05, end=time.time() - 3600)
    filler = fill(small_disk)
    port = free_port()
    collect = Collector(tmp_path, "--engine", engine, "-i", "0.5", "--file", str(path), "--serve-metrics",
                        f"127.0.0.1:{port}")
    try:
        collect.wait_for("history paused (disk full)")
        tokens = ask(engine, 3)
        wait_served(port, REQUESTS, engine, 3)
        filler.unlink()
        collect.wait_for("history resumed", timeout=120)
        code, _, err = collect.stop()
    finally:
        collect.stop()
    assert code == 0, err
    no_traceback(err)
    after = row_counts(path)
    assert after["node_minutes"] >= before["node_minutes"] and after["events"] >= before["events"] + 2
    found = history_json(path, "3h")
    assert sum(d["gen_tokens"] for d in found["daily"] if d["url"] == engine) == tokens
    assert event_texts(path, "history") == ["history paused (disk full)", "history resumed"]
