"""Benchmark: what `sparktop predict` costs, start to end, as a user runs it.

    python -m tests.benchmarks.predict_cost [--quick] [--runs 9]
    python -m tests.benchmarks.predict_cost --src before=/tmp/before --src after=.   # side by side

Times the whole process of

    sparktop predict gpt-oss-120b -c 1,8,64 --inventory TWO-NODES          (a recipe)
    sparktop predict --model gpt-oss-120b -c 1,8,64 --inventory TWO-NODES  (a model card)

on an inventory of two nodes, so each prints every two-node layout it
allows (solo, cluster-ray, cluster-mp, shuffle, least-busy: 15 predicted
levels) with the recommendation and the fit's error for the card. Each
command runs once unmeasured (Python compiles the package's bytecode, as an
installed package has it; PYTHONDONTWRITEBYTECODE is dropped for the child),
then `--runs` times (3 with --quick, else 7); the rows are the median wall
time and the median CPU (user + system, of the process and its children)
beside issue 36's budget of one second. Config and data folders are empty
temporary ones: a fit of the user's own inventory is not what is timed.

`--src NAME=DIR` runs `sparktop` from another source tree (e.g. `git archive
HEAD | tar -x -C /tmp/before`) with PYTHONPATH=DIR; the variants run in
turn, run by run, so they see the same machine and the same load. Before
issue 36 each command took about 4.5 s wall and 7.2 s CPU here (the fit's
report over 1,310 published figures on every call, in two processes), 0.46 s
after it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.benchmarks.common import ROOT, Bench, Row, say, text_table

TITLE = "what `sparktop predict` costs, start to end"
NEEDS: tuple[str, ...] = ()
BUDGET_S = 1.0  # issue 36: a recipe at three concurrencies and every two-node layout, under a second
LEVELS = "1,8,64"
INVENTORY = """\
nodes:
  - name: spark-a
    host: spark-a.lan
  - name: spark-b
    host: spark-b.lan
"""
FORMS = (("recipe", ["gpt-oss-120b"]), ("--model", ["--model", "gpt-oss-120b"]))


def command(form: list[str], inventory: Path) -> list[str]:
    return [sys.executable, "-m", "sparktop", "predict", *form, "-c", LEVELS, "--inventory", str(inventory)]


def environment(src: Path, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(src)
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        env[var] = str(work / var.lower())
    return env


def once(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run; its output is checked, not kept."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or "cluster-mp" not in done.stdout:
        raise RuntimeError(f"{' '.join(argv[2:])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(sources: dict[str, Path], runs: int, work: Path) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Every (source, form) run `runs` times after one warm-up, in turn."""
    inventory = work / "two-nodes.yaml"
    inventory.write_text(INVENTORY)
    cwd = work / "cwd"  # not a source tree: `-m sparktop` comes from PYTHONPATH alone
    cwd.mkdir(exist_ok=True)
    envs = {name: environment(src, work / name) for name, src in sources.items()}
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for i in range(runs + 1):
        for name in sources:
            for form, args in FORMS:
                t = once(command(args, inventory), envs[name], cwd)
                if i:  # the first run writes the bytecode
                    got.setdefault((name, form), []).append(t)
        if i:
            say(f"{TITLE}: run {i}/{runs}")
    return got


def rows_of(got: dict[tuple[str, str], list[tuple[float, float]]], several: bool) -> list[Row]:
    rows = []
    for (name, form), times in got.items():
        what = f"predict {' '.join(dict(FORMS)[form])} -c {LEVELS}, 5 layouts" + (f" [{name}]" if several else "")
        wall = statistics.median(w for w, _ in times)
        cpu = statistics.median(c for _, c in times)
        rows += [Row("predict_cost", f"{what}: wall", wall, BUDGET_S, "issue 36's budget", "s", len(times)),
                 Row("predict_cost", f"{what}: CPU", cpu, BUDGET_S, "issue 36's budget", "s",
                     len(times))]
    return rows


def run(bench: Bench) -> list[Row]:
    """For run_all: this tree's two forms, the median of a few runs each."""
    runs = bench.pick(3, 7)
    say(f"{TITLE}: {runs} runs of each form")
    return rows_of(measure({"this tree": ROOT}, runs, bench.dir("predict_cost")), several=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 runs of each command instead of 7")
    ap.add_argument("--runs", type=int, help="runs of each command (after one warm-up)")
    ap.add_argument("--src", action="append", metavar="NAME=DIR",
                    help="a source tree to run sparktop from (repeatable; default: this tree)")
    args = ap.parse_args(argv)
    sources = {}
    for item in args.src or []:
        name, _, path = item.partition("=")
        if not path:
            ap.error(f"--src {item!r}: expected NAME=DIR")
        sources[name] = Path(path).resolve()
    sources = sources or {"this tree": ROOT}
    runs = args.runs or (3 if args.quick else 7)
    with tempfile.TemporaryDirectory(prefix="sparktop-bench-") as tmp:
        rows = rows_of(measure(sources, runs, Path(tmp)), several=len(sources) > 1)
    print(text_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
