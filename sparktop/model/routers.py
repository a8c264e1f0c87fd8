"""Routers in front of replicas, as they behave.

A router is part of the stack, with its version: a row names it, says how it
splits a lockstep burst of c requests over r replicas (a distribution over
splits, each a tuple of requests per replica with its weight), and what it
adds per request (None: the fitted `router_overhead_s`). The simulation
(`model.simulate.predict`) takes the expectation of every statistic over
that distribution.

Behaviours, from how each router works:

- `even` (HAProxy `balance leastconn`, the router sparktop puts in front of
  replicas unless a layout names a LiteLLM strategy): each request goes to
  the server with the fewest requests in flight, counted by HAProxy itself
  as it assigns the request, so requests that arrive together still see
  each other: a lockstep burst of c over r replicas splits as evenly as it
  goes, c // r each and one more on c % r of them, every time (measured
  with HAProxy 2.6 over two twin engines, c2 to c16: c/2 each, exactly;
  tests/e2e/test_lab_router.py asserts it).
- `random` (LiteLLM simple-shuffle): every request to a replica drawn
  uniformly and independently: the binomial split over two replicas (every
  split for small c, five quantiles for large), seeded multinomial draws
  over more.
- `race` (LiteLLM least-busy as sparktop launches it, measured with
  LiteLLM 1.106.2 over two twin engines, tests/benchmarks/router_split.py):
  least-busy reads the in-flight count of each deployment when it picks
  one (`async_get_available_deployments`) and increments the chosen one's
  in `log_pre_api_call`, just before the request is sent (after awaits
  that let other requests in); ties go to the first deployment. Requests
  that arrive together are handled in the order they reach it: with
  probability q (the race) a request reads before its predecessor has
  counted, sees what its predecessor saw and goes where it went (a wave);
  otherwise it sees every earlier request counted and goes to the least
  busy. A burst of 2 piles on one replica with probability q, a burst of c
  with q**(c-1); large bursts split close to even; a continuous load
  (requests one at a time as others finish) splits evenly.
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
# ... and the HAProxy (settings.Defaults.haproxy_image).
HAPROXY_VERSION = engine_ids.get(engine_ids.HAPROXY).default_image.rsplit(":", 1)[-1]

# least-busy's race probability: how often a request reads the in-flight counts before the request just before it
# has counted itself (a burst of c then all goes to one replica with probability q**(c-1)). Fitted (maximum
# likelihood) by tests/benchmarks/router_split.py to LiteLLM 1.106.2 over two twin engines, bursts on kept-alive
# connections as llama-benchy sends them (`--warm`), 2026-11-29: q = 0.82 (all on one backend in 17 of 20 bursts of
# 2, 16/20 of 4, 1/20 of 8; the busiest backend's mean share 0.93, 0.95, 0.74, where q = 0.8 gives 0.90, 0.83,
# 0.73); on fresh connections 0.88 (40 bursts each of 2, 4, 8, 16: mean share 0.93, 0.94, 0.78, 0.64; q = 0.8 gives
# 0.635 at 16). It is a property of the router's host and the client as much as of LiteLLM: it grows with the
# host's CPU load (this lab: 2 cores at a load of 4-8 per core), and issue 39's run, where bursts of 2-4 piled up
# about as often as random shuffle, implies q = 0.5. One q overstates the pile-up of bursts of 8 (0.21 vs 0.05).
# A third run (40 kept-alive bursts each of 2, 4, 8, 16) fitted 0.79; the three runs' bursts are
# tests/fixtures/routers/litellm-1.106.2-least-busy.json (380 bursts: the maximum-likelihood q over all of them is
# within 0.05 of this one, and the busiest backend's mean share within 0.05 of the lab's at c2, c8 and c16). Where
# one q misses: bursts of 4 pile up in 0.81 of the lab's bursts and 0.51 of the model's (share 0.94 vs 0.83). A lag
# model (each read misses the requests of the last m whose count has not landed, m growing with the burst) fitted
# no better (log-likelihood -442.5 with four parameters against -446.5 with one).
LEAST_BUSY_RACE = 0.8
PRUNE = 1e-7  # least-busy's paths less likely than this are dropped
MASS_LEFT = 0.005  # and the least likely splits holding this much probability, the rest renormalised
SHUFFLE_DRAWS = 12  # random splits averaged for a shuffle over more than two replicas

Split = tuple[int, ...]


@dataclass(frozen=True)
class Router:
    id: str
    layout: str  # the layout's router word (`2x solo,least-busy`): leastconn | shuffle | least-busy
    product: str  # "LiteLLM 1.106.2", "HAProxy 3.2.24"
    strategy: str  # LiteLLM's routing_strategy, HAProxy's `balance`
    behaviour: str  # even | random | race | first
    note: str  # how it splits, for text
    race: float = 0.0  # `race`: the probability a request reads before its predecessor counted
    overhead_s: float | None = None  # per request; None: the fitted router_overhead_s (LiteLLM's)
    engine: str = engine_ids.ROUTER  # what runs it (engine_ids: ROUTER is LiteLLM, HAPROXY)

    def splits(self, c: int, replicas: int) -> list[tuple[Split, float]]:
        """How a lockstep burst of c requests is split over the replicas, with weights."""
        if self.behaviour == "even":
            return [(even_split(c, replicas), 1.0)]
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
HAPROXY = f"haproxy-{HAPROXY_VERSION}"
ROWS: tuple[Router, ...] = (
    # HAProxy forwards in C without reading the body: its per-request cost is well under a millisecond, next to
    # the ~30 ms fitted for LiteLLM's Python proxy (router_overhead_s), so none is added.
    Router(f"{HAPROXY}/leastconn", "leastconn", f"HAProxy {HAPROXY_VERSION}", "leastconn", "even",
           "requests in flight counted exactly: a lockstep burst of c splits c/r each", overhead_s=0.0,
           engine=engine_ids.HAPROXY),
    Router(f"litellm-{LITELLM_VERSION}/shuffle", "shuffle", LITELLM, "simple-shuffle", "random",
           "each request to a replica at random"),
    Router(f"litellm-{LITELLM_VERSION}/least-busy", "least-busy", LITELLM, "least-busy", "race",
           "as measured: bursts of 2-4 mostly race to one backend, bursts of 16 and more and a "
           "continuous load split close to even",
           race=LEAST_BUSY_RACE),
    Router(f"litellm-{LITELLM_VERSION}/latency", "latency", LITELLM, "latency-based-routing", "first",
           "every lockstep batch to one backend"),
    Router(f"{ARTICLES}/shuffle", "shuffle", "LiteLLM (the articles' setup)", "simple-shuffle", "random",
           "each request to a replica at random"),
    Router(f"{ARTICLES}/least-busy", "least-busy", "LiteLLM (the articles' setup)", "least-busy", "first",
           "a lockstep batch to the first node, as the articles measured"),
    # LiteLLM in front of HAProxy (`2x solo,litellm`): LiteLLM's one deployment is HAProxy, which splits as
    # leastconn does; each request pays LiteLLM's cost (the fitted router_overhead_s).
    Router(f"litellm-{LITELLM_VERSION}+{HAPROXY}/litellm", "litellm",
           f"LiteLLM {LITELLM_VERSION} + HAProxy {HAPROXY_VERSION}", "leastconn",
           "even", "LiteLLM in front, HAProxy's exact split behind it: c/r each"),
)
LITELLM_LAUNCHED = f"litellm-{LITELLM_VERSION}"  # the LiteLLM sparktop launches for `shuffle`, `least-busy`
# The router version sparktop launches for each layout word (`leastconn`, the default, is HAProxy's).
LAUNCHED = {"leastconn": HAPROXY, "shuffle": LITELLM_LAUNCHED, "least-busy": LITELLM_LAUNCHED,
            "latency": LITELLM_LAUNCHED, "litellm": f"{LITELLM_LAUNCHED}+{HAPROXY}"}


def router_for(layout_router: str, version: str | None = None) -> Router:
    """The row of `layout_router` (leastconn | shuffle | least-busy) in `version` (what sparktop launches for
    that word when None: `LAUNCHED`), or a row's own id."""
    family = version or LAUNCHED.get(layout_router, LITELLM_LAUNCHED)
    for row in ROWS:
        if row.id == version or row.id == f"{family}/{layout_router}":
            return row
    raise KeyError(f"no router {layout_router!r} in version {family!r}")


