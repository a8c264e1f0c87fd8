"""The monitor with three to eight nodes: which view fits the screen, what
one line per node or engine says, and the cluster's summary line."""

from __future__ import annotations

import time

import pytest

from sparktop.observe.snapshot import Container, EngineSnapshot, Gpu, Memory, NodeSnapshot
from sparktop.observe.state import ClusterState
from sparktop.ui.cards import EngineCard
from sparktop.ui.render import nodes_named
from sparktop.ui.rows import engine_line, node_line, summary_line
from sparktop.ui.screens import card_columns, compact_view

GIB = 1024**3
NAMES = [f"spark-{c}" for c in "abcdefgh"]


def node(name: str, used_gib: float = 90, power: float = 50, t: float | None = None, launch: str = "L1",
         state: str = "ok") -> NodeSnapshot:
    total = int(119.6 * GIB)
    return NodeSnapshot(name=name, t=t or time.time(), state=state,
                        memory=Memory(total=total, available=total - int(used_gib * GIB), cached=0),
                        gpu=Gpu(util=90, temp=66, power=power), gpu_status="ok",
                        containers=[Container(f"{launch}-vllm", "vllm/vllm-openai", "running", "Up 1 minute",
                                              labels={"sparktop.launch": launch})],
                        docker_status="ok", cpu_pct=20)


def engine(url: str, node_name: str, topology: str = "solo", gen: float = 100.0, state: str = "ready",
           launch: str = "L1") -> EngineSnapshot:
    return EngineSnapshot(key=url, url=url, t=time.time(), state=state, node=node_name, topology=topology,
                          model="qwen3-235b", container=f"{launch}-vllm", gen_tps=gen, prompt_tps=1000.0,
                          running=4, waiting=1, kv_usage=0.42, ttft_p50=0.5)


@pytest.mark.parametrize(("size", "nodes", "engines", "expected"), [
    ((80, 24), 2, 2, (False, False)),  # two nodes: the cards, always
    ((160, 48), 4, 4, (False, False)),  # four cards of each fit in two columns
    ((160, 48), 8, 8, (True, True)),  # sixteen cards in two columns do not
    ((200, 50), 8, 2, (False, False)),  # three columns at 200
    ((240, 60), 8, 8, (False, False)),  # four at 240
    ((120, 40), 4, 4, (True, False)),  # a line per node leaves room for the engines' cards
    ((120, 40), 8, 8, (True, True)),
    ((80, 24), 8, 8, (True, True)),
    ((80, 24), 4, 1, (True, False)),  # one tp=4 engine: its card, under four lines
    ((80, 24), 8, 2, (True, False)),  # two engines never become lines
])
def test_the_view_that_fits(size, nodes, engines, expected):
    assert compact_view(*size, nodes, engines) == expected


@pytest.mark.parametrize(("width", "columns"), [(80, 1), (120, 2), (160, 2), (200, 3), (240, 4)])
def test_many_cards_take_two_columns_at_160_and_three_or_four_from_200(width, columns):
    assert card_columns(width, many=True) == columns
    assert card_columns(160, many=False) == 4  # two nodes' cards: always side by side from 80


def test_a_node_line_fits_80_columns_and_says_memory_gpu_and_cpu():
    line = node_line(node("spark-c"), 76)
    assert line.cell_len <= 76
    text = line.plain
    assert text.startswith("● spark-c") and "90.0/120G" in text and "90%" in text and "cpu  20%" in text


def test_a_lost_node_line_says_why():
    lost = node("spark-d", state="down")
    lost.reason = "ssh: connection refused"
    assert "connection refused" in node_line(lost, 76).plain


def test_an_engine_over_four_nodes_names_them_once():
    spread = ["spark-a", "spark-b", "spark-c", "spark-d"]
    snap = engine("http://10.0.0.1:8000", "spark-a", topology="tp=4")
    text = engine_line(snap, 76, spread).plain
    assert "qwen3-235b · tp=4" in text and "spark-a +3" in text and "KV  42%" in text
    # A card wide enough names every node; a narrow one the head and how many more.
    wide = EngineCard("k")._lines(snap, None, 80, nodes=spread)[0].plain
    assert "on spark-a, spark-b, spark-c, spark-d" in wide
    narrow = EngineCard("k")._lines(snap, None, 36, nodes=spread)[0].plain
    assert "on spark-a +3" in narrow and len(narrow) <= 36
    assert nodes_named(["spark-a"], 3) == "spark-a"


