"""Sweep statistics against hand-computed cases (llama-benchy's definitions)."""

from __future__ import annotations

import pytest

from sparktop.bench.request import RequestRecord, interpolate, spread
from sparktop.bench.stats import batch_stats, knee, level_stats, peak_rate, percentile


def rec(start, first, tokens, prompt=100, level=2, run=1, index=0, error=None):
    r = RequestRecord(level=level, run=run, index=index, start=start, first_response=first, first_token=first,
                      end=tokens[-1] + 0.01 if tokens else None, prompt_tokens=prompt,
                      completion_tokens=len(tokens), token_times=list(tokens), error=error)
    return r


def test_two_requests_by_hand():
    # A: starts at 0, first token 0.5, then 10 tokens, one every 0.1 s -> last at 1.5
    a = rec(0.0, 0.5, [0.5 + 0.1 * i for i in range(11)], prompt=100)
    # B: starts at 0.1, first token at 1.0, 5 more tokens every 0.2 s -> last at 2.0
    b = rec(0.1, 1.0, [1.0 + 0.2 * i for i in range(6)], prompt=300, index=1)
    s = batch_stats([a, b], latency=0.0)
    # pp total = (100 + 300) / (max first 1.0 - min start 0.0) = 400
    assert s.pp_tps_total == pytest.approx(400.0)
    # tg total = (10 + 5) decode tokens / (max last 2.0 - min first 0.5) = 10
    assert s.tg_tps_total == pytest.approx(10.0)
    # per request: pp 100/0.5 = 200 and 300/0.9; tg 10/1.0 = 10 and 5/1.0 = 5
    assert s.pp_tps_req == pytest.approx([200.0, 300 / 0.9])
    assert s.tg_tps_req == pytest.approx([10.0, 5.0])
    assert s.ttft_s == pytest.approx([0.5, 0.9])


def test_end_to_end_figures_by_hand():
    """What pipeline owners quote: output tokens over the batch's wall time,
    each request's over its own start-to-end time, and the wall time."""
    a = rec(0.0, 0.5, [0.5 + 0.1 * i for i in range(11)], prompt=100)  # 11 tokens, 0 -> 1.5
    b = rec(0.1, 1.0, [1.0 + 0.2 * i for i in range(6)], prompt=300, index=1)  # 6 tokens, 0.1 -> 2.0
    s = batch_stats([a, b])
    assert s.wall_s == pytest.approx(2.0)
    assert s.e2e_tps_total == pytest.approx(17 / 2.0)
    assert s.e2e_tps_req == pytest.approx([11 / 1.5, 6 / 1.9])
    lv = level_stats(2, [[a, b], [a, b]])
    assert (lv.e2e_tps_total, lv.wall_s_mean) == (pytest.approx(8.5), pytest.approx(2.0))
    assert lv.e2e_tps_req == pytest.approx((11 / 1.5 + 6 / 1.9) / 2)


def test_latency_is_taken_off_prefill_per_request_only():
    a = rec(0.0, 0.5, [0.5, 0.6, 0.7], prompt=100, level=1)
    s = batch_stats([a], latency=0.1)
    assert s.pp_tps_req == pytest.approx([100 / 0.4])
    assert s.ttft_s == pytest.approx([0.5])  # TTFT is end to end


def test_failed_requests_count_as_errors_not_as_speed():
    a = rec(0.0, 0.5, [0.5, 0.6, 0.7])
    b = RequestRecord(level=2, run=1, index=1, start=0.0, error="HTTP 500: boom")
    s = batch_stats([a, b])
    assert (s.requests, s.errors) == (2, 1)
    assert s.tg_tps_total == pytest.approx(2 / 0.2)


def test_level_at_c1_uses_per_request_figures_and_at_c2_batch_totals():
    one = [[rec(0, 0.5, [0.5, 0.7, 0.9], level=1)], [rec(10, 10.25, [10.25, 10.35, 10.45], level=1)]]
    lv = level_stats(1, one)
    assert lv.tg_tps_total == pytest.approx((2 / 0.4 + 2 / 0.2) / 2)
    assert lv.tg_tps_total == lv.tg_tps_req
    assert lv.ttft_ms_mean == pytest.approx(375.0)
    assert lv.ttft_ms_p50 == pytest.approx(375.0)
    two = [[rec(0, 0.5, [0.5, 0.6, 0.7]), rec(0, 0.5, [0.5, 0.6, 0.7], index=1)]]
    lv2 = level_stats(2, two)
    assert lv2.tg_tps_total == pytest.approx(4 / 0.2)
    assert lv2.tg_tps_req == pytest.approx(10.0)


def test_peak_is_the_busiest_second():
    times = [0.0, 0.1, 0.2, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0, 5.0]
    assert peak_rate(times) == 6.0  # 1.5 .. 2.0 plus nothing before 1.0
    assert peak_rate([0.0, 0.25, 0.5]) == pytest.approx(6.0)  # a burst shorter than a second: its own rate
    assert peak_rate([]) == 0.0


def test_percentiles_interpolate_like_numpy():
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile([10, 20, 30, 40, 50], 0.95) == pytest.approx(48.0)
    assert percentile([], 0.5) is None


def test_knee_finds_where_throughput_stops_growing_or_falls():
    def lv(c, tg):
        return level_stats(c, []).__class__(**{**level_stats(c, []).as_dict(), "tg_tps_total": tg})

    grows = [lv(1, 50), lv(2, 95), lv(4, 180), lv(8, 300), lv(16, 320), lv(32, 330)]
    k = knee(grows)
    assert k.concurrency == 8 and not k.falls
    assert "stops growing at c8" in k.describe()
    falls = [lv(1, 50), lv(2, 95), lv(4, 80)]
    assert knee(falls).concurrency == 2 and knee(falls).falls
    assert knee([lv(1, 50), lv(2, 95)]).next_gain is None


def test_tokens_in_one_chunk_spread_between_chunks():
    assert spread([1.0, 2.0], [1, 4], start=1.0) == pytest.approx([1.0, 1.25, 1.5, 1.75, 2.0])
    assert interpolate([1.0, 3.0], 5) == pytest.approx([1.0, 1.5, 2.0, 2.5, 3.0])


def test_a_record_survives_the_file_round_trip():
    a = rec(1795250394.233384, 1795250394.25, [1795250394.25, 1795250394.2612345])
    import json

    b = RequestRecord.from_dict(json.loads(a.to_json()))
    assert b.token_times == pytest.approx(a.token_times, abs=1e-6)
    assert b.decode_tokens == 1 and b.prompt_tokens == 100


def test_a_stream_read_in_one_piece_has_no_decode_rate_and_is_counted():
    """What a starved client or a buffering proxy leaves: 64 tokens stamped at
    one instant. No rate is made up from them, and the level says how many."""
    whole = rec(0.0, 1.4, [1.4] * 64, level=1)
    timed = rec(2.0, 2.1, [2.1 + 0.01 * i for i in range(64)], level=1, run=2)
    one = level_stats(1, [[whole]])
    assert (one.tg_tps_total, one.tg_unmeasured) == (None, 1)
    both = level_stats(1, [[whole], [timed]])
    assert both.tg_tps_total == pytest.approx(100.0)  # only the stream with a span
    assert both.tg_unmeasured == 1
    assert level_stats(1, [[timed]]).tg_unmeasured == 0
