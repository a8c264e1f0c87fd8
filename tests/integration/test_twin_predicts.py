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


@simulated
async def test_a_twin_started_from_a_recipes_plan_serves_what_predict_says(tmp_path):
    """gpt-oss-120b's recipe names `quantization: mxfp4-spark`, which no vLLM flag carries, and no image, so
    the inventory's (NGC's: the ngc-vllm stack): the twin its plan starts gets both through the container's
    labels and image, and at --speed 2 serves exactly `forecast(subject_for_plan(...))` at speed 2."""
    import dataclasses
    import json

    from sparktop.launch.catalog import find_recipe
    from sparktop.launch.prediction import subject_for_plan
    from sparktop.launch.topology import make_plan
    from sparktop.model.forecast import forecast
    from sparktop.settings import Inventory, Node
    from tests.helpers.plan_engines import plan_engines, without_address

    recipe = find_recipe("gpt-oss-120b")
    inv = Inventory(nodes=[Node("spark-a", "spark-a.lan")])
    plan = make_plan(recipe, "solo", inv, lid="t")
    (engine,) = plan_engines(plan)
    assert engine.labels["sparktop.quant"] == "mxfp4-spark" and engine.labels["sparktop.stack"] == "ngc-vllm"
    speed, levels = 2.0, [1, 8, 32]
    environ = {"SPARKTOP_TWIN_IMAGE": engine.image, "SPARKTOP_TWIN_LABELS": json.dumps(engine.labels)}
    clock = sim_clock()
    async with sim_twin(*without_address(engine.argv), speed=speed, clock=clock, environ=environ) as twin:
        assert twin.basis.stack == "ngc-vllm" and twin.card.quant.scheme == "mxfp4-spark"
        settings = SweepSettings(endpoint=twin.url, levels=levels, runs=1, exact_tg=True, latency_mode="none",
                                 model="gpt-oss-120b")
        finished = await Sweep(settings, tmp_path, clock=clock).run()
    assert finished.status == "done"
    subject = dataclasses.replace(subject_for_plan(plan, recipe, inv), speed=speed)
    fc = forecast(subject, ["solo"], levels)
    for lv in finished.levels:
        row = fc.at("solo", lv.concurrency)
        assert row is not None and lv.errors == 0
        assert lv.tg_tps_total == pytest.approx(row.decode_tps, rel=1e-5)
        assert lv.pp_tps_total == pytest.approx(row.prefill_tps, rel=1e-5)
        assert lv.ttft_ms_mean == pytest.approx(row.ttft_ms, rel=1e-5)
