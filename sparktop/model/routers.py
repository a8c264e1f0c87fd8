"""Routers in front of replicas, as they behave.

A router is part of the stack, with its version: a row names it, says how it
splits a lockstep burst of c requests over r replicas (a distribution over
splits, each a tuple of requests per replica with its weight), and what it
adds per request (None: the fitted `router_overhead_s`). The simulation
(`model.simulate.predict`) takes the expectation of every statistic over
that distribution.

Behaviours, from how each router works:

- `random` (LiteLLM simple-shuffle): every request to a replica drawn
  uniformly and independently: the binomial split over two replicas (every
  split for small c, five quantiles for large), seeded multinomial draws
  over more.
- `race` (LiteLLM least-busy as sparktop launches it, measured with
  LiteLLM 1.106.2 over two twin engines, tests/benchmarks/router_split.py):
  least-busy reads the in-flight count of each deployment when it picks
  one (`async_get_available_deployments`) and increments the chosen one's
  in `log_pre_api_call`, just before the request is sent; ties go to the
  first deployment. Requests that arrive together are handled in the order
  they reach it, and a request whose read falls before its predecessors'
  increments sees the count they saw. A request misses the increments of
  its L most recent predecessors, L geometric with P(L >= k) = q**k (q, the
  race probability: a request reads before the one just before it has
  counted). A burst of 2 then piles on the first replica with probability
  q; large bursts split close to even; a continuous load (requests one at
  a time as others finish) splits evenly.
- `first` (the articles' least-busy, and LiteLLM latency-based-routing): a
  lockstep batch all goes to the first replica. The articles' setup
  starved its second node ("Least-busy tracks Solo almost exactly"): their
  least-busy counted a request only once it streamed back, so a batch that
  arrives before any does sees every count at zero. latency-based-routing
  sends a batch to the replica that answered fastest so far, all of it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cache

from sparktop import engine_ids

# The LiteLLM sparktop launches: its proxy image's tag (settings.Defaults.router_image, from engine_ids).
LITELLM_VERSION = engine_ids.get(engine_ids.ROUTER).default_image.rsplit(":", 1)[-1].lstrip("v")

# least-busy's race probability: how often a request reads the in-flight counts before the request just
# before it has counted itself. Fitted to the share of bursts of 2 that all went to one replica with LiteLLM
# 1.106.2 over two twin engines (tests/benchmarks/router_split.py, 2026-11-29: 24 of 40 bursts of 2).
LEAST_BUSY_RACE = 0.6
RACE_DRAWS = 1000  # seeded bursts averaged for least-busy's split distribution
SHUFFLE_DRAWS = 12  # random splits averaged for a shuffle over more than two replicas

Split = tuple[int, ...]


@dataclass(frozen=True)
class Router:
    id: str
    layout: str  # the layout's router word (`2x solo,least-busy`): shuffle | least-busy
    product: str  # "LiteLLM 1.106.2"
    strategy: str  # LiteLLM's routing_strategy
    behaviour: str  # random | race | first
    note: str  # how it splits, for text
    race: float = 0.0  # `race`: the probability a request reads before its predecessor counted
    overhead_s: float | None = None  # per request; None: the fitted router_overhead_s

    def splits(self, c: int, replicas: int) -> list[tuple[Split, float]]:
        """How a lockstep burst of c requests is split over the replicas, with weights."""
        if self.behaviour == "random":
            return shuffle_splits(c, replicas)
        if self.behaviour == "race":
            return race_splits(c, replicas, self.race)
        return [((c,) + (0,) * (replicas - 1), 1.0)]

    def busiest(self, c: int, replicas: int) -> int:
        """The requests on the busiest replica, for the KV cache check."""
        if c <= 0:
            return 0
        if self.behaviour == "random" and replicas == 2:
            mode = max(range(c + 1), key=lambda a: _binom(c, a))
            return max(mode, c - mode)
        points = self.splits(c, replicas)
        return round(sum(w * max(s) for s, w in points) / sum(w for _, w in points))

    def describe(self) -> str:
        """"LiteLLM 1.106.2 least-busy (as measured: ...)"."""
        return f"{self.product} {self.strategy} ({self.note})"

    def as_dict(self) -> dict:
        return {"id": self.id, "product": self.product, "strategy": self.strategy, "behaviour": self.behaviour,
                "note": self.note, **({"race": self.race} if self.behaviour == "race" else {})}


LITELLM = f"LiteLLM {LITELLM_VERSION}"
ARTICLES = "litellm-articles"  # the version the published articles ran (they do not name it)
ROWS: tuple[Router, ...] = (
    Router(f"litellm-{LITELLM_VERSION}/shuffle", "shuffle", LITELLM, "simple-shuffle", "random",
           "each request to a replica at random"),
    Router(f"litellm-{LITELLM_VERSION}/least-busy", "least-busy", LITELLM, "least-busy", "race",
           "as measured: bursts of 2-4 race to one backend, larger bursts and continuous load split evenly",
           race=LEAST_BUSY_RACE),
    Router(f"litellm-{LITELLM_VERSION}/latency", "latency", LITELLM, "latency-based-routing", "first",
           "every lockstep batch to one backend"),
    Router(f"{ARTICLES}/shuffle", "shuffle", "LiteLLM (the articles' setup)", "simple-shuffle", "random",
           "each request to a replica at random"),
    Router(f"{ARTICLES}/least-busy", "least-busy", "LiteLLM (the articles' setup)", "least-busy", "first",
           "a lockstep batch to the first node, as the articles measured"),
)
LAUNCHED = f"litellm-{LITELLM_VERSION}"  # the router version sparktop launches


def router_for(layout_router: str, version: str | None = None) -> Router:
    """The row of `layout_router` (shuffle | least-busy) in `version` (LAUNCHED when None), or a row's own id."""
    for row in ROWS:
        if row.id == version or row.id == f"{version or LAUNCHED}/{layout_router}":
            return row
    raise KeyError(f"no router {layout_router!r} in version {version or LAUNCHED!r}")


