"""A recorded two-node demo made into a cluster of N nodes, for the monitor's
layouts with many nodes: every event of spark-a and spark-b is repeated for
spark-c, spark-d, ... (alternately from each recorded node), with their own
addresses (127.0.0.2 ... 127.0.0.9), and the figures of each copy scaled a
little so the nodes do not read the same."""

from __future__ import annotations

import copy
import dataclasses
import string
from pathlib import Path

from sparktop.observe.record import Recording
from sparktop.observe.snapshot import EngineGone, EngineSnapshot, NodeSnapshot, Notice

RECORDED = ("spark-a", "spark-b")


def node_names(n: int) -> list[str]:
    return [f"spark-{string.ascii_lowercase[i]}" for i in range(n)]


def _url(url: str, source: int, index: int) -> str:
    return url.replace(f"127.0.0.{source + 2}:", f"127.0.0.{index + 2}:")


def fanned_recording(path: Path, nodes: int) -> Recording:
    recording = Recording.load(path)
    names = node_names(nodes)
    rows = []
    for t, event in recording.rows:
        rows.append((t, event))
        for index, name in enumerate(names[2:], 2):
            source = index % 2
            scale = 1.0 - 0.07 * (index // 2)  # each pair of copies a little less busy
            if isinstance(event, NodeSnapshot):
                if event.name != RECORDED[source]:
                    continue
                copied = copy.deepcopy(event)
                copied.name = name
                if copied.gpu is not None and copied.gpu.util is not None:
                    copied.gpu.util *= scale
                rows.append((t, copied))
            elif isinstance(event, EngineSnapshot):
                if event.node != RECORDED[source]:
                    continue
                copied = copy.deepcopy(event)
                copied.url = _url(event.url, source, index)
                copied.key = _url(event.key, source, index)
                copied.node = name
                for field in ("gen_tps", "prompt_tps", "running"):
                    value = getattr(copied, field)
                    if value is not None:
                        setattr(copied, field, value * scale)
                rows.append((t, copied))
            elif isinstance(event, Notice):
                key = event.key
                if event.subject == "node" and key == RECORDED[source]:
                    rows.append((t, dataclasses.replace(event, key=name)))
                elif event.subject == "engine" and f"127.0.0.{source + 2}:" in key:
                    rows.append((t, dataclasses.replace(event, key=_url(key, source, index))))
            elif isinstance(event, EngineGone) and f"127.0.0.{source + 2}:" in event.key:
                rows.append((t, EngineGone(_url(event.key, source, index))))
    return Recording(recording.path, recording.header, rows)


def fanned_app(path: Path, nodes: int):
    """The app on a paused replay of the recording fanned out to `nodes` nodes, at its end."""
    from sparktop.observe.record import ReplaySource
    from sparktop.ui.app import SparktopApp

    source = ReplaySource(fanned_recording(path, nodes), speed=1.0)
    source.seek(1e12)
    source.pause()
    return SparktopApp(source, replay=True)


async def settle_fanned(pilot, nodes: int) -> None:
    """Until the screen shows every node and engine, not only the state (a
    paused replay's screen is painted at most once a second), then a moment more."""
    from sparktop.ui.cards import Card

    app = pilot.app
    for _ in range(600):
        if len(list(app.screen.query(Card))) == 2 * nodes and f"{nodes} nodes" in str(
                app.screen.query_one("#status").content):
            break
        await pilot.pause(0.1)
    await pilot.pause(0.8)
