"""Issue 37, journey 2: what a new user meets with `sparktop study` on the demo.

A study started while a demo runs stops before launching anything and says how out; a study whose
layouts all failed reads "failed"; its report lists only the commands that ran and says what stopped
the rest; `--inventory demo` leaves out what `--demo` leaves out; `--demo` alone studies the demo's
model; "run it again" names a catalog recipe by its name; `sparktop studies` says when, as a time ago;
the demo's plan is timed as the twins start and run.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from sparktop.launch.catalog import find_recipe
from sparktop.settings import DEMO_INVENTORY, Inventory, Node, demo_inventory_path, shipped_recipes_dir
from sparktop.study import report
from sparktop.study.planning import (
    DEMO_RECIPE,
    DEMO_STARTUP_SPEED,
    DEMO_STOP_S,
    STOP_S,
    left_out_here,
    new_study,
)
from sparktop.study.state import DONE, FAILED, PENDING, Study, TopologyState, studies_dir

BARE = os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin")
                       if not os.path.exists(os.path.join(p, "litellm")))


def sparktop(*args: str, path: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    # No `--yes` and no terminal: a study prints its plan and starts nothing.
    env = {**os.environ, **({"PATH": path} if path else {})}
    return subprocess.run([sys.executable, "-m", "sparktop", *args], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=timeout)


# -- 1. a study on the demo's nodes while a demo runs there --------------------------------------------------------


def test_a_demo_study_while_a_demo_runs_stops_before_launching_and_says_how_out():
    started = sparktop("demo", "--no-wait")
    assert started.returncode == 0, started.stderr
    try:
        refused = sparktop("study", "gpt-oss-120b", "--demo", "--yes")
        assert refused.returncode != 0
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith("sparktop: a demo is running on the demo's nodes (spark-a: ")
        assert "`sparktop demo --stop`" in line and "`sparktop study gpt-oss-120b --demo`" in line
        assert "1/" not in refused.stdout and "preflight" not in refused.stdout  # no layout was tried
        # The same on `--inventory demo`: its layouts would meet the demo's engines on the same ports.
        also = sparktop("study", "gpt-oss-120b", "--inventory", "demo", "--yes")
        assert also.returncode != 0 and "a demo is running on the demo's nodes" in also.stderr
        # Nothing was launched or recorded: the demo's own engines still run, and no study exists.
        assert sparktop("studies").stdout.startswith("No studies yet")
        status = sparktop("status", "--inventory", "demo")
        assert "gpt-oss-120b" in status.stdout, status.stdout + status.stderr
    finally:
        stopped = sparktop("demo", "--stop")
    assert "Stopped the demo cluster (2 containers removed" in stopped.stdout


# -- 2. a study whose layouts failed: `studies` and the report -----------------------------------------------------


def _study(name: str, statuses: list[str], created: float) -> Study:
    tops = []
    for i, status in enumerate(statuses):
        t = TopologyState(["solo", "cluster-ray", "cluster-mp"][i], status=status, launch_id=f"lid{i}",
                          commands=[f"docker run -d --name engine-{name}-{i} vllm/vllm-openai"])
        if status == FAILED:
            t.reason = "preflight failed on spark-a: ports: port 8000 already in use on 127.0.0.2"
        tops.append(t)
    study = Study(id=name, recipe="gpt-oss-120b", model="gpt-oss-120b", topologies=tops, levels=[1, 8],
                  status="done", created=created, ended=created + 60)
    study.path = studies_dir() / name
    study.save()
    return study


def test_studies_says_failed_when_every_layout_failed_and_counts_the_failures_of_a_mix():
    now = time.time()
    _study("all-failed", [FAILED, FAILED, FAILED], now - 146)
    _study("some-failed", [DONE, FAILED, DONE], now - 3 * 3600)
    _study("all-done", [DONE, DONE, DONE], now - 30)
    out = sparktop("studies").stdout
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert rows["all-failed"].split()[1] == "failed"
    assert "done, 1 of 3 failed" in rows["some-failed"]
    assert rows["all-done"].split()[1] == "done" and "failed" not in rows["all-done"]
    # The "started" column reads as a time ago.
    assert re.search(r"  2m \d\ds ago\s*$", rows["all-failed"]), rows["all-failed"]
    assert re.search(r"  3h 00m ago\s*$", rows["some-failed"]), rows["some-failed"]


def test_the_report_lists_only_commands_that_ran_and_says_what_stopped_the_others(tmp_path):
    study = _study("mixed", [FAILED, PENDING, PENDING], time.time() - 100)
    ray = study.topologies[1]  # launched, then failed in its launch
    ray.status, ray.reason = FAILED, "spark-a: the engine exited during start-up"
    mp = study.topologies[2]  # launched and measured (no run on disk here)
    mp.status, mp.startup_s = DONE, 12.0
    text = report.markdown(study, tmp_path)
    ran = text[text.index("Command lines"):text.index("Run it again")]
    assert "engine-mixed-0" not in ran  # stopped by preflight: its `docker run` never ran
    assert ("**solo** — not launched: preflight failed on spark-a: ports: port 8000 already in use on 127.0.0.2"
            in ran)
    assert "**cluster-ray** — failed: spark-a: the engine exited during start-up" in ran
    assert "docker run -d --name engine-mixed-1" in ran and "docker run -d --name engine-mixed-2" in ran
    assert "`mixed` (done, 2 of 3 failed)" in text


def test_a_study_whose_every_layout_failed_reads_failed_in_its_report(tmp_path):
    study = _study("nothing", [FAILED, FAILED], time.time())
    text = report.markdown(study, tmp_path)
    assert "`nothing` (failed)" in text
    assert "docker run" not in text


# -- 3. --inventory demo leaves out what --demo leaves out ---------------------------------------------------------


def test_inventory_demo_leaves_out_the_litellm_layouts_as_demo_does():
    demo = sparktop("study", "gpt-oss-120b", "--demo", path=BARE)  # sets the demo's nodes up, writes its inventory
    assert demo_inventory_path().exists()
    inv = sparktop("study", "gpt-oss-120b", "--inventory", "demo", path=BARE)
    left = ("left out: shuffle, least-busy (replicas behind LiteLLM, and this machine has no `litellm`: "
            "pip install 'litellm[proxy]' to measure them)")
    for planned in (demo, inv):
        lines = planned.stdout.splitlines()
        assert lines[0] == left, planned.stdout + planned.stderr
        assert [line.split()[1] for line in lines if line.strip()[:1].isdigit()] == ["solo", "cluster-ray",
                                                                                       "cluster-mp"]
    # Its quicker look keeps `--inventory demo`.
    assert "a quicker look: sparktop study gpt-oss-120b -c 1,8 --runs 2 --inventory demo" in inv.stdout


def test_left_out_only_on_the_demo_and_only_without_litellm():
    entries = [TopologyState(n) for n in ("solo", "cluster-mp", "shuffle", "least-busy")]
    kept, out = left_out_here(entries, on_demo=True, has_litellm=False)
    assert [t.name for t in kept] == ["solo", "cluster-mp"] and [t.name for t in out] == ["shuffle", "least-busy"]
    assert left_out_here(entries, on_demo=True, has_litellm=True)[1] == []
    assert left_out_here(entries, on_demo=False, has_litellm=False)[1] == []


# -- 4. `study --demo` without a recipe ----------------------------------------------------------------------------


def test_demo_study_without_a_recipe_studies_the_demos_model_and_says_so():
    planned = sparktop("study", "--demo", path=BARE)
    assert planned.stdout.splitlines()[0] == "no recipe named: studying the demo's model, gpt-oss-120b"
    assert "gpt-oss-120b · c1,2,4,8,16,32,64" in planned.stdout
    assert "not starting without confirmation" in planned.stderr


def test_the_demo_recipe_is_what_the_demo_serves():
    from sparktop.cli import build_parser
    from sparktop.twin.cluster import DEMO_MODEL

    assert DEMO_RECIPE == DEMO_MODEL == build_parser().parse_args(["demo"]).model


# -- 5. "Run it again" names a catalog recipe ----------------------------------------------------------------------


def test_run_it_again_names_a_catalog_recipe_and_keeps_a_file_given_by_path(tmp_path):
    shipped = str(shipped_recipes_dir() / "gpt-oss-120b.yaml")
    study = Study(id="x", recipe="gpt-oss-120b", model="gpt-oss-120b", topologies=[TopologyState("solo")],
                  levels=[1], recipe_path=shipped, inventory=DEMO_INVENTORY)
    assert report.reproduce(study).startswith("sparktop study gpt-oss-120b --topologies solo ")
    mine = tmp_path / "my-recipe.yaml"
    mine.write_text(Path(shipped).read_text())
    study.recipe_path = str(mine)
    assert report.reproduce(study).startswith(f"sparktop study {mine} --topologies solo ")
    study.recipe_path = "recipes/gpt-oss-120b.yaml"  # a path the user typed comes back as typed
    assert report.reproduce(study).startswith("sparktop study recipes/gpt-oss-120b.yaml --topologies solo ")


# -- 7. the demo's estimate is the twins' -------------------------------------------------------------------------


def test_the_demos_estimate_is_the_twins_start_up_and_pace():
    recipe = find_recipe("gpt-oss-120b")
    inventory = Inventory(nodes=[Node(name="spark-a", host="localhost"), Node(name="spark-b", host="localhost")])

    def plan(path):
        return new_study(recipe, inventory, ["solo", "cluster-ray"], levels=[1, 8], runs=2, pp=1024, tg=128,
                         extra_body={}, overrides={}, nodes=None, inventory_path=path)

    spark, on_sparks = plan(None)
    twins, on_twins = plan(DEMO_INVENTORY)
    for name in ("solo", "cluster-ray"):
        real, demo = on_sparks[name], on_twins[name]
        assert real is not None and demo is not None
        assert real.startup_s > 60  # a Spark reads 60 GB of weights and compiles
        assert demo.startup_s < real.startup_s / 10  # the twins start in seconds
        assert demo.sweep_s == real.sweep_s  # at speed 1 the twins run at a GB10's pace
        assert (real.stop_s, demo.stop_s) == (STOP_S, DEMO_STOP_S)
    assert twins.estimate_s < spark.estimate_s / 2


def test_the_demos_start_up_speed_is_the_one_the_study_plans_with():
    from sparktop.demo import demo_inventory

    assert inspect.signature(demo_inventory).parameters["startup_speed"].default == DEMO_STARTUP_SPEED


def test_the_demo_plan_says_its_time_is_the_twins():
    planned = sparktop("study", "gpt-oss-120b", "-c", "1,8", "--runs", "2", "--demo", path=BARE)
    assert "estimated wall time on the demo's twins: about " in planned.stdout
    assert "at GB10 speed" not in planned.stdout
