"""The sweep's figures are the server's true rates on any stream.

A scripted server (`tests/helpers/stream_server.py`) prefills and decodes
on a fixed timeline, so the true TTFT, prefill and decode rates are known;
the sweep measures it as it would an engine, for each stream shape that
once fooled it:

- several tokens per chunk (speculative decoding, vLLM's --stream-interval,
  proxies that batch chunks), with token ids or with usage only — usage used
  to be spread evenly from the first chunk to the last, which counts N-1
  decode tokens over a span that holds N-k (llama-benchy's bias, kept as
  `tg_tps_*_llama_benchy`);
- an empty role chunk sent as the headers go out, before prefill — it used
  to end "prefill" after a millisecond;
- no usage and no token ids: the streamed text counted with --tokenizer, or
  one token per chunk marked approximate.

The server and the sweep run in one process on simulated time
(tests/helpers/simulated.py): the server sends each chunk at the moment its
script says on the loop's clock, the sweep stamps each chunk on the same
clock, and nothing this machine does (HTTP, JSON, tokenizing, another test
on the other core) takes any of that time. So each figure must equal what
the script planned, to float rounding. The same check with the server and
nine sweeps as separate processes on real time is a measurement of how
close a loaded machine gets: `tests/benchmarks/stream_exactness_live.py`.

The CLI test runs the server in its own process (the CLI runs its own
event loop) and assert only what the CLI does, not its timings.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparktop.bench.request import RequestRecord, apportion, count_tokens, scan, stream_chat
from sparktop.bench.results import load_run
from sparktop.bench.stats import LevelStats
from sparktop.bench.sweep import Sweep, SweepSettings
from sparktop.cli import main
from tests.helpers.simulated import sim_clock, simulated
from tests.helpers.stream_server import Script, serving, stream_server
from tests.helpers.tokenizer import book_text, train_tokenizer

# TG=128 at 50 t/s: usage spread from the first chunk to the last is 1.6 % high at 3 per chunk.
PP, TG, PREFILL, DECODE = 1024, 128, 1000.0, 50.0
LEVELS, RUNS = [1, 2], 2
# Float rounding, not a tolerance for lateness: the sweep stamps in epoch seconds (about 1.7e9, which a
# double holds to 2.4e-7 s), and every span a figure is over is a second or more.
EXACT = 1e-6


@dataclass(frozen=True)
class Case:
    script: Script
    counted_by: str  # how the sweep should count its tokens
    tokenizer: bool = False  # the sweep gets --tokenizer

    @property
    def decode(self) -> float:
        """What the sweep should report per request: the true rate, or what one per chunk makes of it."""
        s = self.script
        if self.counted_by != "chunks":
            return s.decode_tps
        sizes = s.chunk_sizes(TG)
        return s.decode_tps * (len(sizes) - 1) / (TG - sizes[0])

    @property
    def llama_benchy(self) -> float:
        """llama-benchy's figure: without token ids, N-1 tokens over a span that holds N minus the first chunk's."""
        if self.counted_by in ("usage", "usage+tokenizer", "tokenizer"):
            return self.script.decode_tps * (TG - 1) / (TG - self.script.chunk_sizes(TG)[0])
        return self.decode

    def planned(self, c: int) -> dict[str, float]:
        """The sweep's figures at level c as the script fixes them: a request's first chunk leaves a prefill
        of PP tokens after it arrives, its last (TG - first chunk) / decode_tps after that; a batch's requests
        are sent together and share nothing, so its totals are c times a request's."""
        return {"TTFT ms": 1000 * PP / self.script.prefill_tps,
                "pp/req": self.script.prefill_tps, "pp total": c * self.script.prefill_tps,
                "tg/req": self.decode, "tg total": c * self.decode,
                "tg/req llama-benchy": self.llama_benchy, "tg total llama-benchy": c * self.llama_benchy}


def script(**kw) -> Script:
    return Script(prefill_tps=PREFILL, decode_tps=DECODE, **kw)


