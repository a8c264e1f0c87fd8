"""Benchmark: how close `sparktop sweep` gets to a stream's true rates on real time, under load.

The suite checks the sweep's arithmetic on every stream shape exactly, on
simulated time (tests/integration/test_stream_exactness.py). This is the same
check live: the scripted server (tests/helpers/stream_server.py) in a process
of its own, and one `sparktop sweep` process per stream shape, all nine
started together (0.4 s apart) as users would run them, on this machine's
clock. The "true" rates are those of what the server logged it sent (its
`/<script>/sent`: a loaded server wakes late, and a late chunk is what the
client should see); the table prints each figure beside them and the
difference. Nothing passes or fails: on a busy machine the client's own
event loop adds latency to prefill and TTFT (a few %), and decode stays
within about 1 %.

    python tests/benchmarks/stream_exactness_live.py [--stagger 0.4] [--runs 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from sparktop.bench.results import load_run  # noqa: E402
from tests.helpers.stream_server import stream_server  # noqa: E402
from tests.helpers.tokenizer import book_text, train_tokenizer  # noqa: E402
from tests.integration.test_stream_exactness import CASES, LEVELS, PP, TG, Case  # noqa: E402


def sweeps(base: str, tokenizer: Path, root: Path, runs: int, stagger: float) -> dict[str, Path | str]:
    """Every case's sweep, all at once, each in its own process: {name: its run directory, or why none}."""
    procs = {}
    for name, case in CASES.items():
        out = root / name.replace(" ", "-").replace(",", "")
        cmd = [sys.executable, "-m", "sparktop", "sweep", "--endpoint", case.script.url(base), "--pp", str(PP),
               "--tg", str(TG), "-c", ",".join(map(str, LEVELS)), "--runs", str(runs), "--no-warmup",
               "--results", str(out), *(["--tokenizer", str(tokenizer)] if case.tokenizer else [])]
        procs[name] = (subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True), out)
        time.sleep(stagger)
    finished: dict[str, Path | str] = {}
    for name, (proc, out) in procs.items():
        _, err = proc.communicate(timeout=600)
        found = list(out.iterdir()) if out.exists() else []
        finished[name] = found[0] if len(found) == 1 else f"exit {proc.returncode}, no run: {err[-500:]}"
    return finished


def true_rates(case: Case, c: int, batches: list[list[tuple[float, float, float]]]) -> dict[str, float]:
    """What the server sent at level c, in the sweep's definitions: the script's rates over the spans the
    chunks actually took (a decode span the server stretched by a late wake-up holds the same tokens)."""
    s = case.script
    plan = (TG - s.chunk_sizes(TG)[0]) / s.decode_tps
    requests = [r for b in batches for r in b]
    mean = statistics.fmean
    return {
        "TTFT ms": mean(1000 * (first - t0) for t0, first, _ in requests),
        "pp/req": mean(PP / (first - t0) for t0, first, _ in requests),
        "pp total": mean(c * PP / (max(r[1] for r in b) - min(r[0] for r in b)) for b in batches),
        "tg/req": mean(case.decode * plan / (last - first) for _, first, last in requests),
        "tg total": mean(c * case.decode * plan / (max(r[2] for r in b) - min(r[1] for r in b)) for b in batches),
        "tg/req llama-benchy": mean(case.llama_benchy * plan / (last - first) for _, first, last in requests),
        "tg total llama-benchy": mean(c * case.llama_benchy * plan / (max(r[2] for r in b) - min(r[1] for r in b))
                                      for b in batches),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="batches per level")
    ap.add_argument("--stagger", type=float, default=0.4, help="seconds between the sweeps' starts")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tokenizer = train_tokenizer(root / "tokenizer.json", book_text())
        with stream_server(tokenizer) as base:
            finished = sweeps(base, tokenizer, root / "runs", args.runs, args.stagger)
            sent = {name: httpx.get(case.script.url(base).removesuffix("/v1") + "/sent").json()
                    for name, case in CASES.items()}
        worst: dict[str, float] = {}
        for name, case in CASES.items():
            run_dir = finished[name]
            if isinstance(run_dir, str):
                print(f"{name}: {run_dir}")
                continue
            levels = {lv.concurrency: lv for lv in load_run(run_dir).levels()}
            timelines = sorted((t0, first, last) for t0, n, first, last in sent[name] if n == TG)
            for c in LEVELS:
                level, timelines = timelines[:c * args.runs], timelines[c * args.runs:]
                true = true_rates(case, c, [level[i:i + c] for i in range(0, len(level), c)])
                lv = levels.get(c)
                if lv is None:
                    print(f"{name} c{c}: not measured")
                    continue
                got = {"TTFT ms": lv.ttft_ms_mean, "pp/req": lv.pp_tps_req, "pp total": lv.pp_tps_total,
                       "tg/req": lv.tg_tps_req, "tg total": lv.tg_tps_total,
                       "tg/req llama-benchy": lv.tg_tps_req_llama_benchy,
                       "tg total llama-benchy": lv.tg_tps_total_llama_benchy}
                for what, t in true.items():
                    diff = (got[what] or 0) / t - 1
                    worst[what] = max(worst.get(what, 0.0), abs(diff))
                    print(f"{name} c{c} {what:22} measured {got[what] or 0:9.2f}  true {t:9.2f}  {diff:+.2%}  "
                          f"(planned {case.planned(c)[what]:.2f})")
        print("\nworst |measured/true - 1| per figure:")
        for what, w in worst.items():
            print(f"  {what:22} {w:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
