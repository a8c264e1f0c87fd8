"""Replicas of one model behind a router (`2x tp=2`, `4x solo,shuffle`): each one's share of the requests
and whether it lags the others.

The replicas of a layout are the engines serving the same model in the same replicated layout. A replica
lags when its TTFT or ITL p95 is over `LAG_RATIO` times the median of the replicas', or its KV cache is
more than `KV_GAP` points above their median (vllm-htop's rule for the replica that falls behind): a slow
node, a router that piles requests on one backend, a replica whose cache fills first.

The group's own latency (`group_latency`: TTFT, ITL, queue and e2e p50/p95/p99 of every request the
replicas served) is taken as Prometheus' `histogram_quantile(q, sum by (le) (rate(...)))` takes it: each
replica's histogram over its window (`EngineSnapshot.latency_histograms`), their bucket counts summed, the
quantile of the sum. Never a mean of the replicas' percentiles: a mean of p95s is not a p95 (a slow replica
serving a tenth of the requests moves the group's p95 little and the mean of two p95s half way).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from sparktop.engine_ids import is_router
from sparktop.layouts import layout_of
from sparktop.observe.prometheus import QUANTILES, Histogram, histogram_quantiles
from sparktop.observe.snapshot import FIGURES, EngineSnapshot

LAG_RATIO = 1.5
KV_GAP = 0.15


@dataclass(frozen=True)
class Replica:
    key: str
    share: float | None  # of the group's finished requests per second, 0..1 (None: no rate yet)
    lagging: str | None  # why it lags the others, in words


def groups(engines: Iterable[EngineSnapshot]) -> dict[tuple[str, str], list[EngineSnapshot]]:
    """Ready engines by (model, layout), for layouts with replicas only; each group has two or more. The
    router in front of them shares their model and layout, but is not one of them (`group_behind`)."""
    out: dict[tuple[str, str], list[EngineSnapshot]] = {}
    for e in engines:
        layout = layout_of(e.topology)
        if (e.state == "ready" and e.model and layout is not None and layout.replicas > 1 and e.topology
                and not is_router(e.kind)):
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


def group_behind(engines: Iterable[EngineSnapshot], router: EngineSnapshot) -> list[EngineSnapshot] | None:
    """The replicas `router` routes to: the group of its model and layout; of its layout alone when its
    model names none of them and only one group has that layout (a router serving the model under another
    name)."""
    found = groups(engines)
    if (router.model or "", router.topology or "") in found:
        return found[(router.model or "", router.topology or "")]
    same = [g for (_, topology), g in found.items() if topology == router.topology]
    return same[0] if len(same) == 1 else None


def merge(histograms: list[Histogram]) -> Histogram | None:
    """Several engines' histograms (cumulative bucket counts, sum) as one: Prometheus' `sum by (le)`.

    Replicas of one launch have the same bounds. Where they differ (engines of different versions), the
    counts are summed on the bounds every one of them has: there each count is exact, while on the union
    of bounds a replica's count at a bound it lacks is only bounded from below (its next bound down's), which
    would move the quantiles up. Fewer bounds, wider buckets, but nothing made up. None when they share no
    finite bound: there is no histogram of the whole to take a quantile of. The total (+Inf) is every
    histogram's own total, whatever its bounds."""
    if not histograms:
        return None
    shared = set.intersection(*(set(buckets) for buckets, _ in histograms)) - {math.inf}
    if not shared:
        return None
    buckets = {le: sum(b[le] for b, _ in histograms) for le in sorted(shared)}
    buckets[math.inf] = sum(b[max(b)] for b, _ in histograms)
    sums = [total for _, total in histograms]
    return buckets, None if any(total is None for total in sums) else sum(t for t in sums if t is not None)


@dataclass(frozen=True)
class Merged:
    """One latency of a group over the window, from its replicas' histograms summed."""

    figures: dict[str, float | None]  # p50, p95, p99, seconds (None: nothing observed)
    count: float  # observations summed: requests (TTFT, queue, e2e) or tokens (ITL)
    replicas: int  # how many replicas' histograms went in (all of them, unless `GroupLatency.notes` says)


@dataclass(frozen=True)
class GroupLatency:
    keys: list[str]  # the group's replicas
    latency: dict[str, Merged] = field(default_factory=dict)  # ttft | itl | queue | e2e
    notes: list[str] = field(default_factory=list)  # what was left out of the sum, and why

    def p95(self, name: str) -> float | None:
        merged = self.latency.get(name)
        return None if merged is None else merged.figures.get("p95")


LATENCIES = ("ttft", "itl", "queue", "e2e")


def group_latency(group: list[EngineSnapshot]) -> GroupLatency:
    """The group's percentiles over the window from its replicas' histograms summed (`merge`), by the one
    `quantile` every engine's own percentiles come from. A replica without a histogram over its window
    (just started, restarted inside it, not exporting it) is left out and named in the notes: the figure is
    then the others' (`Merged.replicas` says how many)."""
    out = GroupLatency([e.key for e in group])
    lacking: dict[str, list[str]] = {}
    for name in LATENCIES:
        have = [(e, (e.latency_histograms or {}).get(name)) for e in group]
        found = [h for _, h in have if h is not None]
        if not found:
            continue  # none of them has it: nothing to merge, nothing missing
        for e, h in have:
            if h is None:
                lacking.setdefault(e.key, []).append(FIGURES[name])
        merged = merge(found)
        if merged is None:
            out.notes.append(f"{FIGURES[name]}: the replicas' histograms share no bucket bound")
            continue
        if len({frozenset(b) for b, _ in found}) > 1:
            out.notes.append(f"{FIGURES[name]}: the replicas' buckets differ, summed on the {len(merged[0]) - 1}"
                             " bounds they share")
        figures = histogram_quantiles(merged, QUANTILES) or {q: None for q, _ in QUANTILES}
        out.latency[name] = Merged(figures, merged[0][math.inf], len(found))
    out.notes.extend(f"{key}: no {', '.join(names)} histogram over its window yet" for key, names in lacking.items())
    return out
