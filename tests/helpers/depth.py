"""Holding the monitor's request figures to the server's own counters and
histograms: finished requests per second by reason, and latency
percentiles (TTFT, ITL, queue time, end to end) over the window and the
last minute.

The bodies are the very ones sparktop read (through
tests/helpers/recording_proxy.py), parsed here with prometheus-client
alone; the quantile is Prometheus' histogram_quantile written out again
(linear inside a bucket), not sparktop's. The poller picks the base scrape
of a window itself; a figure agrees when some scrape it could have used
(inside the window, read with histograms or not) gives it.
"""

from __future__ import annotations

import functools
import math

from prometheus_client.parser import text_string_to_metric_families

from sparktop.observe.snapshot import EngineSnapshot

HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds",
              "queue": "vllm:request_queue_time_seconds", "e2e": "vllm:e2e_request_latency_seconds"}
FINISHED = "vllm:request_success_total"


def counter(text: str, name: str) -> float:
    """A counter's value summed over its label sets, as the server printed it."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                total += s.value
    return total


@functools.lru_cache(maxsize=1024)  # a body is read again for each snapshot and window it may belong to
def by_reason(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == FINISHED:
                out[s.labels["finished_reason"]] = out.get(s.labels["finished_reason"], 0.0) + s.value
    return out


@functools.lru_cache(maxsize=4096)
def buckets(text: str, name: str) -> tuple[dict[float, float], float]:
    """Cumulative counts by upper bound, and the sum of the observations."""
    out: dict[float, float] = {}
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name + "_bucket":
                le = float(s.labels["le"])
                out[le] = out.get(le, 0.0) + s.value
            elif s.name == name + "_sum":
                total += s.value
    return out, total


def histogram_quantile(q: float, cumulative: dict[float, float], mean: float) -> float | None:
    """Prometheus' histogram_quantile, except that the first bucket (from 0)
    ends at twice the observations' mean when that is below its bound (what
    sparktop documents: requests that never queued read ~0, not 150 ms)."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return None
    rank = q * cumulative[bounds[-1]]
    lower, below = 0.0, 0.0
    for b in bounds:
        if cumulative[b] >= rank:
            if math.isinf(b):
                return lower
            if cumulative[b] == below:
                return b
            upper = 2 * mean if below == 0 and lower == 0 and 2 * mean < b else b
            return lower + (upper - lower) * (rank - below) / (cumulative[b] - below)
        lower, below = b, cumulative[b]
    return lower


def window_quantiles(texts: list[str], i: int, j: int, name: str) -> dict[str, float | None]:
    (new, new_sum), (old, old_sum) = buckets(texts[i], HISTOGRAMS[name]), buckets(texts[j], HISTOGRAMS[name])
    delta = {le: new[le] - old.get(le, 0.0) for le in new}
    count = delta[max(delta)] if delta else 0
    mean = (new_sum - old_sum) / count if count else 0.0
    return {"p50": histogram_quantile(0.5, delta, mean), "p95": histogram_quantile(0.95, delta, mean),
            "p99": histogram_quantile(0.99, delta, mean)}


def close(a: float | None, b: float | None, rel: float = 1e-6) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-9)


def problems(snap: EngineSnapshot, texts: list[str], times: list[float], i: int,
             rate_window: float, window: float = 30.0, minute: float = 60.0, rel: float = 0.01) -> list[str]:
    """What in `snap` (made from scrape `i` of `texts`, read at `times`, the
    poller's clock) disagrees with the bodies. `rel`: how far a rate may be
    from the counters' growth over the times given (0.01 where the times are
    the snapshots', which stand a few microseconds off the poller's own; 1e-9
    where they are the very stamps its rates were computed on)."""
    out = []
    if snap.finished_rate_by_reason is not None:
        now = by_reason(texts[i])
        candidates = [k for k in range(i) if times[i] - times[k] <= rate_window + 1.0]
        ok = False
        for k in candidates:
            then = by_reason(texts[k])
            dt = times[i] - times[k]
            theirs = {r: (now[r] - then.get(r, 0.0)) / dt for r in now}
            if all(abs(snap.finished_rate_by_reason.get(r, 0.0) - v) <= rel * max(v, 0.1) for r, v in theirs.items()):
                ok = True
                break
        if not ok:
            out.append(f"t={snap.t:.2f} finished/s {snap.finished_rate_by_reason} matches no scrape's counters")
        if abs((snap.finished_rate or 0) - sum(snap.finished_rate_by_reason.values())) > 1e-9:
            out.append(f"t={snap.t:.2f} finished/s {snap.finished_rate} is not the sum over reasons")
    if snap.finished_by_reason is not None and snap.finished_by_reason != by_reason(texts[i]):
        out.append(f"t={snap.t:.2f} lifetime {snap.finished_by_reason} != {by_reason(texts[i])}")
    for name in HISTOGRAMS:
        mine = (snap.latency or {}).get(name)
        if not mine:
            continue
        # The percentiles were computed at the last scrape read with histograms, at or before i.
        found_window = found_minute = False
        for h in range(i, -1, -1):
            bases = [k for k in range(h) if times[h] - times[k] <= window + 0.5]
            if not found_window and any(
                    all(close(mine.get(p), v) for p, v in window_quantiles(texts, h, k, name).items())
                    for k in bases):
                found_window = True
            minute_bases = [k for k in range(h) if times[h] - times[k] <= minute + 1.5]
            if not found_minute and any(close(mine.get("p95_1m"), window_quantiles(texts, h, k, name)["p95"])
                                        for k in minute_bases):
                found_minute = True
            if found_window and found_minute:
                break
        if not found_window:
            out.append(f"t={snap.t:.2f} {name} {mine} matches no window of the server's histogram")
        if not found_minute and mine.get("p95_1m") is not None:
            out.append(f"t={snap.t:.2f} {name} p95 1m {mine['p95_1m']} matches no minute of the histogram")
    return out
