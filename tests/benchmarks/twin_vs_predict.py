"""Benchmark: the twin on real time against the model it runs (`sparktop predict`).

    python -m tests.benchmarks.twin_vs_predict            # c1..c64
    python -m tests.benchmarks.twin_vs_predict --quick    # c1..c16

A twin serving gpt-oss-120b the way the article served it (`sparktop twin
serve openai/gpt-oss-120b --gpu-memory-utilization 0.7`, its own process),
swept by the CLI (`sparktop sweep -c ... --runs 1 --exact-tg --latency-mode
none`) at Spark's own speed up to c8 and at twice it from c16 (a first token
there waits seconds and a decode step over 100 ms; the figures are scaled
back by the speed), beside `sparktop.model.simulate.predict` for the same
level (pp 1024, tg 128).

On simulated time the two are one computation (tests/integration/
test_twin_predicts.py holds them equal to 1e-5). Here the difference is what
real time adds: each request's HTTP, tokenizing and the client's own work,
which the model does not count, and a busy CPU that wakes the twin late (the
twin does not catch up, as a real GPU would simply be late).
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.benchmarks.common import ROOT, Bench, Row, say, standalone
from tests.helpers.twin_process import start_twin_process

TITLE = "the twin on real time vs predict"
NEEDS = ("twin",)
MODEL = "gpt-oss-120b"
PP, TG = 1024, 128


def sweep_twin(work, speed: float, levels: list[int]) -> dict[int, dict]:
    twin, url = start_twin_process("openai/" + MODEL, "--gpu-memory-utilization", "0.7", speed=speed)
    try:
        sweep = subprocess.run([sys.executable, "-m", "sparktop", "sweep", "-e", url, "-c", ",".join(map(str, levels)),
                                "--runs", "1", "--exact-tg", "--json", "--latency-mode", "none",
                                "--results", str(work / f"speed-{speed:g}")],
                               capture_output=True, text=True, timeout=1800, cwd=ROOT)
    finally:
        twin.terminate()
        twin.wait(10)
    if sweep.returncode != 0:
        raise RuntimeError(f"sparktop sweep failed: {sweep.stderr[-1500:]}")
    return {lv["concurrency"]: {**lv, "speed": speed} for lv in json.loads(sweep.stdout)["levels"]}


def run(bench: Bench) -> list[Row]:
    from sparktop.model.cards import find_card
    from sparktop.model.fit import SERVING, load_constants
    from sparktop.model.simulate import predict

    speeds = {1.0: [1, 2, 4, 8], 2.0: bench.pick([16], [16, 32, 64])}
    work = bench.dir("twin-vs-predict")
    measured: dict[int, dict] = {}
    for speed, levels in speeds.items():
        say(f"{TITLE}: c{','.join(map(str, levels))} at {speed:g}x Spark's speed")
        measured.update(sweep_twin(work, speed, levels))
    card, k = find_card(MODEL), load_constants()
    rows = []
    for c in sorted(measured):
        m = measured[c]
        p = predict(card, "solo", c, PP, TG, k, SERVING[MODEL]).stats
        s = m["speed"]
        note = f"twin at {s:g}x, scaled back" if s != 1 else ""
        for figure, unit, mine, theirs in (("decode t/s, the batch", "t/s", m["tg_tps_total"] / s, p.tg_tps_total),
                                           ("prefill t/s, the batch", "t/s", m["pp_tps_total"] / s, p.pp_tps_total),
                                           ("TTFT mean", "ms", m["ttft_ms_mean"] * s, p.ttft_ms_mean)):
            rows.append(Row("twin_vs_predict", f"c{c} {figure}", mine, theirs, "predict", unit, m["requests"],
                            note=note))
    return rows


if __name__ == "__main__":
    sys.exit(standalone(run))
