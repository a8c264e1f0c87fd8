"""A sweep says which node it measures; other load on this machine (the demo's) reads it and steps aside."""

from __future__ import annotations

import json
import subprocess
import sys

from sparktop.measuring import host_of, measured_hosts, measured_now, measuring, state_dir


def test_a_sweep_marks_its_node_while_it_runs_and_not_after():
    assert measured_now() == []
    with measuring("http://127.0.0.2:8000/v1"):
        assert measured_hosts() == {"127.0.0.2"}
        assert [e["url"] for e in measured_now()] == ["http://127.0.0.2:8000/v1"]
    assert measured_now() == []


def test_the_mark_of_a_sweep_that_died_counts_for_nothing():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folder = state_dir() / "measuring"
    folder.mkdir(parents=True)
    (folder / "gone.json").write_text(json.dumps({"url": "http://127.0.0.3:8000", "pid": int(dead.stdout)}))
    assert measured_hosts() == set()


def test_a_node_is_its_host_whatever_the_form_of_the_url():
    assert host_of("http://127.0.0.2:8000/v1") == host_of("127.0.0.2:30000") == "127.0.0.2"
    assert host_of("http://Spark-A:8000") == "spark-a"
