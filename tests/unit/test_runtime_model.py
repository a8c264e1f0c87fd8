"""The runtime model (`sparktop.model.runtimes`): the factors stored in
`runtime-factors.json` against the figures in `published-runtimes.yaml`.

Nothing here refits (that is `python -m sparktop.model.runtimes --fit`): the
stored factors are replayed on the published figures and must give the errors
the file states, keep every predicted decode under the bandwidth roofline, and
agree with what each source's own figures say (who is faster, what scales)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from sparktop import engine_ids
from sparktop.errors import SparktopError
from sparktop.model import runtimes
from sparktop.model.cards import find_card
from sparktop.model.constants import CAPPED
from sparktop.model.fit import load_constants
from sparktop.model.runtimes import CannotModel, Figure, apply_runtime, describe, load_figures
from sparktop.model.simulate import predict

FITTED_RUNTIMES = tuple(runtimes.KNOBS)


@pytest.fixture(scope="module")
def stored() -> dict:
    return runtimes._stored()


@pytest.fixture(scope="module")
def base():
    """The vLLM constants the factors were fitted on."""
    return runtimes.stored_base()


@pytest.fixture(scope="module")
def rows(base) -> dict[str, list[runtimes.Row]]:
    return {rt: runtimes.evaluate(load_figures(rt), apply_runtime(rt, base)) for rt in FITTED_RUNTIMES}


def _figure(runtime: str, **want) -> Figure:
    hits = [f for f in load_figures(runtime) if all(getattr(f, key) == v for key, v in want.items())]
    assert len(hits) == 1, (runtime, want, hits)
    return hits[0]


def _decode(runtime: str, card: str, scheme: str, k, c: int = 1, pp: int = 2048, tg: int = 128,
            topology: str = "solo") -> float:
    """The model's aggregate decode rate for `runtime` serving `card` in `scheme`."""
    value = predict(runtimes.runtime_card(runtime, find_card(card), scheme), topology, c, pp, tg,
                    apply_runtime(runtime, k)).stats.tg_tps_total
    assert value is not None
    return value


# -- names and refusals -------------------------------------------------------------------------


def test_runtime_ids_and_aliases():
    assert runtimes.runtime_id("llama-cpp") == runtimes.runtime_id("llama.cpp") == "llama.cpp"
    assert runtimes.runtime_id("TensorRT-LLM") == "trtllm"
    assert runtimes.runtime_id("sglang") == "sglang"
    with pytest.raises(CannotModel, match="unknown runtime 'mlc'"):
        runtimes.runtime_id("mlc")


def test_vllm_is_the_fitted_constants_themselves():
    k = load_constants()
    assert apply_runtime("vllm", k) is k


def test_a_runtime_without_figures_cannot_be_modelled():
    with pytest.raises(CannotModel) as exc:
        apply_runtime("tgi", load_constants())
    assert isinstance(exc.value, SparktopError)
    assert str(exc.value) == ("no published DGX Spark figures for TGI: predict models vLLM, SGLang, llama.cpp, "
                              "TensorRT-LLM and Ollama")
    assert "no published DGX Spark figures" in describe("tgi")


def test_describe_is_one_line_per_runtime(stored):
    for rt in runtimes.RUNTIMES:  # derived from engine_ids
        line = describe(rt)
        assert "\n" not in line and line.startswith(engine_ids.get(rt).name)
    for rt in FITTED_RUNTIMES:
        entry = stored["runtimes"][rt]
        assert f"fitted to {entry['figures']} of its published DGX Spark figures" in describe(rt)
    assert "fitted-constants.json" in describe("vllm")


# -- the stored fit ------------------------------------------------------------------------------


def test_stored_factors_are_what_each_runtime_may_fit(stored, base):
    for rt in FITTED_RUNTIMES:
        entry = stored["runtimes"][rt]
        assert set(entry["factors"]) == set(runtimes.KNOBS[rt]) | set(runtimes.SHARED.get(rt, {}))
        for name, value in entry["factors"].items():
            lo, _ = runtimes.FACTOR_RANGE
            assert lo <= value <= runtimes._ceiling(name, base) * 1.0001, (rt, name, value)
        for other_name, other in runtimes.SHARED.get(rt, {}).items():
            assert entry["factors"][other_name] == stored["runtimes"][other]["factors"][other_name]
        assert entry["figures"] == len(load_figures(rt))
        assert entry["sources"]
    # Efficiencies stay physical: at most the nominal bandwidth, the measured GEMM rate, the link's line rate.
    for rt in FITTED_RUNTIMES:
        k = apply_runtime(rt, base)
        for f in CAPPED:
            assert 0 < getattr(k, f) <= 1.0