def litellm_strategy(layout_router: str | None) -> str:
    """The routing_strategy sparktop writes into the LiteLLM config for a layout's router."""
    return router_for(layout_router or "least-busy").strategy


# The router version each published source ran its replicas behind, where it had any. The three articles
# (published-benchmarks.yaml) share one setup: LiteLLM, version not stated, whose least-busy sent every lockstep
# batch to the first node (seed 001: "Least-busy tracks Solo almost exactly — confirming it's effectively a
# single-node topology due to backend starvation"); 000 and 002 ran simple-shuffle only. Kept here, not in
# stacks.yaml, whose digest dates the saved fit's errors (fit.figures_digest).
SOURCE_ROUTERS = {
    "000_29510f1a55d2a20e.txt": ARTICLES,
    "001_7e7e5ebce39c566c.txt": ARTICLES,
    "002_8b80f839e1bd93c9.txt": ARTICLES,
}


def for_source(source: str) -> str | None:
    """The router version a published source ran, None: not stated (the LiteLLM sparktop launches: a study)."""
    return SOURCE_ROUTERS.get(source)


# -- the split distributions --------------------------------------------------------------------


def even_split(c: int, replicas: int) -> Split:
    """c requests over `replicas` as evenly as they go, the larger shares first: 5 over 2 is (3, 2)."""
    return tuple(c // replicas + (1 if i < c % replicas else 0) for i in range(replicas))


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


def race_splits(c: int, replicas: int, race: float) -> list[tuple[Split, float]]:
    """least-busy's split distribution for a burst of c, exactly: requests reach the router in order; each one
    reads the in-flight counts, and with probability `race` it reads before its predecessor has counted, seeing
    what its predecessor saw and so going where it went (a wave); otherwise it sees every request before it
    counted and goes to the least busy replica. The splits busiest replica first, most likely first (over more
    than two replicas, one split per count on the busiest)."""
    return list(_race_splits(c, replicas, race))


@cache
def _race_splits(c: int, replicas: int, race: float) -> tuple[tuple[Split, float], ...]:
    if c <= 0:
        return (((0,) * replicas, 1.0),)
    # The replicas are alike, so a state is the counts busiest first (which of two equal replicas took a request
    # changes no split) and the count of the replica the current wave goes to -> its probability.
    first = (1,) + (0,) * (replicas - 1)
    states: dict[tuple[Split, int], float] = {(first, 1): 1.0}
    for _ in range(c - 1):
        nxt: dict[tuple[Split, int], float] = {}
        for (counts, target), p in states.items():
            for before, w in ((target, race), (counts[-1], 1.0 - race)):  # the wave's replica, or the least busy
                if w <= 0.0:
                    continue
                i = counts.index(before)
                key = (tuple(sorted(counts[:i] + (before + 1,) + counts[i + 1:], reverse=True)), before + 1)
                nxt[key] = nxt.get(key, 0.0) + p * w
        states = {k: v for k, v in nxt.items() if v > PRUNE}
    splits: dict[Split, float] = {}
    for (counts, _), p in states.items():
        splits[counts] = splits.get(counts, 0.0) + p
    # One split per count on the busiest replica (its likeliest), with the weight of all that share it: exact
    # over two replicas, and over more what the batch's slowest engine depends on most.
    by_max: dict[int, tuple[Split, float, float]] = {}
    for split, p in splits.items():
        best, top, total = by_max.get(split[0], (split, 0.0, 0.0))
        by_max[split[0]] = (split, p, total + p) if p > top else (best, top, total + p)
    ranked = sorted(((split, total) for split, _, total in by_max.values()), key=lambda x: -x[1])
    kept, mass = [], 0.0
    for split, p in ranked:  # the likeliest splits holding all but MASS_LEFT of the probability
        kept.append((split, p))
        mass += p
        if mass >= 1.0 - MASS_LEFT:
            break
    return tuple((split, p / mass) for split, p in kept)


def one_backend_share(points: list[tuple[Split, float]]) -> float:
    """How often every request goes to one replica."""
    total = sum(w for _, w in points)
    return sum(w for s, w in points if max(s) == sum(s)) / total if total else 0.0


def mean_max_share(points: list[tuple[Split, float]]) -> float:
    """The busiest replica's mean share of the burst."""
    total = sum(w for _, w in points)
    return sum(w * max(s) / max(1, sum(s)) for s, w in points) / total if total else 0.0
