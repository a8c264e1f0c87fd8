"""What a launch reports while it runs: the executor's events.

`Executor.run()` yields these in order; the CLI prints them, `LaunchRun`
folds them into the state a screen draws, the app turns each into a
message. Match on the type (`match event: case Ready(): ...`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparktop.launch.plan import Plan, Step


@dataclass(frozen=True)
class StepStarted:
    index: int
    step: Step


@dataclass(frozen=True)
class StepDone:
    index: int
    step: Step
    seconds: float


@dataclass(frozen=True)
class LogLine:
    node: str
    container: str
    line: str


@dataclass(frozen=True)
class Stage:
    """A container's start-up stage as its log shows it (loading weights, …)."""

    node: str
    container: str
    stage: str


@dataclass(frozen=True)
class Ready:
    plan: Plan
    seconds: float


@dataclass(frozen=True)
class Failed:
    reason: str
    lines: list[str] = field(default_factory=list)  # the log lines that say why


@dataclass(frozen=True)
class TornDown:
    launch_id: str
    nodes: list[str]
    removed: int


LaunchEvent = StepStarted | StepDone | LogLine | Stage | Ready | Failed | TornDown
