"""The all-replicas row: the percentiles of every request a model's replicas served, from their histograms'
bucket counts summed over the window (Prometheus' `histogram_quantile(q, sum by (le) (...))`), never a mean
of their percentiles. Built from constructed scrapes and snapshots with known counts: nothing here is
measured on this machine."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from sparktop.observe.engines import by_id
from sparktop.observe.prometheus import QUANTILES, Scrape, histogram_quantiles, quantile
from sparktop.observe.record import decode, encode
from sparktop.observe.replicas import group_behind, group_latency, groups, merge, replica_of
from sparktop.observe.snapshot import EngineSnapshot
from sparktop.observe.state import ClusterState
from sparktop.status import engine_json, replica_groups_json, status_json
from sparktop.ui.cards import EngineCard, replicas_text
from sparktop.ui.rows import engine_line

INF = math.inf
BOUNDS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, INF)
LAYOUT = "2x tp=2,least-busy"


def cumulative(counts: dict[float, int], bounds: tuple[float, ...] = BOUNDS) -> dict[float, float]:
    """Cumulative buckets from how many observations fell in each bucket (keyed by its upper bound)."""
    out, running = {}, 0.0
    for le in bounds:
        running += counts.get(le, 0)
        out[le] = running
    return out


# Built to show why a mean of p95s is no p95: a fast replica served 90 requests, each in (0.1, 0.2] s; a slow
# one served 10, each in (2, 5] s. The group's 95th request of 100 is the slow one's 5th.
FAST = (cumulative({0.2: 90}), 90 * 0.15)
SLOW = (cumulative({5.0: 10}), 10 * 3.0)


def replica(n: int, histograms: dict | None, model: str = "gpt-oss-120b", topology: str = LAYOUT,
            kind: str = "vllm") -> EngineSnapshot:
    url = f"http://127.0.0.{n}:8000"
    return EngineSnapshot(key=url, url=url, t=100.0, state="ready", kind=kind, model=model, topology=topology,
                          latency_histograms=histograms, finished_rate=1.0)


def router(model: str = "gpt-oss-120b") -> EngineSnapshot:
    return EngineSnapshot(key="http://127.0.0.2:4000", url="http://127.0.0.2:4000", t=100.0, state="ready",
                          kind="router", model=model, topology=LAYOUT)


def test_the_groups_p95_is_the_quantile_of_the_summed_buckets_not_the_mean_of_the_replicas_p95s():
    fast, slow = replica(2, {"ttft": FAST}), replica(4, {"ttft": SLOW})
    merged = group_latency([fast, slow]).latency["ttft"]
    summed = {le: FAST[0][le] + SLOW[0][le] for le in BOUNDS}
    # histogram_quantile(0.95, sum by (le) (...)): rank 95 of 100 lies in (2, 5], 5 of its 10 in.
    assert merged.figures["p95"] == pytest.approx(quantile(0.95, summed)) == pytest.approx(2 + 3 * 5 / 10)
    assert merged.figures["p50"] == pytest.approx(0.1 + 0.1 * 50 / 90)  # the 50th is a fast one
    assert (merged.count, merged.replicas) == (100, 2)
    each = [quantile(0.95, FAST[0]), quantile(0.95, SLOW[0])]
    assert each == [pytest.approx(0.1 + 0.1 * 85.5 / 90), pytest.approx(2 + 3 * 9.5 / 10)]
    assert abs(statistics.mean(each) - merged.figures["p95"]) > 0.9  # 2.52 s, where the truth is 3.5 s


def test_merging_sums_counts_and_sums_bound_by_bound():
    buckets, total = merge([FAST, SLOW])
    assert buckets == {le: FAST[0][le] + SLOW[0][le] for le in BOUNDS} and total == pytest.approx(13.5 + 30.0)
    assert merge([FAST, (SLOW[0], None)])[1] is None  # one without its sum: no mean of the whole
    assert merge([]) is None


def test_one_replica_alone_gives_its_own_percentiles():
    """The group's figure and an engine's own come from the one quantile: a histogram merged with nothing
    is itself."""
    alone = group_latency([replica(2, {"ttft": FAST}), replica(4, None)])
    assert alone.latency["ttft"].figures == histogram_quantiles(FAST, QUANTILES)
    assert alone.latency["ttft"].replicas == 1
    assert alone.notes == ["http://127.0.0.4:8000: no TTFT histogram over its window yet"]
    assert group_latency([replica(2, None), replica(4, None)]).latency == {}  # nothing to say, nothing missing


def test_replicas_whose_bounds_differ_are_summed_on_the_bounds_they_share():
    """Engines of two versions: a count at a bound one of them lacks is not known, so the sum is taken on the
    bounds both have (exact there), the total from each one's own."""
    finer = (0.1, 0.25, 0.5, 1.0, INF)
    coarser = (0.1, 0.5, 2.0, INF)
    a = (cumulative({0.25: 40, 0.5: 40, 1.0: 20}, finer), None)
    b = (cumulative({0.5: 30, 2.0: 10}, coarser), None)
    buckets, _ = merge([a, b])
    assert buckets == {0.1: 0, 0.5: 80 + 30, INF: 100 + 40}
    both = group_latency([replica(2, {"ttft": a}), replica(4, {"ttft": b})])
    assert both.latency["ttft"].figures["p50"] == pytest.approx(quantile(0.5, buckets))
    assert both.notes == ["TTFT: the replicas' buckets differ, summed on the 2 bounds they share"]
    # No finite bound in common: no histogram of the whole, said rather than made up.
    apart = group_latency([replica(2, {"ttft": (cumulative({0.2: 5}, (0.2, INF)), None)}),
                           replica(4, {"ttft": (cumulative({0.3: 5}, (0.3, INF)), None)})])
    assert apart.latency == {} and apart.notes == ["TTFT: the replicas' histograms share no bucket bound"]


