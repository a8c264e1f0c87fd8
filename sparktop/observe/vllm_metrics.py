"""vLLM's Prometheus `/metrics`: parsed with prometheus-client's own text
parser, then turned into the figures the monitor shows.

- Names: vLLM v1 (`vllm:kv_cache_usage_perc`, `vllm:prefix_cache_*`,
  `vllm:inter_token_latency_seconds`) and the older ones
  (`vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_*`,
  `vllm:time_per_output_token_seconds`); the first present wins.
- Series are matched by sample name, so a scrape with or without
  `# TYPE` lines parses the same; `_created` series are used only to
  detect restarts; label order does not matter; NaN is "no value".
- Rates come from counter deltas between two scrapes; a counter that went
  down (or whose `_created` changed) was reset by a restart, and the new
  value is the delta, as Prometheus' rate() does: never negative.
- Percentiles come from histogram bucket deltas over a window of scrapes.
- Requests finished, by `finished_reason` (stop, length, abort, error,
  repetition): a rate per reason and the totals over the engine's life; the
  engine's start time is its token counters' `_created` time.
- Latency percentiles (TTFT, ITL, queue time, end to end) come from the
  histograms' bucket deltas: p50/p95/p99 over the window (30 s) and a p95
  over the last minute, so a spike stays in view after it has passed.
- vLLM 0.32 adds: waiting requests by reason (`capacity`, `deferred`),
  admission rejections by queue limit (one counter per API server, with no
  `engine` label), the sleep state (`awake`, `weights_offloaded` = level 1,
  `discard_all` = level 2) and its own estimate of the bytes each GPU reads
  and writes. Each is None when the series is absent (older vLLM).
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
GEN_TOKENS = ("vllm:generation_tokens_total",)
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_HIT_RATE = ("vllm:gpu_prefix_cache_hit_rate",)  # v0 gauge, -1 when unknown
PREEMPTIONS = ("vllm:num_preemptions_total",)
REQUESTS = ("vllm:request_success_total",)
TTFT: tuple[str, ...] = ("vllm:time_to_first_token_seconds",)
ITL: tuple[str, ...] = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
QUEUE: tuple[str, ...] = ("vllm:request_queue_time_seconds",)
E2E: tuple[str, ...] = ("vllm:e2e_request_latency_seconds",)
# The latency histograms the monitor reads, by the short name it shows them under.
LATENCIES: dict[str, tuple[str, ...]] = {"ttft": TTFT, "itl": ITL, "queue": QUEUE, "e2e": E2E}
MINUTE = 60.0  # the span of the "p95 over the last minute"
QUEUE_WAIT_S = 5.0  # a request that waited longer than this in the queue is worth an event
# vLLM 0.32
WAITING_BY_REASON = ("vllm:num_requests_waiting_by_reason",)  # reason: capacity | deferred
REJECTIONS = ("vllm:admission_rejections_total",)  # reason: max_num_queued_reqs | max_num_queued_tokens
SLEEP_STATE = ("vllm:engine_sleep_state",)  # sleep_state: awake | weights_offloaded | discard_all
READ_BYTES = ("vllm:estimated_read_bytes_per_gpu_total",)
WRITE_BYTES = ("vllm:estimated_write_bytes_per_gpu_total",)


WANTED = {
    name.removesuffix("_total")
    for group in (KV_USAGE, RUNNING, WAITING, PROMPT_TOKENS, GEN_TOKENS, PREFIX_QUERIES, PREFIX_HITS,
                  PREFIX_HIT_RATE, PREEMPTIONS, REQUESTS, TTFT, ITL, QUEUE, E2E, WAITING_BY_REASON, REJECTIONS,
                  SLEEP_STATE, READ_BYTES, WRITE_BYTES)
    for name in group
}
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


class MetricsError(ValueError):
    pass


def _base(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


# `_created` is read only to notice restarts, on the token counters.
CREATED_WANTED = {name.removesuffix("_total") + "_created" for name in PROMPT_TOKENS + GEN_TOKENS}


HISTOGRAM_BASES = {name for names in LATENCIES.values() for name in names}


def _alternatives(names) -> str:
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))


def _filter(histograms: bool) -> re.Pattern:
    bases = WANTED if histograms else WANTED - HISTOGRAM_BASES
    # No `# TYPE` lines: samples are matched by name, and untyped samples
    # parse the same, in half the parser's time.
    return re.compile(
        rf"^(?:(?:{_alternatives(bases)})(?:_bucket|_count|_sum|_total)?[{{ ].*"
        rf"|(?:{_alternatives(CREATED_WANTED)})[{{ ].*)$",
        re.M,
    )


_FILTERS = {True: _filter(True), False: _filter(False)}


def relevant_lines(text: str, histograms: bool = True) -> str:
    """Only the series the monitor reads.

    A vLLM scrape is mostly histogram buckets, Python process metrics and
    `_created` series nobody here looks at; dropping them (one regex pass,
    in C) before prometheus-client parses the rest keeps a 1 s poll cheap.
    """
    return "\n".join(_FILTERS[histograms].findall(text)) + "\n"


# Sample lines already parsed, by their exact text: from one scrape to the
# next most lines read the same (an idle series, a histogram's upper buckets,
# the queue's zeroes), and prometheus-client's parser walks every label
# character by character. Bounded: emptied when full. Labels dicts in it are
# shared between scrapes and never changed.
_LINE_CACHE: dict[str, tuple[str, dict[str, str], float]] = {}
_LINE_CACHE_MAX = 8192


def _parsed_lines(lines: list[str]) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line, in order; the lines not
    seen before are parsed by prometheus-client, together."""
    cache = _LINE_CACHE
    if len(cache) + len(lines) > _LINE_CACHE_MAX:
        cache.clear()
    new = [line for line in dict.fromkeys(lines) if line not in cache]
    if new:
        parsed = [(sample.name, dict(sample.labels), sample.value)
                  for family in text_string_to_metric_families("\n".join(new) + "\n") for sample in family.samples]
        if len(parsed) != len(new):  # not one sample per line: no cache for this text
            return [(sample.name, dict(sample.labels), sample.value)
                    for family in text_string_to_metric_families("\n".join(lines) + "\n")
                    for sample in family.samples]
        cache.update(zip(new, parsed, strict=True))
    return [cache[line] for line in lines]


