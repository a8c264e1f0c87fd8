"""sparktop's sweep and llama-benchy (the tool the articles used) measure the
same twin server and agree: tg totals within 2 %, pp and TTFT within 5 %.

Like is compared with like: the decode figures are the sweep's
`tg_tps_*_llama_benchy`, llama-benchy's way of counting decode tokens on the
sweep's requests. On this server (token ids, one token per chunk) they are the
sweep's own figures; on streams without token ids whose chunks hold several
tokens, llama-benchy's count is biased high and the sweep's is not
(tests/integration/test_stream_exactness.py).

Both run as their own processes against a twin in its own process, one
after the other, offline: a tokenizer.json trained here, llama-benchy's book
pre-seeded in its cache under a temporary HOME."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from sparktop.bench.results import load_run
from tests.helpers.benchy import run_llama_benchy
from tests.helpers.timing import first_token_tolerance
from tests.helpers.tokenizer import train_shared_tokenizer
from tests.helpers.twin_process import start_twin_process

pytestmark = pytest.mark.slow

LEVELS = ["1", "2", "4"]
PP, TG, RUNS = "2048", "48", "3"  # a TTFT of ~180 ms: a few ms of scheduling jitter stays under 5 %
EXACT = ["--exact-tg"]  # the same work for both: every request generates TG tokens


# What the two clients' own per-request costs may differ by (llama-benchy's clock starts before its request
# is built and sent; the server tokenizes its longer text): 8-11 ms in the working tree, 22-33 ms in a
# clean-clone CI run on the same 2-core machine. A first-token time read from the wrong event would
# differ by a decode step or the prefill itself, far more.
CLIENT_MS = 40.0


def client_allowance(ttft_ms: float) -> float:
    return first_token_tolerance(ttft_ms, CLIENT_MS)


def by_concurrency(levels: list[dict]) -> dict[int, dict]:
    return {lv["concurrency"]: lv for lv in levels}


def test_sparktop_and_llama_benchy_agree_on_the_same_server(tmp_path):
    tokenizer = train_shared_tokenizer(tmp_path / "tokenizer.json")
    # At Spark's speed, as the depth fixture below: the tools differ by a few ms of real CPU time per request
    # (llama-benchy's longer text to tokenize, its clock started before the request leaves), which at twice
    # the speed was 4-6 % of a c4 TTFT on a busy machine.
    twin, url = start_twin_process("llama-3.1-8b", "--tokenizer", str(tokenizer), speed=1,
                                   log=open(tmp_path / "twin.log", "w"))  # noqa: SIM115 - the twin writes it
    try:
        theirs = run_llama_benchy(url, "llama-3.1-8b", tokenizer, tmp_path, pp=int(PP), tg=int(TG),
                                  levels=list(map(int, LEVELS)), runs=int(RUNS))
        sp = subprocess.run(
            [sys.executable, "-m", "sparktop", "sweep", "--endpoint", url + "/v1", "--tokenizer", str(tokenizer),
             "--pp", PP, "--tg", TG, "-c", ",".join(LEVELS), "--runs", RUNS, *EXACT, "--json",
             "--results", str(tmp_path / "results")],
            capture_output=True, text=True, timeout=600)
        assert sp.returncode == 0, sp.stderr[-2000:]
    finally:
        twin.terminate()
        twin.wait(10)

    assert by_concurrency(json.loads(sp.stdout)["levels"]).keys() == set(map(int, LEVELS))
    (run_dir,) = (tmp_path / "results").iterdir()
    ours = by_concurrency([lv.as_dict() for lv in load_run(run_dir).levels()])
    rows = []
    for c in map(int, LEVELS):
        o, t = ours[c], theirs[c]
        assert o["errors"] == 0
        # Each client builds and sends its c requests one after another: their costs add up per request.
        near = first_token_tolerance(t["e2e_ttft"]["mean"], CLIENT_MS * c)  # prefill: the same first token
        pairs = {"tg": (o["tg_tps_total_llama_benchy"], t["tg_throughput"]["mean"], 0.02),
                 "tg/r": (o["tg_tps_req_llama_benchy"], t["tg_req_throughput"]["mean"], 0.02),
                 "pp": (o["pp_tps_total"], t["pp_throughput"]["mean"], near),
                 "ttft": (o["ttft_ms_mean"], t["e2e_ttft"]["mean"], near)}
        for name, (mine, ref, tol) in pairs.items():
            rows.append((c, name, mine, ref, mine / ref - 1, tol))
    report = "\n".join(f"c{c} {n:4} sparktop {m:10.2f}  llama-benchy {r:10.2f}  {d:+.2%} (limit {tol:.0%})"
                       for c, n, m, r, d, tol in rows)
    print(report)
    assert all(abs(d) <= tol for *_, d, tol in rows), report


PAIRS = 2  # the tools alternate, first one then the other: a machine that slows for a minute slows both


@pytest.fixture(scope="module")
def at_depth(tmp_path_factory):
    """Both tools at depth 0 and 4096, each context loaded into the prefix cache before the measured request
    (llama-benchy's --enable-prefix-caching, sparktop's --prefix-cache on), in PAIRS alternating pairs against
    one twin: {(depth, c): ([ours per pair], [theirs per pair])}. One run of each disagreed by 6-8 % on TTFT
    on a quiet machine and 11 % on a busy one while their means over pairs stay within 5 %: llama-benchy's
    own c1 TTFT moved 180-191 ms between runs minutes apart."""
    tmp_path = tmp_path_factory.mktemp("depth")
    tokenizer = train_shared_tokenizer(tmp_path / "tokenizer.json")
    # At Spark speed, not twice it: what differs between the tools is real CPU time (the server tokenizing
    # llama-benchy's longer text, llama-benchy's clock starting before its request leaves), a fixed 8-9 ms
    # that a TTFT twice as long halves in proportion.
    twin, url = start_twin_process("llama-3.1-8b", "--tokenizer", str(tokenizer), speed=1,
                                   log=open(tmp_path / "twin.log", "w"))  # noqa: SIM115 - the twin writes it

    def theirs_once(n: int) -> dict:
        (tmp_path / f"benchy{n}").mkdir()
        entries = run_llama_benchy(url, "llama-3.1-8b", tokenizer, tmp_path / f"benchy{n}", pp=int(PP), tg=int(TG),
                                   levels=[1, 2], runs=int(RUNS), raw=True,
                                   extra=["--depth", "0", "4096", "--enable-prefix-caching"])
        return {(e["context_size"], e["concurrency"]): e for e in entries if not e.get("is_context_prefill_phase")}

    def ours_once(n: int) -> dict:
        results = tmp_path / f"results{n}"
        sp = subprocess.run(
            [sys.executable, "-m", "sparktop", "sweep", "--endpoint", url + "/v1", "--tokenizer", str(tokenizer),
             "--pp", PP, "--tg", TG, "-c", "1,2", "--runs", RUNS, *EXACT, "--depth", "0,4096", "--prefix-cache",
             "on", "--json", "--results", str(results)],
            capture_output=True, text=True, timeout=900)
        assert sp.returncode == 0, sp.stderr[-2000:]
        (run_dir,) = results.iterdir()
        return {(lv.depth, lv.concurrency): lv for lv in load_run(run_dir).levels()}

    ours: list[dict] = []
    theirs: list[dict] = []
    try:
        for n in range(PAIRS):
            if n % 2 == 0:
                theirs.append(theirs_once(n))
                ours.append(ours_once(n))
            else:
                ours.append(ours_once(n))
                theirs.append(theirs_once(n))
    finally:
        twin.terminate()
        twin.wait(10)
    keys = {(0, 1), (0, 2), (4096, 1), (4096, 2)}
    assert all(set(o) == keys for o in ours) and all(set(t) == keys for t in theirs)
    assert all(lv.errors == 0 for o in ours for lv in o.values())
    return {key: ([o[key] for o in ours], [t[key] for t in theirs]) for key in sorted(keys)}


def _report(rows) -> str:
    return "\n".join(f"d{d} c{c} {n:4} sparktop {m:10.2f}  llama-benchy {r:10.2f}  {x:+.2%}"
                     for (d, c), n, m, r, x in rows)


def test_at_depth_both_measure_the_same_decode_and_the_same_ttft_without_a_context(at_depth):
    """Issue 28: within 5 % at depth 0 and 4096."""
    rows = []
    for key, (o, t) in at_depth.items():
        mine = statistics.fmean(lv.tg_tps_total_llama_benchy for lv in o)
        ref = statistics.fmean(e["tg_throughput"]["mean"] for e in t)
        rows.append((key, "tg", mine, ref, mine / ref - 1))
        if key[0] == 0:
            mine = statistics.fmean(lv.ttft_ms_mean for lv in o)
            ref = statistics.fmean(e["e2e_ttft"]["mean"] for e in t)
            rows.append((key, "ttft", mine, ref, mine / ref - 1))
    print(_report(rows))
    assert all(abs(x) <= (client_allowance(r) if n == "ttft" else 0.05) for _, n, _, r, x in rows), _report(rows)


def test_at_depth_4096_the_ttft_after_a_cached_context_agrees(at_depth):
    """Issue 28: within 5 % after a cached 4096-token context. sparktop read 2-7 % lower here until two
    differences in what the tools sent were taken out: its contexts were 8 % over their depth, and with a
    vocabulary trained on the book alone its prompt words were three tokens each, half the characters of
    llama-benchy's for the same count, which the server tokenizes in half the time (5 ms of server CPU per
    6k-token prompt at c1, twice that at c2, more on a busy machine). Both tools now send the same number of
    tokens. What is left, seen through a timing proxy at c1 (sparktop 257 ms, llama-benchy 267 ms): the
    server answers llama-benchy 4.5 ms later (its book text is 5 % more characters for the same tokens), and
    llama-benchy's clock starts 4 ms before its request leaves, so sparktop reads 3-4 % lower, and one
    run of each 4-8 % lower as either tool's run drifts: their means over alternating pairs are compared.
    With the twin at twice Spark's speed those 8-9 ms of real CPU time were 3-4 % of a 265 ms TTFT and one
    CI run read -5.03 %; at Spark's speed the two tools' means agree within half a percent."""
    means = {key: (statistics.fmean(lv.ttft_ms_mean for lv in o), statistics.fmean(e["e2e_ttft"]["mean"] for e in t))
             for key, (o, t) in at_depth.items() if key[0] == 4096}
    rows = [(key, "ttft", mine, ref, mine / ref - 1) for key, (mine, ref) in means.items()]
    print(_report(rows))
    assert all(abs(x) <= client_allowance(r) for _, _, _, r, x in rows), _report(rows)
