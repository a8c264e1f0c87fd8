"""A sweep run as it is read back: its metadata, its requests and its levels.

The readers of each format that holds a run build one: `results.load_run` (a
run directory, llama-benchy's JSON) and `arena.read_arena` (Spark Arena's
files). Apart from them so that each reader may import the other's module.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from sparktop.bench.request import RequestRecord
from sparktop.bench.stats import (
    EngineWatch,
    LevelKey,
    LevelStats,
    RateLevelStats,
    level_stats,
    parse_slo,
    rate_level_stats,
)


@dataclass
class Run:
    """A run as read back: its metadata, its requests and its levels."""

    path: Path | None
    meta: dict
    records: list[RequestRecord] = field(default_factory=list)
    engine: dict[int, EngineWatch] = field(default_factory=dict)
    imported_levels: list[LevelStats] | None = None  # from llama-benchy, which keeps no requests

    @property
    def id(self) -> str:
        return self.meta.get("id") or (self.path.name if self.path else "run")

    @property
    def label(self) -> str:
        return self.meta.get("label") or self.meta.get("topology") or self.id

    def batches(self) -> dict[LevelKey, list[list[RequestRecord]]]:
        """Complete batches per level (its concurrency, and its depth in a depth sweep). A batch cut short
        by a crash is left out of the figures (its requests stay on disk); when a resumed run redid it, the
        complete attempt is the one that counts."""
        groups: dict[tuple[int, int, int, int], list[RequestRecord]] = defaultdict(list)
        for r in self.records:
            if r.scheduled is not None or r.context_load:
                continue  # a rate sweep's request (`rate_levels`), or a context loaded before a batch
            groups[(r.depth, r.level, r.run, r.attempt)].append(r)
        chosen: dict[tuple[int, int, int], list[RequestRecord]] = {}
        for (depth, level, run, _attempt), recs in sorted(groups.items()):
            if len(recs) >= level:
                chosen[(depth, level, run)] = sorted(recs, key=lambda r: r.index)
        out: dict[LevelKey, list[list[RequestRecord]]] = defaultdict(list)
        for (depth, level, _run), recs in sorted(chosen.items()):
            out[LevelKey(level, depth)].append(recs)
        return dict(out)

    def incomplete(self) -> int:
        """Requests written by batches that never finished."""
        counted = sum(len(b) for bs in self.batches().values() for b in bs)
        return len(self.records) - counted

    @property
    def mode(self) -> str:
        """"rate" for a rate sweep (bench/load.py), else "concurrency" (lockstep batches)."""
        return self.meta.get("mode") or "concurrency"

    def rate_levels(self) -> list[RateLevelStats]:
        """A rate sweep's levels, recomputed from its requests (one level per measured rate, in order)."""
        settings = self.meta.get("settings") or {}
        slo = parse_slo(settings["slo"]) if settings.get("slo") else []
        groups: dict[int, list[RequestRecord]] = defaultdict(list)
        for r in self.records:
            if r.scheduled is not None:
                groups[r.run].append(r)
        return [rate_level_stats(recs, recs[0].rate, settings.get("arrivals") or "poisson", slo, recs[0].depth)
                for _, recs in sorted(groups.items())]

    def levels(self) -> list[LevelStats]:
        if self.imported_levels is not None:
            return self.imported_levels
        latency = float(self.meta.get("latency_s") or 0.0)
        pp = int((self.meta.get("settings") or {}).get("pp") or 0)
        levels = [level_stats(c, bs, latency, pp + c.depth, self.engine.get(c))
                  for c, bs in sorted(self.batches().items())]
        loads: dict[tuple[int, int], dict[int, list[RequestRecord]]] = defaultdict(lambda: defaultdict(list))
        for r in self.records:
            if r.context_load:
                loads[(r.depth, r.level)][r.run].append(r)
        for lv in levels:
            batches = loads.get((lv.depth, lv.concurrency))
            if batches:
                lv.context_load = level_stats(LevelKey(lv.concurrency, lv.depth), list(batches.values()), latency,
                                              lv.depth, peak=False)
        return levels
