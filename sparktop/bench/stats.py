"""Sweep statistics, with llama-benchy's definitions so both tools agree.

Per request: TTFT = first token − start, to the first chunk that carries a
token (an empty role chunk sent before prefill is not one); pp t/s =
prompt_tokens / (TTFT − latency); tg t/s = tokens after the first chunk /
(t_last − t_first). Per batch (c > 1): pp total = Σ prompt_tokens / (max
first token − min start); tg total = Σ decode tokens / (max last token − min
first token); peak = most tokens in any 1-s window. A level's figure is the
mean over its batches; at c = 1 the "total" is the per-request figure, as in
llama-benchy. What pipeline owners quote too: the output tokens of a batch
over its wall time (e2e total, c × tg / wall), each request's output tokens
over its own start-to-end time (e2e per request), and the wall time per
batch. On top: the engine's KV cache and queue during the level, and the
knee — where adding concurrency stops adding throughput.

The decode tokens are counted as `bench.request` explains: exact with token
ids, usage or a local tokenizer however many tokens a chunk holds. Where
llama-benchy counts otherwise (no token ids: it spreads the count evenly
from the first chunk to the last, N−1 decode tokens over a span that holds
N−k), its figures are kept beside ours (`tg_tps_*_llama_benchy`) to compare
like with like; with token ids they are the same. A level whose server gave
neither token ids, usage nor a tokenizer to count with is counted one token
per chunk and marked `tg_approximate`.

A rate sweep's levels (`bench/load.py`) are figured here too, from the same
records: `rate_level_stats` (percentiles over requests, the client's lag, a
queue that grows, goodput and the Wilson bound of the share that met the
SLO) and the SLO itself (`parse_slo`, `meets`). The sweep and a run read back
from its files (`bench.run.Run.rate_levels`) both use them.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from sparktop.bench.levels import SweepError
from sparktop.bench.request import RequestRecord


def peak_rate(times: list[float], window: float = 1.0) -> float:
    """Most tokens stamped within any `window` seconds, per second; a burst
    shorter than the window counts at its own rate (as llama-benchy does)."""
    if not times:
        return 0.0
    ts = sorted(times)
    span = ts[-1] - ts[0]
    if 0 < span < window:
        return len(ts) / span
    best, lo = 0, 0
    for hi, t in enumerate(ts):
        while ts[lo] <= t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best / window


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _std(values: list[float]) -> float | None:
    return statistics.pstdev(values) if values else None


class LevelKey(int):
    """A sweep level: its concurrency (the int it is) and the context depth it ran at. A level at depth 0
    equals and hashes as its plain concurrency, so runs without depths (and every table keyed by
    concurrency) read as before; at a depth it formats as `4 @4096` (`f"c{key}"` reads c4 @4096). Levels
    sort by depth, then concurrency."""

    depth: int

    def __new__(cls, concurrency: int, depth: int = 0) -> LevelKey:
        key = super().__new__(cls, concurrency)
        key.depth = depth
        return key

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LevelKey):
            return int(self) == int(other) and self.depth == other.depth
        if isinstance(other, int):
            return self.depth == 0 and int(self) == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return int.__hash__(self) if self.depth == 0 else hash((self.depth, int(self)))

    def __lt__(self, other: int) -> bool:
        return (self.depth, int(self)) < (getattr(other, "depth", 0), int(other))

    def __format__(self, spec: str) -> str:
        text = int.__repr__(self) if not spec else int.__format__(int(self), spec)
        return f"{text} @{self.depth}" if self.depth and not spec else text

    def __str__(self) -> str:
        return self.__format__("")

    def __repr__(self) -> str:
        return f"LevelKey({int(self)}, depth={self.depth})"


@dataclass
class BatchStats:
    requests: int
    errors: int
    pp_tps_total: float | None
    tg_tps_total: float | None
    peak_tps: float | None
    pp_tps_req: list[float]
    tg_tps_req: list[float]
    ttft_s: list[float]
    e2e_tps_total: float | None = None
    e2e_tps_req: list[float] = field(default_factory=list)
    wall_s: float | None = None
    tg_tps_total_llama_benchy: float | None = None
    tg_tps_req_llama_benchy: list[float] = field(default_factory=list)
    tg_approximate: bool = False
    tg_unmeasured: int = 0


def batch_stats(records: list[RequestRecord], latency: float = 0.0, expected_prompt: int = 0,
                peak: bool = True) -> BatchStats:
    ok = [r for r in records if r.ok and r.first_token is not None]
    first = {id(r): r.first_token for r in ok if r.first_token is not None}  # every one, typed as such
    pp_req: list[float] = []
    tg_req: list[float] = []
    tg_req_lb: list[float] = []
    ttft: list[float] = []
    prompt_sum = 0
    unmeasured = 0  # streams read in one piece: no decode rate to see in them
    for r in ok:
        # What was prefilled: a prompt's tokens served from the prefix cache were not (a figure that counts
        # them is the 770,000 t/s prefill no GB10 can do).
        prompt = max(0, (r.prompt_tokens or expected_prompt) - (r.cached_tokens or 0))
        prompt_sum += prompt
        ttft.append(first[id(r)] - r.start)
        # Prefill ends with the first token, not with a first response that
        # carries none (a role chunk some servers send as headers go out).
        est = first[id(r)] - r.start - latency
        if est > 0 and prompt:
            pp_req.append(prompt / est)
        if len(r.token_times) > 1:
            span = r.token_times[-1] - r.token_times[0]
            if span <= 0:
                unmeasured += 1
            else:
                if decode := r.decode_tokens:
                    tg_req.append(decode / span)
                if decode_lb := r.decode_tokens_llama_benchy:
                    tg_req_lb.append(decode_lb / span)
    pp_total: float | None = None
    tg_total: float | None = None
    tg_total_lb: float | None = None
    peak_tps: float | None = None
    lasts = [t for r in ok if (t := r.last_token or r.end) is not None]
    if ok and lasts:
        pp_span = max(first.values()) - min(r.start for r in ok)
        if pp_span > 0 and prompt_sum:
            pp_total = prompt_sum / pp_span
        tg_span = max(lasts) - min(first.values())
        decode_sum = sum(r.decode_tokens for r in ok)
        if tg_span > 0 and decode_sum:
            tg_total = decode_sum / tg_span
        decode_sum_lb = sum(r.decode_tokens_llama_benchy for r in ok)
        if tg_span > 0 and decode_sum_lb:
            tg_total_lb = decode_sum_lb / tg_span
        if peak:  # a prediction has no use for it, and it is the costly part
            peak_tps = peak_rate([t for r in ok for t in r.token_times])
    e2e_total: float | None = None
    wall: float | None = None
    e2e_req: list[float] = []
    ends = [(r.start, e, r.completion_tokens) for r in ok if (e := r.last_token or r.end) is not None]
    if ends:
        wall = max(e for _, e, _ in ends) - min(s for s, _, _ in ends)
        if wall > 0:
            e2e_total = sum(n for _, _, n in ends) / wall
        e2e_req = [n / (e - s) for s, e, n in ends if e > s and n]
    return BatchStats(len(records), len(records) - len(ok), pp_total, tg_total, peak_tps, pp_req, tg_req, ttft,
                      e2e_total, e2e_req, wall, tg_total_lb, tg_req_lb, any(r.approximate for r in ok),
                      unmeasured)


@dataclass
class EngineWatch:
    """What the engine's /metrics said during a level (None: not readable),
    and whether the level was measured on an engine with nothing else to do
    (the sweep's clean-measurement guard; see `bench.sweep`)."""

    kv_cache_usage_max: float | None = None
    running_max: float | None = None
    waiting_max: float | None = None
    preemptions: float | None = None
    contaminated: bool = False  # foreign traffic, or an engine busy before the level
    foreign_requests: int | None = None  # None: the guard could not tell (off, or no readings)
    contamination: str | None = None  # what was seen, as a sentence
    remeasured: bool = False  # a first attempt was contaminated and set aside
    idle_wait_s: float | None = None  # waited before the level for the engine to go idle
    attempt: int | None = None  # the records' attempt this line describes
    # The nodes' GPU power (nvidia-smi) averaged over the level's measured
    # batches; None when no power source was given or none answered.
    power_w: float | None = None
    power_samples: int = 0


@dataclass
class LevelStats:
    concurrency: int
    runs: int
    requests: int
    errors: int
    timeouts: int
    pp_tps_total: float | None
    pp_tps_req: float | None
    tg_tps_total: float | None
    tg_tps_req: float | None
    ttft_ms_mean: float | None
    ttft_ms_p50: float | None
    ttft_ms_p95: float | None
    ttft_ms_std: float | None
    peak_tps: float | None
    tg_tps_total_std: float | None = None
    pp_tps_total_std: float | None = None
    e2e_tps_total: float | None = None  # output tokens / batch wall time
    e2e_tps_req: float | None = None  # output tokens / a request's own start-to-end time
    wall_s_mean: float | None = None  # start of the batch to its last token
    kv_cache_usage_max: float | None = None
    running_max: float | None = None
    waiting_max: float | None = None
    preemptions: float | None = None
    error_reasons: dict[str, int] = field(default_factory=dict)
    # The clean-measurement guard: the engine served something besides the
    # sweep during the level (or was busy before it). `foreign_requests`
    # is None when nothing could tell (no vLLM metrics to watch).
    contaminated: bool = False
    foreign_requests: int | None = None
    contamination: str | None = None  # e.g. "7 foreign requests between 0.4 s and 3.1 s into the level"
    remeasured: bool = False  # measured twice: the first attempt was contaminated
    # llama-benchy's decode figures on the same requests (see the module's
    # docstring): the same as ours with token ids, biased high without.
    tg_tps_total_llama_benchy: float | None = None
    tg_tps_req_llama_benchy: float | None = None
    # Some request was counted one token per chunk (no token ids, usage or
    # tokenizer): the decode figures are a guess that is low when chunks hold more.
    tg_approximate: bool = False
    # Requests whose every token arrived in one read (a proxy that buffered
    # the stream, or a client starved of CPU): they have no decode rate, and
    # a level of only such requests has none either.
    tg_unmeasured: int = 0
    # Energy: the nodes' GPU power during the level over the tokens it
    # generated per second of wall time (prefill included: serving a request
    # costs both), J per generated token and Wh per million.
    power_w: float | None = None
    j_per_token: float | None = None
    wh_per_mtok: float | None = None
    # The engine's own per-request figures where it sends them (llama.cpp's `timings`): prompt tokens per second
    # of its prompt processing, generated tokens per second of its decoding; means over the level's requests.
    server_pp_tps_req: float | None = None
    server_tg_tps_req: float | None = None
    depth: int = 0  # context tokens before each prompt (a depth sweep's level)
    cached_prompt_tokens: float | None = None  # per request, served from the prefix cache (not prefilled)
    # --prefix-cache on at a depth: the requests that loaded each context before the measured ones
    # (llama-benchy's context-load phase; Spark Arena's ctx_pp / ctx_tg rows).
    context_load: LevelStats | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["concurrency"] = int(self.concurrency)
        d.pop("context_load", None)
        return d

    @property
    def key(self) -> LevelKey:
        return LevelKey(int(self.concurrency), self.depth)

    def cost_per_mtok(self, price_per_kwh: float | None) -> float | None:
        """What a million generated tokens cost in electricity at this price per kWh."""
        if self.wh_per_mtok is None or price_per_kwh is None:
            return None
        return self.wh_per_mtok / 1000 * price_per_kwh


def _reason(error: str) -> str:
    """Group errors by their kind, not their every detail."""
    if error.startswith("timed out"):
        return "timed out"
    return error.split(":")[0] if error.startswith("HTTP") else error[:60]


def level_stats(concurrency: int, batches: list[list[RequestRecord]], latency: float = 0.0,
                expected_prompt: int = 0, engine: EngineWatch | None = None, peak: bool = True) -> LevelStats:
    per = [batch_stats(b, latency, expected_prompt, peak) for b in batches]
    pp_req = [v for b in per for v in b.pp_tps_req]
    tg_req = [v for b in per for v in b.tg_tps_req]
    tg_req_lb = [v for b in per for v in b.tg_tps_req_llama_benchy]
    ttft_ms = [v * 1000 for b in per for v in b.ttft_s]
    if concurrency > 1:
        pp_tot = [b.pp_tps_total for b in per if b.pp_tps_total is not None]
        tg_tot = [b.tg_tps_total for b in per if b.tg_tps_total is not None]
        tg_tot_lb = [b.tg_tps_total_llama_benchy for b in per if b.tg_tps_total_llama_benchy is not None]
    else:
        pp_tot, tg_tot, tg_tot_lb = pp_req, tg_req, tg_req_lb
    records = [r for b in batches for r in b]
    reasons: dict[str, int] = defaultdict(int)
    for r in records:
        if r.error:
            reasons[_reason(r.error)] += 1
    eng = engine or EngineWatch()
    timings = [r.server_timings for r in records if r.ok and r.server_timings]
    e2e_total = _mean([b.e2e_tps_total for b in per if b.e2e_tps_total is not None])
    j_per_token = eng.power_w / e2e_total if eng.power_w is not None and e2e_total else None
    cached = [r.cached_tokens for r in records if r.ok and r.cached_tokens is not None]
    return LevelStats(
        depth=getattr(concurrency, "depth", 0), cached_prompt_tokens=_mean([float(c) for c in cached]),
        concurrency=int(concurrency), runs=len(batches), requests=len(records),
        errors=sum(1 for r in records if not r.ok), timeouts=sum(1 for r in records if r.timed_out),
        pp_tps_total=_mean(pp_tot), pp_tps_req=_mean(pp_req),
        tg_tps_total=_mean(tg_tot), tg_tps_req=_mean(tg_req),
        ttft_ms_mean=_mean(ttft_ms), ttft_ms_p50=percentile(ttft_ms, 0.5),
        ttft_ms_p95=percentile(ttft_ms, 0.95), ttft_ms_std=_std(ttft_ms),
        peak_tps=_mean([b.peak_tps for b in per if b.peak_tps is not None]),
        tg_tps_total_std=_std(tg_tot), pp_tps_total_std=_std(pp_tot),
        e2e_tps_total=e2e_total,
        e2e_tps_req=_mean([v for b in per for v in b.e2e_tps_req]),
        wall_s_mean=_mean([b.wall_s for b in per if b.wall_s is not None]),
        kv_cache_usage_max=eng.kv_cache_usage_max, running_max=eng.running_max,
        waiting_max=eng.waiting_max, preemptions=eng.preemptions,
        error_reasons=dict(reasons),
        contaminated=eng.contaminated, foreign_requests=eng.foreign_requests, contamination=eng.contamination,
        remeasured=eng.remeasured,
        tg_tps_total_llama_benchy=_mean(tg_tot_lb), tg_tps_req_llama_benchy=_mean(tg_req_lb),
        tg_approximate=any(b.tg_approximate for b in per),
        tg_unmeasured=sum(b.tg_unmeasured for b in per),
        power_w=eng.power_w, j_per_token=j_per_token,
        wh_per_mtok=None if j_per_token is None else j_per_token * 1e6 / 3600,
        server_pp_tps_req=_mean([t["prompt_n"] / t["prompt_ms"] * 1000 for t in timings
                                 if t.get("prompt_ms") and t.get("prompt_n")]),
        server_tg_tps_req=_mean([t["predicted_n"] / t["predicted_ms"] * 1000 for t in timings
                                 if t.get("predicted_ms") and t.get("predicted_n")]),
    )


@dataclass
class Knee:
    concurrency: int  # the last level worth its concurrency
    next_gain: float | None  # relative gain of the level after it (None: it is the last)
    falls: bool  # throughput drops at a higher level

    def describe(self, metric: str = "decode") -> str:
        if self.next_gain is None:
            return f"{metric} throughput still growing at c{self.concurrency} (the highest level run)"
        if self.falls:
            return (f"{metric} throughput peaks at c{self.concurrency} and falls after it "
                    f"({self.next_gain:+.0%} at the next level)")
        return (f"{metric} throughput stops growing at c{self.concurrency} "
                f"(the next level adds {self.next_gain:+.0%})")


def knee(levels: list[LevelStats], key: str = "tg_tps_total", min_gain: float = 0.10) -> Knee | None:
    """The first level after which raising concurrency gains less than
    `min_gain` — or where throughput falls."""
    pts = [(lv.concurrency, getattr(lv, key)) for lv in sorted(levels, key=lambda lv: lv.concurrency)
           if getattr(lv, key)]
    if not pts:
        return None
    for (c, v), (_, nxt) in zip(pts, pts[1:], strict=False):
        gain = nxt / v - 1
        if gain < min_gain:
            best = max(x for _, x in pts)
            falls = gain < -0.03 or any(x < v * 0.97 for cc, x in pts if cc > c) and v >= best * 0.97
            return Knee(c, gain, falls)
    return Knee(pts[-1][0], None, False)


# -- rate levels (`bench/load.py`): requests sent on a schedule, and the SLO they are held to --------

SLO_METRICS = {"ttft": "time to first token", "itl": "inter-token latency", "e2e": "end-to-end latency"}
_SLO = re.compile(r"^(ttft|itl|e2e)_p(\d{1,2}(?:\.\d+)?)\s*=\s*(\d+(?:\.\d+)?)\s*(ms|s)?$")
BEHIND_MIN_S = 0.020  # lag below this is the event loop's noise, at any rate
BEHIND_SHARE = 0.10  # of the mean gap between sends: a p95 lag past it means the schedule was not kept
SEND_SHORTFALL = 0.95  # sending fewer per second than this share of the rate asked: behind
WILSON_Z = 1.645  # one-sided 95 %


@dataclass(frozen=True)
class SloTerm:
    metric: str  # ttft | itl | e2e
    quantile: float  # 0.95
    limit_s: float

    @property
    def text(self) -> str:
        limit = f"{self.limit_s * 1000:g}ms" if self.limit_s < 1 else f"{self.limit_s:g}s"
        return f"{self.metric}_p{self.quantile * 100:g}={limit}"


def parse_slo(text: str, where: str = "--slo") -> list[SloTerm]:
    """`ttft_p95=2s,itl_p95=100ms` (a unit-less number is seconds)."""
    terms = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = _SLO.match(part.lower())
        if m is None:
            raise SweepError(f"{where}: {part!r} is not a target like ttft_p95=2s or itl_p95=100ms "
                             f"(metrics: {', '.join(SLO_METRICS)}; percentiles p50..p99; units s or ms)")
        q = float(m.group(2)) / 100
        if not 0 < q < 1:
            raise SweepError(f"{where}: {part!r}: the percentile must be between p1 and p99")
        limit = float(m.group(3)) / (1000 if m.group(4) == "ms" else 1)
        if limit <= 0:
            raise SweepError(f"{where}: {part!r}: the limit must be more than 0")
        terms.append(SloTerm(m.group(1), q, limit))
    if not terms:
        raise SweepError(f"{where}: no target given (e.g. ttft_p95=2s,itl_p95=100ms)")
    return terms


def ttft_s(r: RequestRecord) -> float | None:
    return r.first_token - r.start if r.ok and r.first_token is not None else None


def itl_s(r: RequestRecord) -> float | None:
    """The request's mean gap between tokens after the first (None: fewer than two tokens)."""
    n = r.completion_tokens or len(r.token_times)
    if not r.ok or r.first_token is None or r.last_token is None or n < 2:
        return None
    span = r.last_token - r.first_token
    return span / (n - 1) if span > 0 else None


def e2e_s(r: RequestRecord) -> float | None:
    return r.end - r.start if r.ok and r.end is not None else None


_MEASURE: dict[str, Callable[[RequestRecord], float | None]] = {"ttft": ttft_s, "itl": itl_s, "e2e": e2e_s}


def meets(r: RequestRecord, slo: list[SloTerm]) -> bool:
    """A request meets the SLO when it succeeded and each of its figures is within its limit."""
    if not r.ok:
        return False
    for term in slo:
        value = _MEASURE[term.metric](r)
        if value is None:
            # One token (no ITL) cannot break an ITL target; a missing TTFT or end can break anything.
            if term.metric == "itl" and r.first_token is not None:
                continue
            return False
        if value > term.limit_s:
            return False
    return True


def wilson_lower(successes: int, n: int, z: float = WILSON_Z) -> float | None:
    """The lower end of the Wilson score interval of a share (one-sided 95 % by default)."""
    if n == 0:
        return None
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - spread) / (1 + z * z / n))


