"""History written for real: `sparktop collect` polling a twin engine in its
own process over HTTP, the app writing while it is open, and a writer
killed mid-write. A collector is followed by what it says (its output, the
figures it serves) and stopped once it has read what the test needs, not
after a fixed time."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from sparktop.history.collect import unit_text
from sparktop.history.query import HistoryReader
from sparktop.history.store import HistoryStore
from sparktop.history.writer import HistoryWriter
from sparktop.ui.app import SparktopApp
from tests.helpers.cluster import load, poller_for, start_cluster
from tests.helpers.collector import Collector, collect_env, history_json, wait_served
from tests.helpers.collector import ask as _ask
from tests.helpers.pilot import until
from tests.helpers.twin_process import start_twin_process


def _env() -> dict:
    return collect_env()


def test_collect_writes_a_session_with_what_the_engine_served(tmp_path):
    """The collector's state is followed through the figures it serves to Prometheus (what it applied to
    its state, it has written to the history's minute), so it is stopped once it has read the engine
    before the test's four requests and after them."""
    from tests.conftest import free_port

    twin, url = start_twin_process("llama-3.1-8b", speed=8)
    path = tmp_path / "history.sqlite"
    port = free_port()
    collect = None
    try:
        before = _ask(url, 3)  # before the collector: the engine's counters hold them, the session counts them
        collect = Collector(tmp_path, "--engine", url, "-i", "0.5", "--file", str(path),
                            "--serve-metrics", f"127.0.0.1:{port}")
        collect.wait_for("writing history to")
        wait_served(port, "sparktop_engine_requests_finished_total", url, 3)  # it has read the three
        after = _ask(url, 4)
        wait_served(port, "sparktop_engine_requests_finished_total", url, 7)  # ... and the four after
        code, out, err = collect.stop()
    finally:
        if collect is not None:
            collect.stop()
        twin.terminate()
        twin.wait(10)
    assert code == 0, err
    assert "writing history to" in out and "history written to" in out
    found = history_json(path)
    # Only the given engine's: this machine's own engines (found by the local node's probe) may be there too.
    (session,) = [x for x in found["sessions"] if x["url"] == url]
    assert session["url"] == url and session["end_reason"] == "watch ended"  # serving when collect stopped
    assert session["gen_tokens"] == before + after  # its own counter, since it started
    assert session["requests"] == 7
    assert "llama" in (session["model"] or "").lower()
    # The engine started just before the collector: what it served since is in the first minute too, so
    # the days and the session say the same.
    days = [d for d in found["daily"] if d["url"] == url]
    assert sum(d["gen_tokens"] for d in days) == before + after == session["gen_tokens"]
    assert sum(d["requests"] for d in days) == 7
    assert session["unwatched_tokens"] == 0