def litellm_strategy(layout_router: str | None) -> str:
    """The routing_strategy sparktop writes into the LiteLLM config for a layout's router."""
    return router_for(layout_router or "least-busy").strategy


def for_source(source: str) -> str | None:
    """The router version a published source ran (stacks.yaml `sources:` `router:`), None: not stated."""
    from sparktop.model.stacks import load_stacks

    src = load_stacks().sources.get(source)
    return src.router if src is not None else None


# -- the split distributions --------------------------------------------------------------------


def _binom(c: int, a: int) -> float:
    return math.comb(c, a) / 2 ** c


def split_points(c: int) -> list[tuple[int, float]]:
    """How many of c requests go to the first of two replicas, with weights: every split for small c, five
    quantiles of the binomial for large."""
    if c <= 8:
        return [(a, _binom(c, a)) for a in range(c + 1)]
    cdf, points, a = 0.0, [], 0
    for q in (0.1, 0.3, 0.5, 0.7, 0.9):
        while cdf + _binom(c, a) < q:
            cdf += _binom(c, a)
            a += 1
        points.append((a, 0.2))
    return points


def multinomial_splits(c: int, replicas: int) -> list[tuple[Split, float]]:
    """Splits of c requests over `replicas` engines, each drawn as the router draws them (uniformly,
    independently), from a fixed seed so a prediction reads the same every time; equal weights."""
    rng = random.Random(c * 1009 + replicas)
    splits = []
    for _ in range(SHUFFLE_DRAWS):
        counts = [0] * replicas
        for _ in range(c):
            counts[rng.randrange(replicas)] += 1
        splits.append((tuple(counts), 1.0))
    return splits


def shuffle_splits(c: int, replicas: int) -> list[tuple[Split, float]]:
    if replicas == 2:
        return [((a, c - a), w) for a, w in split_points(c)]
    return multinomial_splits(c, replicas)


def race_burst(c: int, replicas: int, race: float, rng: random.Random) -> list[int]:
    """One burst through least-busy: each request picks the least-loaded replica (ties: the first) by the
    counts of the requests before it, less the L most recent (L geometric: P(L >= k) = race**k)."""
    chosen: list[int] = []
    seen = [(0,) * replicas]  # seen[k]: the counts after the first k requests have counted
    draw = rng.random
    for i in range(c):
        lag = 0
        while lag < i and draw() < race:
            lag += 1
        counts = seen[i - lag]
        pick = counts.index(min(counts))  # the least busy; ties to the first
        chosen.append(pick)
        last = seen[-1]
        seen.append(last[:pick] + (last[pick] + 1,) + last[pick + 1:])
    return chosen


@cache
def race_splits(c: int, replicas: int, race: float) -> list[tuple[Split, float]]:
    """least-busy's split distribution for a burst of c (seeded draws of `race_burst`; the split as requests per
    replica in replica order), most likely first."""
    if c <= 0:
        return [((0,) * replicas, 1.0)]
    rng = random.Random(c * 7919 + replicas)
    tally: dict[Split, int] = {}
    for _ in range(RACE_DRAWS):
        chosen = race_burst(c, replicas, race, rng)
        split = tuple(chosen.count(r) for r in range(replicas))
        tally[split] = tally.get(split, 0) + 1
    return sorted(((s, n / RACE_DRAWS) for s, n in tally.items()), key=lambda x: -x[1])


def one_backend_share(points: list[tuple[Split, float]]) -> float:
    """How often every request goes to one replica."""
    total = sum(w for _, w in points)
    return sum(w for s, w in points if max(s) == sum(s)) / total if total else 0.0


def mean_max_share(points: list[tuple[Split, float]]) -> float:
    """The busiest replica's mean share of the burst."""
    total = sum(w for _, w in points)
    return sum(w * max(s) / max(1, sum(s)) for s, w in points) / total if total else 0.0
