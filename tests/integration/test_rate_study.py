"""A study of request rates on the demo's twin nodes: each layout searched
for its highest rate meeting an SLO, the report ranking them by it. The
shuffle layout runs the real LiteLLM proxy (the lab's install, put on PATH
as a user's would be) in front of two solo engines.

What each layout's search finds is this machine's capacity: twins at five
times a Spark's speed and LiteLLM, all on its CPU, measured on real time
(here LiteLLM saturates near 30 requests/s, well before the engines). So
the test asserts what the report must say whatever those figures are: every
layout searched, each verdict its rate's own figures, each max rate the
highest that passed with the first that failed just above it, and the best
the layout with the highest. The figures themselves are printed, not
asserted. It takes minutes (three layouts started, each searched over up to
twelve 3-second levels) because it runs the study end to end as a user
would, with a real router between the client and the twins.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from sparktop.bench.sweep import SweepSettings
from tests.e2e.lab import ensure_litellm, free_port

pytestmark = pytest.mark.slow

LAYOUTS = {"solo", "cluster-mp", "shuffle"}
SLO = {"ttft_p95": 0.5, "itl_p95": 0.1}
START = 8.0  # the search's first rate


def a_port_free_on_both_nodes() -> int:
    """The engines' API port, free on both of the demo's addresses (the default 8000 may be another test's;
    the router's, ray's and the rendezvous' ports are still the inventory's defaults)."""
    for _ in range(50):
        port = free_port("127.0.0.2")
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.3", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no port free on both 127.0.0.2 and 127.0.0.3")


def test_a_rate_study_finds_the_max_rate_of_each_layout_and_reports_goodput(tmp_path):
    """A rate study over every layout on the demo's twins: each layout is launched (a real LiteLLM for the
    routers) and its rate searched by steps of --duration 3 s of load; the steps are what take the time."""
    env = dict(os.environ)  # the isolated XDG dirs of this test (conftest), for the subprocess too
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "litellm").symlink_to(ensure_litellm())  # only the proxy, not its Python, on PATH
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        [sys.executable, "-m", "sparktop", "study", "llama-3.1-8b", "--demo", "--speed", "5", "--topologies",
         ",".join(sorted(LAYOUTS)), "--rate", f"{START:g}", "--slo", "ttft_p95=500ms,itl_p95=100ms",
         "--find-max-rate", "--duration", "3", "--pp", "256", "--tg", "32", "--port",
         str(a_port_free_on_both_nodes()), "--yes"],
        capture_output=True, text=True, timeout=1500, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    studies = tmp_path / "xdg" / "data" / "sparktop" / "studies"
    (study_dir,) = [p for p in studies.iterdir() if (p / "study.json").exists()]
    rep = subprocess.run([sys.executable, "-m", "sparktop", "report", str(study_dir), "--json"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert rep.returncode == 0, rep.stderr
    md = (study_dir / "report" / "report.md").read_text()
    rates = json.loads(rep.stdout)["rates"]
    print({name: (m["rate"], m["failed_at"]) for name, m in rates["max_rates"].items()})
    check_rate_report(rates, md)


def check_rate_report(rates: dict, md: str) -> None:
    """What the report of this study must say, whatever rates this machine served: `rates` is
    `sparktop report --json`'s, `md` the report.md."""
    assert rates["slo"] == ["ttft_p95=500ms", "itl_p95=100ms"]
    assert set(rates["max_rates"]) == LAYOUTS
    tolerance = SweepSettings(endpoint="").rate_tolerance
    for name, m in rates["max_rates"].items():
        # The rows are the levels the search measured, each verdict its own figures'.
        rows = {r["rate"]: r["values"][name] for r in rates["rows"] if r["values"].get(name) is not None}
        tried = [rate for rate, _, _ in m["tried"]]
        assert tried and tried[0] == START and set(tried) == set(rows), (name, tried, sorted(rows))
        for rate, ok, why in m["tried"]:
            v = rows[rate]
            assert ok == v["meets"], (name, rate, why, v)
            if v["meets"]:  # met: each percentile within its limit, the queue steady, the client on schedule
                assert all(v[k] is not None and v[k] <= limit for k, limit in SLO.items()), (name, rate, v)
                assert not v["saturated"] and not v["behind"], (name, rate, v)
            assert v["goodput"] <= v["request_throughput"]  # those that met the SLO are some of those served
            assert (why is None) == ok  # a failed level says why
        # The max rate is the highest that passed; the first that failed is the lowest above it, within the
        # search's tolerance of it (when the search found both ends).
        passed = [r for r, v in rows.items() if v["meets"]]
        failed = [r for r, v in rows.items() if not v["meets"] and (not passed or r > max(passed))]
        assert m["rate"] == (max(passed) if passed else None), (name, m)
        assert m["failed_at"] == (min(failed) if failed else None), (name, m)
        if m["rate"] is not None and m["failed_at"] is not None:
            assert m["rate"] < m["failed_at"] <= (1 + tolerance) * m["rate"], (name, m)
            assert m["share"] == rows[m["rate"]]["share"]
    found = {n: m["rate"] for n, m in rates["max_rates"].items() if m["rate"]}
    best = rates["best"]
    if found:
        # The layout with the highest max rate (either, when two tie).
        assert best["rate"] == max(found.values()) and found[best["topology"]] == best["rate"], (best, found)
    else:
        assert best is None
    assert "Requests per second within the SLO" in md and "Goodput per rate" in md
    for name, m in rates["max_rates"].items():  # each layout's max rate in its row of the table
        cell = f"{m['rate']:.3g}/s" if m["rate"] else "none met it"
        assert f"| {name} | {cell} |" in md, name
