"""History written for real: `sparktop collect` polling a twin engine in its
own process over HTTP, the app writing while it is open, and a writer
killed mid-write."""

from __future__ import annotations

import json
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
from tests.helpers.pilot import until
from tests.helpers.twin_process import start_twin_process


def _env() -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def _ask(url: str, n: int) -> int:
    """`n` short completions; the tokens the server says it generated."""
    tokens = 0
    for i in range(n):
        r = httpx.post(f"{url}/v1/completions", json={"model": "llama-3.1-8b", "prompt": f"hello {i}",
                                                        "max_tokens": 24}, timeout=30)
        r.raise_for_status()
        tokens += r.json()["usage"]["completion_tokens"]
    return tokens


def test_collect_writes_a_session_with_what_the_engine_served(tmp_path):
    twin, url = start_twin_process("llama-3.1-8b", speed=8)
    path = tmp_path / "history.sqlite"
    collect = None
    try:
        before = _ask(url, 3)  # before the collector: the engine's counters hold them, the session counts them
        collect = subprocess.Popen([sys.executable, "-m", "sparktop", "collect", "--engine", url, "-i", "0.5",
                                    "--file", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=_env())
        time.sleep(3)
        after = _ask(url, 4)
        time.sleep(3)  # the counters after the last request read at least once
        collect.send_signal(signal.SIGTERM)
        out, err = collect.communicate(timeout=30)
    finally:
        if collect is not None and collect.poll() is None:
            collect.kill()
        twin.terminate()
        twin.wait(10)
    assert collect.returncode == 0, err
    assert "writing history to" in out and "history written to" in out
    shown = subprocess.run([sys.executable, "-m", "sparktop", "history", "--file", str(path), "--json",
                            "--since", "1h"], capture_output=True, text=True, timeout=60, env=_env())
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    # Only the given engine's: this machine's own engines (found by the local node's probe) may be there too.
    (session,) = [x for x in found["sessions"] if x["url"] == url]
    assert session["url"] == url and session["open"]
    assert session["gen_tokens"] == before + after  # its own counter, since it started
    assert session["requests"] == 7
    assert "llama" in (session["model"] or "").lower()
    # The minutes hold what was served while it was watched: the four requests after the collector started.
    days = [d for d in found["daily"] if d["url"] == url]
    assert sum(d["gen_tokens"] for d in days) == after
    assert sum(d["requests"] for d in days) == 4


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
        proc = subprocess.Popen([sys.executable, "-m", "sparktop", "collect", "--file", str(path), "-i", "0.5"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        first.close()
    assert proc.returncode == 0, err
    assert f"is written by pid {os.getpid()}" in out


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
            await pilot.pause(2)
    finally:
        await poller.close()
        await cluster.stop_all()
    assert app.history is None  # closed with the app, the minute in progress written
    with HistoryStore.open(path, write=False) as s:
        reader = HistoryReader(s)
        sessions = reader.sessions(time.time() - 3600)
        nodes = reader.keys("node")
    assert {x.url for x in sessions} == set(urls)
    assert all(x.gen_tokens > 0 and x.open for x in sessions)
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
