"""Issue 37, journey 4: `sparktop demo --no-wait` runs no app, yet its history is written (a collector it
starts), and `sparktop demo --stop` stops that collector after it saw the engines go: `sparktop history
--inventory demo` then lists the demo's sessions ended, none "serving"."""

from __future__ import annotations

import json

import pytest

from sparktop.demo import COLLECT_PID, _is_collector, demo_root
from sparktop.twin.cluster import loopback_aliases_work
from tests.integration.test_demo_journeys import sparktop, until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not loopback_aliases_work(), reason="needs 127.0.0.2 and 127.0.0.3")]

URLS = {"http://127.0.0.2:8000", "http://127.0.0.3:8000"}


def history() -> dict:
    done = sparktop("history", "--inventory", "demo", "--json", "--since", "1h")
    return json.loads(done.stdout or "{}")


def test_a_demo_left_running_writes_its_history_and_stop_ends_it():
    started = sparktop("demo", "--no-wait", "--speed", "8")
    assert started.returncode == 0, started.stderr
    assert "sparktop history --inventory demo" in started.stdout
    pid = int((demo_root() / COLLECT_PID).read_text())
    try:
        assert _is_collector(pid)

        def serving():
            sessions = [s for s in history().get("sessions", []) if s["url"] in URLS]
            return sessions if {s["url"] for s in sessions} == URLS and all(s["open"] for s in sessions) else None

        until(serving, timeout=90.0, what="the demo's two engines serving in its history, with no app open")
    finally:
        stopped = sparktop("demo", "--stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "history collector stopped" in stopped.stdout
    assert not _is_collector(pid)  # stopped with the demo, not left behind
    assert not (demo_root() / COLLECT_PID).exists()
    sessions = [s for s in history()["sessions"] if s["url"] in URLS]
    assert {s["url"] for s in sessions} == URLS
    # Ended as the collector saw it go (removed: "stopped"; or not answering: "unreachable"), never "serving".
    assert all(not s["open"] and s["end_reason"] in ("stopped", "unreachable") for s in sessions), sessions
