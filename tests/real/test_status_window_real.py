"""`sparktop status --seconds N` means its N seconds: against the real vLLM 0.32, a load that stops
before status's last polls still shows in the generation rate it prints, because the rate is the server's
counter over the whole watch, not between its last two polls.

Before, status reported the rate between its last two polls: a real engine's counters move in bursts (its
gauges stood still while 8 requests ran), so three runs in a row printed 0.0, and its latency percentiles
were null in 2 runs of 5. Here the last polls see a counter that stands still by construction (the load is
stopped while status watches), which is what the old status printed 0.0 for.

Status reads the server through a recording proxy (tests/helpers/recording_proxy.py): the test knows every
body it read. How close the rate comes to the counter's over the same seconds is a measurement of this
machine: `python -m tests.benchmarks.status_window`."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from tests.helpers.recording_proxy import RecordingProxy
from tests.helpers.wait import eventually
from tests.real.test_monitor_real import start_sweep, stop, wait_busy

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]

# Long enough that status polls a few more times after the load stops, however busy the machine (it polls
# once a second; the load stops after its third poll).
SECONDS = 20
STOP_AFTER = 3
GEN = "vllm:generation_tokens_total"


async def test_status_shows_a_load_that_stopped_before_its_last_polls(vllm_server, tmp_path):
    """About 25 s: status's twenty seconds, and the load's start."""
    proxy = await RecordingProxy(vllm_server.url).start()
    load = start_sweep(vllm_server, tmp_path, c=8, runs=20, pp=64, tg=1024)
    try:
        await wait_busy(vllm_server.url)
        status = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sparktop", "status", "--json", "--engine", proxy.url, "--seconds", str(SECONDS),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        # Status has read the load a few times: then the load stops, early in its watch.
        await eventually(lambda: len(proxy.scrapes) >= STOP_AFTER, timeout=60, step=0.1,
                         what=f"{STOP_AFTER} polls by status")
        await asyncio.to_thread(stop, load)
        out, err = await asyncio.wait_for(status.communicate(), 120)
        assert status.returncode == 0, err.decode()[-2000:]
    finally:
        await asyncio.to_thread(stop, load)
        await proxy.stop()
    doc = json.loads(out)
    (engine,) = [e for e in doc["engines"] if e["url"] == proxy.url]
    assert doc["window_s"] == SECONDS
    counters = [r.values[GEN] for r in proxy.scrapes]
    # The precondition: status's last polls saw the counter stand still (the rate between them is 0) ...
    assert counters[-1] == counters[-2] == counters[-3], f"the load did not stop before status's last polls: " \
                                                         f"{counters}"
    # ... after it had grown while status watched.
    assert counters[0] < counters[-1], counters
    assert engine["gen_tokens_total"] == counters[-1]
    assert engine["gen_tps"] and engine["gen_tps"] > 0, (engine["gen_tps"], counters)
    # Latency percentiles over the same window: the requests that ran in it.
    assert engine["latency_ms"] and engine["latency_ms"]["itl"]["p50"], engine["latency_ms"]
