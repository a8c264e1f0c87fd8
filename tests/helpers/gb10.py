"""Canned answers of a GB10 node to sparktop's host probe, built from real
captures (tests/fixtures/captures), for an SSH server that plays a Spark."""

from __future__ import annotations

from pathlib import Path

CAP = Path(__file__).resolve().parents[1] / "fixtures" / "captures"

# `free -b` on a DGX Spark (jethac/dgx-spark-hijinks), expressed as the
# /proc/meminfo fields the probe reads.
_FREE = (CAP / "free-b_dgx-spark_jethac-telemetry.txt").read_text().split()
TOTAL_B = int(_FREE[_FREE.index("Mem:") + 1])
AVAILABLE_B = int(_FREE[_FREE.index("Mem:") + 6])
CACHE_B = int(_FREE[_FREE.index("Mem:") + 5])
FREE_B = int(_FREE[_FREE.index("Mem:") + 3])
SWAP_TOTAL_B = int(_FREE[_FREE.index("Swap:") + 1])
SWAP_FREE_B = int(_FREE[_FREE.index("Swap:") + 3])

MEMINFO = (
    f"MemTotal:       {TOTAL_B // 1024} kB\n"
    f"MemFree:        {FREE_B // 1024} kB\n"
    f"MemAvailable:   {AVAILABLE_B // 1024} kB\n"
    f"Buffers:              0 kB\n"
    f"Cached:         {CACHE_B // 1024} kB\n"
    f"SwapTotal:      {SWAP_TOTAL_B // 1024} kB\n"
    f"SwapFree:       {SWAP_FREE_B // 1024} kB\n"
)

# GB10 answers to the probe's two queries, in the shape the captures show
# (memory fields [N/A]; util/temp/power as numbers with nounits; the clock event reasons as NVML's hex
# bitmask, none holding the clocks down).
GPU_CSV = "NVIDIA GB10, 96, 46, 10.45, 2405, P0, 0x0000000000000000\n"
APPS_CSV = "577729, VLLM::EngineCore, 89093\n"
DOCKER_JSON = (CAP / "docker-ps_format-json_nginx_docker-cli-docs.jsonl").read_text()


def probe_answer(stat_jiffies: int = 0, gpu_csv: str = GPU_CSV, apps_csv: str = APPS_CSV,
                 docker: str | None = DOCKER_JSON, smi: bool = True) -> str:
    busy = 1000 + stat_jiffies
    parts = ["@@meminfo", MEMINFO.rstrip("\n"), "@@stat", f"cpu  {busy} 0 {busy} {8000 + 3 * stat_jiffies} 0 0 0 0 0 0"]
    if smi:
        parts += ["@@gpu", gpu_csv.rstrip("\n"), "@@rc 0", "@@apps", apps_csv.rstrip("\n"), "@@rc 0"]
    else:
        parts += ["@@gpu", "@@missing"]
    if docker is None:
        parts += ["@@docker", "@@missing"]
    else:
        parts += ["@@docker", docker.rstrip("\n"), "@@rc 0"]
    parts.append("@@end")
    return "\n".join(parts) + "\n"
