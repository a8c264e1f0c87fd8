"""Energy per token in a sweep: the nodes' power read during each level's
measured batches, over the tokens those batches generated per second of
wall time; in the results (JSON, Markdown, CSV) with the cost per million
tokens when a price is set.

The twin, the sweep and the fake GPU's power run on simulated time
(tests/helpers/simulated.py): which readings fall inside a level is fixed by
the model's step times, so each level's power is the mean of exactly those
readings. Energy per level on real time is a measurement:
tests/benchmarks/sweep_energy_twin.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from sparktop.bench import export
from sparktop.bench.events import LevelDone, LevelStarted
from sparktop.bench.results import load_run
from sparktop.bench.sweep import POWER_INTERVAL, Sweep, SweepSettings
from sparktop.observe.power import NodesPower, parse_power
from sparktop.remote.local import LocalTransport
from sparktop.settings import Preferences
from tests.helpers.simulated import sim_clock, sim_twin, simulated


def test_power_readings_parse_as_nvidia_smi_prints_them():
    assert parse_power("11.73\n") == 11.73
    assert parse_power("11.73 W\n40.10 W\n") == pytest.approx(51.83)  # two GPUs: summed
    assert parse_power("[N/A]\n") is None and parse_power("") is None


@simulated
async def test_each_level_gets_its_power_and_energy_per_token(tmp_path):
    clock = sim_clock()
    readings: list[tuple[float, float]] = []  # (when the reading was returned, watts)
    # Per level: when its warm-up began, when its measured batches began, when it was done.
    levels: dict[int, tuple[float, float, float]] = {}
    async with sim_twin("llama-3.1-8b", speed=4, clock=clock) as server:

        async def power() -> float:
            # A GPU that draws more with more requests running, as a GB10 does.
            await asyncio.sleep(0.01)
            watts = 12.0 + 9.0 * len(server.engine.running)
            readings.append((clock.now(), watts))
            return watts

        # Levels of a few seconds each: a power reading a second, as on a Spark. Each warms up first: what the
        # GPU draws then is read, and is no part of the level's figure.
        sweep = Sweep(SweepSettings(server.url + "/v1", levels=[1, 4], runs=2, pp=256, tg=256, exact_tg=True),
                      tmp_path / "runs", power=power, clock=clock)
        began: dict[tuple[int, bool], float] = {}
        async for event in sweep.events():
            if isinstance(event, LevelStarted):
                began[event.concurrency, event.warmup] = clock.now()
            elif isinstance(event, LevelDone):
                c = event.stats.concurrency
                levels[c] = (began[c, True], began[c, False], clock.now())
    run = load_run(sweep.writer.dir)
    c1, c4 = run.levels()
    for lv in (c1, c4):
        warm, start, end = levels[lv.concurrency]
        assert any(warm < t < start for t, _ in readings)  # the warm-up's draw was read too
        inside = [watts for t, watts in readings if start < t < end]
        # The level's power is the mean of the readings taken while its measured batches ran, one a second.
        assert sweep_samples(run, lv.concurrency) == len(inside) >= int((end - start) / POWER_INTERVAL) >= 2
        assert lv.power_w == pytest.approx(sum(inside) / len(inside), rel=1e-12)
        assert lv.j_per_token == pytest.approx(lv.power_w / lv.e2e_tps_total)
        assert lv.wh_per_mtok == pytest.approx(lv.j_per_token * 1e6 / 3600)
    assert c4.power_w > c1.power_w, "four requests running draw more than one"
    assert c4.j_per_token < c1.j_per_token, "four requests share the draw: less energy per token"

    prefs = Preferences(energy_price_per_kwh=0.30, currency="EUR")
    data = export.as_json(run, prefs.energy_price_per_kwh)
    assert data["levels"][1]["cost_per_mtok"] == pytest.approx(c4.wh_per_mtok / 1000 * 0.30)
    md = export.markdown(run, prefs)
    assert "| J/tok |" in md and "cost/Mtok" in md and f"{c1.j_per_token:.2f}" in md
    assert "least energy per token at c4" in md
    csv = export.csv_text([run], 0.30).splitlines()
    assert "j_per_token" in csv[0] and "cost_per_mtok" in csv[0]
    assert json.loads(json.dumps(data))  # plain JSON


def sweep_samples(run, c: int) -> int:
    return run.engine[c].power_samples


async def test_no_power_reading_means_no_energy_columns(twin, tmp_path):
    server = await twin("llama-3.1-8b", speed=20)
    nowhere = NodesPower({"spark-a": LocalTransport(env={"PATH": str(tmp_path)})})  # no nvidia-smi there
    sweep = Sweep(SweepSettings(server.url + "/v1", levels=[1], runs=1, pp=128, tg=16, warmup=False),
                  tmp_path / "runs", power=nowhere)
    await sweep.run()
    run = load_run(sweep.writer.dir)
    assert run.levels()[0].j_per_token is None
    assert "J/tok" not in export.markdown(run, Preferences(energy_price_per_kwh=0.3))