def test_the_router_is_not_a_replica_and_finds_the_group_it_routes_to():
    fast, slow, front = replica(2, {"ttft": FAST}), replica(4, {"ttft": SLOW}), router()
    assert list(groups([fast, slow, front]).values()) == [[fast, slow]]
    assert group_behind([fast, slow, front], front) == [fast, slow]
    assert replica_of([fast, slow, front], front.key) is None
    # Serving the model under another name: its layout alone, while one group has it.
    assert group_behind([fast, slow], router("gpt-oss")) == [fast, slow]
    other = [replica(6, None, model="llama"), replica(8, None, model="llama")]
    assert group_behind([fast, slow, *other], router("gpt-oss")) is None  # two groups: which, nobody knows
    assert group_behind([fast, replica(4, None, topology="solo")], front) is None


def vllm_scrape(t: float, ttft: dict[float, float], ttft_sum: float, itl: dict[float, float],
                itl_sum: float) -> str:
    lines = [f'vllm:generation_tokens_total{{model_name="m"}} {t * 10}']
    for name, buckets, total in (("vllm:time_to_first_token_seconds", ttft, ttft_sum),
                                 ("vllm:inter_token_latency_seconds", itl, itl_sum)):
        lines += [f'{name}_bucket{{le="{"+Inf" if le == INF else le}",model_name="m"}} {n}'
                  for le, n in buckets.items()]
        lines += [f'{name}_sum{{model_name="m"}} {total}', f'{name}_count{{model_name="m"}} {buckets[INF]}']
    return "\n".join(lines) + "\n"


def watched(n: int, before: tuple, after: tuple) -> EngineSnapshot:
    """A vLLM replica read twice as the poller reads it: its window's histograms carried into its snapshot."""
    engine = by_id("vllm")("test")
    engine.metrics.add(Scrape.parse(vllm_scrape(0.0, *before), 0.0, engine.names))
    d = engine.metrics.add(Scrape.parse(vllm_scrape(30.0, *after), 30.0, engine.names))
    snap = replica(n, None)
    engine.fill(snap, d)
    snap.model, snap.state = "gpt-oss-120b", "ready"
    return snap


ITL_BOUNDS = (0.01, 0.025, 0.05, 0.1, INF)


def twins() -> tuple[EngineSnapshot, EngineSnapshot]:
    """Two replicas that served requests before the window (counted in neither) and then FAST's and SLOW's."""
    earlier = cumulative({0.1: 500}), 20.0, cumulative({0.01: 1000}, ITL_BOUNDS), 5.0
    fast = watched(2, earlier, ({le: earlier[0][le] + n for le, n in FAST[0].items()}, 20.0 + FAST[1],
                                cumulative({0.01: 1000, 0.025: 900}, ITL_BOUNDS), 5.0 + 900 * 0.02))
    slow = watched(4, earlier, ({le: earlier[0][le] + n for le, n in SLOW[0].items()}, 20.0 + SLOW[1],
                                cumulative({0.01: 1000, 0.05: 100}, ITL_BOUNDS), 5.0 + 100 * 0.04))
    return fast, slow


def test_each_engines_window_histograms_reach_its_snapshot_and_survive_a_recording():
    fast, slow = twins()
    assert fast.latency_histograms["ttft"] == (FAST[0], pytest.approx(FAST[1]))  # the window's, not the life's
    assert fast.ttft_p95 == pytest.approx(quantile(0.95, FAST[0]))  # the engine's own, from the same buckets
    line = json.loads(json.dumps(encode(fast)))  # as a recording writes and reads it: "Infinity", lists
    assert decode(line) == fast
    assert group_latency([decode(line), slow]) == group_latency([fast, slow])


def test_status_json_and_the_routers_row_and_card_show_the_groups_figure_from_one_function():
    fast, slow = twins()
    front = router()
    state = ClusterState()
    for e in (fast, slow, front):
        state.apply(e)
    (group,) = replica_groups_json(state)
    merged = group_latency([fast, slow])
    assert group["router"] == front.url and group["replicas"] == [fast.url, slow.url]
    assert group["latency_ms"]["ttft"] == {"p50": pytest.approx(155.6, abs=0.05), "p95": 3500.0, "p99": 4700.0}
    assert group["merged"]["ttft"] == {"observations": 100, "replicas": 2} and group["notes"] == []
    assert group["latency_ms"]["itl"]["p95"] == round(merged.p95("itl") * 1000, 1)
    assert status_json(state)["replica_groups"] == [group]
    assert engine_json(front, state)["replica"] is None  # the router is no replica of its group
    # The router's row and card say the same figure, from the same function.
    itl = f"{merged.p95('itl') * 1000:.0f}ms"
    said = replicas_text(front, [fast, slow, front], 80)
    assert said == f"TTFT p95 3.5s · ITL p95 {itl} (all)"
    row = engine_line(front, 160, ["spark-a"], engines=[fast, slow, front]).plain
    assert f"routes to 2 engines · {said}" in row
    assert "TTFT p95 3.5s (all)" in engine_line(front, 100, ["spark-a"], engines=[fast, slow, front]).plain
    card = EngineCard(front.key)
    card.engines = lambda: [fast, slow, front]  # the app's engines, without an app
    lines = [line.plain for line in card._lines(front, None, 48)]
    assert said in lines and lines[lines.index(said) - 1] == "routes to 2 engines"
    # A replica without histograms yet: the others' figure, said to be theirs.
    slow.latency_histograms = None
    assert replicas_text(front, [fast, slow, front], 80).endswith("(1 of 2)")
