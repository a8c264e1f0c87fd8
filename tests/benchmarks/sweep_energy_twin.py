"""Benchmark: energy and cost per token at each concurrency, a sweep on a twin node.

One twin node (its own `nvidia-smi`, whose GPU power follows the engine's
busy fraction) serving a solo engine; `sparktop sweep`'s Sweep with the
node's power read each second during every level's measured batches, as
`sparktop sweep --power NODE` does; prints the Markdown results (W, J/tok
and cost per million tokens at the given price per kWh).

    python tests/benchmarks/sweep_energy_twin.py                       # gpt-oss-120b, c1..c32
    python tests/benchmarks/sweep_energy_twin.py --model llama-3.1-8b -c 1,4,16 --price 0.25 --currency USD
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sparktop.bench import export  # noqa: E402
from sparktop.bench.results import load_run  # noqa: E402
from sparktop.bench.sweep import Sweep, SweepSettings  # noqa: E402
from sparktop.observe.power import NodesPower  # noqa: E402
from sparktop.settings import Preferences  # noqa: E402
from sparktop.twin.cluster import TwinCluster, wait_ready  # noqa: E402
from tests.helpers.real_vllm import free_port  # noqa: E402

TITLE = "energy per token on a twin node"
NEEDS = ("twin",)


async def measure(args) -> object:
    """The sweep's results (sparktop.bench.results) of one twin node at the given levels."""
    root = Path(tempfile.mkdtemp(prefix="sparktop-energy-"))
    cluster = TwinCluster(root / "cluster", names=("spark-a",), speed=args.speed).setup()
    try:
        node = cluster.nodes[0]
        # A port free on the node's address: the default 8000 may be another test's or engine's.
        urls = await cluster.run_solo(model=args.model, port=free_port(node.address), startup_speed=200.0)
        await wait_ready(urls, timeout=180)
        levels = [int(c) for c in args.concurrency.split(",")]
        sweep = Sweep(SweepSettings(urls[0] + "/v1", levels=levels, runs=args.runs, pp=args.pp, tg=args.tg),
                      root / "runs", power=NodesPower({node.name: node.transport()}))
        await sweep.run()
        return load_run(sweep.writer.dir)
    finally:
        await cluster.stop_all()


async def show(args) -> None:
    result = await measure(args)
    print(export.markdown(result, Preferences(energy_price_per_kwh=args.price, currency=args.currency)))


def run(bench) -> list:
    """For run_all: W, J per token and decode t/s at each level (no other tool measures a twin node's energy:
    the figures stand alone)."""
    from tests.benchmarks.common import Row

    args = parser().parse_args(["-c", "1,4", "--runs", "1"] if bench.quick else ["-c", "1,4,16"])
    result = asyncio.run(measure(args))
    rows = []
    for lv in result.levels():
        c, n = lv.concurrency, lv.requests
        rows += [Row("sweep_energy_twin", f"c{c} GPU power while measuring", lv.power_w, None, "", "W", n),
                 Row("sweep_energy_twin", f"c{c} energy per generated token", lv.j_per_token, None, "", "J/tok", n),
                 Row("sweep_energy_twin", f"c{c} decode t/s, the batch", lv.tg_tps_total, None, "", "t/s", n)]
    return rows


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt-oss-120b")
    ap.add_argument("-c", "--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pp", type=int, default=1024)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--speed", type=float, default=1.0, help="the twin's speed (1: a GB10's)")
    ap.add_argument("--price", type=float, default=0.30, help="price per kWh")
    ap.add_argument("--currency", default="EUR")
    return ap


def main() -> None:
    asyncio.run(show(parser().parse_args()))


if __name__ == "__main__":
    main()
