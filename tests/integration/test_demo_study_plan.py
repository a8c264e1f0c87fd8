"""`sparktop study --demo` as a new user meets it: its plan leaves out what cannot run here and says why,
offers a quicker variant that runs, and its report's "run it again" line runs the same study."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from sparktop.study.report import reproduce
from sparktop.study.state import Study, TopologyState


def study(*args: str, path: str) -> subprocess.CompletedProcess:
    # No `--yes` and no terminal: the plan is printed, nothing starts.
    return subprocess.run([sys.executable, "-m", "sparktop", "study", *args], capture_output=True, text=True,
                          env={**os.environ, "PATH": path}, stdin=subprocess.DEVNULL, timeout=120)


def test_without_litellm_the_demo_study_leaves_the_router_layouts_out_up_front_and_offers_a_quick_look():
    bare = os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin")
                           if not os.path.exists(os.path.join(p, "litellm")))
    planned = study("gpt-oss-120b", "--demo", "--speed", "4", path=bare)
    lines = planned.stdout.splitlines()
    assert lines[0] == ("left out: shuffle, least-busy (replicas behind LiteLLM, and this machine has no `litellm`: "
                        "pip install 'litellm[proxy]' to measure them)")
    rows = [line.split()[1] for line in lines if line.strip()[:1].isdigit()]
    assert rows == ["solo", "cluster-ray", "cluster-mp"]
    quick = next(line for line in lines if line.startswith("a quicker look: ")).removeprefix("a quicker look: ")
    assert quick == "sparktop study gpt-oss-120b -c 1,8 --runs 2 --demo --speed 4"
    # The quick look is a command that plans: two levels, two runs.
    again = study(*shlex.split(quick)[2:], path=bare)
    assert "c1,8 · 2 runs" in again.stdout, again.stdout
    assert "a quicker look" not in again.stdout
    assert "not starting without confirmation" in again.stderr


def test_a_demo_studys_run_it_again_line_is_the_demo_at_its_pace():
    done = Study(id="x", recipe="gpt-oss-120b", model="openai/gpt-oss-120b", topologies=[TopologyState("solo")],
                 levels=[1, 8], runs=2, inventory="demo", speed=4.0)
    line = reproduce(done)
    assert "--demo --speed 4" in line and "--inventory" not in line