CASES = {
    "one token per chunk": Case(script(), "token_ids"),
    "3 per chunk, usage only": Case(script(per_chunk=3, token_ids=False), "usage"),
    "3 per chunk, token ids": Case(script(per_chunk=3), "token_ids"),
    "first alone then 4 per chunk, token ids": Case(script(first_chunk=1, per_chunk=4), "token_ids"),
    "empty role chunk before prefill": Case(script(role_first=True), "token_ids"),
    "role chunk first, reasoning, 2 per chunk, usage only": Case(
        script(role_first=True, reasoning=True, per_chunk=2, token_ids=False), "usage"),
    "2 per chunk, no usage, no ids, --tokenizer": Case(
        script(per_chunk=2, usage=False, token_ids=False, tokenizer=True), "tokenizer", tokenizer=True),
    "first alone then 3 per chunk, usage only, --tokenizer": Case(
        script(first_chunk=1, per_chunk=3, token_ids=False, tokenizer=True), "usage+tokenizer", tokenizer=True),
    "2 per chunk, no usage, no ids, no tokenizer": Case(script(per_chunk=2, usage=False, token_ids=False), "chunks"),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json", book_text())


@pytest.fixture(scope="module")
def server(tokenizer):
    """The server in its own process, for the CLI (which runs an event loop of its own)."""
    with stream_server(tokenizer) as base:
        yield base


async def sweep_on_simulated_time(case: Case, tokenizer: Path, root: Path):
    """The sweep of `case` (c1 and c2, two runs each, as `sparktop sweep -c 1,2 --runs 2 --no-warmup` would)
    against the server on this test's loop: (what the sweep finished with, the server's log of that script's
    streamed requests: [arrival, max_tokens, first chunk sent, last chunk sent])."""
    clock = sim_clock()
    async with serving(tokenizer) as (base, server):
        settings = SweepSettings(endpoint=case.script.url(base), levels=LEVELS, runs=RUNS, pp=PP, tg=TG,
                                 warmup=False, tokenizer=str(tokenizer) if case.tokenizer else None)
        finished = await Sweep(settings, root, clock=clock).run()
    return finished, server.sent.get(case.script.path(), [])


@simulated
@pytest.mark.parametrize("name", list(CASES))
async def test_the_sweep_reports_the_rates_the_server_sent(name, tokenizer, tmp_path):
    case = CASES[name]
    s = case.script
    finished, sent = await sweep_on_simulated_time(case, tokenizer, tmp_path)
    assert finished.status == "done", finished.reason
    # The server kept its script (it is on the loop's clock): every request of PP tokens by its count, and
    # each one's first and last chunks sent when planned. These are what the figures below are true to.
    measured = [t for t in sent if t[1] == TG]
    assert len(measured) == sum(c * RUNS for c in LEVELS), sent
    decode_span = (TG - s.chunk_sizes(TG)[0]) / s.decode_tps
    for t0, _, first, last in measured:
        assert first - t0 == pytest.approx(PP / s.prefill_tps, abs=1e-9)
        assert last - first == pytest.approx(decode_span, abs=1e-9)
    levels: dict[int, LevelStats] = {lv.concurrency: lv for lv in finished.levels}
    assert sorted(levels) == LEVELS
    rows, bad = [], []
    for c in LEVELS:
        lv = levels[c]
        assert lv.errors == 0 and lv.requests == c * RUNS
        assert lv.tg_approximate == (case.counted_by == "chunks")
        got = {"TTFT ms": lv.ttft_ms_mean, "pp/req": lv.pp_tps_req, "pp total": lv.pp_tps_total,
               "tg/req": lv.tg_tps_req, "tg total": lv.tg_tps_total,
               "tg/req llama-benchy": lv.tg_tps_req_llama_benchy,
               "tg total llama-benchy": lv.tg_tps_total_llama_benchy}
        for what, true in case.planned(c).items():
            rows.append(f"{name} c{c} {what:22} measured {got[what] or 0:12.6f}  true {true:12.6f}")
            if got[what] is None or got[what] != pytest.approx(true, rel=EXACT):
                bad.append(rows[-1])
    print("\n".join(rows))
    assert not bad, "\n".join(bad)
    run = load_run(finished.path)
    assert {r.counted_by for r in run.records} == {case.counted_by}
    counted = len(s.chunk_sizes(TG)) if case.counted_by == "chunks" else TG
    assert {r.completion_tokens for r in run.records} == {counted}


@simulated
async def test_the_old_figures_were_wrong_on_these_streams(tokenizer, tmp_path):
    """The cases do exercise what was wrong: llama-benchy's count is high
    (127 tokens over 125's span), and prefill to the role chunk is no
    prefill at all."""
    usage_only = CASES["3 per chunk, usage only"]
    finished, _ = await sweep_on_simulated_time(usage_only, tokenizer, tmp_path / "usage")
    lv = finished.levels[0]
    assert lv.tg_tps_req_llama_benchy / lv.tg_tps_req == pytest.approx(127 / 125, rel=EXACT)

    role_first = CASES["empty role chunk before prefill"]
    finished, _ = await sweep_on_simulated_time(role_first, tokenizer, tmp_path / "role")
    records = load_run(finished.path).records
    assert records
    for r in records:
        assert r.first_response is not None and r.first_token is not None
        # The role chunk came the moment the request was sent: a "TTFT" to it would be no time at all, ...
        assert r.first_response - r.start == pytest.approx(0, abs=EXACT)
        # ... and the whole prefill lies between it and the first token.
        assert r.first_token - r.first_response == pytest.approx(PP / role_first.script.prefill_tps, rel=EXACT)


def test_the_cli_counts_by_the_tokenizer_it_is_given_and_says_once_when_it_has_none(server, tokenizer, tmp_path,
                                                                                   capsys):
    """`sparktop sweep` as a user types it, against the server in its own process: a stream with neither usage
    nor token ids is counted one token per chunk and the CLI says so once; with --tokenizer every token is
    counted from the text. Only what it counted and said is asserted, not how fast the stream was."""
    fast = dict(prefill_tps=100000.0, decode_tps=400.0, per_chunk=2, usage=False, token_ids=False)
    argv = ["sweep", "-c", "1,2", "--runs", "1", "--pp", "64", "--tg", "16", "--no-warmup"]
    assert main([*argv, "-e", Script(**fast).url(server), "--results", str(tmp_path / "a")]) == 0
    out = capsys.readouterr()
    assert (out.out + out.err).count("decode rates are approximate") == 1
    assert main([*argv, "-e", Script(**fast, tokenizer=True).url(server), "--tokenizer", str(tokenizer),
                 "--results", str(tmp_path / "b")]) == 0
    out = capsys.readouterr()
    assert "approximate" not in out.out + out.err
    for results, counted_by, tokens in (("a", "chunks", 8), ("b", "tokenizer", 16)):
        (path,) = (tmp_path / results).iterdir()
        run = load_run(path)
        assert run.meta.get("status") == "done"
        assert {lv.concurrency: lv.requests for lv in run.levels()} == {1: 1, 2: 2}
        assert {r.counted_by for r in run.records} == {counted_by}
        assert {r.completion_tokens for r in run.records} == {tokens}  # 8 chunks of 2, or the 16 tokens


# -- how a chunk's tokens are counted ------------------------------------------


def test_token_ids_without_text_are_tokens_and_a_role_chunk_is_not():
    assert scan(b'{"choices":[{"index":0,"delta":{},"token_ids":[7,8]}]}') == (True, False, 2)
    assert scan(b'{"choices":[{"index":0,"delta":{"role":"assistant"}}]}') == (True, False, None)
    assert scan(b'{"choices":[{"delta":{"content":""},"token_ids":[]}]}') == (True, False, 0)
    assert scan(b'{"prompt_token_ids":[1,2],"choices":[{"delta":{"role":"assistant","content":""}}]}') == (
        True, False, None)


def test_usage_is_spread_over_the_chunks_in_whole_tokens():
    assert apportion(128, [1] * 43)[:3] == [3, 3, 3] and sum(apportion(128, [1] * 43)) == 128
    assert apportion(64, [1] * 22)[0] == 3  # 21 chunks of 3 and one of 1: the first holds 3
    assert apportion(10, [1, 3, 3, 3]) == [1, 3, 3, 3]
    assert apportion(6, [0, 0]) == [3, 3] and apportion(5, []) == []
    assert count_tokens([3, 3], True, 6, None, None) == ([3, 3], "token_ids")
    assert count_tokens([1, 1, 1], False, 6, None, None) == ([2, 2, 2], "usage")
    assert count_tokens([1, 1], False, None, None, None) == ([1, 1], "chunks")


def test_the_local_tokenizer_counts_each_chunk_where_its_tokens_end(tokenizer):
    from sparktop.bench.prompts import load_local_tokenizer, tokens_per_piece

    tok = load_local_tokenizer(str(tokenizer))
    words = [" the", " node", " reads", " the", " cache"]
    whole = len(tok.encode("".join(words)))
    pieces = ["".join(words[:1]), "".join(words[1:3]), "".join(words[3:])]
    counts = tokens_per_piece(tok, pieces)
    assert sum(counts) == whole and counts[0] == len(tok.encode(words[0]))
    # A word cut between two chunks counts once, in the chunk where it ends.
    assert tokens_per_piece(tok, [" the no", "de reads"]) == [1, 2]


def test_llama_benchys_count_is_kept_beside_ours():
    # Three chunks of 3 tokens by usage: ours counts the 6 after the first chunk, llama-benchy 8.
    times = [10.0, 10.0, 10.0, 10.02, 10.04, 10.06, 10.08, 10.10, 10.12]
    r = RequestRecord(level=1, run=1, index=0, start=9.5, first_token=10.0, token_times=times, counted_by="usage")
    assert (r.decode_tokens, r.decode_tokens_llama_benchy) == (6, 8)
    r.counted_by = "token_ids"
    assert r.decode_tokens_llama_benchy == 6
    assert RequestRecord.from_dict({"level": 1, "run": 1, "index": 0}).counted_by == ""  # an older record


@pytest.fixture
async def aiohttp_raw_sse():
    """Factory: an SSE endpoint that streams the given chunks `gap` seconds apart."""
    from aiohttp import web

    runners = []

    async def make(chunks: list[dict], gap: float) -> str:
        async def handler(request):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for c in chunks:
                await asyncio.sleep(gap)
                await resp.write(b"data: " + json.dumps(c).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp

        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1/chat/completions"

    yield make
    for r in runners:
        await r.cleanup()


async def test_tokens_that_stream_no_text_are_counted_and_llama_benchy_drops_them(aiohttp_raw_sse):
    # vLLM 0.32's shape (tests/fixtures/vllm-0.32.0/chat-stream-token-ids.sse): a token that ends
    # inside a UTF-8 character streams `"content": ""` with its id. 8 tokens, 2 of them textless.
    def chunk(content, ids, finish=None):
        return {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [
            {"index": 0, "delta": {"content": content}, "finish_reason": finish, "token_ids": ids}]}
    chunks = [{"id": "c", "object": "chat.completion.chunk", "model": "m", "prompt_token_ids": [1, 2],
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
              chunk(" O", [5]), chunk("", [200]), chunk("\u00e9 60", [201, 7]), chunk("ly", [8]),
              chunk("", [202]), chunk("mory", [9]), chunk("#", [4], "length"),
              {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [],
               "usage": {"prompt_tokens": 2, "total_tokens": 10, "completion_tokens": 8}}]
    url = await aiohttp_raw_sse(chunks, gap=0.01)
    rec = await stream_chat(url, {"model": "m", "messages": [], "stream": True}, RequestRecord(1, 1, 0), 10)
    assert rec.ok and rec.counted_by == "token_ids"
    assert rec.completion_tokens == 8  # what usage says, and what vLLM's histograms count
    assert rec.textless_tokens == 2
    assert (rec.decode_tokens, rec.decode_tokens_llama_benchy) == (7, 5)