def _clean(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


@dataclass
class Scrape:
    """One /metrics answer, indexed by sample name."""

    t: float
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, t: float, everything: bool = False, histograms: bool = True) -> Scrape:
        """`histograms=False` skips the latency buckets (most of the parse
        work); percentiles then come from the scrapes that have them."""
        scrape = cls(t)
        scrape.vllm = "vllm:" in text
        scrape.has_histograms = histograms or everything
        try:
            if everything:
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        scrape.samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
            else:
                for name, labels, value in _parsed_lines(_FILTERS[histograms].findall(text)):
                    scrape.samples.setdefault(name, []).append((labels, value))
        except (ValueError, TypeError, IndexError) as exc:
            raise MetricsError(f"cannot parse /metrics: {exc}") from None
        return scrape

    vllm: bool = False
    has_histograms: bool = True

    @property
    def is_vllm(self) -> bool:
        return self.vllm or any(name.startswith("vllm:") for name in self.samples)

    def _first(self, names: tuple[str, ...]) -> tuple[str, list[tuple[dict, float]]] | None:
        for name in names:
            series = self.samples.get(name)
            if series:
                return name, series
        return None

    def total(self, names: tuple[str, ...]) -> float | None:
        """Sum over every series (engines, finish reasons) of the first name present."""
        found = self._first(names)
        if not found:
            return None
        values = [v for _, v in found[1] if not math.isnan(v)]
        return sum(values) if values else None

    def mean(self, names: tuple[str, ...]) -> float | None:
        found = self._first(names)
        if not found:
            return None
        values = [v for _, v in found[1] if not math.isnan(v)]
        return sum(values) / len(values) if values else None

    def by_label(self, names: tuple[str, ...], label: str) -> dict[str, float] | None:
        """Sums over the series of the first name present, per value of `label`
        (a reason): `{"capacity": 2.0, "deferred": 1.0}`."""
        found = self._first(names)
        if not found:
            return None
        out: dict[str, float] = {}
        for labels, value in found[1]:
            if not math.isnan(value):
                key = labels.get(label, "")
                out[key] = out.get(key, 0.0) + value
        return out or None

    def sleep(self) -> tuple[bool, int | None] | None:
        """(sleeping, level) from `vllm:engine_sleep_state`, or None when it is absent.

        vLLM sets `awake` to 0 while the engine sleeps, and one of
        `weights_offloaded` (level 1) or `discard_all` (level 2); a sleep that
        only released the KV cache (`release_kv_cache_memory`) has neither,
        so its level is None. Data-parallel engines sleep together; should
        they differ, the deepest sleep is reported, since a sleeping engine
        is what a user must not mistake for an idle one."""
        series = self.samples.get(SLEEP_STATE[0])
        if not series:
            return None
        engines: dict[str, dict[str, float]] = {}
        for labels, value in series:
            if not math.isnan(value):
                engines.setdefault(labels.get("engine", ""), {})[labels.get("sleep_state", "")] = value
        sleeping, level, known = False, None, False
        for states in engines.values():
            this = 2 if states.get("discard_all", 0) >= 1 else 1 if states.get("weights_offloaded", 0) >= 1 else None
            if "awake" not in states and this is None:
                continue
            known = True
            if states.get("awake", 1) < 1 or this is not None:
                sleeping = True
                if this is not None:
                    level = max(level or 0, this)
        return (sleeping, level) if known else None

    def created(self, names: tuple[str, ...]) -> float | None:
        """The newest `_created` time of a counter (changes when the engine restarts)."""
        found = self._first(names)
        if not found:
            return None
        base = found[0][: -len("_total")] if found[0].endswith("_total") else found[0]
        series = self.samples.get(base + "_created")
        return max(v for _, v in series) if series else None

    def histogram_with_sum(self, names: tuple[str, ...]) -> tuple[dict[float, float], float | None] | None:
        """The buckets and the sum of the observations (None when the scrape has no `_sum`)."""
        buckets = self.histogram(names)
        if buckets is None:
            return None
        for name in names:
            series = self.samples.get(name + "_sum")
            if series:
                return buckets, sum(v for _, v in series if not math.isnan(v))
        return buckets, None

    def histogram(self, names: tuple[str, ...]) -> dict[float, float] | None:
        """Cumulative bucket counts by upper bound, summed over series."""
        for name in names:
            series = self.samples.get(name + "_bucket")
            if not series:
                continue
            buckets: dict[float, float] = {}
            for labels, value in series:
                try:
                    le = float(labels.get("le", "nan"))
                except ValueError:
                    continue
                if math.isnan(le) or math.isnan(value):
                    continue
                buckets[le] = buckets.get(le, 0.0) + value
            return buckets or None
        return None


