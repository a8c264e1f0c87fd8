"""One engine table (`sparktop/engine_ids.py`): every name any layer accepted
for an engine still names it, every seam's engine is a row, and what the
seams say about an engine's identity is what its row says."""

from __future__ import annotations

import pytest

from sparktop import engine_ids
from sparktop.engine_ids import DEFAULT, GENERIC, ROUTER, ROWS, EngineId, UnknownEngine
from sparktop.launch.runtimes import RUNTIMES
from sparktop.observe import engines
from sparktop.observe.engines import ENGINES, by_id, for_command, for_image
from sparktop.twin.dialects import DIALECTS, dialect_for, speaks

# The alias maps each layer kept before the table (at f5119bf), written out so that a row losing a name fails here:
# launch/runtimes/__init__.ALIASES, twin/dialects/__init__.RUNTIME_ALIASES, model/runtimes.ALIASES, and the
# aliases of observe's engine classes. Each alias must name the engine its target names.
OLD_LAUNCH = {"vllm-distributed": "vllm", "vllm-ray": "vllm", "eugr-vllm": "vllm", "llama.cpp": "llama-cpp",
              "llamacpp": "llama-cpp", "llama_cpp": "llama-cpp", "tensorrt-llm": "trtllm", "trt-llm": "trtllm",
              "tensorrt_llm": "trtllm"}
OLD_TWIN = {"llama-cpp": "llama.cpp", "llamacpp": "llama.cpp", "llama_cpp": "llama.cpp", "tensorrt-llm": "trtllm",
            "trt-llm": "trtllm", "tensorrt_llm": "trtllm"}
OLD_MODEL = {"llama.cpp": "llama-cpp", "llamacpp": "llama-cpp", "llama_cpp": "llama-cpp", "llama-server": "llama-cpp",
             "tensorrt-llm": "trtllm", "tensorrt_llm": "trtllm", "trt-llm": "trtllm", "trt_llm": "trtllm",
             "text-generation-inference": "tgi"}
OLD_OBSERVE = {"llama-cpp": "llama.cpp", "llamacpp": "llama.cpp", "llama_cpp": "llama.cpp",
               "llama-server": "llama.cpp", "tensorrt-llm": "trtllm", "trt-llm": "trtllm", "tensorrt_llm": "trtllm",
               "trtllm-serve": "trtllm"}
# The ids each layer used (launch's runtime ids, observe's and the twin's engine ids, model's runtime ids).
OLD_IDS = {"vllm": "vllm", "sglang": "sglang", "llama-cpp": "llama.cpp", "llama.cpp": "llama.cpp", "trtllm": "trtllm",
           "ollama": "ollama", "tgi": "tgi", "router": "router", "openai": "openai"}


@pytest.mark.parametrize("old", [OLD_LAUNCH, OLD_TWIN, OLD_MODEL, OLD_OBSERVE], ids=["launch", "twin", "model",
                                                                                    "observe"])
def test_every_alias_any_layer_took_names_the_same_engine(old):
    for alias, target in old.items():
        assert engine_ids.runtime_id(alias) == engine_ids.runtime_id(target) == OLD_IDS[target], alias


def test_every_id_any_layer_used_resolves_and_llama_cpp_is_canonical():
    for old, canonical in OLD_IDS.items():
        assert engine_ids.runtime_id(old) == canonical
    assert engine_ids.runtime_id("llama-cpp") == "llama.cpp" and engine_ids.get("llama.cpp").sparkrun == "llama-cpp"


def test_the_live_alias_maps_agree_with_the_table():
    """While launch and model keep maps of their own, each alias resolves where the table says."""
    from sparktop.launch import runtimes as launch
    from sparktop.model import runtimes as model

    for table in (getattr(launch, "ALIASES", {}), getattr(model, "ALIASES", {})):
        for alias, target in table.items():
            assert engine_ids.runtime_id(alias) == engine_ids.runtime_id(target), alias


def test_names_are_unique_and_lookups_forgive_case_and_spaces():
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids))
    names = [n.lower() for r in ROWS for n in (r.id, *r.aliases)]
    assert len(names) == len(set(names))
    assert engine_ids.lookup("  LLAMA-CPP ") is engine_ids.get("llama.cpp")
    assert engine_ids.lookup("mlc") is None and engine_ids.lookup(None) is None and engine_ids.lookup("") is None
    with pytest.raises(UnknownEngine, match="mlc is not an engine sparktop knows"):
        engine_ids.get("mlc")


