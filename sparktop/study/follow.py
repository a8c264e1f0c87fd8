"""Following a study that another process runs (`sparktop --study ID`).

The study's own process writes `study.json` after every change and each
request to its run's `requests.jsonl` as it finishes; this reads them back
as the same events the runner emits in-process (`StudyStarted`,
`TopologyStarted`, `StageChanged`, `SweepUpdate(LevelDone)`,
`TopologyFinished`, `StudyFinished`), so a screen draws a study the same
way whether it runs here or headless. It reads files only, at `interval`,
re-armed after each read; what it cannot see from files (the launch log
lines, each request of a batch) the attached screen does not show.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from sparktop.bench.events import LevelDone
from sparktop.bench.results import load_run
from sparktop.errors import SparktopError
from sparktop.study.events import (
    StageChanged,
    StudyEvent,
    StudyFinished,
    StudyStarted,
    SweepUpdate,
    TopologyFinished,
    TopologyStarted,
)
from sparktop.study.state import PENDING, STUDY, load_study


async def follow(study_dir: Path, interval: float = 0.5) -> AsyncIterator[StudyEvent]:
    study = load_study(study_dir)
    yield StudyStarted(study, resumed=False, removed=0)
    stamp = None
    stages: dict[str, str] = {}
    statuses: dict[str, str] = {}
    levels: dict[str, set[int]] = {}
    while True:
        try:
            mtime = (Path(study.dir) / STUDY).stat().st_mtime_ns
            if mtime != stamp:
                stamp = mtime
                study = load_study(study.dir)
        except (OSError, SparktopError):
            await asyncio.sleep(interval)  # rewritten at this moment: read it next time
            continue
        total = len(study.topologies)
        for index, t in enumerate(study.topologies):
            before = statuses.get(t.name)
            if before is None:
                statuses[t.name] = t.status
                if t.status != PENDING and not t.finished:
                    yield TopologyStarted(t.name, index, total)
            elif before == PENDING and t.status != PENDING:
                yield TopologyStarted(t.name, index, total)
            if t.stage and stages.get(t.name) != t.stage:
                stages[t.name] = t.stage
                yield StageChanged(t.name, t.stage)
            run_dir = study.run_dir(t)
            if run_dir is not None and run_dir.exists():
                try:
                    measured = load_run(run_dir).levels()
                except SparktopError:
                    measured = []
                seen = levels.setdefault(t.name, set())
                for lv in measured:
                    if lv.concurrency not in seen and (t.finished or _complete(lv, study.runs)):
                        seen.add(lv.concurrency)
                        yield SweepUpdate(t.name, LevelDone(lv))
            if before != t.status and t.finished:
                yield TopologyFinished(t.name, t.status, t.reason, list(t.lines))
            statuses[t.name] = t.status
        if study.status != "running" or not study.running_here():
            yield StudyFinished(study, study.state)
            return
        await asyncio.sleep(interval)


def _complete(level, runs: int) -> bool:
    """A level with all its batches."""
    return level.runs >= runs
