"""The test's own view of an engine's counters (vLLM's, llama.cpp's): /metrics
scraped on a thread every few hundred milliseconds and parsed with
prometheus-client's parser alone (none of sparktop's code), to hold
sparktop's figures against.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

ENGINE_PREFIXES = ("vllm:", "llamacpp:")


def parse(text: str) -> dict[str, float]:
    """Sample name -> value summed over label sets (engines, reasons)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(ENGINE_PREFIXES) and not s.labels.get("le"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def buckets(text: str) -> dict[str, dict[float, float]]:
    """Histogram name -> {upper bound: cumulative count}, summed over label sets."""
    out: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("vllm:") and s.name.endswith("_bucket"):
                by_le = out.setdefault(s.name.removesuffix("_bucket"), {})
                le = float(s.labels["le"])
                by_le[le] = by_le.get(le, 0.0) + s.value
    return out


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return r.read().decode()


def scrape(url: str) -> dict[str, float]:
    return parse(scrape_text(url))


@dataclass
class Scraper:
    """Scrapes `url` every `every` seconds on a thread until stopped."""

    url: str
    every: float = 0.2
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    # When each scrape was asked for; samples[i] is (when its answer was in, values):
    # the server read its values somewhere between the two.
    asked: list[float] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = time.time()
            try:
                values = scrape(self.url)
            except OSError:
                values = None
            if values is not None:
                self.asked.append(asked)
                self.samples.append((time.time(), values))
            self._stop.wait(self.every)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(15)

    def around(self, t0: float, t1: float) -> list[dict[str, float]]:
        """What the server may have said between `t0` and `t1`: the samples
        whose request overlapped that span, and the last one answered before
        it and the first one asked after it (the values in between lie
        between those, unless they went up and down again)."""
        spans = list(zip(self.asked, self.samples, strict=True))
        during = [v for a, (e, v) in spans if a <= t1 and e >= t0]
        before = [v for a, (e, v) in spans if e < t0][-1:]
        after = [v for a, (e, v) in spans if a > t1][:1]
        return before + during + after

    def value_at(self, name: str, t: float) -> float:
        """A counter at time `t`, interpolated between the samples that bracket it."""
        pts = [(ts, v[name]) for ts, v in self.samples if name in v]
        for (t0, v0), (t1, v1) in zip(pts, pts[1:], strict=False):
            if t0 <= t <= t1:
                return v0 + (v1 - v0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)
        raise ValueError(f"{name} not sampled around {t}")

    def rate(self, name: str, t0: float, t1: float) -> float:
        return (self.value_at(name, t1) - self.value_at(name, t0)) / (t1 - t0)
