"""What a sweep reports while it runs.

`Sweep.events()` yields these in order, ending with `SweepFinished`; the
CLI draws a rich progress display from them, the app turns each into a
message. Match on the type (`match event: case LevelDone(stats=s): ...`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparktop.bench.request import RequestRecord
from sparktop.bench.stats import LevelStats

if TYPE_CHECKING:
    from sparktop.bench.sweep import SweepSettings


@dataclass(frozen=True)
class SweepStarted:
    run_id: str
    path: Path
    model: str
    settings: SweepSettings
    total_requests: int
    resumed_requests: int = 0


@dataclass(frozen=True)
class LevelStarted:
    concurrency: int
    warmup: bool


@dataclass(frozen=True)
class RequestDone:
    record: RequestRecord
    done: int  # recorded requests so far, whole sweep
    total: int
    level_done: int
    level_total: int
    live_tps: float | None  # aggregate decode tokens/s of the batch so far
    eta_s: float | None


@dataclass(frozen=True)
class EngineSample:
    kv_cache_usage: float | None
    running: float | None
    waiting: float | None


@dataclass(frozen=True)
class LevelDone:
    stats: LevelStats


@dataclass(frozen=True)
class SweepFinished:
    status: str  # done | stopped | cancelled | failed
    reason: str | None
    levels: list[LevelStats]
    path: Path


SweepEvent = SweepStarted | LevelStarted | RequestDone | EngineSample | LevelDone | SweepFinished