def test_a_name_given_twice_is_refused_when_the_table_is_built():
    rows = (EngineId("a", "A", aliases=("x",)), EngineId("b", "B", aliases=("X",)))
    with pytest.raises(AssertionError, match="'X' names both a and b"):
        engine_ids._index(rows)


def test_the_three_special_ids():
    assert [r.id for r in ROWS if r.router] == [ROUTER] and engine_ids.is_router(ROUTER)
    assert engine_ids.is_router("litellm") and not engine_ids.is_router("vllm") and not engine_ids.is_router(None)
    assert not engine_ids.is_router("something else")
    assert [r.id for r in ROWS if r.base_model] == [DEFAULT]
    assert ROWS[-1].id == GENERIC and ROWS[0].id == DEFAULT
    assert engine_ids.name_of(ROUTER) == "LiteLLM" and engine_ids.name_of("llama-cpp") == "llama.cpp"
    assert engine_ids.name_of("mlc") == "mlc" and engine_ids.name_of(None) == "engine"


def test_every_seams_engine_is_a_row():
    ids = {r.id for r in ROWS}
    assert {e.id for e in (*ENGINES, engines.GENERIC)} == ids  # observe knows every engine there is
    assert {r.engine for r in RUNTIMES.values()} <= ids
    assert set(DIALECTS) <= ids
    # observe's recognition order is the table's
    assert [e.id for e in ENGINES] == [r.id for r in ROWS if r.id != GENERIC]


def test_observe_reads_its_identity_from_the_row():
    for engine in (*ENGINES, engines.GENERIC):
        row = engine_ids.get(engine.id)
        assert engine.row is row
        assert (engine.name, engine.aliases, engine.default_port, engine.images, engine.router) == (
            row.name, row.aliases, row.default_port, row.images, row.router)
        assert (engine.names.prefix if engine.names is not None else None) == row.metric_prefix, engine.id
        for alias in row.aliases:
            assert by_id(alias) is engine and by_id(alias.upper()) is engine
    assert by_id("mlc") is None and engines.name_of("sglang") == "SGLang"


def test_a_metric_prefix_other_than_the_rows_is_refused():
    from sparktop.observe.engines.base import Engine
    from sparktop.observe.prometheus import MetricNames

    with pytest.raises(TypeError, match="its engine_ids row says 'sglang:'"):
        type("Wrong", (Engine,), {"row": engine_ids.get("sglang"), "names": MetricNames(prefix="vllm:")})


def test_each_rows_programs_and_default_image_are_recognised_as_it():
    for row in ROWS:
        for program in row.programs:
            found = for_command([f"/usr/bin/{program}", "serve", "some-model"])
            assert found is not None and found[0].id == row.id, program
        if row.default_image:
            found_image = for_image(row.default_image)
            assert found_image is not None and found_image.id == row.id, row.default_image


def test_launch_runtimes_name_the_rows_engine():
    for runtime in RUNTIMES.values():
        row = engine_ids.get(runtime.id)
        assert row.id == runtime.engine and row.name == runtime.name
        assert not runtime.default_image or row.default_image == runtime.default_image or row.id == DEFAULT


def test_twin_dialects_read_their_identity_from_the_row():
    for engine_id in DIALECTS:
        dialect = dialect_for(engine_id)
        row = engine_ids.get(engine_id)
        assert (type(dialect).row, dialect.id, dialect.name) == (row, row.id, row.name)
        for alias in row.aliases:
            assert speaks(alias) and dialect_for(alias).id == row.id
    assert not speaks("ollama") and not speaks("mlc")
    with pytest.raises(KeyError):
        dialect_for("ollama")
    assert [d for d in DIALECTS if dialect_for(d).sleep_mode] == [DEFAULT]


def test_process_titles_make_the_same_process_pattern():
    from sparktop.observe.host_probe import SERVER_ARG

    assert engines.PROCESS_TITLES == ("VLLM::",) and engines.title_pattern() == "^VLL[M]::"
    assert engines.process_pattern() + r"|^VLL[M]::|(^|/)sparkto[p]$" == SERVER_ARG  # as it was written out