def counter_delta(prev: float | None, cur: float | None, reset: bool = False) -> float | None:
    if cur is None:
        return None
    if prev is None:
        return None
    if reset or cur < prev:
        return cur  # restarted: everything counted since the restart is new
    return cur - prev


def quantile(q: float, buckets: dict[float, float], mean: float | None = None) -> float | None:
    """Prometheus' histogram_quantile on cumulative buckets.

    With the observations' `mean` (a histogram's sum over its count), a rank
    in the first bucket is interpolated up to twice the mean rather than to
    the bucket's bound, when that is lower: vLLM's queue-time buckets start
    at 300 ms, and requests that never waited would otherwise read as a
    150 ms median. (Twice the mean is where a uniform spread from zero with
    that mean ends; the mean of all observations can only raise it.)"""
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return prev_bound  # above the last finite bucket: report its bound
            if count == prev_count:
                return bound
            if prev_count == 0 and prev_bound == 0 and mean is not None and 0 <= 2 * mean < bound:
                bound = 2 * mean
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def _sub(a: dict[float, float], b: dict[float, float]) -> dict[float, float] | None:
    out = {}
    for le, v in a.items():
        d = v - b.get(le, 0.0)
        if d < 0:
            return None  # reset inside the window
        out[le] = d
    return out


@dataclass
class Derived:
    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    prompt_tps: float | None = None
    gen_tps: float | None = None
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    itl_p50: float | None = None
    itl_p95: float | None = None
    prefix_hit_rate: float | None = None
    preemptions: float | None = None
    requests: float | None = None
    waiting_by_reason: dict[str, float] | None = None  # capacity | deferred; sums to `waiting`
    rejections: float | None = None  # admission rejections since the API server started
    rejections_by_reason: dict[str, float] | None = None  # max_num_queued_reqs | max_num_queued_tokens
    rejection_rate: float | None = None  # per second, over the rate window
    rejections_recent: float | None = None  # over the window (30 s, less while it fills)
    rejections_span: float | None = None  # the seconds `rejections_recent` covers
    sleeping: bool | None = None
    sleep_level: int | None = None  # 1: weights offloaded, 2: everything discarded
    mem_read_bps: float | None = None  # vLLM's estimate, bytes/s per GPU; None unless it moved
    mem_write_bps: float | None = None
    finished_rate: float | None = None  # requests finished per second, every reason
    finished_rate_by_reason: dict[str, float] | None = None  # stop | length | abort | error | repetition
    finished_by_reason: dict[str, float] | None = None  # since the engine started
    prompt_tokens_total: float | None = None  # since the engine started
    gen_tokens_total: float | None = None
    started_at: float | None = None  # unix time the engine's counters were created (its start)
    # {"ttft" | "itl" | "queue" | "e2e": {"p50", "p95", "p99" over the window, "p95_1m"}}, seconds
    latency: dict[str, dict[str, float | None]] | None = None
    queue_slow: float | None = None  # requests in the window that waited over QUEUE_WAIT_S in the queue


