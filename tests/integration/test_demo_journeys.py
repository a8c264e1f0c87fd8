"""The demo as a cluster the whole CLI can address, walked as a user walks it from another shell.

`sparktop demo --no-wait` leaves its twin nodes running under a light load and writes an inventory that
`--inventory demo` names; `status`, `sweep`, `collect` and `history` reach the demo's nodes through it, a
sweep gets its node to itself (the load steps aside), the demo's history outlives its nodes, and `--stop`
leaves nothing for `--inventory demo` to find."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sparktop.twin.cluster import loopback_aliases_work

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not loopback_aliases_work(), reason="needs 127.0.0.2 and 127.0.0.3")]


def sparktop(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparktop", *args], capture_output=True, text=True,
                          env=dict(os.environ), timeout=timeout)


def until(check, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.5)


def test_the_demo_left_running_is_a_cluster_every_command_reaches(tmp_path):
    """Takes about a minute: a demo's two twins start, a sweep, a collector and `history` run against them
    as separate processes, and the demo starts a second time to show its history kept."""
    started = sparktop("demo", "--no-wait", "--speed", "8")
    assert started.returncode == 0, started.stderr
    assert "sparktop status --inventory demo" in started.stdout
    try:
        # status from another shell sees the demo's two nodes and its two engines, and the load moving them.
        def busy():
            doc = json.loads(sparktop("status", "--inventory", "demo", "--json", "--seconds", "2").stdout)
            # Both engines serving, and placed in their containers (on a loaded machine a node's first answer,
            # containers and all, can miss status's window: a second status has it).
            return doc if all((e["gen_tokens_total"] or 0) > 0 and e["container"] for e in doc["engines"]) else None

        doc = until(busy, what="the demo's load on both engines")
        assert [n["node"] if "node" in n else n["name"] for n in doc["nodes"]] == ["spark-a", "spark-b"]
        assert sorted(e["url"] for e in doc["engines"]) == ["http://127.0.0.2:8000", "http://127.0.0.3:8000"]
        assert {e["state"] for e in doc["engines"]} == {"ready"}
        # Each node runs the recipe as `sparktop launch gpt-oss-120b --topology solo` starts it (its image, flags
        # and prediction labels), so the demo serves what `sparktop predict gpt-oss-120b` says.
        assert all(e["container"].startswith("sparktop-gpt-oss-120b-solo-") for e in doc["engines"]), doc["engines"]
        # Under load, each engine's prediction is for the requests it runs (a count, not a measured rate).
        assert all(e["predicted"] is None or e["predicted"]["concurrency"] >= 1 for e in doc["engines"])

        # A sweep of spark-a gets the node to itself: the load steps aside, no level sees foreign requests.
        # Plain `status` (this machine's inventory) says where the demo's nodes are.
        plain = sparktop("status", "--seconds", "1")
        assert plain.returncode == 0 and "`sparktop status --inventory demo`" in plain.stderr, plain.stderr
        # The endpoint found by the inventory the demo names, as its hint says; two engines serve, so the node.
        which = sparktop("sweep", "--inventory", "demo", "-c", "1")
        assert which.returncode != 0 and "Traceback" not in which.stderr
        assert "2 engines serve on demo" in which.stderr and "--node NAME" in which.stderr, which.stderr
        swept = sparktop("sweep", "--inventory", "demo", "--node", "spark-a", "-c", "1,2", "--runs", "2", "--pp",
                         "64", "--tg", "16", "--json", "--results", str(tmp_path / "results"))
        assert swept.returncode == 0, swept.stderr
        assert "at http://127.0.0.2:8000 on spark-a" in swept.stderr
        run = json.loads(swept.stdout)
        # What it swept is recorded with where it runs: the demo's solo engine on spark-a.
        assert (run["topology"], run["nodes"]) == ("solo", ["spark-a"]), {k: run.get(k) for k in ("topology", "nodes")}
        levels = run["levels"]
        assert [lv["concurrency"] for lv in levels] == [1, 2]
        assert all(not lv.get("contaminated") and not lv.get("remeasured") and not lv.get("foreign_requests")
                   for lv in levels), levels

        # A collector writes the demo's history where the demo's inventory says; history reads it back.
        collector = subprocess.Popen([sys.executable, "-m", "sparktop", "collect", "--inventory", "demo"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            until(lambda: json.loads(sparktop("history", "--inventory", "demo", "--json").stdout or "{}")
                  .get("sessions"), what="a serving session in the demo's history")
        finally:
            collector.send_signal(signal.SIGTERM)
            collector.wait(30)
        sessions = json.loads(sparktop("history", "--inventory", "demo", "--json").stdout)["sessions"]
        assert {s["url"] for s in sessions} >= {"http://127.0.0.2:8000", "http://127.0.0.3:8000"}
    finally:
        stopped = sparktop("demo", "--stop")
    assert stopped.returncode == 0, stopped.stderr
    # Stopped: `--inventory demo` names no cluster, in one line.
    gone = sparktop("status", "--inventory", "demo")
    assert gone.returncode != 0 and "Traceback" not in gone.stderr
    assert "no demo cluster is running" in gone.stderr.strip().splitlines()[-1]
    assert "--inventory demo" not in sparktop("status", "--seconds", "1").stderr
    # Its history is still there for `history --inventory demo`, with no demo running, and plain `history`
    # (the user's own, empty) points to it.
    after = json.loads(sparktop("history", "--inventory", "demo", "--json").stdout)
    assert {s["url"] for s in after["sessions"]} >= {"http://127.0.0.2:8000", "http://127.0.0.3:8000"}
    own = sparktop("history")
    assert own.returncode != 0 and "`sparktop history --inventory demo`" in own.stderr
    # The next demo starts its nodes afresh but keeps the history of the last.
    again = sparktop("demo", "--no-wait", "--speed", "8")
    try:
        assert again.returncode == 0, again.stderr
        kept = json.loads(sparktop("history", "--inventory", "demo", "--json", "--since", "1h").stdout)
        assert {s["url"] for s in kept["sessions"]} >= {"http://127.0.0.2:8000", "http://127.0.0.3:8000"}
    finally:
        sparktop("demo", "--stop")
