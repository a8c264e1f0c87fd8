"""Routers as they behave (sparktop.model.routers): each row's split of a lockstep burst over the replicas, the
mechanism behind it, and what `predict` says it modelled."""

from __future__ import annotations

import json
import math

import pytest

from sparktop.model import routers
from sparktop.model.routers import (
    LEAST_BUSY_RACE,
    mean_max_share,
    one_backend_share,
    race_splits,
    router_for,
)


def test_shuffle_is_the_binomial_split_over_two_replicas_and_seeded_draws_over_more():
    points = router_for("shuffle").splits(4, 2)
    assert points == [((a, 4 - a), math.comb(4, a) / 16) for a in range(5)]
    assert one_backend_share(points) == pytest.approx(2 / 16)
    assert mean_max_share(points) == pytest.approx((2 * 1 + 8 * 0.75 + 6 * 0.5) / 16)
    # Past c8: five quantiles of the binomial, equal weights, centred on the even split.
    big = router_for("shuffle").splits(64, 2)
    assert len(big) == 5 and big[2][0] == (32, 32)
    four = router_for("shuffle").splits(8, 4)
    assert len(four) == routers.SHUFFLE_DRAWS and all(sum(s) == 8 and len(s) == 4 for s, _ in four)
    assert four == router_for("shuffle").splits(8, 4)  # the same every time


def test_least_busy_without_a_race_splits_every_burst_exactly():
    """Each request sees every count before it: least-busy alternates."""
    assert race_splits(16, 2, 0.0) == [((8, 8), 1.0)]
    assert race_splits(5, 2, 0.0) == [((3, 2), 1.0)]
    assert race_splits(6, 3, 0.0) == [((2, 2, 2), 1.0)]


def test_a_request_that_reads_before_its_predecessor_counted_follows_it():
    """Always racing: every request reads the counts as the first one did, and the burst piles up."""
    assert race_splits(4, 2, 1.0) == [((4, 0), 1.0)]
    # A burst of c all goes one way only as one wave: q**(c-1).
    for c in (2, 4, 8):
        assert one_backend_share(race_splits(c, 2, 0.7)) == pytest.approx(0.7 ** (c - 1), abs=1e-6)
    # 3 and 1: waves of 1 then 3 (the three see the first counted), of 3 then 1, or 1, 1 (a tie: the first) and 2.
    assert dict(race_splits(4, 2, 0.5))[(3, 1)] == pytest.approx(0.5 * 0.5 * 0.5 + 0.5 * 0.5 * 0.5 + 0.5 ** 3)


def test_least_busy_as_launched_piles_a_burst_of_two_with_the_race_probability():
    points = router_for("least-busy").splits(2, 2)
    assert one_backend_share(points) == pytest.approx(LEAST_BUSY_RACE)
    assert {s for s, _ in points} == {(2, 0), (1, 1)}
    # Small bursts pile up more often than random shuffle's; from 16 on they split closer to even than it.
    for c in (2, 4):
        shuffle = one_backend_share(router_for("shuffle").splits(c, 2))
        assert one_backend_share(router_for("least-busy").splits(c, 2)) > shuffle


