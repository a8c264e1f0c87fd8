"""Replicas of one model behind a router (`2x tp=2`, `4x solo,shuffle`): each one's share of the requests
and whether it lags the others.

The replicas of a layout are the engines serving the same model in the same replicated layout. A replica
lags when its TTFT or ITL p95 is over `LAG_RATIO` times the median of the replicas', or its KV cache is
more than `KV_GAP` points above their median (vllm-htop's rule for the replica that falls behind): a slow
node, a router that piles requests on one backend, a replica whose cache fills first.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from sparktop.layouts import layout_of
from sparktop.observe.snapshot import EngineSnapshot

LAG_RATIO = 1.5
KV_GAP = 0.15


@dataclass(frozen=True)
class Replica:
    key: str
    share: float | None  # of the group's finished requests per second, 0..1 (None: no rate yet)
    lagging: str | None  # why it lags the others, in words


def groups(engines: Iterable[EngineSnapshot]) -> dict[tuple[str, str], list[EngineSnapshot]]:
    """Ready engines by (model, layout), for layouts with replicas only; each group has two or more."""
    out: dict[tuple[str, str], list[EngineSnapshot]] = {}
    for e in engines:
        layout = layout_of(e.topology)
        if e.state == "ready" and e.model and layout is not None and layout.replicas > 1 and e.topology:
            out.setdefault((e.model, e.topology), []).append(e)
    return {k: sorted(v, key=lambda e: e.key) for k, v in out.items() if len(v) > 1}


def _lag(e: EngineSnapshot, others: list[EngineSnapshot]) -> str | None:
    for name, value, pick in (("TTFT p95", e.ttft_p95, lambda o: o.ttft_p95),
                              ("ITL p95", e.itl_p95, lambda o: o.itl_p95)):
        peers = [v for v in (pick(o) for o in others) if v]
        if value and peers and value > LAG_RATIO * statistics.median(peers):
            return f"{name} {value * 1000:.0f} ms, {value / statistics.median(peers):.1f}× the other replicas'"
    peers_kv = [o.kv_usage for o in others if o.kv_usage is not None]
    if e.kv_usage is not None and peers_kv and e.kv_usage - statistics.median(peers_kv) > KV_GAP:
        return f"KV cache {e.kv_usage:.0%} against {statistics.median(peers_kv):.0%} on the other replicas"
    return None


def replicas(group: list[EngineSnapshot]) -> list[Replica]:
    """Each replica of one group: its share of the requests and whether it lags the others."""
    rates = [e.finished_rate for e in group]
    total = sum(r for r in rates if r)
    return [Replica(e.key, (e.finished_rate or 0.0) / total if total else None,
                    _lag(e, [o for o in group if o is not e])) for e in group]


def replica_of(engines: Iterable[EngineSnapshot], key: str) -> Replica | None:
    """The engine `key` as a replica of its group, or None when it is not one."""
    for group in groups(engines).values():
        for r in replicas(group):
            if r.key == key:
                return r
    return None
