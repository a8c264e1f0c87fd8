"""An engine's Prometheus `/metrics`, whatever the engine: parsed with
prometheus-client's own text parser, then turned into the figures the
monitor shows. Which series mean what is each engine's (`MetricNames`, one
table per engine module in `observe/engines/`); how they are read is here.

- Series are matched by sample name, so a scrape with or without
  `# TYPE` lines parses the same; `_created` series are used only to
  detect restarts; label order does not matter; NaN is "no value".
- Series with several label sets (vLLM's data-parallel `engine`, SGLang's
  `tp_rank`/`pp_rank`/`dp_rank`) are summed, gauges of a share (KV use)
  averaged.
- Rates come from counter deltas between two scrapes; a counter that went
  down (or whose `_created` changed) was reset by a restart, and the new
  value is the delta, as Prometheus' rate() does: never negative. Gauges
  that an engine resets when they are read (llama.cpp's `*_seconds` rates)
  are never used: counters only.
- Percentiles come from histogram bucket deltas over a window of scrapes:
  p50/p95/p99 over the window (30 s) and a p95 over the last minute, so a
  spike stays in view after it has passed.
- Requests finished, by a reason label where the engine has one (vLLM's
  `finished_reason`): a rate per reason and the totals over the engine's
  life; the engine's start time is its token counters' `_created` time.
- vLLM 0.32's extras (waiting by reason, admission rejections, the sleep
  state, its estimate of the bytes each GPU moves) are None for an engine
  that has none of them.
- Speculative decoding: the share of drafted tokens accepted and the mean
  accepted length, over the window, from counters (vLLM) or a gauge
  (SGLang's accept length).
"""

from __future__ import annotations

import math
import os
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from prometheus_client.parser import text_string_to_metric_families

MINUTE = 60.0  # the span of the "p95 over the last minute"
QUEUE_WAIT_S = 5.0  # a request that waited longer than this in the queue is worth an event
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))  # the percentiles over the window, by name

Names = tuple[str, ...]


# Token rates over 10 s, as vLLM's own log line gives them: a real engine's counters move in bursts (its
# scheduler, its output processor), and a rate between two polls a second apart jumps between 0 and twice
# the truth. Latency percentiles and hit rates over a rolling minute.
RATE_WINDOW_S = 10.0
LATENCY_WINDOW_S = 60.0


@dataclass(frozen=True)
class MetricNames:
    """Which series of an engine's scrape hold which figure; in each group
    the first name present wins (an engine's current name, then its older
    ones). An empty group: the engine does not export that figure."""

    prefix: str  # every series of the engine starts with it: `vllm:`, `sglang:`, `llamacpp:`, `trtllm_`
    kv_usage: Names = ()  # a gauge, 0..1 (mean over series)
    running: Names = ()
    waiting: Names = ()
    prompt_tokens: Names = ()  # counters
    gen_tokens: Names = ()
    prefix_queries: Names = ()  # prompt tokens looked up in the prefix cache, and those found
    prefix_hits: Names = ()
    cached_tokens: Names = ()  # prompt tokens served from the cache: hit rate = cached / prompt tokens
    prefix_hit_rate: Names = ()  # a gauge 0..1, where the engine gives only that (-1: unknown)
    preemptions: Names = ()  # requests preempted (vLLM) or retracted (SGLang)
    requests: Names = ()  # requests finished
    finished_label: str | None = None  # the label that says why a request finished
    ttft: Names = ()  # histograms, seconds
    itl: Names = ()
    queue: Names = ()
    e2e: Names = ()
    waiting_by_reason: Names = ()  # vLLM 0.32: reason = capacity | deferred
    rejections: Names = ()  # vLLM 0.32: admission rejections, reason = max_num_queued_reqs | ..._tokens
    sleep_state: Names = ()  # vLLM 0.32: sleep_state = awake | weights_offloaded | discard_all
    read_bytes: Names = ()  # vLLM's estimate of the bytes each GPU reads and writes (counters)
    write_bytes: Names = ()
    spec_drafts: Names = ()  # counters: drafts proposed, tokens drafted, tokens accepted
    spec_draft_tokens: Names = ()
    spec_accepted: Names = ()
    spec_accept_len: Names = ()  # a gauge: mean tokens accepted per draft, where that is all there is
    spec_accept_rate: Names = ()  # a gauge: the share of drafted tokens accepted, likewise
    created: Names = ()  # counters whose `_created` time changes when the engine restarts
    # Figures whose labelled counter the engine creates at its first count (SGLang's retractions): no series
    # yet means none counted, not "not exported".
    first_counted: tuple[str, ...] = ()
    release_marks: Names = ()  # series only a release that has those lazy counters exports (else: absent)
    # Every series appears when the first request finishes (TensorRT-LLM's collector): until then an absent
    # series says nothing about what the engine exports.
    created_by_first_request: bool = False
    # Its token counters move only when a request ends (TensorRT-LLM): over a few seconds they read 0 through a
    # long generation and then a burst no GPU ran; their rates are taken over the whole window instead.
    counted_at_end: bool = False

    @property
    def latencies(self) -> dict[str, Names]:
        """The latency histograms, by the short name the monitor shows them under."""
        return {name: group for name, group in
                (("ttft", self.ttft), ("itl", self.itl), ("queue", self.queue), ("e2e", self.e2e)) if group}

    def groups(self) -> dict[str, Names]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("prefix", "finished_label", "first_counted", "created_by_first_request",
                                  "counted_at_end")
                and getattr(self, f.name)}


