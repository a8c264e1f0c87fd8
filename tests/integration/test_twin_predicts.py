"""The twin runs what it predicts: a twin serving gpt-oss-120b the way the
article served it, swept by sparktop (sped up), lands within 5 % of
`sparktop predict` at every level from c=1 to c=64."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparktop.model.cards import find_card
from sparktop.model.fit import SERVING, load_constants
from sparktop.model.simulate import predict
from tests.helpers.twin_process import start_twin_process

pytestmark = pytest.mark.slow
# The twin runs `speed` times faster than a Spark: rates are that many times
# higher, times that much shorter. What does not speed up is each request's
# few milliseconds of connecting, HTTP and tokenising (16 of them add ~25 ms
# before the engine has seen the last), so the speed-up stays modest.
# At Spark's own speed up to c8: in a clean-clone CI run those milliseconds were +6.8 % of c1's 421 ms TTFT at
# twice it. From c16 a first token waits seconds and a decode step over 100 ms, so twice it (2.2 minutes of the
# test's 3.7 were c16-c64 at Spark's speed).
SPEEDS = {1: [1, 2, 4, 8], 2: [16, 32, 64]}
LEVELS = [c for levels in SPEEDS.values() for c in levels]
REAL_MS = 30.0


def sweep_twin(tmp_path, speed: int, levels: list[int]) -> dict[int, dict]:
    twin, url = start_twin_process("openai/gpt-oss-120b", "--gpu-memory-utilization", "0.7", speed=speed)
    try:
        sweep = subprocess.run([sys.executable, "-m", "sparktop", "sweep", "-e", url, "-c",
                                ",".join(map(str, levels)), "--runs", "1", "--exact-tg", "--json",
                                "--latency-mode", "none", "--results", str(tmp_path)],
                               capture_output=True, text=True, timeout=600)
    finally:
        twin.terminate()
        twin.wait(10)
    assert sweep.returncode == 0, sweep.stderr[-1500:]
    return {lv["concurrency"]: {**lv, "speed": speed} for lv in json.loads(sweep.stdout)["levels"]}


def test_a_swept_twin_reproduces_its_own_prediction(tmp_path):
    measured = {}
    for speed, levels in SPEEDS.items():
        measured.update(sweep_twin(tmp_path, speed, levels))
    card, k = find_card("gpt-oss-120b"), load_constants()
    rows = []
    for c in LEVELS:
        p = predict(card, "solo", c, 1024, 128, k, SERVING["gpt-oss-120b"]).stats
        m = measured[c]
        for name, mine, theirs in (("decode", m["tg_tps_total"] / m["speed"], p.tg_tps_total),
                                   ("prefill", m["pp_tps_total"] / m["speed"], p.pp_tps_total),
                                   ("ttft", m["ttft_ms_mean"] * m["speed"], p.ttft_ms_mean)):
            rows.append((c, name, mine, theirs, mine / theirs - 1))
    report = "\n".join(f"c{c:<3} {n:8} measured {m:10.1f} predicted {p:10.1f} {d:+.1%}" for c, n, m, p, d in rows)
    print(report)
    ttft = {c: p for c, n, _, p, _ in rows if n == "ttft"}
    # A first token also waits for the twin's real per-request work (HTTP, tokenizing the prompt), which its
    # virtual clock does not count: 6 ms one morning, 22 ms that afternoon on the same shared 2-core machine.
    assert all(abs(d) <= (max(0.05, REAL_MS / ttft[c]) if n != "decode" else 0.05)
               for c, n, _, _, d in rows), report
