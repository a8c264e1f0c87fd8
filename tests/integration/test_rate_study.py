"""A study of request rates on the demo's twin nodes: each layout searched
for its highest rate meeting an SLO, the report ranking them by it. The
shuffle layout runs the real LiteLLM proxy (the lab's install, put on PATH
as a user's would be) in front of two solo engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.lab import ensure_litellm

pytestmark = pytest.mark.slow


def test_a_rate_study_finds_the_max_rate_of_each_layout_and_reports_goodput(tmp_path):
    env = dict(os.environ)  # the isolated XDG dirs of this test (conftest), for the subprocess too
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "litellm").symlink_to(ensure_litellm())  # only the proxy, not its Python, on PATH
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        [sys.executable, "-m", "sparktop", "study", "llama-3.1-8b", "--demo", "--speed", "5", "--topologies",
         "solo,cluster-mp,shuffle", "--rate", "8", "--slo", "ttft_p95=500ms,itl_p95=100ms", "--find-max-rate",
         "--duration", "3", "--pp", "256", "--tg", "32", "--yes"],
        capture_output=True, text=True, timeout=1500, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    studies = tmp_path / "xdg" / "data" / "sparktop" / "studies"
    (study_dir,) = [p for p in studies.iterdir() if (p / "study.json").exists()]
    rep = subprocess.run([sys.executable, "-m", "sparktop", "report", str(study_dir), "--json"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert rep.returncode == 0, rep.stderr
    data = json.loads(rep.stdout)
    rates = data["rates"]
    assert set(rates["max_rates"]) == {"solo", "cluster-mp", "shuffle"}
    for name, m in rates["max_rates"].items():
        # A bracket per layout: the highest rate that met the SLO, the lowest that did not, close together.
        assert m["rate"] and m["failed_at"] and m["rate"] < m["failed_at"] <= 1.25 * m["rate"], (name, m)
        at_max = next(r["values"][name] for r in rates["rows"] if r["rate"] == m["rate"])
        assert at_max["meets"] and at_max["ttft_p95"] <= 0.5
        # Physics: what was served is what was asked, no more.
        assert at_max["request_throughput"] <= 1.1 * m["rate"]
    # Not asserted: shuffle above solo. At the twin's speed 5 the engines serve five times a Spark's rate
    # while LiteLLM on this machine's CPU does not: here the router saturates near 30 requests/s, and the
    # report shows it (its queue grew, TTFT p95 near a second) rather than the engines' limit.
    print({name: (m["rate"], m["failed_at"]) for name, m in rates["max_rates"].items()})
    best = rates["best"]
    assert best["topology"] == max(rates["max_rates"], key=lambda n: rates["max_rates"][n]["rate"])
    md = (study_dir / "report" / "report.md").read_text()
    assert "Requests per second within the SLO" in md and "Goodput per rate" in md