class MetricsError(ValueError):
    pass


_SELECTORS: dict[str, tuple[str, tuple[tuple[str, frozenset[str]], ...]]] = {}


def series_name(name: str) -> tuple[str, tuple[tuple[str, frozenset[str]], ...]]:
    """`sglang:realtime_tokens_total{mode=prefill_compute|prefill_cache}` ->
    the sample name and its label selector (the label, the values kept).
    A names table writes a selector where one series of an engine holds
    several figures under a label."""
    found = _SELECTORS.get(name)
    if found is None:
        base, _, rest = name.partition("{")
        selector = tuple((k.strip(), frozenset(v.split("|"))) for k, _, v in
                         (part.partition("=") for part in rest.rstrip("}").split(",") if part))
        found = _SELECTORS[name] = (base, selector)
    return found


def _alternatives(names) -> str:
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))


_FILTERS: dict[tuple[MetricNames, bool], re.Pattern] = {}


def _filtered_names(names: MetricNames, histograms: bool) -> tuple[set[str], set[str]]:
    """The series names `line_filter` keeps (each with or without a histogram's
    or counter's suffix), and the `_created` names it keeps."""
    latency = {n for group in names.latencies.values() for n in group}
    bases = {series_name(n)[0].removesuffix("_total") for group in names.groups().values() for n in group}
    if not histograms:
        bases -= latency
    created = {n.removesuffix("_total") + "_created" for n in names.created} or {"\x00never"}
    return bases, created


def line_filter(names: MetricNames, histograms: bool = True) -> re.Pattern:
    """One regex that keeps the sample lines of the series `names` reads
    (and the `_created` lines of its restart counters), built once per engine."""
    key = (names, histograms)
    found = _FILTERS.get(key)
    if found is not None:
        return found
    bases, created = _filtered_names(names, histograms)
    # No `# TYPE` lines: samples are matched by name, and untyped samples
    # parse the same, in half the parser's time.
    pattern = re.compile(
        rf"^(?:(?:{_alternatives(bases)})(?:_bucket|_count|_sum|_total)?[{{ ].*"
        rf"|(?:{_alternatives(created)})[{{ ].*)$",
        re.M,
    )
    _FILTERS[key] = pattern
    return pattern


_LINE_MATCHERS: dict[tuple[MetricNames, bool], tuple[str, Callable[[str], re.Match | None]]] = {}