@dataclass
class RateLevelStats:
    rate: float | None  # asked, requests/s (None: a replayed trace's own times)
    arrivals: str
    requests: int
    completed: int
    errors: int
    duration_s: float | None  # first send to last response
    request_throughput: float | None  # completed requests / duration
    output_tps: float | None  # output tokens / duration
    input_tps: float | None
    ttft_p50: float | None
    ttft_p95: float | None
    ttft_p99: float | None
    ttft_mean: float | None
    itl_p50: float | None
    itl_p95: float | None
    itl_mean: float | None
    e2e_p50: float | None
    e2e_p95: float | None
    send_rate: float | None  # requests sent per second over the span of the sends
    lag_p50: float | None  # actual send minus scheduled, seconds (held under --max-concurrency left out)
    lag_p95: float | None
    lag_max: float | None
    held_mean: float | None  # seconds a request waited for a slot under --max-concurrency
    concurrency_mean: float | None  # requests in flight, time-weighted over the level
    concurrency_peak: int
    behind: str | None  # why the client fell behind its schedule, or None
    depth: int = 0
    saturated: str | None = None  # why the server is not keeping up at this rate (its queue grew), or None
    slo: list[str] = field(default_factory=list)
    slo_met: int | None = None  # requests that met every target
    slo_share: float | None = None
    slo_lower: float | None = None  # Wilson lower bound of the share (95 %, one-sided)
    goodput: float | None = None  # requests/s that met the SLO
    meets_slo: bool | None = None  # every percentile within its limit
    slo_values: dict[str, float | None] = field(default_factory=dict)  # the percentile each target names

    def as_dict(self) -> dict:
        # null without an SLO, as meets_slo: nothing was asked of the level, so it neither passed nor failed
        return asdict(self) | {"passes": self.passes if self.slo else None}

    @property
    def label(self) -> str:
        return f"{rate_text(self.rate)}/s" if self.rate is not None else "trace"

    @property
    def passes(self) -> bool:
        """The level served its rate within the SLO: every percentile within its limit, the server's queue
        not growing, and the client on its schedule (a level it fell behind was offered less than its rate).
        The one verdict the CLI, the screen, the max-rate search and the study report give."""
        return bool(self.meets_slo) and not self.saturated and not self.behind


