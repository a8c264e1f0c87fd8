"""The twin runs what it predicts: a twin serving gpt-oss-120b the way the
article served it, swept by sparktop from c=1 to c=64, reports exactly what
`sparktop predict` computes for each level.

Both run on simulated time (tests/helpers/simulated.py): the twin's steps
take the time the model gives them on the loop's clock, and the sweep stamps
every chunk on that clock, so nothing this machine does (HTTP, tokenizing,
another test on the other core) enters a figure. The same sweep on real time
is a measurement: `tests/benchmarks/twin_vs_predict.py`."""

from __future__ import annotations

import pytest

from sparktop.bench.sweep import Sweep, SweepSettings
from sparktop.model.cards import find_card
from sparktop.model.fit import SERVING, load_constants
from sparktop.model.simulate import predict
from tests.helpers.simulated import sim_clock, sim_twin, simulated

LEVELS = [1, 2, 4, 8, 16, 32, 64]


@simulated
async def test_a_swept_twin_reproduces_its_own_prediction(tmp_path):
    clock = sim_clock()
    async with sim_twin("openai/gpt-oss-120b", "--gpu-memory-utilization", "0.7", clock=clock) as twin:
        settings = SweepSettings(endpoint=twin.url, levels=LEVELS, runs=1, exact_tg=True, latency_mode="none")
        finished = await Sweep(settings, tmp_path, clock=clock).run()
    assert finished.status == "done"
    measured = {lv.concurrency: lv for lv in finished.levels}
    card, k = find_card("gpt-oss-120b"), load_constants()
    rows = []
    for c in LEVELS:
        p = predict(card, "solo", c, 1024, 128, k, SERVING["gpt-oss-120b"]).stats
        m = measured[c]
        assert m.requests == c and m.errors == 0
        for name, mine, theirs in (("decode", m.tg_tps_total, p.tg_tps_total),
                                   ("prefill", m.pp_tps_total, p.pp_tps_total),
                                   ("ttft", m.ttft_ms_mean, p.ttft_ms_mean),
                                   ("ttft p95", m.ttft_ms_p95, p.ttft_ms_p95)):
            rows.append((c, name, mine, theirs))
    report = "\n".join(f"c{c:<3} {n:8} swept {m:10.3f} predicted {p:10.3f}" for c, n, m, p in rows)
    # One computation, two paths (the scheduler stepped by the twin's loop, and by predict's own loop): they
    # differ only by float rounding in the clock's microsecond steps (3e-6 at worst).
    assert all(m == pytest.approx(p, rel=1e-5) for _, _, m, p in rows), report