def kept_lines(text: str, names: MetricNames, histograms: bool = True) -> list[str]:
    """The lines `line_filter` keeps, in order: what its `findall` over the
    whole text gives. A multi-line pattern tries every position of a 50 kB
    scrape, most of it `# HELP`/`# TYPE` lines and series nobody here reads;
    splitting the lines, dropping those without the names' common prefix and
    matching the rest one by one takes half the time, every poll."""
    key = (names, histograms)
    found = _LINE_MATCHERS.get(key)
    if found is None:
        bases, created = _filtered_names(names, histograms)
        prefix = os.path.commonprefix(sorted(bases | created - {"\x00never"}))
        # The same pattern without its line anchors, matched against one line at a time.
        pattern = line_filter(names, histograms).pattern.removeprefix("^").removesuffix("$")
        found = _LINE_MATCHERS[key] = (prefix, re.compile(pattern).fullmatch)
    prefix, match = found
    return [line for line in text.split("\n") if line.startswith(prefix) and match(line)]


def relevant_lines(text: str, names: MetricNames, histograms: bool = True) -> str:
    """Only the series the monitor reads.

    A vLLM scrape is mostly histogram buckets, Python process metrics and
    `_created` series nobody here looks at; dropping them before
    prometheus-client parses the rest keeps a 1 s poll cheap.
    """
    return "\n".join(kept_lines(text, names, histograms)) + "\n"


# Sample lines already parsed, by their exact text: from one scrape to the
# next most lines read the same (an idle series, a histogram's upper buckets,
# the queue's zeroes), and prometheus-client's parser walks every label
# character by character. Bounded: emptied when full. Each holds the sample's
# name and its (labels, value), which scrapes share and never change: a
# minute of scrapes kept for rates and percentiles then holds one pair per
# distinct line, not a new one per line every second for the garbage
# collector to walk.
_LINE_CACHE: dict[str, tuple[str, tuple[dict[str, str], float]]] = {}
_LINE_CACHE_MAX = 8192


