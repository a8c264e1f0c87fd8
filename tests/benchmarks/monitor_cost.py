"""Benchmark: what watching costs, measured the way a user runs it.

Two twin engines (`sparktop twin serve`, separate processes) under steady
load (`python -m sparktop.twin.load`, another process), and the real CLI

    sparktop --engine URL1 --engine URL2 -i 1      (one node: this one)

inside `tmux new -d -x 160 -y 48`. Once both engines show figures, the
CPU of the sparktop process and its children (the probe commands it runs
on this node) is read with psutil from outside over `--seconds`, as % of
one core; the twins and the load generator are not counted. Repeated
`--runs` times; prints each run, the median, the terminal size read back
from tmux, and the versions.

    python tests/benchmarks/monitor_cost.py                       # this tree
    python tests/benchmarks/monitor_cost.py --src before=/tmp/before --src after=.   # side by side
    python tests/benchmarks/monitor_cost.py --runs 1 --py-spy /tmp/prof   # also where the time goes
    python tests/benchmarks/monitor_cost.py --engines vllm,vllm --engines vllm,llama-cpp   # engine mixes

`--engines E,E` (repeatable) chooses the engines watched: twins of vLLM
(`vllm`), llama.cpp (`llama-cpp`: `llama-server --metrics -np 4`, read from
its /metrics and /slots), SGLang (`sglang`, `--enable-metrics`) or
TensorRT-LLM (`trtllm`); each mix is a variant, run interleaved with the
others like `--src`. Default: two vLLM twins, the figure quoted since the
monitor's budget was set.

`--src NAME=DIR` runs `sparktop` from another source tree (e.g. `git
archive HEAD | tar -x -C /tmp/before`) with PYTHONPATH=DIR, interleaving
the variants run by run so both see the same machine and the same load.
`--py-spy PREFIX` records each run with py-spy (`pip install py-spy`) into
PREFIX-NAME-RUN.txt (collapsed stacks) and prints the top functions by
own and by total time.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
COLS, ROWS = 160, 48
SPY_RATE = 250


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/v1/models", timeout=1) as r:
            if r.status == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"twin at {url} did not come up")


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout.strip()


def cpu_seconds(proc: psutil.Process) -> float:
    """CPU of the process, its reaped children, and its children alive now."""
    t = proc.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            c = child.cpu_times()
            total += c.user + c.system
    return total


IDLE = ("select", "poll", "wait", "_wait_for_tstate_lock", "sleep")  # a thread waiting, not working


def _short(file: str) -> str:
    """sparktop/ui/cards.py for our files, the file name for the rest."""
    return file[file.rindex("sparktop/"):] if "sparktop/" in file else Path(file).name


def top_functions(path: Path, started: float, window: tuple[float, float], rate: int, n: int = 14) -> str:
    """The top functions of the main thread in a py-spy speedscope file
    (recorded with --idle, so sample i is about i/rate s after `started`),
    over the measurement `window` only, by own and by total samples."""
    import json

    data = json.loads(path.read_text())
    frames = [f"{f['name']} ({_short(f.get('file') or '?')}:{f.get('line', '')})" for f in data["shared"]["frames"]]
    profile = max(data["profiles"], key=lambda p: len(p["samples"]))  # the main thread: the most samples
    first, last = int((window[0] - started) * rate), int((window[1] - started) * rate)
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    busy = idle = 0
    for stack in profile["samples"][first:last]:
        names = [frames[i] for i in stack]
        if not names or names[-1].split(" ")[0].rsplit(".", 1)[-1] in IDLE:
            idle += 1
            continue
        busy += 1
        own[names[-1]] += 1
        for name in set(names):
            total[name] += 1
    if not busy:
        return "  no busy samples"
    out = [f"  main thread: {busy} busy samples of {busy + idle} ({100 * busy / max(1, busy + idle):.1f} % busy)",
           "  own time (share of busy samples):"]
    out += [f"    {100 * k / busy:5.1f}%  {f}" for f, k in own.most_common(n)]
    out.append("  total time (with callees), sparktop functions:")
    out += [f"    {100 * k / busy:5.1f}%  {f}" for f, k in total.most_common()
            if "(sparktop/" in f][:n]
    out.append("  total time, library functions:")
    out += [f"    {100 * k / busy:5.1f}%  {f}" for f, k in total.most_common()
            if k < busy * 0.9 and "(sparktop/" not in f][:n]
    return "\n".join(out)


# How each engine's twin is started: its own command line, one model (gpt-oss-120b) for all.
TWIN_COMMANDS = {
    "vllm": ["gpt-oss-120b"],
    "llama-cpp": ["--engine", "llama-cpp", "-hf", "ggml-org/gpt-oss-120b-GGUF", "--metrics", "-np", "4"],
    "sglang": ["--engine", "sglang", "--model-path", "openai/gpt-oss-120b", "--enable-metrics"],
    "trtllm": ["--engine", "trtllm", "openai/gpt-oss-120b"],
}


def one_run(name: str, src: Path, urls: list[str], args, run: int, extra_env: str = "") -> float | None:
    session = f"sparktop-bench-{os.getpid()}-{name}-{run}".replace(":", "_").replace(".", "_")  # tmux targets
    env_prefix = " ".join(x for x in (f"PYTHONPATH={src}" if src != ROOT else "", extra_env) if x)
    engines = " ".join(f"--engine {u}" for u in urls)
    # A one-node inventory: this node, no default-port candidate to probe.
    window = None
    command = f"exec env TERM=xterm-256color {env_prefix} {sys.executable} -m sparktop {engines} -i 1"
    spy_out = Path(f"{args.py_spy}-{name}-{run}.json") if args.py_spy else None
    if spy_out is not None:
        # py-spy cannot attach here (no ptrace of non-children), so it starts sparktop itself; --idle keeps
        # one sample per tick, so a sample's index says when it was taken.
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        command = (f"exec env TERM=xterm-256color {env_prefix} {spy} record --idle --nonblocking -r {SPY_RATE} "
                   f"-f speedscope -o {spy_out} -- {sys.executable} -m sparktop {engines} -i 1")
    spy_started = time.monotonic()
    # Started in the source tree measured: `python -m` puts its working directory first on sys.path, so
    # from anywhere else (this repository, where the benchmark runs) PYTHONPATH would not choose the tree.
    tmux("new-session", "-d", "-s", session, "-x", str(COLS), "-y", str(ROWS), "-c", str(src), command)
    try:
        pid = int(tmux("list-panes", "-t", session, "-F", "#{pane_pid}"))
        size = tmux("display-message", "-p", "-t", session, "#{window_width}x#{window_height}")
        proc = psutil.Process(pid)
        if spy_out is not None:  # measure sparktop, not py-spy
            time.sleep(1.0)
            proc = proc.children()[0]
        # Measure the steady state: both engines showing figures.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            screen = tmux("capture-pane", "-p", "-t", session)
            if screen.count("t/s") >= 2 * len(urls) and screen.count("ready") >= len(urls):
                break
            time.sleep(0.5)
        else:
            print(f"  {name} run {run}: engines never showed figures:\n{screen}")
            return None
        time.sleep(args.warmup)
        before, t0 = cpu_seconds(proc), time.monotonic()
        time.sleep(args.seconds)
        after, t1 = cpu_seconds(proc), time.monotonic()
        pct = 100 * (after - before) / (t1 - t0)
        rss = proc.memory_info().rss / 1e6
        which = subprocess.run(["env", *([env_prefix] if env_prefix else []), sys.executable, "-c",
                                "import sparktop; print(sparktop.__file__)"], capture_output=True, text=True,
                               cwd="/").stdout.strip()
        print(f"  {name:>8} run {run}: {pct:5.2f} % of a core  (terminal {size}, rss {rss:.0f} MB, {which})",
              flush=True)
        window = (t0, t1)
        return pct
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            tmux("send-keys", "-t", session, "q")
            time.sleep(3.0 if spy_out else 1.0)  # py-spy writes its file once sparktop exits
        if spy_out is not None and window is not None and spy_out.exists():
            print(top_functions(spy_out, spy_started, window, SPY_RATE))
        with contextlib.suppress(subprocess.CalledProcessError):
            tmux("kill-session", "-t", session)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after the first figures before measuring")
    ap.add_argument("--src", action="append", metavar="NAME=DIR",
                    help="a source tree to run sparktop from (repeatable; default: this tree)")
    ap.add_argument("--py-spy", metavar="PREFIX", help="also record where the time goes with py-spy")
    ap.add_argument("--engines", action="append", metavar="E,E",
                    help=f"engines watched, a variant each (repeatable; of {', '.join(TWIN_COMMANDS)}; "
                         "default vllm,vllm)")
    ap.add_argument("--history-ab", action="store_true",
                    help="run each variant with its history written (to a scratch file) and with history off "
                         "(history: false in settings.yaml), interleaved: what writing history costs")
    args = ap.parse_args()
    trees = [(s.split("=", 1)[0], Path(s.split("=", 1)[1]).resolve()) for s in args.src or []] or [
        ("current", ROOT)]
    mixes = [m.split(",") for m in args.engines or ["vllm,vllm"]]
    for mix in mixes:
        for engine in mix:
            if engine not in TWIN_COMMANDS:
                raise SystemExit(f"--engines: {engine!r} is not one of {', '.join(TWIN_COMMANDS)}")
    # A variant: a source tree and the engines it watches.
    variants = [(f"{tree}:{'+'.join(mix)}" if len(mixes) > 1 else tree, src, mix, "")
                for mix in mixes for tree, src in trees]
    scratch = Path(tempfile.mkdtemp(prefix="sparktop-bench-history-"))
    if args.history_ab:
        (scratch / "off.yaml").write_text("history: false\n")
        (scratch / "on.yaml").write_text("history: true\n")
        data = f"XDG_DATA_HOME={scratch / 'data'}"
        variants = [(f"{name}+{label}", src, mix, f"{data} SPARKTOP_SETTINGS={scratch / label.split('-')[-1]}.yaml")
                    for name, src, mix, _ in variants for label in ("history-on", "history-off")]
    else:
        # The history file of these runs is the benchmark's, not the user's.
        variants = [(name, src, mix, f"XDG_DATA_HOME={scratch / 'data'}") for name, src, mix, _ in variants]
    from importlib.metadata import version

    print(f"sparktop monitor cost: {COLS}x{ROWS} tmux, twin engines under load, one node, -i 1, "
          f"{args.seconds:g} s x {args.runs} runs")
    print(f"python {platform.python_version()}, textual {version('textual')}, rich {version('rich')}, "
          f"{tmux('-V')}, sparktop {version('sparktop')}, {os.cpu_count()} cpus, {platform.platform()}")
    print(f"command: sparktop --engine URL1 --engine URL2 -i 1 in `tmux new -d -x {COLS} -y {ROWS}`")
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            # Enough twins of each engine for the mix that needs the most of it; a mix watches its first ones.
            need = {e: max(m.count(e) for m in mixes) for m in mixes for e in m}
            started: dict[str, list[str]] = {}
            for engine, count in need.items():
                for i in range(count):
                    port = free_port()
                    log = open(Path(tmp) / f"twin-{engine}-{i}.log", "w")  # noqa: SIM115 - closed with the process
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "sparktop", "twin", "serve", *TWIN_COMMANDS[engine],
                         "--host", "127.0.0.1", "--port", str(port), "--startup-speed", "500"],
                        stdout=log, stderr=log, cwd=tmp, env={**os.environ, "PYTHONPATH": str(ROOT)}))
                    started.setdefault(engine, []).append(f"http://127.0.0.1:{port}")
            every = [u for us in started.values() for u in us]
            for url in every:
                wait_ready(url, time.monotonic() + 60)
            procs.append(subprocess.Popen([sys.executable, "-m", "sparktop.twin.load", *every, "--min", "3",
                                           "--max", "3", "--parent", str(os.getpid())],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(3)
            results: dict[str, list[float]] = {name: [] for name, _, _, _ in variants}
            for run in range(1, args.runs + 1):
                for name, src, mix, extra_env in variants:
                    urls = [started[e][mix[:k].count(e)] for k, e in enumerate(mix)]
                    pct = one_run(name, src, urls, args, run, extra_env)
                    if pct is not None:
                        results[name].append(pct)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
    for name, values in results.items():
        if values:
            print(f"{name:>8}: median {statistics.median(values):.2f} % of a core "
                  f"(runs: {', '.join(f'{v:.2f}' for v in values)})")
    if args.history_ab:
        for name, *_ in variants[::2]:
            base = name.rsplit("+", 1)[0]
            on, off = results.get(f"{base}+history-on"), results.get(f"{base}+history-off")
            if on and off:
                diffs = [a - b for a, b in zip(on, off, strict=False)]
                print(f"{base}: writing history adds {statistics.median(diffs):+.2f} % of a core "
                      f"(median of paired runs: {', '.join(f'{d:+.2f}' for d in diffs)})")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
