"""Run the benchmarks and write one table of their figures, sparktop's beside the other's.

    .venv/bin/python -m tests.benchmarks.run_all --out bench-results/           # everything (about 40 minutes)
    .venv/bin/python -m tests.benchmarks.run_all --out bench-results/ --quick   # fewer pairs and levels
    .venv/bin/python -m tests.benchmarks.run_all --only benchy_twin,twin_vs_predict
    .venv/bin/python -m tests.benchmarks.run_all --list

Writes OUT/table.md (a header saying what ran where, then one Markdown table)
and OUT/table.json (the same rows, with the run's facts), after every
benchmark so that an interrupted run keeps what it measured, and each
benchmark's own output to OUT/logs/NAME.log; prints the table at the end. A
benchmark that fails is listed with its reason and the others go on (the
exit status is then 1).

The benchmarks on the real vLLM share one server (started once, about a
minute; installed into .lab/ on first use, a few minutes), as the tests do;
`--vllm-server URL,WORKDIR` uses one left running by
`tests/helpers/real_vllm.start`. llama.cpp is built once per machine (about
5 minutes, kept in ~/.cache/sparktop-tests); llama-benchy, AIPerf and
vllm-htop are installed into .lab/ on first use.

These are measurements on this machine, never pass/fail: the suite asserts
only what cannot drift (counts, states, the server's own log), and what a
test used to hold to a tolerance is a row here.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import io
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tests.benchmarks.common import ROOT, Bench, Row, markdown, say, text_table

# In the order they run: predict's cost and the twin's first (nothing to start), then the real vLLM's (one server
# for all), then llama.cpp's.
BENCHMARKS = ["predict_cost", "demo_study_speed",
              "benchy_twin", "twin_vs_predict", "twin_decode", "sweep_client_cost", "sweep_energy_twin",
              "node_death", "monitor_vs_vllm_htop", "sweep_vs_vllm", "benchy_vllm", "status_window", "rate_vs_tools",
              "llamacpp_timings"]


class Tee(io.TextIOBase):
    """A benchmark's prints: to its log file and to stderr (stdout is the table's)."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, text: str) -> int:
        self.file.write(text)
        self.file.flush()
        sys.stderr.write(text)
        return len(text)

    def flush(self) -> None:
        self.file.flush()
        sys.stderr.flush()

    def close(self) -> None:
        self.file.close()


def git_describe() -> str:
    r = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "not a git tree"


def machine() -> str:
    return f"{platform.node()}, {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}"


def write(out: Path, facts: dict, rows: list[Row]) -> None:
    done = facts["benchmarks"]
    lines = [f"# sparktop benchmarks, {facts['started']}", "",
             f"`{facts['command']}` at {facts['commit']} on {facts['machine']}; "
             f"load average {facts['load_before']:.2f} before, {facts.get('load_after', float('nan')):.2f} after; "
             f"{'quick' if facts['quick'] else 'full'} run, {facts.get('total_s', 0) / 60:.1f} minutes.", ""]
    for name, d in done.items():
        what = f"{d['seconds'] / 60:.1f} min" + (f", FAILED: {d['error']}" if d.get("error") else "")
        lines.append(f"- `{name}` ({d['title']}): {what}")
    for name, seconds in facts.get("engines", {}).items():
        lines.append(f"- {name}: {seconds:.0f} s")
    lines += ["", "sparktop/other is a ratio; where the figure is a share or an offset, sparktop − other in its "
              "unit. n: the measurements (pairs, runs, requests) behind each side.", "", markdown(rows), ""]
    (out / "table.md").write_text("\n".join(lines), encoding="utf-8")
    (out / "table.json").write_text(json.dumps({**facts, "rows": [r.as_dict() for r in rows]}, indent=1),
                                    encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench-results"), help="where table.md, table.json and logs/ go")
    ap.add_argument("--only", help="a comma-separated subset (see --list)")
    ap.add_argument("--skip", help="a comma-separated set to leave out")
    ap.add_argument("--quick", action="store_true", help="one pair per figure, fewer levels and runs")
    ap.add_argument("--vllm-server", help="URL,WORKDIR of a real vLLM left running (tests/helpers/real_vllm.py)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (every tool's own output)")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and what each needs")
    args = ap.parse_args(argv)
    if args.list:
        for name in BENCHMARKS:
            module = importlib.import_module(f"tests.benchmarks.{name}")
            print(f"{name:22} {module.TITLE}  [{', '.join(module.NEEDS) or 'nothing to start'}]")
        return 0
    chosen = [n.strip() for n in (args.only or ",".join(BENCHMARKS)).split(",") if n.strip()]
    skipped = {n.strip() for n in (args.skip or "").split(",") if n.strip()}
    if unknown := [n for n in [*chosen, *skipped] if n not in BENCHMARKS]:
        ap.error(f"unknown benchmark(s) {unknown}: see --list")
    chosen = [n for n in BENCHMARKS if n in chosen and n not in skipped]

    # TERM and HUP stop the run like Ctrl-C: the real vLLM is stopped, the table so far is written.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    out = args.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sparktop-bench-"))
    bench = Bench(work, quick=args.quick, vllm_server=args.vllm_server)
    facts: dict = {"started": datetime.datetime.now().isoformat(timespec="seconds"),
                   "command": "python -m tests.benchmarks.run_all " + " ".join(argv if argv is not None
                                                                               else sys.argv[1:]),
                   "commit": git_describe(), "machine": machine(), "quick": args.quick,
                   "load_before": os.getloadavg()[0], "benchmarks": {}, "engines": bench.started}
    rows: list[Row] = []
    t_all = time.monotonic()
    failed = False
    try:
        for name in chosen:
            module = importlib.import_module(f"tests.benchmarks.{name}")
            say(f"== {name}: {module.TITLE}")
            t0 = time.monotonic()
            tee = Tee(out / "logs" / f"{name}.log")
            error = None
            try:
                with contextlib.redirect_stdout(tee):
                    got = module.run(bench)
                rows += got
            except KeyboardInterrupt:
                error = "interrupted"
                raise
            except Exception as exc:  # one benchmark's failure is a row of the report, not the end of the run
                error = f"{type(exc).__name__}: {str(exc)[:600]}"
                tee.write(traceback.format_exc())
                failed = True
            finally:
                tee.close()
                facts["benchmarks"][name] = {"title": module.TITLE, "seconds": time.monotonic() - t0,
                                             "error": error}
                facts["total_s"] = time.monotonic() - t_all
                facts["load_after"] = os.getloadavg()[0]
                write(out, facts, rows)
            say(f"== {name}: {time.monotonic() - t0:.0f} s" + (f", FAILED: {error}" if error else ""))
    except KeyboardInterrupt:
        say("interrupted: the table so far is written")
        failed = True
    finally:
        bench.close()
        facts["total_s"] = time.monotonic() - t_all
        facts["load_after"] = os.getloadavg()[0]
        write(out, facts, rows)
        if args.keep:
            say(f"work directory kept: {work}")
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    print(text_table(rows))
    print(f"\n{len(rows)} figures from {len(facts['benchmarks'])} benchmarks in {facts['total_s'] / 60:.1f} minutes; "
          f"{out / 'table.md'}, {out / 'table.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