def _parsed_lines(lines: list[str]) -> list[tuple[str, tuple[dict[str, str], float]]]:
    """(name, (labels, value)) of each sample line, in order; the lines not
    seen before are parsed by prometheus-client, together."""
    cache = _LINE_CACHE
    if len(cache) + len(lines) > _LINE_CACHE_MAX:
        cache.clear()
    new = [line for line in dict.fromkeys(lines) if line not in cache]
    if new:
        parsed = [(sample.name, (dict(sample.labels), sample.value))
                  for family in text_string_to_metric_families("\n".join(new) + "\n") for sample in family.samples]
        if len(parsed) != len(new):  # not one sample per line: no cache for this text
            return [(sample.name, (dict(sample.labels), sample.value))
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
    def parse(cls, text: str, t: float, names: MetricNames | None = None, histograms: bool = True) -> Scrape:
        """The series `names` reads (every series without `names`);
        `histograms=False` skips the latency buckets (most of the parse
        work): percentiles then come from the scrapes that have them."""
        scrape = cls(t)
        scrape.has_histograms = histograms or names is None
        try:
            if names is None:
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        scrape.samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
            else:
                scrape.engine_seen = names.prefix in text
                samples = scrape.samples
                for name, pair in _parsed_lines(kept_lines(text, names, histograms)):
                    found = samples.get(name)
                    if found is None:
                        samples[name] = [pair]
                    else:
                        found.append(pair)
        except (ValueError, TypeError, IndexError) as exc:
            raise MetricsError(f"cannot parse /metrics: {exc}") from None
        return scrape

    engine_seen: bool = False  # the engine's prefix is in the text (whatever series were kept)
    has_histograms: bool = True

    def has(self, names: tuple[str, ...]) -> bool:
        """Whether any series of `names` is in this scrape (a histogram by its buckets)."""
        return self._first(names) is not None or any(n + "_bucket" in self.samples for n in names)

    def _first(self, names: tuple[str, ...]) -> tuple[str, list[tuple[dict, float]]] | None:
        """The first name present: its sample name and series (only those its
        label selector keeps, for a name written `name{label=a|b}`)."""
        for name in names:
            base, selector = series_name(name)
            series = self.samples.get(base)
            if series and selector:
                series = [(labels, v) for labels, v in series
                          if all(labels.get(k) in values for k, values in selector)]
            if series:
                return base, series
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

    def sleep(self, names: tuple[str, ...]) -> tuple[bool, int | None] | None:
        """(sleeping, level) from `vllm:engine_sleep_state`, or None when it is absent.

        vLLM sets `awake` to 0 while the engine sleeps, and one of
        `weights_offloaded` (level 1) or `discard_all` (level 2); a sleep that
        only released the KV cache (`release_kv_cache_memory`) has neither,
        so its level is None. Data-parallel engines sleep together; should
        they differ, the deepest sleep is reported, since a sleeping engine
        is what a user must not mistake for an idle one."""
        found = self._first(names)
        series = found[1] if found else None
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
    # The histograms `latency` is taken from, by the same names: what the window observed (cumulative
    # buckets, sum), so replicas' can be summed into the group's percentiles (`replicas.group_latency`)
    latency_histograms: dict[str, Histogram] | None = None
    # When the figures were read (the probe's clock at the body's arrival), 0 when unknown: the
    # snapshot is stamped with it, not with the end of a parse that may take a busy core 0.3 s.
    read_at: float = 0.0
    queue_slow: float | None = None  # requests in the window that waited over QUEUE_WAIT_S in the queue
    gen_tps_now: float | None = None  # since the previous scrape only (gen_tps: over the rate window)
    prompt_tps_now: float | None = None
    spec_acceptance: float | None = None  # drafted tokens accepted, 0..1, over the window
    spec_accept_len: float | None = None  # tokens accepted per draft (plus the one the target makes), mean
    # The figures (`snapshot.FIGURES`) the engine's scrape held no series for: not exported by it
    missing: list[str] = field(default_factory=list)


# Each figure the monitor shows, and the name groups whose series give it.
FIGURE_GROUPS: dict[str, tuple[str, ...]] = {
    "kv": ("kv_usage",), "running": ("running",), "waiting": ("waiting",), "prompt_tps": ("prompt_tokens",),
    "gen_tps": ("gen_tokens",), "prefix": ("prefix_queries", "cached_tokens", "prefix_hit_rate"),
    "preemptions": ("preemptions",), "finished": ("requests",), "ttft": ("ttft",), "itl": ("itl",),
    "queue": ("queue",), "e2e": ("e2e",), "spec": ("spec_accepted", "spec_accept_len", "spec_accept_rate"),
}


Histogram = tuple[dict[float, float], float | None]  # cumulative buckets, and the sum of the observations


def window_histogram(new: Histogram | None, old: Histogram | None) -> Histogram | None:
    """What was observed between two scrapes: cumulative bucket counts and the sum, new minus old (None
    without both, or when a count went down: a restart inside the window)."""
    if new is None or old is None:
        return None
    window = _sub(new[0], old[0])
    if not window:
        return None
    return window, new[1] - old[1] if new[1] is not None and old[1] is not None else None


def histogram_quantiles(histogram: Histogram | None,
                        qs: tuple[tuple[str, float], ...]) -> dict[str, float | None] | None:
    """`quantile` at each of `qs` ((name, q), ...) of one histogram, an engine's window or several merged
    (`replicas.group_latency`), the mean taken from its sum."""
    if histogram is None or not histogram[0]:
        return None
    buckets, total = histogram
    count = buckets[max(buckets)]
    mean = total / count if count > 0 and total is not None else None
    return {name: quantile(q, buckets, mean) for name, q in qs}


def _window_quantiles(new: Histogram | None, old: Histogram | None,
                      qs: tuple[tuple[str, float], ...]) -> dict[str, float | None] | None:
    return histogram_quantiles(window_histogram(new, old), qs)


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

    def __init__(self, names: MetricNames, window: float = LATENCY_WINDOW_S, rate_window: float = RATE_WINDOW_S,
                 max_scrapes: int = 120):
        self.names = names
        self.window = window  # percentiles and prefix hit rate
        self.rate_window = rate_window  # tokens/s: smooth like vLLM's own log, still responsive
        if names.counted_at_end:
            self.rate_window = window
        self.max_scrapes = max_scrapes
        self.scrapes: deque[Scrape] = deque(maxlen=max_scrapes)
        self._percentiles: dict[str, float | None] = {}
        self._latency: dict[str, dict[str, float | None]] | None = None
        self._latency_histograms: dict[str, Histogram] | None = None
        self._queue_slow: float | None = None
        self._missing_latency: list[str] = []
        # (t, {latency name: cumulative buckets}) of the scrapes read with
        # histograms, for the last minute's p95.
        self._minute: deque[tuple[float, dict[str, Histogram | None]]] = deque()

    def set_windows(self, rate: float, latency: float, poll_interval: float = 1.0) -> None:
        """Token rates over the last `rate` seconds, percentiles and hit rates over the last `latency`."""
        self.window = max(latency, rate)
        self.rate_window = self.window if self.names.counted_at_end else rate
        keep = max(self.max_scrapes, int(self.window / max(poll_interval, 0.1)) + 5)
        if keep != self.scrapes.maxlen:
            self.scrapes = deque(self.scrapes, maxlen=keep)

    def parse(self, text: str, t: float, histograms: bool = True) -> Scrape:
        return Scrape.parse(text, t, self.names, histograms=histograms)

    def reset(self) -> None:
        self.scrapes.clear()
        self._percentiles = {}
        self._latency = None
        self._latency_histograms = None
        self._queue_slow = None
        self._minute.clear()

    def add(self, scrape: Scrape) -> Derived:
        n = self.names
        prev = self.scrapes[-1] if self.scrapes else None
        restarted = prev is not None and self._restarted(prev, scrape)
        if restarted:
            self.reset()
            prev_for_rates = prev  # the delta is everything since the restart
        else:
            prev_for_rates = next((s for s in self.scrapes if scrape.t - s.t <= self.rate_window), prev)
        self.scrapes.append(scrape)
        while len(self.scrapes) > 2 and scrape.t - self.scrapes[0].t > self.window:
            self.scrapes.popleft()
        label = n.finished_label
        d = Derived(
            kv_usage=_clean(scrape.mean(n.kv_usage)),
            running=_clean(scrape.total(n.running)),
            waiting=_clean(scrape.total(n.waiting)),
            preemptions=_clean(scrape.total(n.preemptions)),
            requests=_clean(scrape.total(n.requests)),
            waiting_by_reason=scrape.by_label(n.waiting_by_reason, "reason"),
            rejections=_clean(scrape.total(n.rejections)),
            rejections_by_reason=scrape.by_label(n.rejections, "reason"),
            finished_by_reason=scrape.by_label(n.requests, label) if label else None,
            prompt_tokens_total=_clean(scrape.total(n.prompt_tokens)),
            gen_tokens_total=_clean(scrape.total(n.gen_tokens)),
            started_at=scrape.created(n.gen_tokens) if n.created else None,
        )
        if d.kv_usage is not None and d.kv_usage > 1.0 + 1e-9:
            d.kv_usage = min(1.0, d.kv_usage / 100.0)  # a percentage where a share was expected
        sleep = scrape.sleep(n.sleep_state) if n.sleep_state else None
        if sleep is not None:
            d.sleeping, d.sleep_level = sleep
        if prev_for_rates is not None:
            dt = scrape.t - prev_for_rates.t
            if prev is not None and scrape.t > prev.t and not restarted and not n.counted_at_end:
                # Since the last poll alone: the sparkline's instantaneous figure, bursty as a real
                # engine's counters are.
                for attr, names in (("prompt_tps_now", n.prompt_tokens), ("gen_tps_now", n.gen_tokens)):
                    delta = counter_delta(prev.total(names), scrape.total(names))
                    if delta is not None:
                        setattr(d, attr, delta / (scrape.t - prev.t))
            if dt > 0:
                for attr, names in (("prompt_tps", n.prompt_tokens), ("gen_tps", n.gen_tokens),
                                    ("rejection_rate", n.rejections)):
                    delta = counter_delta(prev_for_rates.total(names), scrape.total(names), restarted)
                    if delta is not None:
                        setattr(d, attr, delta / dt)
                if label:
                    finished = self._rates_by_reason(prev_for_rates, scrape, restarted, dt)
                    if finished is not None:
                        d.finished_rate_by_reason = finished
                        d.finished_rate = sum(finished.values())
                else:
                    done = counter_delta(prev_for_rates.total(n.requests), scrape.total(n.requests), restarted)
                    if done is not None:
                        d.finished_rate = done / dt
                # Bytes per GPU: the mean over data-parallel engines, each on
                # its own GPU, to set against one node's bandwidth. A build
                # that does not estimate them (vLLM's CPU backend) leaves both
                # at 0: no figure then, rather than a "0 GB/s" that means nothing.
                read = counter_delta(prev_for_rates.mean(n.read_bytes), scrape.mean(n.read_bytes), restarted)
                write = counter_delta(prev_for_rates.mean(n.write_bytes), scrape.mean(n.write_bytes), restarted)
                if (read or 0.0) + (write or 0.0) > 0:
                    d.mem_read_bps = None if read is None else read / dt
                    d.mem_write_bps = None if write is None else write / dt
        oldest = self.scrapes[0]
        if scrape.has_histograms:
            self._histogram_window(scrape)
        for name, value in self._percentiles.items():
            setattr(d, name, value)
        d.latency = self._latency
        d.latency_histograms = self._latency_histograms
        d.queue_slow = self._queue_slow
        if oldest is not scrape:
            self._window_figures(d, oldest, scrape)
        if d.prefix_hit_rate is None:
            legacy = scrape.mean(n.prefix_hit_rate)
            if legacy is not None and 0 <= legacy <= 1:
                d.prefix_hit_rate = legacy
        if d.spec_accept_len is None and n.spec_accept_len:
            length = _clean(scrape.mean(n.spec_accept_len))
            d.spec_accept_len = length if length else None  # 0: no speculative decoding running
        if d.spec_acceptance is None and n.spec_accept_rate:
            rate = _clean(scrape.mean(n.spec_accept_rate))
            d.spec_acceptance = rate if rate else None
        if d.preemptions is None and "preemptions" in self._lazy(scrape):
            d.preemptions = 0.0
        d.missing = self._missing(scrape)
        return d

    def _window_figures(self, d: Derived, oldest: Scrape, scrape: Scrape) -> None:
        """What is counted over the whole window: prefix hits, recent rejections, drafts accepted."""
        n = self.names
        hits = counter_delta(oldest.total(n.prefix_hits), scrape.total(n.prefix_hits))
        queries = counter_delta(oldest.total(n.prefix_queries), scrape.total(n.prefix_queries))
        if not n.prefix_queries and n.cached_tokens:
            hits = counter_delta(oldest.total(n.cached_tokens), scrape.total(n.cached_tokens))
            queries = counter_delta(oldest.total(n.prompt_tokens), scrape.total(n.prompt_tokens))
        if queries and hits is not None:
            d.prefix_hit_rate = min(1.0, hits / queries)
        # A rejection is an error someone got: kept in view for the whole
        # window, not only the few seconds the rate is nonzero.
        d.rejections_recent = counter_delta(oldest.total(n.rejections), scrape.total(n.rejections))
        if d.rejections_recent is not None:
            d.rejections_span = scrape.t - oldest.t
        accepted = counter_delta(oldest.total(n.spec_accepted), scrape.total(n.spec_accepted))
        drafted = counter_delta(oldest.total(n.spec_draft_tokens), scrape.total(n.spec_draft_tokens))
        drafts = counter_delta(oldest.total(n.spec_drafts), scrape.total(n.spec_drafts))
        if accepted is not None and drafted:
            d.spec_acceptance = min(1.0, accepted / drafted)
        if accepted is not None and drafts:
            d.spec_accept_len = 1.0 + accepted / drafts  # the target model's own token counts too

    def _lazy(self, scrape: Scrape) -> tuple[str, ...]:
        """The figures whose absent series mean "none counted yet" in this scrape: the engine's release
        creates their counters at the first count."""
        n = self.names
        if not n.first_counted or not scrape.engine_seen:
            return ()
        return n.first_counted if not n.release_marks or scrape.has(n.release_marks) else ()

    def _missing(self, scrape: Scrape) -> list[str]:
        """The figures this engine does not export: no names for them, or none
        of their series in its scrape (histograms judged on scrapes that have them)."""
        missing = []
        lazy = self._lazy(scrape)
        # No series of the engine at all yet (a server still warming up, a release that creates them as it
        # counts): the scrape says nothing about what it exports.
        unsettled = not scrape.engine_seen or (self.names.created_by_first_request
                                               and not scrape.has(self.names.requests))
        for figure, groups in FIGURE_GROUPS.items():
            names = [name for group in groups for name in getattr(self.names, group)]
            if unsettled and names:
                continue  # no request has finished yet: its series do not exist yet
            if figure in ("ttft", "itl", "queue", "e2e") and names and not scrape.has_histograms:
                if figure in self._missing_latency:
                    missing.append(figure)
                continue
            if not names or not (scrape.has(tuple(names)) or figure in lazy):
                missing.append(figure)
        if scrape.has_histograms:
            self._missing_latency = [f for f in missing if f in ("ttft", "itl", "queue", "e2e")]
        return missing

    def _histogram_window(self, scrape: Scrape) -> None:
        """Percentiles over the window and over the last minute, from the
        scrapes read with histograms (every few seconds, not every poll)."""
        self._percentiles = {}
        latencies = self.names.latencies
        now = {name: scrape.histogram_with_sum(names) for name, names in latencies.items()}
        hist_oldest = next((s for s in self.scrapes if s.has_histograms), None)
        self._minute.append((scrape.t, now))
        while len(self._minute) > 2 and scrape.t - self._minute[1][0] >= MINUTE:
            self._minute.popleft()  # keep one point at least a minute old: the minute's base
        minute_base = next(((t, h) for t, h in self._minute if scrape.t - t <= MINUTE + 1.0), None)
        if hist_oldest is None or hist_oldest is scrape:
            self._latency = None
            self._latency_histograms = None
            self._queue_slow = None
            return
        latency: dict[str, dict[str, float | None]] = {}
        windows: dict[str, Histogram] = {}
        for name, names in latencies.items():
            old = hist_oldest.histogram_with_sum(names)
            window = window_histogram(now[name], old)
            figures = histogram_quantiles(window, QUANTILES)
            if window is not None:
                windows[name] = window
            if name == "queue" and now[name] is not None and old is not None:
                self._queue_slow = above(QUEUE_WAIT_S, window[0]) if window is not None else None
            if minute_base is not None and minute_base[1] is not now:
                minute = _window_quantiles(now[name], minute_base[1].get(name), (("p95_1m", 0.95),))
                if minute is not None:
                    figures = {**(figures or {"p50": None, "p95": None, "p99": None}), **minute}
            if figures is not None:
                latency[name] = figures
        self._latency = latency or None
        self._latency_histograms = windows or None
        for short in ("ttft", "itl"):
            figures = latency.get(short) or {}
            if figures.get("p50") is not None or figures.get("p95") is not None:
                self._percentiles[f"{short}_p50"] = figures.get("p50")
                self._percentiles[f"{short}_p95"] = figures.get("p95")

    def _rates_by_reason(self, prev: Scrape, cur: Scrape, restarted: bool, dt: float) -> dict[str, float] | None:
        label = self.names.finished_label or ""
        before, now = prev.by_label(self.names.requests, label), cur.by_label(self.names.requests, label)
        if now is None or before is None:
            return None
        out = {}
        for reason, value in now.items():
            delta = counter_delta(before.get(reason, 0.0), value, restarted)
            out[reason] = (delta or 0.0) / dt
        return out

    def _restarted(self, prev: Scrape, cur: Scrape) -> bool:
        for names in (self.names.gen_tokens, self.names.prompt_tokens):
            if names and self.names.created:
                a, b = prev.created(names), cur.created(names)
                if a is not None and b is not None and b > a:
                    return True
            pa, pb = prev.total(names), cur.total(names)
            if pa is not None and pb is not None and pb < pa:
                return True
        return False