Histogram = tuple[dict[float, float], float | None]  # cumulative buckets, and the sum of the observations


def _window_quantiles(new: Histogram | None, old: Histogram | None,
                      qs: tuple[tuple[str, float], ...]) -> dict[str, float | None] | None:
    if new is None or old is None:
        return None
    window = _sub(new[0], old[0])
    if not window:
        return None
    count = window[max(window)]
    mean = (new[1] - old[1]) / count if count > 0 and new[1] is not None and old[1] is not None else None
    return {name: quantile(q, window, mean) for name, q in qs}


def above(bound: float, buckets: dict[float, float]) -> float:
    """How many observations in cumulative `buckets` exceeded `bound`
    (rounded up to the next bucket bound: a histogram knows no finer)."""
    if not buckets:
        return 0.0
    bounds = sorted(buckets)
    at = next((buckets[b] for b in reversed(bounds) if b <= bound), 0.0)
    return max(0.0, buckets[bounds[-1]] - at)


class EngineMetrics:
    """Keeps the last scrapes of one engine and derives rates and percentiles."""

    def __init__(self, window: float = 30.0, rate_window: float = 5.0, max_scrapes: int = 120):
        self.window = window  # percentiles and prefix hit rate
        self.rate_window = rate_window  # tokens/s: smooth like vLLM's own log, still responsive
        self.scrapes: deque[Scrape] = deque(maxlen=max_scrapes)
        self._percentiles: dict[str, float | None] = {}
        self._latency: dict[str, dict[str, float | None]] | None = None
        self._queue_slow: float | None = None
        # (t, {latency name: cumulative buckets}) of the scrapes read with
        # histograms, for the last minute's p95.
        self._minute: deque[tuple[float, dict[str, Histogram | None]]] = deque()

    def reset(self) -> None:
        self.scrapes.clear()
        self._percentiles = {}
        self._latency = None
        self._queue_slow = None
        self._minute.clear()

    def add(self, scrape: Scrape) -> Derived:
        prev = self.scrapes[-1] if self.scrapes else None
        restarted = prev is not None and self._restarted(prev, scrape)
        if restarted:
            self.scrapes.clear()
            self._percentiles = {}
            self._latency = None
            self._queue_slow = None
            self._minute.clear()
            prev_for_rates = prev  # the delta is everything since the restart
        else:
            prev_for_rates = next((s for s in self.scrapes if scrape.t - s.t <= self.rate_window), prev)
        self.scrapes.append(scrape)
        while len(self.scrapes) > 2 and scrape.t - self.scrapes[0].t > self.window:
            self.scrapes.popleft()
        d = Derived(
            kv_usage=_clean(scrape.mean(KV_USAGE)),
            running=_clean(scrape.total(RUNNING)),
            waiting=_clean(scrape.total(WAITING)),
            preemptions=_clean(scrape.total(PREEMPTIONS)),
            requests=_clean(scrape.total(REQUESTS)),
            waiting_by_reason=scrape.by_label(WAITING_BY_REASON, "reason"),
            rejections=_clean(scrape.total(REJECTIONS)),
            rejections_by_reason=scrape.by_label(REJECTIONS, "reason"),
            finished_by_reason=scrape.by_label(REQUESTS, "finished_reason"),
            prompt_tokens_total=_clean(scrape.total(PROMPT_TOKENS)),
            gen_tokens_total=_clean(scrape.total(GEN_TOKENS)),
            started_at=scrape.created(GEN_TOKENS),
        )
        sleep = scrape.sleep()
        if sleep is not None:
            d.sleeping, d.sleep_level = sleep
        if prev_for_rates is not None:
            dt = scrape.t - prev_for_rates.t
            if dt > 0:
                for attr, names in (("prompt_tps", PROMPT_TOKENS), ("gen_tps", GEN_TOKENS),
                                    ("rejection_rate", REJECTIONS)):
                    delta = counter_delta(prev_for_rates.total(names), scrape.total(names), restarted)
                    if delta is not None:
                        setattr(d, attr, delta / dt)
                finished = self._rates_by_reason(prev_for_rates, scrape, restarted, dt)
                if finished is not None:
                    d.finished_rate_by_reason = finished
                    d.finished_rate = sum(finished.values())
                # Bytes per GPU: the mean over data-parallel engines, each on
                # its own GPU, to set against one node's bandwidth. A build
                # that does not estimate them (vLLM's CPU backend) leaves both
                # at 0: no figure then, rather than a "0 GB/s" that means nothing.
                read = counter_delta(prev_for_rates.mean(READ_BYTES), scrape.mean(READ_BYTES), restarted)
                write = counter_delta(prev_for_rates.mean(WRITE_BYTES), scrape.mean(WRITE_BYTES), restarted)
                if (read or 0.0) + (write or 0.0) > 0:
                    d.mem_read_bps = None if read is None else read / dt
                    d.mem_write_bps = None if write is None else write / dt
        oldest = self.scrapes[0]
        if scrape.has_histograms:
            self._histogram_window(scrape)
        for name, value in self._percentiles.items():
            setattr(d, name, value)
        d.latency = self._latency
        d.queue_slow = self._queue_slow
        if oldest is not scrape:
            queries = counter_delta(oldest.total(PREFIX_QUERIES), scrape.total(PREFIX_QUERIES))
            hits = counter_delta(oldest.total(PREFIX_HITS), scrape.total(PREFIX_HITS))
            if queries and hits is not None:
                d.prefix_hit_rate = min(1.0, hits / queries)
            # A rejection is an error someone got: kept in view for the whole
            # window, not only the few seconds the rate is nonzero.
            d.rejections_recent = counter_delta(oldest.total(REJECTIONS), scrape.total(REJECTIONS))
            if d.rejections_recent is not None:
                d.rejections_span = scrape.t - oldest.t
        if d.prefix_hit_rate is None:
            legacy = scrape.mean(PREFIX_HIT_RATE)
            if legacy is not None and legacy >= 0:
                d.prefix_hit_rate = legacy
        return d

    def _histogram_window(self, scrape: Scrape) -> None:
        """Percentiles over the window and over the last minute, from the
        scrapes read with histograms (every few seconds, not every poll)."""
        self._percentiles = {}
        now = {name: scrape.histogram_with_sum(names) for name, names in LATENCIES.items()}
        hist_oldest = next((s for s in self.scrapes if s.has_histograms), None)
        self._minute.append((scrape.t, now))
        while len(self._minute) > 2 and scrape.t - self._minute[1][0] >= MINUTE:
            self._minute.popleft()  # keep one point at least a minute old: the minute's base
        minute_base = next(((t, h) for t, h in self._minute if scrape.t - t <= MINUTE + 1.0), None)
        if hist_oldest is None or hist_oldest is scrape:
            self._latency = None
            self._queue_slow = None
            return
        latency: dict[str, dict[str, float | None]] = {}
        qs = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
        for name, names in LATENCIES.items():
            old = hist_oldest.histogram_with_sum(names)
            figures = _window_quantiles(now[name], old, qs)
            current = now[name]
            if name == "queue" and current is not None and old is not None:
                window = _sub(current[0], old[0])
                self._queue_slow = above(QUEUE_WAIT_S, window) if window is not None else None
            if minute_base is not None and minute_base[1] is not now:
                minute = _window_quantiles(now[name], minute_base[1].get(name), (("p95_1m", 0.95),))
                if minute is not None:
                    figures = {**(figures or {"p50": None, "p95": None, "p99": None}), **minute}
            if figures is not None:
                latency[name] = figures
        self._latency = latency or None
        for short, attr in (("ttft", "ttft"), ("itl", "itl")):
            figures = latency.get(short) or {}
            if figures.get("p50") is not None or figures.get("p95") is not None:
                self._percentiles[f"{attr}_p50"] = figures.get("p50")
                self._percentiles[f"{attr}_p95"] = figures.get("p95")

    @staticmethod
    def _rates_by_reason(prev: Scrape, cur: Scrape, restarted: bool, dt: float) -> dict[str, float] | None:
        before, now = prev.by_label(REQUESTS, "finished_reason"), cur.by_label(REQUESTS, "finished_reason")
        if now is None or before is None:
            return None
        out = {}
        for reason, value in now.items():
            delta = counter_delta(before.get(reason, 0.0), value, restarted)
            out[reason] = (delta or 0.0) / dt
        return out

    @staticmethod
    def _restarted(prev: Scrape, cur: Scrape) -> bool:
        for names in (GEN_TOKENS, PROMPT_TOKENS):
            a, b = prev.created(names), cur.created(names)
            if a is not None and b is not None and b > a:
                return True
            pa, pb = prev.total(names), cur.total(names)
            if pa is not None and pb is not None and pb < pa:
                return True
        return False
