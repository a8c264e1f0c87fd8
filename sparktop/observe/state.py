"""Everything the screen shows, kept as plain data: the latest snapshot of
every node and engine plus a bounded history of the figures drawn as
sparklines and charts. Live polling and replay both feed it the same
events; the UI only reads it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from sparktop.observe.snapshot import GIB, EngineGone, EngineSnapshot, NodeSnapshot, ObserveEvent

HISTORY = 3600  # points per series: an hour at the default interval



@dataclass
class Reset:
    """Replay seeking: forget everything before the events that follow."""


@dataclass
class History:
    maxlen: int = HISTORY
    t: deque = field(default_factory=deque)
    series: dict[str, deque] = field(default_factory=dict)

    def push(self, t: float, values: dict[str, float | None]) -> None:
        if self.t and t <= self.t[-1]:
            return  # a re-emitted snapshot (state change) adds no point
        if not self.t:
            self.t = deque(maxlen=self.maxlen)
        self.t.append(t)
        for name, value in values.items():
            if name not in self.series:
                self.series[name] = deque([None] * (len(self.t) - 1), maxlen=self.maxlen)
            self.series[name].append(value)

    def values(self, name: str, last: int | None = None) -> list[float]:
        """Recent values with gaps as 0 (what a sparkline can draw)."""
        data = self.series.get(name)
        if not data:
            return []
        items = list(data)[-last:] if last else list(data)
        return [0.0 if v is None else float(v) for v in items]

    def points(self, name: str) -> tuple[list[float], list[float]]:
        """(t, value) pairs without gaps, for charts."""
        data: Iterable = self.series.get(name, ())
        xs: list[float] = []
        ys: list[float] = []
        for t, v in zip(self.t, data, strict=False):
            if v is not None:
                xs.append(t)
                ys.append(float(v))
        return xs, ys


class ClusterState:
    def __init__(self, history: int = HISTORY):
        self._clear(history)

    def _clear(self, history: int) -> None:
        self.history_len = history
        self.nodes: dict[str, NodeSnapshot] = {}
        self.engines: dict[str, EngineSnapshot] = {}
        self.node_history: dict[str, History] = {}
        self.engine_history: dict[str, History] = {}
        self.version = 0  # bumps on every change, so a view can skip redraws

    def apply(self, event: ObserveEvent | Reset) -> None:
        self.version += 1
        if isinstance(event, NodeSnapshot):
            self.nodes[event.name] = event
            if event.state == "ok":
                self._node_point(event)
        elif isinstance(event, EngineSnapshot):
            self.engines[event.key] = event
            if event.state in ("ready", "sleeping"):  # asleep, the charts go on (at zero)
                self._engine_point(event)
        elif isinstance(event, EngineGone):
            self.engines.pop(event.key, None)
        elif isinstance(event, Reset):
            self._clear(self.history_len)

    def _node_point(self, s: NodeSnapshot) -> None:
        h = self.node_history.setdefault(s.name, History(self.history_len))
        mem = s.memory
        h.push(s.t, {
            "mem_used_gib": mem.used / GIB if mem else None,
            "mem_frac": mem.used_fraction if mem else None,
            "gpu_util": s.gpu.util if s.gpu else None,
            "cpu": s.cpu_pct,
            "power": s.gpu.power if s.gpu else None,
        })

    def _engine_point(self, s: EngineSnapshot) -> None:
        h = self.engine_history.setdefault(s.key, History(self.history_len))
        h.push(s.t, {
            "kv": s.kv_usage, "running": s.running, "waiting": s.waiting, "gen_tps": s.gen_tps,
            "prompt_tps": s.prompt_tps, "ttft_p50": s.ttft_p50, "itl_p50": s.itl_p50,
        })

    def ordered_nodes(self) -> list[NodeSnapshot]:
        return [self.nodes[k] for k in sorted(self.nodes)]

    def ordered_engines(self) -> list[EngineSnapshot]:
        return sorted(self.engines.values(), key=lambda e: (e.node or "~", e.url))