def test_collect_serves_what_it_reads_to_prometheus(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from tests.conftest import free_port

    twin, url = start_twin_process("llama-3.1-8b", speed=8)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sparktop", "collect", "--engine", url, "-i", "0.5", "--file",
                             str(tmp_path / "h.sqlite"), "--serve-metrics", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        _ask(url, 2)
        samples: dict = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "sparktop_engine_up" not in samples:
            time.sleep(0.5)
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                continue
            samples = {f.name: f.samples for f in text_string_to_metric_families(body)}
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        twin.terminate()
        twin.wait(10)
    assert proc.returncode == 0, err
    assert f"serving Prometheus metrics on http://127.0.0.1:{port}/metrics" in out
    up = [x for x in samples["sparktop_engine_up"] if x.labels.get("engine") == url]
    assert up and up[0].value == 1


def test_a_second_collector_reads_and_says_who_writes(tmp_path):
    path = tmp_path / "history.sqlite"
    first = HistoryWriter(HistoryStore.open(path))
    try:
        collect = Collector(tmp_path, "--file", str(path), "-i", "0.5")
        said = collect.wait_for("is written by")
        code, out, err = collect.stop()
    finally:
        first.close()
    assert code == 0, err
    assert f"is written by pid {os.getpid()}" in said


async def test_collect_keeps_its_history_on_the_clock_it_is_given(tmp_path, twin):
    """What `sparktop collect` builds (its poller and its writer) reads the one clock it is given: here a
    clock moved by hand, set in November 2023. The minutes written are that clock's, and three minutes it
    moves (in steps, between polls) are time passing, not a jump of the machine's clock."""
    from sparktop.history.collect import collect
    from sparktop.settings import Inventory
    from tests.helpers.monitor_sim import EPOCH, HandClock
    from tests.helpers.recording_proxy import RecordingProxy
    from tests.helpers.wait import eventually

    server = await twin("llama-3.1-8b", speed=20)
    proxy = await RecordingProxy(server.url).start()  # counts the collector's scrapes
    hand = HandClock()
    path = tmp_path / "history.sqlite"
    stop = asyncio.Event()
    said: list[str] = []
    run = asyncio.create_task(collect(Inventory(nodes=[]), [proxy.url], interval=0.2, path=str(path),
                                      say=said.append, stop=stop, clock=hand.clock))
    try:
        await eventually(lambda: len(proxy.scrapes) >= 2 or run.done(), timeout=30, what="the engine read twice")
        # Three minutes in two steps, with reads between: a snapshot stamped before a step can reach the writer
        # after it (the queue between them), and a 180 s step at once would read as a jump of its own. Time
        # that passes is steps smaller than the writer's CLOCK_JUMP_S.
        for _ in range(2):
            hand.advance(90.0)
            read = len(proxy.scrapes)
            await eventually(lambda read=read: len(proxy.scrapes) >= read + 2 or run.done(), timeout=30,
                             what="the engine read twice more")
        stop.set()
        assert await asyncio.wait_for(run, 30) == 0
    finally:
        stop.set()
        await proxy.stop()
    with HistoryStore.open(path, write=False) as s:
        minutes = {m for (m,) in s.db.execute("SELECT minute FROM engine_minutes")}
        clock = [t for (t,) in s.db.execute("SELECT text FROM events WHERE kind = 'clock'")]
        started = s.db.execute("SELECT started FROM sessions").fetchall()
    first, later = int((EPOCH + 1000.0) // 60), int((EPOCH + 1180.0) // 60)
    assert {first, later} <= minutes <= set(range(first, later + 1)), (minutes, first, later)
    assert [t for t in clock if "jumped" in t] == []
    # The hand clock reads 2023; the twin engine says it started now: the clock is behind, and it is said.
    assert len([t for t in clock if "the engine says it started" in t and "is behind" in t]) == 1, clock
    assert [EPOCH + 1000.0 <= t <= EPOCH + 1180.0 for (t,) in started] == [True]
    assert said[-1] == f"history written to {path}"


KILLED = textwrap.dedent("""
    import sys, time
    from sparktop.history.store import HistoryStore
    from sparktop.history.writer import HistoryWriter
    from tests.helpers.history_sim import Scenario, run

    writer = HistoryWriter(HistoryStore.open(sys.argv[1]))
    flush = writer.flush

    def reported(now=None):
        flush(now)
        if not writer._rows:  # committed: say up to which minute
            done = writer.store.db.execute("SELECT MAX(minute) FROM node_minutes").fetchone()[0]
            print(done, flush=True)

    writer.flush = reported
    run(Scenario(start=time.time() - 60 * 86400, days=60, step=5.0), writer.observe)
""")


def test_a_writer_killed_mid_write_leaves_a_sound_file_with_every_minute_it_committed(tmp_path):
    path = tmp_path / "history.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(path)], stdout=subprocess.PIPE, text=True,
                            env=_env(), cwd=os.getcwd())
    committed = []
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while time.monotonic() < deadline and len(committed) < 200:
        line = proc.stdout.readline()
        if not line:
            break
        if line.strip() != "None":
            committed.append(int(line))
    proc.kill()  # SIGKILL: no cleanup, whatever it was doing
    proc.wait(10)
    assert len(committed) >= 200, "the writer did not get going"
    with HistoryStore.open(path) as s:  # the lock died with the process: this one writes
        assert s.writer
        assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        newest = s.db.execute("SELECT MAX(minute) FROM node_minutes").fetchone()[0]
        minutes = s.db.execute("SELECT COUNT(DISTINCT minute) FROM node_minutes").fetchone()[0]
        first = s.db.execute("SELECT MIN(minute) FROM node_minutes").fetchone()[0]
    assert newest >= committed[-1]  # nothing it said was written is lost
    assert minutes == newest - first + 1  # and no minute is missing in between


@pytest.mark.slow
async def test_the_app_writes_history_while_it_is_open(tmp_path):
    cluster, urls = await start_cluster(tmp_path / "lab")
    path = tmp_path / "history.sqlite"
    poller = poller_for(cluster)
    await poller.start()
    app = SparktopApp(poller, history=HistoryWriter(HistoryStore.open(path)))
    try:
        async with load(urls), app.run_test(size=(120, 40)) as pilot:
            def serving():
                return all((e.gen_tokens_total or 0) > 0 for e in app.state.engines.values()) and \
                    len(app.state.engines) == 2
            await until(pilot, serving, timeout=30)
    finally:
        await poller.close()
        await cluster.stop_all()
    assert app.history is None  # closed with the app, the minute in progress written
    with HistoryStore.open(path, write=False) as s:
        reader = HistoryReader(s)
        sessions = reader.sessions(time.time() - 3600)
        nodes = reader.keys("node")
    # The cluster's engines (another test's twin on these addresses would be watched, and written, too).
    ours = [x for x in sessions if x.url in urls]
    assert {x.url for x in ours} == set(urls)
    assert all(x.gen_tokens > 0 and x.end_reason in ("watch ended", "stopped", "unreachable") for x in ours)
    assert set(nodes) == {"spark-a", "spark-b"}


def test_the_unit_runs_the_collector_with_its_options_quoted_for_systemd(tmp_path):
    text = unit_text(["/opt/spark top/bin/sparktop", "collect", "--inventory", "/etc/my cluster.yaml",
                      "--serve-metrics", "127.0.0.1:9109"])
    exec_line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_line == ('ExecStart="/opt/spark top/bin/sparktop" collect --inventory "/etc/my cluster.yaml" '
                         "--serve-metrics 127.0.0.1:9109")
    assert "Restart=on-failure" in text and "WantedBy=default.target" in text


def test_collect_install_writes_the_unit_and_says_how_to_enable_it(tmp_path):
    env = {**_env(), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    done = subprocess.run([sys.executable, "-m", "sparktop", "collect", "--install", "--interval", "2"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    unit = tmp_path / "config" / "systemd" / "user" / "sparktop-collect.service"
    assert unit.exists()
    exec_line = next(line for line in unit.read_text().splitlines() if line.startswith("ExecStart="))
    assert exec_line.endswith(" collect --interval 2")
    assert "systemctl --user enable --now sparktop-collect" in done.stdout
