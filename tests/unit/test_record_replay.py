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


async def test_pause_speed_and_seek():
    rec = Recording(Path("x"), {"recording": 1}, [(100.0 + i, node(100.0 + i, 10 + i)) for i in range(10)])
    source = ReplaySource(rec, speed=20.0)
    seen: list = []

    async def run():
        async for event in source.events():
            seen.append(event)

    task = asyncio.create_task(run())
    await asyncio.sleep(0.18)  # ~3.6 recorded seconds at 20x
    assert 2 <= len(seen) <= 6
    source.pause()
    await asyncio.sleep(0.05)
    frozen = len(seen)
    await asyncio.sleep(0.3)
    assert len(seen) == frozen and source.paused
    source.resume()
    source.seek(-100)  # back to the start: everything is replayed from scratch
    await asyncio.sleep(0.05)
    resets = [i for i, e in enumerate(seen) if isinstance(e, Reset)]
    assert resets and isinstance(seen[resets[-1] + 1], NodeSnapshot) and seen[resets[-1] + 1].t == 100.0
    source.seek(1000)  # to the end
    await asyncio.sleep(0.1)
    assert seen[-1].t == 109.0 and source.finished
    task.cancel()
