"""What a study reports while it runs.

`StudyRunner.events()` yields these in order, ending with `StudyFinished`.
The launch and the sweep of the current topology come through wrapped
(`LaunchUpdate`, `SweepUpdate`), so a screen can show the live sweep view
it already has; the study itself never draws anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparktop.bench.events import SweepEvent
from sparktop.launch.events import LaunchEvent
from sparktop.study.state import Study


@dataclass(frozen=True)
class StudyStarted:
    study: Study
    resumed: bool
    removed: int  # containers a resumed study found left over and removed first


@dataclass(frozen=True)
class TopologyStarted:
    name: str
    index: int  # 0-based, in the study's order
    total: int


@dataclass(frozen=True)
class StageChanged:
    name: str  # the topology
    stage: str  # "preflight", "launching: loading weights", "sweeping c8", "stopping" ...


@dataclass(frozen=True)
class LaunchUpdate:
    name: str
    event: LaunchEvent


@dataclass(frozen=True)
class SweepUpdate:
    name: str
    event: SweepEvent


@dataclass(frozen=True)
class TopologyFinished:
    name: str
    status: str  # done | failed
    reason: str | None
    lines: list[str]


@dataclass(frozen=True)
class StudyFinished:
    study: Study
    status: str  # done | cancelled | interrupted


StudyEvent = (StudyStarted | TopologyStarted | StageChanged | LaunchUpdate | SweepUpdate | TopologyFinished
              | StudyFinished)
