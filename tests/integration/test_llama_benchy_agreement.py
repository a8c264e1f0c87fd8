"""sparktop's sweep and llama-benchy (the tool the articles used) measure the
same twin server and agree: decode totals within 2 % (5 % at depth), the same
prompt tokens over the same first-token span, and sparktop's first token read
as the server delivered it, no later than llama-benchy reads it.

Like is compared with like: the decode figures are the sweep's
`tg_tps_*_llama_benchy`, llama-benchy's way of counting decode tokens on the
sweep's requests. On this server (token ids, one token per chunk) they are the
sweep's own figures; on streams without token ids whose chunks hold several
tokens, llama-benchy's count is biased high and the sweep's is not
(tests/integration/test_stream_exactness.py).

First tokens are held to the server, not to each other. The twin logs when
each request's handler began and when its first token went out
(`--request-log`); a client's TTFT is that plus its own work and the
loopback's. That own work is what the two tools differ by on this 2-core
machine: llama-benchy's clock starts before aiohttp serializes its body, and
it reads every chunk of every stream in one Python loop. The difference was
8-11 ms per request on a quiet machine and 37-66 ms in one CI run (-9 to
-13 % of a 400 ms TTFT), while a TTFT read at the wrong token is off by a
decode step (40-50 ms here) or by the prefill. So, per level: both tools
asked the same work (the prompt and cached tokens the server counted, and
at c1 the engine's time to the first token); sparktop reads the server's
TTFT plus less than a decode step, never less than it (a clock started
late would), and no later than llama-benchy does; and the prefill rates
agree once each is multiplied back by its own TTFT (the same tokens
counted over the same span).

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
from tests.helpers.request_log import RequestLog, levels, mean_engine_ms, mean_step_ms, mean_ttft_ms
from tests.helpers.tokenizer import train_shared_tokenizer
from tests.helpers.twin_process import start_twin_process

pytestmark = pytest.mark.slow

LEVELS = ["1", "2", "4"]
PP, TG, RUNS = "2048", "48", "3"  # a TTFT of ~180 ms at Spark's speed
# The same work for both: every request generates TG tokens; and each level measured once (a level the sweep
# thought disturbed would be measured again, batches the server log would count twice).
EXACT = ["--exact-tg", "--no-remeasure"]

# The engine's time to the first token, one tool's requests against the other's, at c1: 0.6-2.0 % apart on a
# quiet machine (the twin sleeps its modeled steps in real time, late when the CPU is busy; llama-benchy's
# context at 4096 leaves 16 more tokens to prefill). A context missed in the cache doubles it. Beyond c1 it also
# depends on whether a batch's sends fall in one step, which a client's per-request work decides.
SAME_ENGINE = 0.05
SAME_TOKENS = 0.01  # the prompt and cached tokens the server counted for one tool's requests and the other's
# What sparktop may add to the server's TTFT per request in flight: the loopback, reading each stream's chunks
# in one event loop (2-3 ms at c1, 6.5-12.5 at c2, 10.5 at c4 on a quiet machine); never a decode step.
OWN_MS = 15.0
STEP_SHARE = 0.8
# sparktop's own time may exceed llama-benchy's by scheduling noise per stream read, not more: on an idle machine
# llama-benchy's own was 1.9, 4.6 and 8.8 ms at c1, c2, c4 while sparktop's ranged 1-5, 3-11 and 7-17.
SLACK_MS = 5.0
# pp x TTFT, one tool against the other: at c1 the prompt tokens each counted (each takes its own round-trip
# estimate off the span, 1-3 ms of 350); beyond, the batch's prompt over its span times the mean TTFT, which a
# spread of sends moves a little (0.1-0.7 % here, 1.3 % in a busy CI run).
PP_SPAN = 0.03


def first_tokens(c: int, mine_ms: float, theirs_ms: float, served_mine: list, served_theirs: list) -> list:
    """Rows (name, value, limit, ok) for one level's first tokens, held to the server's."""
    rows = []
    for name, attr in (("prompt", "prompt_tokens"), ("cached", "cached_tokens")):
        mine = statistics.fmean(getattr(r, attr) for r in served_mine)
        theirs = statistics.fmean(getattr(r, attr) for r in served_theirs)
        prompt = statistics.fmean(r.prompt_tokens for r in served_theirs)
        off = (mine - theirs) / prompt
        rows.append((f"{name} tokens at the server {mine:.0f} vs {theirs:.0f}", off, SAME_TOKENS,
                     abs(off) <= SAME_TOKENS))
    if c == 1:
        engine_mine, engine_theirs = mean_engine_ms(served_mine), mean_engine_ms(served_theirs)
        same = engine_mine / engine_theirs - 1
        rows.append((f"engine to first token {engine_mine:.1f} vs {engine_theirs:.1f} ms", same, SAME_ENGINE,
                     abs(same) <= SAME_ENGINE))
    server_mine, server_theirs = mean_ttft_ms(served_mine), mean_ttft_ms(served_theirs)
    own, their_own = mine_ms - server_mine, theirs_ms - server_theirs
    limit = min(OWN_MS * c, STEP_SHARE * mean_step_ms(served_mine))
    return rows + [
        (f"sparktop ttft {mine_ms:.1f} - server's {server_mine:.1f} (ms)", own, f"0..{limit:.1f}",
         -1.0 <= own <= limit),
        (f"llama-benchy ttft {theirs_ms:.1f} - server's {server_theirs:.1f} (ms)", their_own, ">= -1",
         their_own >= -1.0),
        ("sparktop's own ms less llama-benchy's", own - their_own, f"<= {SLACK_MS * c}",
         own <= their_own + SLACK_MS * c),
    ]


def _rows_text(rows) -> str:
    return "\n".join(f"{key} {name:55} {value:+9.3f} (limit {limit})" + ("" if ok else "  <-- off")
                     for key, name, value, limit, ok in rows)


def run_both(tmp_path, concurrency: list[int], depths: list[int], sweep_extra: list[str],
             benchy_extra: list[str]) -> tuple[dict, dict]:
    """llama-benchy, then `sparktop sweep`, against one twin at Spark's speed that logs what it served: (the
    sweep's printed JSON, {(depth, c): (ours, theirs, the server's view of ours, of theirs)})."""
    tokenizer = train_shared_tokenizer(tmp_path / "tokenizer.json")
    log = RequestLog(tmp_path / "requests.jsonl")
    keys = [(d, c) for d in depths for c in concurrency]
    results = tmp_path / "results"
    twin, url = start_twin_process("llama-3.1-8b", "--tokenizer", str(tokenizer), "--request-log", str(log.path),
                                   speed=1, log=open(tmp_path / "twin.log", "w"))  # noqa: SIM115 - the twin writes it
    try:
        entries = run_llama_benchy(url, "llama-3.1-8b", tokenizer, tmp_path / "benchy", pp=int(PP), tg=int(TG),
                                   levels=concurrency, runs=int(RUNS), raw=True, extra=benchy_extra)
        served_theirs = levels(log.new(), keys, int(PP), int(RUNS))
        sp = subprocess.run(
            [sys.executable, "-m", "sparktop", "sweep", "--endpoint", url + "/v1", "--tokenizer", str(tokenizer),
             "--pp", PP, "--tg", TG, "-c", ",".join(map(str, concurrency)), "--runs", RUNS, *EXACT, *sweep_extra,
             "--json", "--results", str(results)],
            capture_output=True, text=True, timeout=900)
        assert sp.returncode == 0, sp.stderr[-2000:]
        served_ours = levels(log.new(), keys, int(PP), int(RUNS))
    finally:
        twin.terminate()
        twin.wait(10)
    (run_dir,) = results.iterdir()
    ours = {(lv.depth, lv.concurrency): lv for lv in load_run(run_dir).levels()}
    theirs = {(e["context_size"], e["concurrency"]): e for e in entries if not e.get("is_context_prefill_phase")}
    assert set(ours) == set(keys) and set(theirs) == set(keys)
    assert all(lv.errors == 0 for lv in ours.values())
    return json.loads(sp.stdout), {key: (ours[key], theirs[key], served_ours[key], served_theirs[key])
                                   for key in keys}


def test_sparktop_and_llama_benchy_agree_on_the_same_server(tmp_path):
    printed, both = run_both(tmp_path, list(map(int, LEVELS)), [0], [], [])
    assert {lv["concurrency"] for lv in printed["levels"]} == set(map(int, LEVELS))
    rows = []
    for (_, c), (o, t, served_ours, served_theirs) in both.items():
        for name, mine, ref in (("tg t/s, sparktop vs llama-benchy", o.tg_tps_total_llama_benchy,
                                 t["tg_throughput"]["mean"]),
                                ("tg t/s per request, sparktop vs llama-benchy", o.tg_tps_req_llama_benchy,
                                 t["tg_req_throughput"]["mean"])):
            rows.append((f"c{c}", name, mine / ref - 1, 0.02, abs(mine / ref - 1) <= 0.02))
        ttft, their_ttft = o.ttft_ms_mean, t["e2e_ttft"]["mean"]
        span = (o.pp_tps_total * ttft) / (t["pp_throughput"]["mean"] * their_ttft) - 1
        rows.append((f"c{c}", f"pp x ttft (pp {o.pp_tps_total:.0f} vs {t['pp_throughput']['mean']:.0f})", span,
                     PP_SPAN, abs(span) <= PP_SPAN))
        rows += [(f"c{c}", *row) for row in first_tokens(c, ttft, their_ttft, served_ours, served_theirs)]
    print(_rows_text(rows))
    assert all(ok for *_, ok in rows), _rows_text(rows)


@pytest.fixture(scope="module")
def at_depth(tmp_path_factory):
    """Both tools at depth 0 and 4096, each context loaded into the prefix cache before the measured request
    (llama-benchy's --enable-prefix-caching, sparktop's --prefix-cache on)."""
    _, both = run_both(tmp_path_factory.mktemp("depth"), [1, 2], [0, 4096], ["--depth", "0,4096", "--prefix-cache",
                       "on"], ["--depth", "0", "4096", "--enable-prefix-caching"])
    return both


def test_at_depth_both_measure_the_same_decode_and_the_same_ttft_without_a_context(at_depth):
    """Issue 28: the same decode at depth 0 and 4096 (within 5 %), and the same first token without a context."""
    rows = []
    for (d, c), (o, t, so, st) in at_depth.items():
        off = o.tg_tps_total_llama_benchy / t["tg_throughput"]["mean"] - 1
        rows.append((f"d{d} c{c}", "tg t/s, sparktop vs llama-benchy", off, 0.05, abs(off) <= 0.05))
        if d == 0:
            rows += [(f"d{d} c{c}", *row)
                     for row in first_tokens(c, o.ttft_ms_mean, t["e2e_ttft"]["mean"], so, st)]
    print(_rows_text(rows))
    assert all(ok for *_, ok in rows), _rows_text(rows)


def test_at_depth_4096_the_ttft_after_a_cached_context_agrees(at_depth):
    """Issue 28: after a 4096-token context both tools loaded into the prefix cache, each measured request
    finds it there (the server's cached tokens) and both read the first token as the server delivered it.
    sparktop read 2-7 % lower here until two differences in what the tools sent were taken out: its contexts
    were 8 % over their depth, and its prompt words were half the characters of llama-benchy's for the same
    token count, which the server tokenizes in half the time. The server's TTFT for the two tools' requests
    now agrees, and would not if either sent more, or missed the cache."""
    rows = []
    for (d, c), (o, t, so, st) in at_depth.items():
        if d != 4096:
            continue
        for who, served in (("sparktop", so), ("llama-benchy", st)):
            share = statistics.fmean(r.cached_tokens for r in served) / d
            rows.append((f"d{d} c{c}", f"{who}'s context found cached (share of depth)", share, ">= 0.9",
                         share >= 0.9))
        rows += [(f"d{d} c{c}", *row) for row in first_tokens(c, o.ttft_ms_mean, t["e2e_ttft"]["mean"], so, st)]
    print(_rows_text(rows))
    assert all(ok for *_, ok in rows), _rows_text(rows)
