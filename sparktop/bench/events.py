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
    from sparktop.bench.load import MaxRate
    from sparktop.bench.stats import RateLevelStats
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

    def describe(self) -> str:
        """`KV 41% · running 8 · waiting 0`, what is known of it."""
        parts = []
        if self.kv_cache_usage is not None:
            parts.append(f"KV {self.kv_cache_usage:.0%}")
        if self.running is not None:
            parts.append(f"running {self.running:.0f}")
        if self.waiting is not None:
            parts.append(f"waiting {self.waiting:.0f}")
        return " · ".join(parts)


@dataclass(frozen=True)
class WaitingForIdle:
    """Before a level: the engine is still serving something, so the level
    waits (up to `timeout_s`) for it to have nothing running or waiting."""

    concurrency: int
    running: float
    waiting: float
    waited_s: float
    timeout_s: float


@dataclass(frozen=True)
class LevelContaminated:
    """An attempt at a level saw foreign traffic (or a busy engine before
    it). `remeasuring`: the level is measured again, and this attempt's
    figures are set aside; else the level is reported as contaminated."""

    concurrency: int
    attempt: int
    foreign_requests: int | None
    reason: str
    remeasuring: bool


@dataclass(frozen=True)
class LevelDone:
    stats: LevelStats


@dataclass(frozen=True)
class SweepFinished:
    status: str  # done | stopped | cancelled | failed
    reason: str | None
    levels: list[LevelStats]
    path: Path


@dataclass(frozen=True)
class RateLevelStarted:
    """A rate sweep's level (bench/load.py) begins: `requests` sent at `rate` per second (None: a trace)."""

    rate: float | None
    requests: int
    index: int


@dataclass(frozen=True)
class RateLevelDone:
    stats: RateLevelStats


@dataclass(frozen=True)
class MaxRateFound:
    """`--find-max-rate`'s answer, once its search ends."""

    result: MaxRate


SweepEvent = (SweepStarted | LevelStarted | RequestDone | EngineSample | WaitingForIdle | LevelContaminated
              | LevelDone | RateLevelStarted | RateLevelDone | MaxRateFound | SweepFinished)
