"""`nvidia-smi --query-*=... --format=csv` with its header row: the header is
never read as a GPU (tests/fixtures/SOURCES.md says where each file came
from)."""

from __future__ import annotations

from pathlib import Path

from sparktop.observe import hostparse
from sparktop.observe.host_probe import GPU_QUERY

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


def fix(name: str) -> str:
    return (FIX / name).read_text()


def test_a_gb10_answer_with_its_header():
    # colonel-otto: --query-gpu=name,clocks.current.graphics,clocks.max.graphics,temperature.gpu,power.draw
    fields = ["name", "clocks.gr", "clocks.max.graphics", "temperature.gpu", "power.draw"]
    rows = hostparse.parse_csv_query(fix("gb10_csv_name-clocks-temp-power_with-header_colonel-otto.csv"), fields)
    assert rows == [{"name": "NVIDIA GB10", "clocks.gr": "2522 MHz", "clocks.max.graphics": "3003 MHz",
                     "temperature.gpu": "50", "power.draw": "15.57 W"}]


def test_a_header_whose_first_cell_has_a_unit_is_not_a_gpu():
    text = fix("gb10_csv_sparktop-query-without-name_with-header_constructed.csv")
    gpu = hostparse.parse_gpu_query(text)  # utilization.gpu,temperature.gpu,power.draw,clocks.sm,pstate
    assert (gpu.util, gpu.temp, gpu.power, gpu.sm_clock, gpu.pstate) == (0.0, 46.0, 10.0, 2522.0, "P0")


def test_a_header_anywhere_is_skipped():
    # Two answers joined (a header before each), and sparktop's own query with `name` first.
    text = fix("gb10_csv_sparktop-query-without-name_with-header_constructed.csv")
    rows = hostparse.parse_csv_query(text + text, ["utilization.gpu", "temperature.gpu", "power.draw", "clocks.sm",
                                                   "pstate"])
    assert [r["pstate"] for r in rows] == ["P0", "P0"]
    fields = tuple(GPU_QUERY.split(","))
    header = "name, utilization.gpu [%], temperature.gpu, power.draw [W], clocks.current.sm [MHz], pstate"
    gpu = hostparse.parse_gpu_query(f"{header}\nNVIDIA GB10, 96 %, 62, [N/A], 2405 MHz, P0\n", fields)
    assert (gpu.name, gpu.util, gpu.temp, gpu.power, gpu.pstate) == ("NVIDIA GB10", 96.0, 62.0, None, "P0")


def test_values_that_look_like_names_are_still_data():
    # `pstate` alone answers P8; an all-N/A row is a GPU whose fields are unknown.
    assert hostparse.parse_csv_query("P8\n", ["pstate"]) == [{"pstate": "P8"}]
    assert hostparse.parse_csv_query("[N/A], [N/A]\n", ["memory.used", "memory.total"]) == [
        {"memory.used": None, "memory.total": None}]
    assert hostparse.parse_compute_apps("pid, process_name, used_gpu_memory [MiB]\n577729, VLLM::EngineCore, "
                                        "89093 MiB\n")[0].name == "VLLM::EngineCore"
