"""What a card says for a given snapshot: the warnings a Spark owner relies on."""

from __future__ import annotations

import time

from sparktop.observe.snapshot import Container, EngineSnapshot, Gpu, GpuProcess, Memory, NodeSnapshot
from sparktop.ui import render
from sparktop.ui.cards import EngineCard, NodeCard, memory_level

GIB = 1024**3


def node(available_gib: float) -> NodeSnapshot:
    total = int(119.6 * GIB)
    return NodeSnapshot(name="spark-a", t=time.time(), state="ok",
                        memory=Memory(total=total, available=int(available_gib * GIB), cached=20 * GIB),
                        gpu=Gpu(name="NVIDIA GB10", util=97, temp=66, power=48, sm_clock=2405, pstate="P0"),
                        processes=[GpuProcess(1, "VLLM::EngineCore", 85_000)], gpu_status="ok",
                        containers=[Container("sparktop-vllm", "vllm/vllm-openai", "running", "Up 5 minutes")],
                        docker_status="ok", cpu_pct=12)


def test_low_memory_turns_the_card_yellow_then_red():
    assert memory_level(node(40)) == "ok"
    assert memory_level(node(20)) == "warn"  # < 20 % of 119.6 GiB
    assert memory_level(node(8)) == "danger"  # < 10 %: a GB10 is about to freeze


def test_node_card_lines_say_what_the_node_is_doing():
    card = NodeCard("spark-a")
    lines = card._lines(node(30), None, 60)
    text = "\n".join(line.plain for line in lines)
    assert "89.6/119.6G" in text and "avail 30.0G" in text and "engines 83.0G" in text
    assert "gpu  97%  66°C  48W  2405MHz P0" in text
    assert "cpu  12%  1 container" in text and "sparktop-vllm" in text and "Up 5m" in text


def test_engine_card_shows_starting_stage_and_unreachable_reason():
    card = EngineCard("http://a:8000")
    starting = EngineSnapshot(key="k", url="http://10.0.0.1:8000", t=1, state="starting", stage="loading weights")
    assert "starting: loading weights" in "\n".join(line.plain for line in card._lines(starting, None, 40))
    down = EngineSnapshot(key="k", url="http://10.0.0.1:8000", t=1, state="unreachable", reason="connection refused",
                          kv_usage=0.5)
    assert "connection refused" in "\n".join(line.plain for line in card._lines(down, None, 40))


def test_sparklines_have_a_baseline_and_a_fixed_scale_when_asked():
    assert render.spark([0, 0, 0], 3).plain == "▁▁▁"
    assert render.spark([50, 100], 2, top=100).plain == "▄█"
    assert render.spark([50, 100], 2).plain == "▄█"
    rows = render.spark_rows([0, 8, 16], 3, rows=2, top=16)
    assert [r.plain for r in rows] == ["  █", "▁██"]


def test_flow_wraps_between_fields_not_inside_them():
    from rich.text import Text

    lines = render.flow([Text("aaaa"), Text("bbbb"), Text("cccc")], 10)
    assert [line.plain for line in lines] == ["aaaa  bbbb", "cccc"]


def test_a_taller_sparkline_moves_less_often_so_the_rows_redrawn_stay_few():
    from sparktop.ui.cards import polls_per_column

    assert [polls_per_column(rows) for rows in (1, 2, 3)] == [1, 1, 1]  # an 80x24 screen: every poll
    assert [polls_per_column(rows) for rows in (4, 8, 9, 12)] == [2, 2, 3, 3]
    for rows in range(1, 13):  # the rows redrawn per poll when it moves, per chart
        assert rows / polls_per_column(rows) <= 4


def test_a_tall_sparkline_keeps_its_rows_between_moves_and_shows_each_columns_peak():
    """Between moves the card hands the paint the very same rows (nothing to
    compare or redraw); a column is the highest of its polls, so a one-poll
    spike stays in view."""
    from sparktop.observe.state import History
    from sparktop.ui.cards import EngineCard

    card = EngineCard("http://a:8000")
    card.spark_height = 12  # 3 polls a column
    history = History()
    for i, value in enumerate([10, 10, 10, 10, 90, 10, 10, 10, 10]):
        history.push(float(i), {"gen_tps": value, "prompt_tps": 1.0})
    left = ("gen ", "gen_tps", None, "cyan")
    right = ("prompt ", "prompt_tps", None, "blue")
    first = card._sparks(left, right, 40, history)
    assert len(first) == 12
    history.push(9.0, {"gen_tps": 10.0, "prompt_tps": 1.0})  # the 4th column starts filling: nothing moves
    assert card._sparks(left, right, 40, history) is first
    history.push(10.0, {"gen_tps": 10.0, "prompt_tps": 1.0})
    history.push(11.0, {"gen_tps": 10.0, "prompt_tps": 1.0})  # ... and is complete
    moved = card._sparks(left, right, 40, history)
    assert moved is not first
    top_row = moved[0].plain
    assert "90" in top_row  # the scale is the spike's
    columns = [line.plain[5:19] for line in moved]  # the gen chart's cells
    full = [i for i in range(14) if all(line[i] == "█" for line in columns[1:])]
    assert len(full) == 1  # the spike's column, once, at full height
