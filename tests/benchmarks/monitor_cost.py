"""Benchmark: what watching costs. Runs the real `sparktop` app in a
pseudo-terminal (80x24) against a two-node twin cluster with two engines
under load, at the default 1 s interval, and prints

- first frame: seconds from process start until the screen shows the
  status line, and until both nodes and both engines show figures;
- CPU: the app's own CPU use, as % of one core per second, median and p95
  over the measurement window (the shell commands it runs on the local
  twin nodes are reported separately: on real nodes they run remotely);
- memory: resident set size at the end (MB).

    python tests/benchmarks/monitor_cost.py --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import pty
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import contextlib  # noqa: E402

from sparktop.twin.cluster import TwinCluster, wait_ready  # noqa: E402


def inventory(cluster: TwinCluster, path: Path) -> None:
    lines = ["nodes:"]
    for node in cluster.nodes:
        lines += [f"  - name: {node.name}", "    host: localhost", f"    fabric_ip: {node.address}", "    env:"]
        lines += [f"      {k}: {v!r}" for k, v in node.env.items()]
    lines += ["defaults:", "  port: 8000"]
    path.write_text("\n".join(lines) + "\n")


def spawn(args: list[str], cols: int = 80, rows: int = 24):
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(args[0], args)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return pid, fd


def read_until(fd: int, needles: list[bytes], deadline: float, buf: bytearray) -> float | None:
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                buf += os.read(fd, 65536)
            except OSError:
                return None
        if all(n in buf for n in needles):
            return time.monotonic()
    return None


async def main(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = TwinCluster(Path(tmp) / "lab").setup()
        urls = await cluster.run_solo(model="gpt-oss-120b", startup_speed=500)
        await wait_ready(urls)
        load = subprocess.Popen([sys.executable, "-m", "sparktop.twin.load", *urls, "--min", "2", "--max", "6"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        inv = Path(tmp) / "cluster.yaml"
        inventory(cluster, inv)
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}
        os.environ.update(env)
        started = time.monotonic()
        pid, fd = spawn([sys.executable, "-m", "sparktop", "--inventory", str(inv)])
        buf = bytearray()
        try:
            status_at = read_until(fd, [b"sparktop", b"Quit"], started + 15, buf)
            data_at = read_until(fd, [b"spark-a", b"spark-b", b"gpt-oss-120b", b"t/s", b"119.6G"], started + 30, buf)
            proc = psutil.Process(pid)
            spy = None
            if args.py_spy:  # where the time goes: collapsed stacks for the window
                spy = subprocess.Popen(["py-spy", "record", "-p", str(pid), "-d", str(args.seconds), "-r", "200",
                                        "-f", "raw", "-o", args.py_spy], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
            # Drain output continuously while sampling CPU once a second.
            samples = []
            last = proc.cpu_times()
            last_t = time.monotonic()
            end = time.monotonic() + args.seconds
            child_start = last.children_user + last.children_system
            while time.monotonic() < end:
                read_until(fd, [b"\x00never"], time.monotonic() + 1.0, bytearray())
                now = proc.cpu_times()
                t = time.monotonic()
                samples.append(100 * ((now.user - last.user) + (now.system - last.system)) / (t - last_t))
                last, last_t = now, t
            rss = proc.memory_info().rss / 1e6
            if spy is not None:
                spy.wait(30)
            children = (last.children_user + last.children_system - child_start) / args.seconds * 100
        finally:
            os.write(fd, b"q")
            time.sleep(1.0)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
            load.terminate()
            await cluster.stop_all()
    samples.sort()
    print(f"first frame (status line)        {status_at - started:.2f} s" if status_at else "first frame: not seen")
    print(f"first figures (2 nodes, 2 engines) {data_at - started:.2f} s" if data_at else "figures: not seen")
    # Per-second samples come in clock ticks (1 % of a core each); the mean shows what the median rounds.
    print(f"CPU of the app, % of one core     median {statistics.median(samples):.2f}  "
          f"mean {statistics.fmean(samples):.2f}  p95 {samples[int(0.95 * (len(samples) - 1))]:.2f}  "
          f"over {len(samples)} s")
    print(f"CPU of local probe commands       {children:.1f} % (run on the nodes themselves on a real cluster)")
    print(f"resident memory                   {rss:.0f} MB")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--py-spy", metavar="FILE", help="also record collapsed stacks of the app with py-spy")
    asyncio.run(main(ap.parse_args()))
