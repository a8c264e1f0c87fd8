"""A study in the lab: every topology launched over real OpenSSH, swept,
stopped and verified, unattended; killed and resumed; failures recorded and
passed over; foreign traffic caught (see lab.py for the lab)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_lab_launch import MODEL, RECIPE, assert_nothing_left, sparktop
from tests.helpers.signals import ctrl_c_as_in_a_terminal

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SMALL = ["-c", "1,2", "--runs", "2", "--pp", "128", "--tg", "16"]


def studies_root(lab) -> Path:
    return Path(lab.env()["XDG_DATA_HOME"]) / "sparktop" / "studies"


def only_study(lab, before: set[str] | None = None) -> Path:
    found = [p for p in studies_root(lab).iterdir() if (p / "study.json").exists() and p.name not in (before or set())]
    assert len(found) == 1, found
    return found[0]


def started(lab, before: set[str]) -> Path | None:
    """The study begun since `before`, once its first study.json is there (its directory is made a moment
    before that file is written, atomically)."""
    found = [studies_root(lab) / d for d in existing(lab) - before if (studies_root(lab) / d / "study.json").exists()]
    return found[0] if found else None


def existing(lab) -> set[str]:
    root = studies_root(lab)
    return {p.name for p in root.iterdir()} if root.exists() else set()


def read(study_dir: Path) -> dict:
    return json.loads((study_dir / "study.json").read_text())


def requests_by_batch(run_dir: Path) -> Counter:
    """(level, run, attempt) -> requests written."""
    out: Counter = Counter()
    for line in (run_dir / "requests.jsonl").read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            out[(d["level"], d["run"], d.get("attempt", 1))] += 1
    return out


def complete_batches(run_dir: Path) -> Counter:
    """(level, run) -> how many complete attempts exist on disk."""
    out: Counter = Counter()
    for (level, run, _attempt), n in requests_by_batch(run_dir).items():
        if n >= level:
            out[(level, run)] += 1
    return out


def test_a_study_of_every_topology_completes_and_leaves_nothing_running(lab):
    """Every topology launched, swept and stopped over real SSH, unattended: five launches (two with a real
    LiteLLM) in one test, as a user's study runs them."""
    inventory = lab.inventory()
    lab.put_weights(MODEL)
    before = existing(lab)
    began = time.monotonic()
    done = sparktop(lab, "study", RECIPE, "--topologies", "all", *SMALL, "--inventory", str(inventory), "--yes",
                    "--timeout", "120", timeout=900)
    wall = time.monotonic() - began
    assert done.returncode == 0, done.stdout + done.stderr
    study_dir = only_study(lab, before)
    study = read(study_dir)
    names = [t["name"] for t in study["topologies"]]
    assert names == ["solo", "cluster-ray", "cluster-mp", "shuffle", "least-busy"]
    assert study["status"] == "done"
    for t in study["topologies"]:
        assert t["status"] == "done", t
        assert t["contaminated"] == [], t  # an idle lab never raises a false alarm
        assert t["commands"] and t["startup_s"] is not None
        batches = complete_batches(study_dir / "runs" / t["run"])
        assert sorted(batches) == [(c, r) for c in (1, 2) for r in (1, 2)]
        assert set(batches.values()) == {1}
        # A router's layout is measured through its router, as its users call it.
        meta = json.loads((study_dir / "runs" / t["run"] / "meta.json").read_text())
        port = 4000 if t["name"] in ("shuffle", "least-busy") else 8000
        assert meta["endpoint"] == f"http://127.0.0.2:{port}", (t["name"], meta["endpoint"])
    assert_nothing_left(lab)
    print(f"lab study wall time: {wall:.0f} s")

    # The report's winners are compare's winners for the same runs.
    report = json.loads(sparktop(lab, "report", study_dir.name, "--json").stdout)
    runs = [str(study_dir / "runs" / t["run"]) for t in study["topologies"]]
    compared = json.loads(sparktop(lab, "compare", *runs, "--json").stdout)
    ours = _report_winners(report)
    assert ours and ours == _compare_winners(compared, {key for key, _ in ours})
    listed = json.loads(sparktop(lab, "studies", "--json").stdout)
    assert any(s["id"] == study_dir.name and s["state"] == "done" for s in listed)