@pytest.mark.parametrize("c", [16, 32, 64])
def test_least_busy_as_launched_splits_large_bursts_close_to_even(c):
    points = router_for("least-busy").splits(c, 2)
    assert one_backend_share(points) < 0.05
    assert mean_max_share(points) < 0.65
    assert mean_max_share(points) < mean_max_share(router_for("shuffle").splits(c, 2)) + 0.04
    assert race_splits(c, 2, 0.5)[0][0] == (c // 2, c // 2)  # at a smaller race the even split is the likeliest


def test_the_articles_least_busy_sends_a_lockstep_batch_to_the_first_node():
    row = router_for("least-busy", routers.ARTICLES)
    assert row.splits(16, 2) == [((16, 0), 1.0)] and row.busiest(16, 2) == 16
    assert router_for("shuffle", routers.ARTICLES).splits(4, 2) == router_for("shuffle").splits(4, 2)


def test_the_articles_ran_their_own_least_busy_and_sparktop_launches_the_pinned_litellm():
    from sparktop.settings import Defaults

    assert Defaults().router_image.endswith(f":v{routers.LITELLM_VERSION}")
    for source in ("000_29510f1a55d2a20e.txt", "001_7e7e5ebce39c566c.txt", "002_8b80f839e1bd93c9.txt"):
        assert routers.for_source(source) == routers.ARTICLES
    assert routers.for_source("a study of yours") is None
    assert router_for("least-busy").id == f"litellm-{routers.LITELLM_VERSION}/least-busy"


def test_the_launcher_writes_the_strategy_of_the_row_it_modelled():
    from sparktop.launch.topology import ROUTER_KEY_ENV, litellm_config

    config = litellm_config("m", "shuffle", [("hosted_vllm/m", "http://a:8000"), ("hosted_vllm/m", "http://b:8000")])
    assert config["router_settings"] == {"routing_strategy": "simple-shuffle"}
    assert [d["litellm_params"]["api_base"] for d in config["model_list"]] == ["http://a:8000/v1", "http://b:8000/v1"]
    assert config["general_settings"]["master_key"] == f"os.environ/{ROUTER_KEY_ENV}"
    assert litellm_config("m", "least-busy", [])["router_settings"]["routing_strategy"] == "least-busy"


@pytest.mark.slow
def test_least_busy_as_launched_predicts_two_nodes_and_the_articles_one():
    from sparktop.model import fit
    from sparktop.model.cards import find_card
    from sparktop.model.simulate import predict

    card, k = find_card("nemotron-3-super-120b-a12b"), fit.load_constants()
    serving = fit.SERVING[card.name]
    solo = predict(card, "solo", 16, k=k, serving=serving).stats.tg_tps_total
    theirs = predict(card, "least-busy", 16, k=k, serving=serving, router=routers.ARTICLES).stats.tg_tps_total
    ours = predict(card, "least-busy", 16, k=k, serving=serving).stats.tg_tps_total
    shuffle = predict(card, "shuffle", 16, k=k, serving=serving).stats.tg_tps_total
    assert theirs == pytest.approx(solo, rel=0.02)  # "Least-busy tracks Solo almost exactly"
    assert ours > 1.3 * solo and ours >= 0.95 * shuffle


def test_predict_says_which_router_it_modelled(capsys):
    from sparktop.cli import main

    assert main(["predict", "--model", "llama-3.1-8b", "--topology", "least-busy,4x solo,shuffle", "-c", "1,4"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"router: LiteLLM {routers.LITELLM_VERSION} least-busy (as measured: bursts of 2-4 mostly race " \
           "to one backend" in out
    assert f"router: LiteLLM {routers.LITELLM_VERSION} simple-shuffle (each request to a replica at random) for " \
           "4x solo,shuffle" in out
    assert main(["predict", "--model", "llama-3.1-8b", "--topology", "solo", "-c", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["router"] == {}


@pytest.mark.slow
def test_the_articles_least_busy_cells_are_predicted_with_their_own_router():
    """The published least-busy cells keep the articles' router (their fit is unchanged); the same cell with
    the LiteLLM sparktop launches splits the batch over both nodes."""
    from sparktop.model import fit
    from sparktop.model.simulate import predict

    k = fit.load_constants()
    cells = [c for c in fit.published_cells(more=False) if c.topology == "least-busy" and c.metric == "decode_tps"
             and c.concurrency in (16, 64)]
    assert cells and all(routers.for_source(c.source) == routers.ARTICLES for c in cells)
    for cell in cells:
        value, _ = fit.predicted(cell, k)
        card, kk = fit._card(cell), k.for_stack(cell.stack)
        theirs = predict(card, "least-busy", cell.concurrency, k=kk, serving=cell.serving, router=routers.ARTICLES)
        ours = predict(card, "least-busy", cell.concurrency, k=kk, serving=cell.serving)
        assert value == theirs.stats.tg_tps_total
        assert ours.stats.tg_tps_total > 1.3 * value


def test_least_busy_as_launched_matches_the_labs_measured_split():
    """Three lab runs of LiteLLM 1.106.2's least-busy (tests/benchmarks/router_split.py; 440 lockstep bursts
    over two twins, kept-alive and fresh connections): the shipped race probability is within 0.05 of the
    maximum-likelihood fit of every burst that piled up or not, and the busiest backend's mean share of a burst
    (what a batch's slowest replica carries) is within 0.05 of the measured one at c2, c8 and c16. At c4 the
    model piles up half the bursts where the lab piled up four in five (its share 0.83 against 0.94): one q
    cannot give both c4 and c8 (README, Predictions)."""
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "routers" /
                      "litellm-1.106.2-least-busy.json").read_text())
    bursts: dict[int, list[tuple[int, int]]] = {}
    for run in doc["runs"]:
        for c, splits in run["bursts"].items():
            bursts.setdefault(int(c), []).extend(tuple(s) for s in splits)
    assert sum(len(v) for v in bursts.values()) == 380

    def loglik(q: float) -> float:
        return sum(math.log(q ** (c - 1) if max(s) == c else 1 - q ** (c - 1))
                   for c, splits in bursts.items() for s in splits)

    fitted = max((i / 100 for i in range(1, 100)), key=loglik)
    assert abs(fitted - LEAST_BUSY_RACE) <= 0.05, fitted
    for c in (2, 8, 16):
        measured = sum(max(s) / c for s in bursts[c]) / len(bursts[c])
        assert abs(mean_max_share(router_for("least-busy").splits(c, 2)) - measured) <= 0.05, (c, measured)


# -- HAProxy leastconn, the default in front of replicas ----------------------------------------------------------


@pytest.mark.parametrize(("c", "replicas", "split"), [(2, 2, (1, 1)), (4, 2, (2, 2)), (8, 2, (4, 4)),
                                                      (16, 2, (8, 8)), (5, 2, (3, 2)), (7, 3, (3, 2, 2)),
                                                      (1, 4, (1, 0, 0, 0)), (0, 2, (0, 0))])
def test_haproxy_leastconn_splits_every_burst_as_evenly_as_it_goes(c, replicas, split):
    """HAProxy counts a request in flight as it assigns it, so a burst's requests see each other: one split,
    the even one, every time (the lab measures c/2 each over two twins at c2-c16: test_lab_router.py)."""
    row = router_for("leastconn")
    assert row.splits(c, replicas) == [(split, 1.0)]
    assert row.busiest(c, replicas) == max(split)
    assert one_backend_share(row.splits(c, replicas)) == (1.0 if c <= 1 else 0.0)


def test_the_default_router_is_haproxy_and_the_litellm_words_keep_litellm():
    from sparktop import engine_ids
    from sparktop.layouts import parse_layout
    from sparktop.settings import Defaults

    assert parse_layout("2x solo").router == parse_layout("2x tp=2").router == "leastconn"
    row = router_for("leastconn")
    assert (row.id, row.product, row.strategy, row.engine) == (
        f"haproxy-{routers.HAPROXY_VERSION}/leastconn", f"HAProxy {routers.HAPROXY_VERSION}", "leastconn",
        engine_ids.HAPROXY)
    assert row.overhead_s == 0.0  # the fitted router_overhead_s is LiteLLM's Python proxy
    assert Defaults().haproxy_image == f"haproxy:{routers.HAPROXY_VERSION}"
    assert routers.HAPROXY_VERSION.startswith("3.2.")  # pinned to the 3.2 LTS branch
    for word in ("shuffle", "least-busy"):
        assert router_for(word).engine == engine_ids.ROUTER and router_for(word).product.startswith("LiteLLM")
    with pytest.raises(KeyError):
        router_for("leastconn", routers.ARTICLES)  # the articles never ran HAProxy


def test_predict_says_it_modelled_haproxy_for_replicas_without_a_router_word(capsys):
    from sparktop.cli import main

    assert main(["predict", "--model", "llama-3.1-8b", "--topology", "2x solo", "-c", "1,4"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"router: HAProxy {routers.HAPROXY_VERSION} leastconn (requests in flight counted exactly: a lockstep " \
           "burst of c splits c/r each) for 2x solo,leastconn" in out
    assert main(["predict", "--model", "llama-3.1-8b", "--topology", "2x solo", "-c", "4", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["router"]["2x solo,leastconn"]
    assert (said["product"], said["behaviour"]) == (f"HAProxy {routers.HAPROXY_VERSION}", "even")


def test_leastconn_predicts_the_even_split_no_lower_than_least_busy_as_launched():
    """Same engines, same batch: the even split makes the slowest replica no busier than least-busy's races."""
    from sparktop.model.cards import find_card
    from sparktop.model.simulate import predict

    card = find_card("llama-3.1-8b")
    for c in (2, 4):
        even = predict(card, "2x solo,leastconn", c).stats.tg_tps_total
        race = predict(card, "2x solo,least-busy", c).stats.tg_tps_total
        assert even >= race