@pytest.mark.parametrize("runtime", FITTED_RUNTIMES)
def test_stored_factors_reproduce_the_stored_errors(runtime, stored, rows):
    entry = stored["runtimes"][runtime]
    mine = rows[runtime]
    assert all(r.predicted is not None and r.fits for r in mine)  # every batch the sources ran fits the model too
    again = runtimes.mean_errors(mine)
    for key, value in entry["mean_error"].items():
        assert again[key] == pytest.approx(value, abs=0.002), key
    for card, errs in entry["per_card"].items():
        of_card = runtimes.mean_errors(r for r in mine if r.figure.card == card)
        for kind in ("decode", "prefill"):
            if kind in errs:
                assert of_card[kind] == pytest.approx(errs[kind], abs=0.002), (card, kind)


def test_the_factors_still_hold_on_the_shipped_vllm_constants(stored):
    """The factors multiply vLLM's fitted constants: if fitted-constants.json
    moved far enough to change a runtime's errors, refit the factors
    (`python -m sparktop.model.runtimes --fit`)."""
    current = load_constants()
    for rt in FITTED_RUNTIMES:
        errs = runtimes.mean_errors(runtimes.evaluate(load_figures(rt), apply_runtime(rt, current)))
        for kind in ("decode", "prefill"):
            if kind in stored["runtimes"][rt]["mean_error"]:
                assert errs[kind] <= stored["runtimes"][rt]["mean_error"][kind] + 0.03, (
                    f"{rt} {kind}: {errs[kind]:.1%} on the shipped vLLM constants; refit the runtime factors")


# -- physics -----------------------------------------------------------------------------------


def test_no_predicted_decode_is_above_the_bandwidth_roofline(rows, base):
    for rt, mine in rows.items():
        k = apply_runtime(rt, base)
        for r in mine:
            if r.figure.kind == "decode":
                assert r.predicted is not None
                rate = runtimes.decode_rate(r.figure, r.predicted)
                assert rate <= runtimes.decode_roofline(r.figure, k), (rt, r.figure.label())


@pytest.mark.parametrize("runtime,card,scheme", [("llama-cpp", "gpt-oss-120b", "mxfp4"),
                                                 ("ollama", "llama-3.1-70b", "q4_k_m"),
                                                 ("sglang", "llama-3.1-8b", "fp8"),
                                                 ("trtllm", "llama-3.3-70b", "nvfp4")])
def test_batched_decode_stays_under_the_roofline(runtime, card, scheme, base):
    """Beyond the figures: lockstep batches up to 64, where the overheads shrink per token."""
    k = apply_runtime(runtime, base)
    c_ = runtimes.runtime_card(runtime, find_card(card), scheme)
    from sparktop.model.simulate import perf_for

    perf = perf_for(c_, "solo", k)
    for c in (1, 4, 16, 64):
        rate = predict(c_, "solo", c, 512, 32, k).stats.tg_tps_total
        assert rate is not None and rate <= perf.roofline_decode_tps(c, 512), (c, rate)


def test_single_stream_figures_are_under_the_roofline_of_the_layout_they_ran(base):
    """One stream's decode reads the same bytes whatever the routing: a
    published one-stream figure above its roofline would mean the weight
    layout is wrong. llama.cpp's gpt-oss GGUF is one: with BF16 attention and
    unembedding (the HF checkpoint's layout) its 58.7 t/s would be impossible."""
    for rt in FITTED_RUNTIMES:
        k = apply_runtime(rt, base)
        for f in load_figures(rt):
            if f.kind == "decode" and f.concurrency == 1:
                assert runtimes.decode_rate(f, f.value) <= runtimes.decode_roofline(f, k), f.label()
    f = _figure("llama-cpp", card="gpt-oss-120b", tool="llama-bench", depth=0, metric="decode_tps")
    hf_layout = replace(f, runtime="ollama")  # Ollama keeps the checkpoint's layout
    assert f.value > runtimes.decode_roofline(hf_layout, apply_runtime("ollama", base))


