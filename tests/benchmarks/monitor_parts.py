"""Benchmark: where the monitor's CPU goes, part by part, in milliseconds per second.

The situation of monitor_vs_vllm_htop.py (one twin engine under load,
`sparktop --engine URL -i 1` alone in a 160x48 tmux), with the app run
through a small wrapper that times its parts on the main thread's CPU
clock (`time.thread_time`) from `--warmup` seconds after start for
`--seconds`, then quits:

    compositor   Textual turning changed widget lines into terminal output
                 (Screen._compositor_refresh: our cards' render_line, borders, the diff)
    cards        building the cards' lines from the state (MonitorScreen.show_state)
    parse        reading a /metrics answer (Scrape.parse: the filter, prometheus-client)
    metrics      rates and percentiles from the parsed scrape (EngineMetrics.add)
    servers      the process list read for vLLM servers outside Docker (read_servers_here)
    gc           the garbage collector (gc.callbacks)
    main thread  everything on the event loop's thread (the above, aiohttp, the probes,
                 Textual's message pump)
    process      the whole process (getrusage: every thread, user and system)
    card lines   card lines Textual asked for per second (a count: what the compositor redrew)

Each `--src NAME=DIR` runs sparktop from that source tree (`git archive REV
| tar -x -C DIR`), taking turns run by run; the medians are printed side by
side, so a change's effect is read from one run on one machine:

    python tests/benchmarks/monitor_parts.py --src before=/tmp/before --src after=. --runs 3

The wrapper patches the methods it times (and nothing else); a part that a
source tree lacks prints as "-".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

import monitor_cost as mc  # noqa: E402
import monitor_vs_vllm_htop as vs  # noqa: E402

PARTS = ("compositor", "cards", "parse", "metrics", "servers", "gc", "main thread", "process", "card lines")

# Written to a file and run as `python FILE OUT WARMUP SECONDS sparktop-args...`, PYTHONPATH at the tree measured.
WRAPPER = r'''
import functools, gc, json, resource, sys, time
out, warmup, seconds, args = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
acc, on = {}, [False]

def timed(owner, name, part):
    f = getattr(owner, name, None)
    if f is None:
        return
    @functools.wraps(f)
    def w(*a, **k):
        if not on[0]:
            return f(*a, **k)
        t = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            acc[part] = acc.get(part, 0.0) + time.thread_time() - t
    setattr(owner, name, w)

gc_t = [0.0]
def gc_cb(phase, info):
    if not on[0]:
        return
    if phase == "start":
        gc_t[0] = time.perf_counter()
    else:
        acc["gc"] = acc.get("gc", 0.0) + time.perf_counter() - gc_t[0]
gc.callbacks.append(gc_cb)

def counted(owner, name, part):
    f = getattr(owner, name, None)
    if f is None:
        return
    @functools.wraps(f)
    def w(*a, **k):
        if on[0]:
            acc[part] = acc.get(part, 0.0) + 0.001  # shown per second: a count, not ms
        return f(*a, **k)
    setattr(owner, name, w)

from textual.screen import Screen
from sparktop.observe import host_probe
from sparktop.observe import prometheus as vllm_metrics
from sparktop.ui import app as app_mod, screens
timed(Screen, "_compositor_refresh", "compositor")
timed(screens.MonitorScreen, "show_state", "cards")
timed(vllm_metrics.Scrape, "parse", "parse")
timed(vllm_metrics.EngineMetrics, "add", "metrics")
timed(host_probe, "read_servers_here", "servers")
from sparktop.ui import cards
counted(cards.Card, "render_line", "card lines")

App = app_mod.SparktopApp
mount = App.on_mount
def on_mount(self):
    mount(self)
    mark = {}
    def start():
        on[0] = True
        mark.update(t=time.monotonic(), main=time.thread_time(), ru=resource.getrusage(resource.RUSAGE_SELF))
    def stop():
        on[0] = False
        dt = time.monotonic() - mark["t"]
        ru = resource.getrusage(resource.RUSAGE_SELF)
        res = {k: 1000 * v / dt for k, v in acc.items()}
        res["main thread"] = 1000 * (time.thread_time() - mark["main"]) / dt
        res["process"] = 1000 * (ru.ru_utime - mark["ru"].ru_utime + ru.ru_stime - mark["ru"].ru_stime) / dt
        with open(out, "w") as f:
            json.dump(res, f)
        self.exit()
    self.set_timer(warmup, start)
    self.set_timer(warmup + seconds, stop)
App.on_mount = on_mount

from sparktop.cli import main
sys.argv = ["sparktop", *args]
main()
'''


def one_run(name: str, src: Path, url: str, args, run: int, tmp: Path) -> dict | None:
    out = tmp / f"{name}-{run}.json"
    socket = f"sparktop-parts-{os.getpid()}-{name}-{run}"  # a tmux server per run: no race with the last one
    wrapper = tmp / "wrapper.py"
    wrapper.write_text(WRAPPER)
    cmd = shlex.join(["env", "TERM=xterm-256color", f"PYTHONPATH={src}", sys.executable, str(wrapper), str(out),
                      str(args.warmup), str(args.seconds), "--engine", url, "-i", "1"])
    cmd = f"exec {cmd} 2>{shlex.quote(str(tmp / f'{name}-{run}.err'))}"
    subprocess.run(["tmux", "-L", socket, "new-session", "-d", "-s", f"{name}-{run}", "-x", str(mc.COLS),
                    "-y", str(mc.ROWS), cmd], check=True)
    pid = int(subprocess.run(["tmux", "-L", socket, "list-panes", "-F", "#{pane_pid}"], capture_output=True,
                             text=True).stdout or 0)
    deadline = time.monotonic() + args.warmup + args.seconds + 30
    try:
        while time.monotonic() < deadline and not out.exists():
            time.sleep(0.5)
        if pid > 0:
            with contextlib.suppress(psutil.Error):  # it quits by itself after writing its figures
                psutil.Process(pid).wait(15)
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
        if pid > 0:
            with contextlib.suppress(psutil.Error):  # never leave one behind to skew the next run
                psutil.Process(pid).kill()
    if not out.exists():
        err = (tmp / f"{name}-{run}.err").read_text(errors="replace").strip().splitlines()
        print(f"  {name} run {run}: no figures ({err[-1] if err else 'it did not start'})")
        return None
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", action="append", metavar="NAME=DIR", help="a source tree to measure (repeatable)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--warmup", type=float, default=12.0, help="seconds after start before measuring")
    args = ap.parse_args()
    if not shutil.which("tmux"):
        sys.exit("monitor_parts: needs tmux (apt-get install tmux)")
    sources = [(n, Path(d).resolve()) for n, d in (s.split("=", 1) for s in (args.src or ["this=" + str(ROOT)]))]
    tmp = Path(tempfile.mkdtemp(prefix="sparktop-parts-"))
    procs: list[subprocess.Popen] = []
    print(f"monitor parts: 160x48 tmux, 1 twin engine under load, 1 s interval, {args.seconds:g} s x {args.runs} "
          f"runs after {args.warmup:g} s; ms of CPU per second (10 ms/s = 1 % of a core)")
    try:
        url = vs.start_twins(1, tmp, procs)[0]
        results: dict[str, list[dict]] = {name: [] for name, _ in sources}
        for run in range(1, args.runs + 1):
            order = sources if run % 2 else list(reversed(sources))
            for name, src in order:
                res = one_run(name, src, url, args, run, tmp)
                if res is not None:
                    results[name].append(res)
                    print(f"  {name:>8} run {run}: " + "  ".join(f"{p} {res[p]:.2f}" for p in PARTS if p in res))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    print("medians, ms of CPU per second:")
    print(f"  {'':>12}" + "".join(f"{name:>10}" for name, _ in sources))
    for part in PARTS:
        row = []
        for name, _ in sources:
            values = [r[part] for r in results[name] if part in r]
            row.append(f"{statistics.median(values):10.2f}" if values else f"{'-':>10}")
        print(f"  {part:>12}" + "".join(row))


if __name__ == "__main__":
    main()