def _in_flight(records: list[RequestRecord]) -> tuple[float | None, int]:
    """Time-weighted mean and peak of the requests in flight."""
    edges = []
    for r in records:
        if r.end is not None:
            edges += [(r.start, 1), (r.end, -1)]
    if not edges:
        return None, 0
    edges.sort()
    n = peak = 0
    area, last = 0.0, edges[0][0]
    for t, step in edges:
        area += n * (t - last)
        n += step
        peak = max(peak, n)
        last = t
    span = edges[-1][0] - edges[0][0]
    return (area / span if span > 0 else float(peak)), peak


def _mean_in_flight(records: list[RequestRecord], lo: float, hi: float) -> float:
    """Requests in flight between `lo` and `hi`, time-weighted (one still running counts to `hi`)."""
    area = 0.0
    for r in records:
        end = r.end if r.end is not None else hi
        area += max(0.0, min(end, hi) - max(r.start, lo))
    return area / (hi - lo) if hi > lo else 0.0


def _queue_grew(records: list[RequestRecord]) -> str | None:
    """Whether requests piled up while they were being sent: the mean in flight over the second half of
    the sends well above the first half's. A server that keeps up holds a steady number in flight
    (Little's law: rate × latency); one that does not gains a request every 1/(rate − capacity) s.

    Random arrivals make the count wander too: over a half of length h, with L in flight on average each
    for about W seconds, the half's mean varies by about √(4·L·W/h). Only a rise past twice the spread of
    the difference of two halves counts. The rule it replaces (half as many again, and two more) read a
    queue in 17 of 200 simulated 3 s levels at 32/s where every request was served as fast as the first
    (this one in 1), and a search runs ten such levels."""
    sent = sorted(r.start for r in records)
    if len(sent) < 10:
        return None
    a, mid, b = sent[0], sent[len(sent) // 2], sent[-1]
    if b <= a:
        return None
    # The wander of a server that keeps up: each request in flight for its unqueued time (the level's
    # quickest), as many as the first half sent per second (a queue's own delay must not widen it).
    times = [r.end - r.start for r in records if r.end is not None]
    wander = 0.0
    if times and mid > a:
        w = min(times)
        held = (len(sent) // 2) / (mid - a) * w
        wander = 2 * math.sqrt(2 * 4 * held * w / ((b - a) / 2))

    first, second = _mean_in_flight(records, a, mid), _mean_in_flight(records, mid, b)
    if second - first > max(2.0, wander):
        return (f"requests piled up: {first:.1f} in flight on average over the first half of the sends, "
                f"{second:.1f} over the second: the server serves fewer per second than arrive")
    return None


def rate_level_stats(records: list[RequestRecord], rate: float | None, arrivals: str,
                     slo: list[SloTerm] | None = None, depth: int = 0) -> RateLevelStats:
    ok = [r for r in records if r.ok and r.end is not None]
    starts = [r.start for r in records]
    ends = [r.end for r in records if r.end is not None]
    # The span a level's rates are over: from its start (one mean gap before its first send is due, as
    # AIPerf's and vLLM's client's spans begin) to its last response; a trace's from its first request.
    due = sorted(r.scheduled for r in records if r.scheduled is not None)
    planned = (len(due) - 1) / (due[-1] - due[0]) if len(due) > 2 and due[-1] > due[0] else None
    origin = (due[0] - 1.0 / rate) if due and rate else min(starts) if starts else None
    duration = max(ends) - origin if origin is not None and ends and max(ends) > origin else None
    out_tokens = sum(r.completion_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    ttft = [v for v in map(ttft_s, ok) if v is not None]
    itl = [v for v in map(itl_s, ok) if v is not None]
    e2e = [v for v in map(e2e_s, ok) if v is not None]
    lags = [max(0.0, r.start - r.scheduled - r.held_s) for r in records if r.scheduled is not None]
    held = [r.held_s for r in records if r.scheduled is not None]
    sends = sorted(starts)
    send_rate = (len(sends) - 1) / (sends[-1] - sends[0]) if len(sends) > 2 and sends[-1] > sends[0] else None
    mean_c, peak_c = _in_flight(records)
    behind = None
    lag95 = percentile(lags, 0.95)
    schedule_rate = rate or planned
    if schedule_rate is not None and lags:
        gap = 1.0 / schedule_rate
        if lag95 is not None and lag95 > max(BEHIND_MIN_S, BEHIND_SHARE * gap):
            behind = (f"sends ran late: p95 {lag95 * 1000:.0f} ms behind schedule (a tenth of the mean gap is "
                      f"{BEHIND_SHARE * gap * 1000:.0f} ms)")
        # Against its own schedule (a Poisson schedule's realised rate is not the rate asked).
        uncapped = not any(h > 0 for h in held)
        if uncapped and send_rate is not None and planned is not None and len(sends) >= 10 \
                and send_rate < SEND_SHORTFALL * planned:
            behind = (f"sent {send_rate:.3g} requests/s where its schedule had {planned:.3g}: this client "
                      "cannot send faster")
    saturated = _queue_grew(records)
    stats = RateLevelStats(
        rate=rate, arrivals=arrivals, requests=len(records), completed=len(ok), errors=len(records) - len(ok),
        duration_s=duration,
        request_throughput=len(ok) / duration if duration else None,
        output_tps=out_tokens / duration if duration else None,
        input_tps=in_tokens / duration if duration else None,
        ttft_p50=percentile(ttft, 0.50), ttft_p95=percentile(ttft, 0.95), ttft_p99=percentile(ttft, 0.99),
        ttft_mean=sum(ttft) / len(ttft) if ttft else None,
        itl_p50=percentile(itl, 0.50), itl_p95=percentile(itl, 0.95), itl_mean=sum(itl) / len(itl) if itl else None,
        e2e_p50=percentile(e2e, 0.50), e2e_p95=percentile(e2e, 0.95),
        send_rate=send_rate, lag_p50=percentile(lags, 0.50), lag_p95=lag95, lag_max=max(lags) if lags else None,
        held_mean=sum(held) / len(held) if held else None,
        concurrency_mean=mean_c, concurrency_peak=peak_c, behind=behind, depth=depth, saturated=saturated)
    if slo:
        met = sum(1 for r in records if meets(r, slo))
        stats.slo = [t.text for t in slo]
        stats.slo_met = met
        stats.slo_share = met / len(records) if records else None
        stats.slo_lower = wilson_lower(met, len(records))
        stats.goodput = met / duration if duration else None
        values = {"ttft": ttft, "itl": itl, "e2e": e2e}
        stats.slo_values = {t.text: percentile(values[t.metric], t.quantile) for t in slo}
        # Failed requests count against every percentile: as if they never answered.
        failed = stats.errors > 0 and stats.errors / max(1, len(records)) > 1 - max(t.quantile for t in slo)
        stats.meets_slo = not failed and all(v is not None and v <= t.limit_s
                                             for t, v in zip(slo, stats.slo_values.values(), strict=True))
    return stats


def rate_text(rate: float) -> str:
    """A rate as people write it: 3, 0.25, 1.5, 1,536."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"