def test_the_summary_adds_up_memory_rates_and_engines_and_leaves_routers_out():
    state = ClusterState()
    now = time.time()
    for i, name in enumerate(NAMES[:4]):
        for dt in (4, 2, 0):  # a few polls: power is averaged over the window the rates cover
            state.apply(node(name, used_gib=100, power=40 + 10 * i, t=now - dt, launch="L1" if i < 2 else "L2"))
    state.apply(engine("http://10.0.0.1:8000", "spark-a", "tp=2", gen=120.0, launch="L1"))
    state.apply(engine("http://10.0.0.3:8000", "spark-c", "tp=2", gen=80.0, launch="L2"))
    state.apply(engine("http://10.0.0.1:4000", "spark-a", gen=200.0, state="ready", launch="router"))
    state.engines["http://10.0.0.1:4000"].kind = "router"
    s = state.summary()
    assert (s.nodes, s.nodes_ok, s.engines, s.engines_ready) == (4, 4, 2, 2)
    assert s.mem_used == pytest.approx(4 * 100 * GIB, rel=1e-6)
    assert s.gen_tps == 200.0 and s.prompt_tps == 2000.0  # the router's own figures are its engines'
    assert s.watts == pytest.approx(40 + 50 + 60 + 70)
    assert s.j_per_token == pytest.approx(220 / 200)
    text = summary_line(s, 200).plain
    assert "4 nodes ok" in text and "mem 400/478G (84%)" in text and "2/2 engines ready" in text
    assert "gen 200 t/s" in text and "220 W" in text and "1.10 J/tok" in text
    assert summary_line(s, 60).cell_len <= 60  # cut at a field, never mid-figure


def test_a_lost_node_and_a_down_engine_show_in_the_summary():
    state = ClusterState()
    for name in NAMES[:3]:
        state.apply(node(name))
    state.apply(node("spark-c", state="down"))
    state.apply(engine("http://10.0.0.1:8000", "spark-a"))
    state.apply(engine("http://10.0.0.2:8000", "spark-b", state="unreachable"))
    s = state.summary()
    assert (s.nodes_ok, s.engines_ready, s.engines) == (2, 1, 2)
    assert s.watts is None  # a node without power: no cluster-wide energy figure
    text = summary_line(s, 200).plain
    assert "2/3 nodes ok" in text and "1/2 engines ready" in text and "J/tok" not in text


def test_replicas_and_their_router_each_say_what_they_are_on_one_line():
    state = ClusterState()
    for name in ("spark-a", "spark-b", "spark-c", "spark-d"):
        state.nodes[name] = node(name, launch="L2")
        state.nodes[name].containers[0].labels["sparktop.role"] = "vllm-spark-a" if name < "spark-c" else \
            "vllm-spark-c"
    replica = engine("http://10.0.0.1:8000", "spark-a", topology="2x tp=2,least-busy", launch="L2")
    router = engine("http://10.0.0.1:4000", "spark-a", topology="2x tp=2,least-busy", launch="L2")
    router.kind, router.kv_usage, router.gen_tps = "router", None, None
    text = engine_line(replica, 76, ["spark-a", "spark-b"]).plain
    assert "qwen3-235b · 2x tp=2 " in text and "spark-a +1" in text  # the router's name is on its own row
    line = engine_line(router, 116, state.engine_nodes(router)).plain
    assert "qwen3-235b · router least-busy" in line and "routes to 2 engines" in line
    assert "KV" not in line and "gen" not in line  # no cache, and its tokens are its engines'
    assert state.engine_nodes(router) == ["spark-a"]  # the router runs on its node alone


def test_the_cluster_chart_sums_engines_polled_at_different_moments_and_leaves_routers_out():
    state = ClusterState()
    t0 = 1_000_000.0
    for i in range(10):  # two engines polled half a second apart, a router beside them
        a = engine("http://10.0.0.1:8000", "spark-a", gen=100.0)
        b = engine("http://10.0.0.3:8000", "spark-c", gen=50.0 if i < 5 else 80.0)
        router = engine("http://10.0.0.1:4000", "spark-a", gen=150.0)
        router.kind = "router"
        a.t, b.t, router.t = t0 + i, t0 + i + 0.5, t0 + i
        for snap in (a, b, router):
            state.apply(snap)
    t, gen = state.cluster_points("gen_tps", window_s=8.0)
    assert t[-1] == t0 + 9.5 and gen[-1] == 180.0  # 100 + 80: the router's 150 are theirs
    assert gen[0] == 150.0  # 100 + 50, eight seconds earlier
    assert all(b - a == 1.0 for a, b in zip(t, t[1:], strict=False))
