"""The hardware a model runs on: GB10 by precision, read from `data/hardware/`.

A node's figures come from its vendor's specification, each with its source
in the YAML file beside the number: memory, memory bandwidth, dense tensor
throughput per precision (FP4, FP8, BF16), and the link between nodes. The
rates large GEMMs reach on a Spark are measured figures, also with their
source. The performance model scales them by a few fitted efficiencies
(`constants.Constants`: grouped MoE GEMMs, attention); the hardware figures
themselves are never fitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from sparktop.errors import SparktopError
from sparktop.yamlfile import safe_load

DATA = Path(__file__).parent / "data" / "hardware"


@dataclass(frozen=True)
class Hardware:
    name: str = "GB10"
    memory_gib: float = 119.6  # what CUDA reports as total on a Spark (MemTotal)
    bandwidth_gbs: float = 273.0  # LPDDR5x, shared by CPU and GPU
    tensor_tflops: dict[str, float] = field(default_factory=lambda: {"fp4": 500.0, "fp8": 250.0, "bf16": 125.0})
    # What large dense GEMMs measure on the hardware: the rate kernels reach.
    achieved_tflops: dict[str, float] = field(default_factory=lambda: {"fp4": 356.0, "fp8": 188.0, "bf16": 91.5})
    link_gbps: float = 200.0  # one ConnectX-7 port
    load_gibps: float = 0.5  # weights from a warm local disk into memory

    def achieved(self, precision: str) -> float:
        """TFLOPS a large dense GEMM reaches at this precision (measured)."""
        try:
            return self.achieved_tflops[precision]
        except KeyError:
            raise SparktopError(f"{self.name}: no measured GEMM rate for {precision!r}") from None

    def peak_tflops(self, precision: str) -> float:
        try:
            return self.tensor_tflops[precision]
        except KeyError:
            raise SparktopError(f"{self.name}: no tensor throughput for {precision!r}") from None


@cache
def load(name: str = "gb10") -> Hardware:
    path = DATA / f"{name}.yaml"
    try:
        d = safe_load(path.read_text())
    except OSError as exc:
        raise SparktopError(f"{path}: {exc.strerror}") from None

    def value(key):
        v = d[key]
        return v["value"] if isinstance(v, dict) else v

    return Hardware(
        name=d["name"], memory_gib=float(value("memory_gib")), bandwidth_gbs=float(value("bandwidth_gbs")),
        tensor_tflops={p: float(v["value"] if isinstance(v, dict) else v) for p, v in d["tensor_tflops"].items()},
        achieved_tflops={p: float(v["value"] if isinstance(v, dict) else v) for p, v in d["achieved_tflops"].items()},
        link_gbps=float(value("link_gbps")), load_gibps=float(value("load_gibps")),
    )


GB10 = load()
