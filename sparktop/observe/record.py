"""Recording a monitor session and playing it back.

A recording is JSON lines: a header, then one line per event as the poller
produced it (`{"t": ..., "node": {...}}`, `{"t": ..., "engine": {...}}`,
`{"t": ..., "gone": key}`, `{"t": ..., "notice": {...}}`). Each line is flushed as it is written, so a
session that ends badly loses nothing. Playback feeds the same events to a
ClusterState at the recorded pace (or faster), with pause and seek.

The recorder stamps what has no time of its own (its start, an engine gone)
with its `Clock`'s wall time (`sparktop.clock`, the system's by default).
Playback only waits, with asyncio timeouts: it runs on the running loop's
clock, so on a virtual-time loop a test plays a recording in simulated time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from sparktop import __version__
from sparktop.clock import SYSTEM, Clock
from sparktop.errors import SparktopError
from sparktop.observe.snapshot import (
    EngineGone,
    EngineSnapshot,
    NodeSnapshot,
    Notice,
    engine_from_dict,
    node_from_dict,
    to_dict,
)
from sparktop.observe.state import Reset


def encode(event, now: float | None = None) -> dict:
    """A recording's line for `event`; `now` (epoch seconds) stamps an event that has no time of its own."""
    if isinstance(event, NodeSnapshot):
        return {"t": event.t, "node": to_dict(event)}
    if isinstance(event, EngineSnapshot):
        return {"t": event.t, "engine": to_dict(event)}
    if isinstance(event, EngineGone):
        return {"t": SYSTEM.wall() if now is None else now, "gone": event.key}
    if isinstance(event, Notice):
        return {"t": event.t, "notice": event.to_dict()}
    raise TypeError(type(event))


def decode(row: dict):
    if "node" in row:
        return node_from_dict(row["node"])
    if "engine" in row:
        return engine_from_dict(row["engine"])
    if "gone" in row:
        return EngineGone(row["gone"])
    if "notice" in row:
        return Notice.from_dict(row["notice"])
    return None


class Recorder:
    def __init__(self, path: str | Path, interval: float, clock: Clock = SYSTEM):
        self.path = Path(path)
        self.clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open while recording
        self._write({"sparktop": __version__, "recording": 1, "started": clock.wall(), "interval": interval})

    def _write(self, row: dict) -> None:
        self._file.write(json.dumps(row, separators=(",", ":")) + "\n")
        self._file.flush()

    def write(self, event) -> None:
        self._write(encode(event, self.clock.wall()))

    def close(self) -> None:
        self._file.close()


@dataclass
class Recording:
    path: Path
    header: dict
    rows: list[tuple[float, object]] = field(default_factory=list)

    @property
    def start(self) -> float:
        return self.rows[0][0] if self.rows else 0.0

    @property
    def end(self) -> float:
        return self.rows[-1][0] if self.rows else 0.0

    @classmethod
    def load(cls, path: str | Path) -> Recording:
        path = Path(path)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise SparktopError(f"{path}: cannot read: {exc.strerror}") from None
        header: dict = {}
        rows = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                if number == len(lines):
                    break  # a line cut short when the recorder was killed
                raise SparktopError(f"{path}:{number}: not a JSON line") from None
            if "recording" in row:
                header = row
                continue
            try:
                event = decode(row)
            except (TypeError, KeyError) as exc:
                raise SparktopError(f"{path}:{number}: not a sparktop recording line ({exc})") from None
            if event is not None:
                rows.append((float(row.get("t", 0.0)), event))
        if not header:
            raise SparktopError(f"{path}:1: not a sparktop recording (no header line)")
        rows.sort(key=lambda r: r[0])
        return cls(path, header, rows)


class ReplaySource:
    """Plays a recording; `speed`, `paused` and `seek()` are the controls."""

    def __init__(self, recording: Recording, speed: float = 1.0):
        self.recording = recording
        self.speed = speed
        self._paused = asyncio.Event()
        self._paused.set()
        self._index = 0
        self.position = recording.start  # recorded time shown on screen
        self._jump: float | None = None
        self._wake = asyncio.Event()
        self.finished = False

    @property
    def paused(self) -> bool:
        return not self._paused.is_set()

    def pause(self) -> None:
        self._paused.clear()
        self._wake.set()

    def resume(self) -> None:
        self._paused.set()
        self._wake.set()

    @property
    def speed(self) -> float:
        return self._speed

    @speed.setter
    def speed(self, value: float) -> None:
        self._speed = value
        if hasattr(self, "_wake"):
            self._wake.set()

    def seek(self, delta: float) -> None:
        target = max(self.recording.start, min(self.recording.end, self.position + delta))
        self._jump = target
        self._wake.set()

    async def _wait(self, timeout: float | None) -> bool:
        """Sleep until woken (seek, resume, speed change) or timeout; True if woken."""
        self._wake.clear()
        if self._jump is not None:
            return True
        try:
            # Not `wait_for`: on Python 3.11 it drops a cancel that comes as the wait ends.
            async with asyncio.timeout(timeout):
                await self._wake.wait()
            return True
        except TimeoutError:
            return False

    async def events(self) -> AsyncIterator[object]:
        rows = self.recording.rows
        while True:
            if self._jump is not None:
                # Seeking rebuilds the screen from the start up to the target,
                # paused or not, so the picture always matches the position.
                target, self._jump = self._jump, None
                yield Reset()
                self._index = 0
                while self._index < len(rows) and rows[self._index][0] <= target:
                    yield rows[self._index][1]
                    self._index += 1
                self.position = target
                self.finished = self._index >= len(rows)
                continue
            if self._index >= len(rows):
                self.finished = True
                await self._wait(None)
                continue
            if self.paused:
                await self._wait(None)
                continue
            t, event = rows[self._index]
            delay = (t - self.position) / max(self.speed, 0.01)
            if delay > 0 and await self._wait(delay):
                continue  # woken: re-check seek, pause and speed
            self.position = max(self.position, t)
            self._index += 1
            yield event
