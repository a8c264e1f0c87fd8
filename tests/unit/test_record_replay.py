"""Recording a session and playing it back: nothing lost, same screen data,
pause, speed and seek."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sparktop.errors import SparktopError
from sparktop.observe.record import Recorder, Recording, ReplaySource
from sparktop.observe.snapshot import EngineGone, EngineSnapshot, Memory, NodeSnapshot
from sparktop.observe.state import ClusterState, Reset
from tests.helpers.simulated import simulated

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "recording-demo.jsonl"


def node(t: float, used_gib: float) -> NodeSnapshot:
    total = 128 * 1024**3
    return NodeSnapshot(name="spark-a", t=t, state="ok",
                        memory=Memory(total=total, available=total - int(used_gib * 1024**3)))


def engine(t: float, kv: float) -> EngineSnapshot:
    return EngineSnapshot(key="http://a:8000", url="http://a:8000", t=t, state="ready", kv_usage=kv, gen_tps=10 * kv)


def test_recorder_writes_every_event_as_it_happens(tmp_path):
    path = tmp_path / "rec.jsonl"
    rec = Recorder(path, interval=1.0)
    rec.write(node(100.0, 60))
    # Written and flushed before close: a killed session keeps it.
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["recording"] == 1 and json.loads(lines[1])["node"]["name"] == "spark-a"
    rec.write(engine(100.5, 0.25))
    rec.write(EngineGone("http://a:8000"))
    rec.close()
    loaded = Recording.load(path)
    assert [type(e).__name__ for _, e in loaded.rows] == ["NodeSnapshot", "EngineSnapshot", "EngineGone"]
    assert loaded.rows[0][1].memory.used == 60 * 1024**3


def test_a_line_cut_short_by_a_crash_is_tolerated(tmp_path):
    path = tmp_path / "rec.jsonl"
    rec = Recorder(path, interval=1.0)
    rec.write(node(1.0, 10))
    rec.close()
    with open(path, "a") as f:
        f.write('{"t": 2.0, "node": {"name": "spark-a", "t"')  # killed mid-write
    assert len(Recording.load(path).rows) == 1


def test_bad_recordings_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"sparktop": "0.1.0", "recording": 1}\nnot json\n{"t": 1, "engine": {}}\n')
    with pytest.raises(SparktopError, match=r"bad.jsonl:2: not a JSON line"):
        Recording.load(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"t": 1}\n')
    with pytest.raises(SparktopError, match="no header"):
        Recording.load(empty)
    with pytest.raises(SparktopError, match="cannot read"):
        Recording.load(tmp_path / "missing.jsonl")


def test_replaying_the_demo_recording_rebuilds_the_same_state():
    recording = Recording.load(FIXTURE)
    live = ClusterState()
    for _, event in recording.rows:
        live.apply(event)
    assert set(live.nodes) == {"spark-a", "spark-b"} and len(live.engines) == 2
    assert all(e.state == "ready" and e.model == "gpt-oss-120b" for e in live.engines.values())
    assert all(n.memory.total == 128452014080 for n in live.nodes.values())  # 119.6 GiB

    async def play() -> ClusterState:
        source = ReplaySource(recording, speed=1e6)
        state = ClusterState()
        count = 0

        async def run():
            nonlocal count
            async for event in source.events():
                state.apply(event)
                count += 1
                if count == len(recording.rows):
                    return

        await asyncio.wait_for(run(), 10)
        return state

    replayed = asyncio.run(play())
    assert {k: v.kv_usage for k, v in replayed.engines.items()} == {k: v.kv_usage for k, v in live.engines.items()}
    for key in live.engine_history:
        assert replayed.engine_history[key].values("gen_tps") == live.engine_history[key].values("gen_tps")


@simulated
async def test_pause_speed_and_seek():
    """On simulated time (ReplaySource waits only with asyncio timeouts): a row
    recorded a second after the last comes exactly 1/speed s later, so each
    check looks a millisecond either side of when a row is due."""
    rec = Recording(Path("x"), {"recording": 1}, [(100.0 + i, node(100.0 + i, 10 + i)) for i in range(10)])
    source = ReplaySource(rec, speed=20.0)
    seen: list = []

    async def run():
        async for event in source.events():
            seen.append(event)

    def times() -> list[float]:
        return [e.t for e in seen if isinstance(e, NodeSnapshot)]

    task = asyncio.create_task(run())
    try:
        await asyncio.sleep(0.149)  # at 20x the row of 103 is due 0.15 s in
        assert times() == [100.0, 101.0, 102.0]
        await asyncio.sleep(0.002)
        assert times() == [100.0, 101.0, 102.0, 103.0]
        source.pause()
        await asyncio.sleep(10.0)  # 200 recorded seconds, paused: nothing
        assert times() == [100.0, 101.0, 102.0, 103.0] and source.paused
        source.resume()
        await asyncio.sleep(0.049)  # it goes on from where it stood, 103: 104 is 0.05 s away
        assert times()[-1] == 103.0
        await asyncio.sleep(0.002)
        assert times()[-1] == 104.0
        source.seek(-100)  # back to the start: everything is replayed from scratch
        await asyncio.sleep(0.001)
        assert isinstance(seen[-2], Reset) and times()[-1] == 100.0 and source.position == 100.0
        source.speed = 10.0  # now a recorded second takes 0.1 s
        await asyncio.sleep(0.099)
        assert isinstance(seen[-2], Reset)  # at 20x 101 would have come at 0.05 s
        await asyncio.sleep(0.002)
        assert isinstance(seen[-3], Reset) and times()[-2:] == [100.0, 101.0]
        source.seek(1000)  # to the end, at once: all of it within a simulated millisecond
        await asyncio.sleep(0.001)
        last = max(i for i, e in enumerate(seen) if isinstance(e, Reset))
        assert [e.t for e in seen[last + 1:]] == [100.0 + i for i in range(10)] and source.finished
    finally:
        task.cancel()
