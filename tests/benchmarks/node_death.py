"""Benchmark: how fast the monitor notices a node dying and coming back.

An SSH server (asyncssh, in this process) plays a GB10 node; the real poller
watches it at `--interval`. The server is killed (listener and connections)
and restarted `--rounds` times; printed are the times from kill to the
node shown stale and down, and from restart to ok again.

    python tests/benchmarks/node_death.py --interval 1 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sparktop.observe.poller import NodeTarget, Poller  # noqa: E402
from sparktop.observe.snapshot import NodeSnapshot  # noqa: E402
from sparktop.remote import SSHTransport  # noqa: E402
from tests.helpers import gb10  # noqa: E402
from tests.helpers.sshd import SSHServerFixture  # noqa: E402

TITLE = "how fast the monitor notices a node dying and coming back"
NEEDS: tuple[str, ...] = ()


async def measure(args) -> tuple[list[float], list[float], list[float]]:
    """Seconds from each kill to the node shown stale, to shown down, and from each restart to ok."""
    with tempfile.TemporaryDirectory() as tmp:
        polls = [0]

        def answer(command: str):
            polls[0] += 1
            return 0, gb10.probe_answer(polls[0] * 100), ""

        server = await SSHServerFixture(Path(tmp) / "ssh", handler=answer).start()
        transport = SSHTransport(server.alias, config=[server.config], connect_timeout=2)
        poller = Poller([NodeTarget("spark-a", transport)], interval=args.interval, down_after=args.down_after,
                        default_port=None)
        await poller.start()
        states: list[tuple[float, str]] = []

        async def watch():
            async for event in poller.events():
                if isinstance(event, NodeSnapshot):
                    states.append((time.monotonic(), event.state))

        task = asyncio.create_task(watch())
        stale, down, back = [], [], []
        await asyncio.sleep(2 * args.interval)
        for _ in range(args.rounds):
            killed = time.monotonic()
            await server.stop()
            await asyncio.sleep(args.down_after + 2 * args.interval)
            stale.append(next(t for t, s in states if t > killed and s in ("stale", "down")) - killed)
            down.append(next(t for t, s in states if t > killed and s == "down") - killed)
            restarted = time.monotonic()
            await server.start()
            while not any(t > restarted and s == "ok" for t, s in states):
                await asyncio.sleep(0.05)
            back.append(next(t for t, s in states if t > restarted and s == "ok") - restarted)
            await asyncio.sleep(args.interval)
        task.cancel()
        await poller.close()
        await server.stop()
    return stale, down, back


async def main(args) -> None:
    stale, down, back = await measure(args)
    fmt = lambda xs: f"median {statistics.median(xs):.2f} s, max {max(xs):.2f} s"  # noqa: E731
    print(f"interval {args.interval:g} s, down after {args.down_after:g} s, {args.rounds} rounds")
    print(f"dead -> shown stale   {fmt(stale)}   (target: within 2 intervals = {2 * args.interval:g} s)")
    print(f"dead -> shown down    {fmt(down)}")
    print(f"back -> shown ok      {fmt(back)}   (target: within 5 s)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--down-after", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=5)
    return ap


def run(bench) -> list:
    """For run_all: the medians beside the targets the monitor was built to (stale within 2 intervals, ok again
    within 5 s)."""
    from tests.benchmarks.common import Row

    args = parser().parse_args(["--rounds", "2"] if bench.quick else [])
    stale, down, back = asyncio.run(measure(args))
    n = args.rounds
    return [Row("node_death", "a node killed: shown stale after", statistics.median(stale), 2 * args.interval,
                "target", "s", n),
            Row("node_death", "a node killed: shown down after", statistics.median(down), None, "", "s", n,
                note=f"--down-after {args.down_after:g}"),
            Row("node_death", "a node back: shown ok after", statistics.median(back), 5.0, "target", "s", n)]


if __name__ == "__main__":
    asyncio.run(main(parser().parse_args()))