def test_gguf_layouts_weigh_what_llama_bench_says():
    """The size column of llama-bench's table against the card in the layout
    the figure ran: gpt-oss's Q8_0 non-experts, Q8_0 and Q4_K files. A card
    counts the embedding table in BF16 (a GGUF quantizes it too: half a GiB
    on gpt-oss-20b); the Nemotron file is Q4_K at 4.6 bits a weight on
    average, and q4_k_m, the nearest format sparktop knows, 4.85."""
    seen = set()
    for f in load_figures("llama-cpp"):
        if f.tool != "llama-bench" or f.card in seen:
            continue
        seen.add(f.card)
        size = float(re.search(r"\|\s*([\d.]+) GiB\s*\|", f.quote).group(1))
        card = runtimes.runtime_card("llama-cpp", find_card(f.card), f.quant)
        assert card.weights_gib == pytest.approx(size, rel=0.07 if "nemotron" in f.card else 0.05), f.card
    assert len(seen) == 4


# -- the figures file -----------------------------------------------------------------------------


def test_every_figure_names_its_source_card_and_quote():
    sources = runtimes.load_sources()
    figures = load_figures()
    assert {f.runtime for f in figures} == set(FITTED_RUNTIMES)
    for f in figures:
        assert f.source in sources, f.label()
        assert f.quote, f.label()
        find_card(f.card)
        runtimes.runtime_quant(f.runtime, f.quant)
        if f.runtime == "llama.cpp":
            assert re.fullmatch(r"benches/[\w/-]+\.md:\d+", f.where), f.where
            assert f"{f.value:.2f}" in f.quote, f.label()
    counts = {rt: sum(1 for f in figures if f.runtime == rt) for rt in FITTED_RUNTIMES}
    assert counts == {"llama.cpp": 184, "sglang": 10, "trtllm": 10, "ollama": 12}


# -- what each source says ------------------------------------------------------------------------


def test_llama_cpp_gpt_oss_120b_tg32_matches_its_published_figure(stored, base):
    f = _figure("llama-cpp", card="gpt-oss-120b", tool="llama-bench", depth=0, metric="decode_tps")
    assert f.value == pytest.approx(58.72)
    value, _ = runtimes.predicted(f, apply_runtime("llama-cpp", base))
    assert value is not None
    assert abs(value / f.value - 1) <= stored["runtimes"]["llama.cpp"]["mean_error"]["decode"]


def test_trtllm_nvfp4_outruns_sglang_fp8_on_llama_8b_at_one_user(base):
    """NVIDIA's 38.65 t/s (TRT-LLM, NVFP4) against LMSYS's 20.5 (SGLang, FP8)."""
    trt = _figure("trtllm", card="llama-3.1-8b", metric="decode_tps")
    sgl = _figure("sglang", card="llama-3.1-8b", metric="decode_tps", concurrency=1)
    assert trt.value > sgl.value
    assert _decode("trtllm", "llama-3.1-8b", "nvfp4", base) > _decode("sglang", "llama-3.1-8b", "fp8", base)


def test_ollama_is_slower_than_llama_cpp_on_gpt_oss_120b(base):
    """Ollama's 41-42 t/s (three sources) against llama.cpp's 58.7: the HF
    layout (BF16 attention and unembedding) reads more bytes per token."""
    assert _decode("ollama", "gpt-oss-120b", "mxfp4", base) < _decode("llama-cpp", "gpt-oss-120b", "mxfp4", base)


def test_sglang_batch_32_scales_llama_8b_decode(base):
    """LMSYS: 20.5 t/s at batch 1, "scaling up linearly" to 368 at batch 32."""
    one = _decode("sglang", "llama-3.1-8b", "fp8", base, c=1, pp=2048, tg=256)
    many = _decode("sglang", "llama-3.1-8b", "fp8", base, c=32, pp=2048, tg=256)
    assert many > 10 * one


def test_trtllm_tensor_parallel_cuts_ttft_and_tpot_on_llama_70b(rows):
    """NVIDIA's Mar 2026 table: TTFT 33.4 / 21.4 / 15.6 s, TPOT 269 / 133 / 72 ms at TP 1 / 2 / 4."""
    for metric in ("ttft_s", "tpot_ms"):
        mine = sorted((r for r in rows["trtllm"] if r.figure.card == "llama-3.3-70b" and r.figure.metric == metric),
                      key=lambda r: r.figure.tp)
        assert [r.figure.tp for r in mine] == [1, 2, 4]
        published = [r.figure.value for r in mine]
        model = [r.predicted for r in mine]
        assert published == sorted(published, reverse=True)
        assert model == sorted(model, reverse=True), (metric, model)
