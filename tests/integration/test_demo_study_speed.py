"""A study on the demo's twin nodes at --speed 4 compares like with like: it
records the speed, the recipe's format and the stack; its predictions are
`predict`'s for the recipe scaled by the speed (exactly), and the report says
the speed it ran at. That the twins serve those figures is held exactly on
simulated time (test_twin_predicts); how close a real-time study comes to
them is measured, not asserted: tests/benchmarks/demo_study_speed.py.
Real time, a few levels of one layout: about a minute."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.test_rate_study import a_port_free_on_both_nodes

pytestmark = pytest.mark.slow


def test_a_demo_study_at_speed_4_predicts_its_own_twins(tmp_path):
    """A real-time study on the demo's twin nodes (a launch, three levels of two runs, the stop) and its
    report: about a minute on two cores."""
    env = dict(os.environ)  # the isolated XDG dirs of this test (conftest), for the subprocess too
    done = subprocess.run(
        [sys.executable, "-m", "sparktop", "study", "gpt-oss-120b", "--demo", "--speed", "4", "--topologies",
         "solo", "-c", "1,4,16", "--runs", "2", "--port", str(a_port_free_on_both_nodes()), "--yes"],
        capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    studies = tmp_path / "xdg" / "data" / "sparktop" / "studies"
    (study_dir,) = [p for p in studies.iterdir() if (p / "study.json").exists()]
    study = json.loads((study_dir / "study.json").read_text())
    assert study["speed"] == 4 and study["quant"] == "mxfp4-spark"
    rep = subprocess.run([sys.executable, "-m", "sparktop", "report", str(study_dir), "--json"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert rep.returncode == 0, rep.stderr
    md = (study_dir / "report" / "report.md").read_text()
    assert "twins at ×4: figures 4 times a GB10's; predictions scaled the same" in md
    (topology,) = study["topologies"]
    assert sorted(map(int, topology["predicted"])) == [1, 4, 16]
    # The study's predictions are predict's for the recipe at the twins' pace, to the printed digit.
    # (the demo's nodes run the vllm-openai image: its stack, named)
    said = subprocess.run([sys.executable, "-m", "sparktop", "predict", "gpt-oss-120b", "-c", "1,4,16", "--pp",
                           str(study["pp"]), "--tg", str(study["tg"]), "--stack", study["stack"], "--speed", "4",
                           "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert said.returncode == 0, said.stderr
    rows = {r["concurrency"]: r for r in json.loads(said.stdout)["rows"] if r["topology"] == "solo"}
    for c, pred in topology["predicted"].items():
        assert pred["tg_tps_total"] == pytest.approx(rows[int(c)]["decode_tps"], rel=1e-6), c
        assert pred["ttft_ms_mean"] == pytest.approx(rows[int(c)]["ttft_ms"], rel=1e-6), c