def _report_winners(report: dict) -> dict:
    """(metric, concurrency) -> (winner, tie) as the report names them."""
    return {(t["key"], row["concurrency"]): (row["winner"]["name"], row["winner"]["tie"])
            for t in report["tables"] for row in t["rows"]}


def _compare_winners(compared: dict, keys: set[str]) -> dict:
    return {(w["metric"], w["concurrency"]): (w["winner"], w["tie"]) for w in compared["winners"]
            if w["metric"] in keys}


def test_a_killed_study_resumes_without_measuring_anything_twice(lab):
    """A study of all five topologies, killed in its third and resumed: every topology's launch, sweep and stop
    over real SSH, some of them twice."""
    inventory = lab.inventory()
    lab.put_weights(MODEL)
    before = existing(lab)
    proc = subprocess.Popen([sys.executable, "-m", "sparktop", "study", RECIPE, "--topologies", "all",
                             "-c", "1,2,4", "--runs", "2", "--pp", "128", "--tg", "64",
                             "--inventory", str(inventory), "--yes", "--timeout", "120"],
                            env=lab.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 600
        study_dir = None
        while time.time() < deadline:
            if study_dir is None:
                study_dir = started(lab, before)
            if study_dir is not None:
                t = read(study_dir)["topologies"][2]
                requests = study_dir / "runs" / (t["run"] or "-") / "requests.jsonl"
                if t["status"] == "sweeping" and requests.exists() and \
                        sum(requests_by_batch(requests.parent).values()) >= 3:
                    break
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        else:
            pytest.fail("the third topology never got to its sweep")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert study_dir is not None
    third = read(study_dir)["topologies"][2]
    assert any(lab.containers(h) for h in lab.hosts), "the kill should have left the engine running"
    listed = json.loads(sparktop(lab, "studies", "--json").stdout)
    assert any(s["id"] == study_dir.name and s["state"] == "interrupted" for s in listed)

    resumed = sparktop(lab, "study", "--resume", study_dir.name, "--yes", timeout=900)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "removed" in resumed.stdout and "left running" in resumed.stdout
    study = read(study_dir)
    assert [t["status"] for t in study["topologies"]] == ["done"] * 5
    assert study["topologies"][2]["run"] == third["run"]  # the same run, resumed
    for t in study["topologies"]:
        batches = complete_batches(study_dir / "runs" / t["run"])
        assert sorted(batches) == [(c, r) for c in (1, 2, 4) for r in (1, 2)], t["name"]
        assert set(batches.values()) == {1}, (t["name"], batches)  # no batch measured twice
    assert_nothing_left(lab)


def test_failures_are_recorded_and_the_study_goes_on(lab, tmp_path):
    """A study of three topologies (one that cannot start), each launched and swept three runs over real SSH."""
    inventory = lab.inventory()
    lab.put_weights(MODEL)
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    # Solo gets too little memory to hold the weights: it cannot start.
    (recipes / "tight.yaml").write_text(
        "name: tight\nmodel: nvidia/Llama-3.1-8B-Instruct-FP8\nserved_model_name: llama-3.1-8b\n"
        "card: llama-3.1-8b\nvllm:\n  max_model_len: 4096\n"
        "topologies:\n  solo:\n    vllm:\n      gpu_memory_utilization: 0.05\n")
    before = existing(lab)
    proc = subprocess.Popen([sys.executable, "-m", "sparktop", "study", "tight", "--recipes", str(recipes),
                             "--topologies", "solo,cluster-mp,shuffle", "-c", "1,2,4", "--runs", "3",
                             "--pp", "128", "--tg", "64", "--inventory", str(inventory), "--yes", "--timeout", "120"],
                            env=lab.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = threading.Event()

    def kill_cluster_engine():
        # The TP=2 engine dies mid-sweep.
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            study_dir = started(lab, before)
            if study_dir is not None:
                t = read(study_dir)["topologies"][1]
                if t["status"] == "sweeping" and t["run"]:
                    time.sleep(1.0)
                    for host in lab.hosts:
                        for name in lab.containers(host):
                            lab.sh(host, f"docker kill {name}")
                    killed.set()
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_cluster_engine, daemon=True)
    killer.start()
    out, _ = proc.communicate(timeout=900)
    killer.join(5)
    assert killed.is_set(), out
    study = read(only_study(lab, before))
    solo, cluster, shuffle = study["topologies"]
    assert solo["status"] == "failed" and solo["reason"], solo
    assert "memory" in (solo["reason"] + " ".join(solo["lines"])).lower(), solo
    assert cluster["status"] == "failed", cluster
    assert "during the sweep" in cluster["reason"] or "exited" in cluster["reason"], cluster
    assert shuffle["status"] == "done", shuffle
    assert "solo failed" in out and "cluster-mp failed" in out
    assert_nothing_left(lab)


def test_foreign_traffic_during_a_level_is_caught(lab):
    """A study over real SSH with someone else's requests sent during its sweep: one launch, a sweep the guard
    has to catch in the act, and its stop."""
    inventory = lab.inventory()
    lab.put_weights(MODEL)
    before = existing(lab)
    stop = threading.Event()

    def foreign():
        # Someone else's requests, once the study's sweep has begun.
        while not stop.is_set():
            study_dir = started(lab, before)
            if study_dir is not None:
                t = read(study_dir)["topologies"][0]
                if t["status"] == "sweeping" and t["stage"].startswith("sweeping c2"):
                    break
            time.sleep(0.1)
        while not stop.is_set():
            try:
                httpx.post("http://127.0.0.2:8000/v1/chat/completions", timeout=30, json={
                    "model": "llama-3.1-8b", "messages": [{"role": "user", "content": "foreign " * 50}],
                    "max_tokens": 48, "ignore_eos": True})
            except httpx.HTTPError:
                time.sleep(0.1)

    thread = threading.Thread(target=foreign, daemon=True)
    thread.start()
    try:
        done = sparktop(lab, "study", RECIPE, "--topologies", "solo", "-c", "1,2", "--runs", "3", "--pp", "128",
                        "--tg", "64", "--inventory", str(inventory), "--yes", "--timeout", "120", timeout=600)
    finally:
        stop.set()
        thread.join(10)
    assert done.returncode == 0, done.stdout + done.stderr
    [t] = read(only_study(lab, before))["topologies"]
    assert t["contaminated"] == [2], t
    assert "contaminated" in done.stdout
    assert os.path.exists(only_study(lab, before) / "runs" / t["run"])
    assert_nothing_left(lab)


def test_ctrl_c_stops_what_the_study_started_and_leaves_it_resumable(lab):
    inventory = lab.inventory()
    lab.put_weights(MODEL)
    before = existing(lab)
    proc = subprocess.Popen([sys.executable, "-m", "sparktop", "study", RECIPE, "--topologies", "solo,cluster-mp",
                             "-c", "1,2,4", "--runs", "3", "--pp", "128", "--tg", "64", "--inventory", str(inventory),
                             "--yes", "--timeout", "120"],
                            env=lab.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=ctrl_c_as_in_a_terminal)
    deadline = time.time() + 300
    while time.time() < deadline:
        study_dir = started(lab, before)
        if study_dir is not None and read(study_dir)["topologies"][0]["status"] == "sweeping":
            break
        assert proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "resume with `sparktop study --resume" in out
    assert "Traceback" not in out
    study = read(only_study(lab, before))
    assert study["status"] == "interrupted"
    assert study["topologies"][0]["status"] != "done"
    assert_nothing_left(lab)
