"""One engine table (`sparktop/engine_ids.py`): every name any layer accepted
for an engine still names it, every seam's engine is a row, and what the
seams say about an engine's identity is what its row says."""

from __future__ import annotations

import pytest

from sparktop import engine_ids
from sparktop.engine_ids import DEFAULT, GENERIC, HAPROXY, ROUTER, ROWS, EngineId, UnknownEngine
from sparktop.launch.runtimes import RUNTIMES
from sparktop.observe import engines
from sparktop.observe.engines import ENGINES, by_id, for_command, for_image
from sparktop.twin.dialects import DIALECTS, dialect_for, programs_of, speaks

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


def test_no_layer_keeps_an_alias_map_of_its_own():
    """launch, model and the twin read every name from the table: none keeps a map beside it."""
    from sparktop.launch import runtimes as launch
    from sparktop.model import runtimes as model
    from sparktop.twin import dialects

    assert not hasattr(launch, "ALIASES") and not hasattr(model, "ALIASES") and not hasattr(model, "NAMES")
    assert not hasattr(dialects, "RUNTIME_ALIASES")
    for old in (OLD_LAUNCH, OLD_MODEL):
        for alias in old:
            assert model.runtime_id(alias) == engine_ids.runtime_id(alias), alias


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


def test_the_three_special_ids_and_the_two_routers():
    assert [r.id for r in ROWS if r.router] == [ROUTER, HAPROXY] and engine_ids.is_router(ROUTER)
    assert engine_ids.is_router(HAPROXY) and engine_ids.name_of(HAPROXY) == "HAProxy"
    assert HAPROXY not in {r.id for r in engine_ids.KNOWN_ENGINES}  # a router, not an engine of its own
    assert engine_ids.is_router("litellm") and not engine_ids.is_router("vllm") and not engine_ids.is_router(None)
    assert not engine_ids.is_router("something else")
    assert [r.id for r in ROWS if r.base_model] == [DEFAULT]
    assert ROWS[-1].id == GENERIC and ROWS[0].id == DEFAULT
    assert engine_ids.name_of(ROUTER) == "LiteLLM" and engine_ids.name_of("llama-cpp") == "llama.cpp"
    assert engine_ids.name_of("mlc") == "mlc" and engine_ids.name_of(None) == "engine"


def test_every_seams_engine_is_a_row():
    ids = {r.id for r in ROWS}
    assert {e.id for e in (*ENGINES, engines.GENERIC)} == ids  # observe knows every engine there is
    assert set(RUNTIMES) <= ids and all(key == r.id for key, r in RUNTIMES.items())
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
        if row.default_image and row.images:  # HAProxy has none: only its launch's labels say it is a router
            found_image = for_image(row.default_image)
            assert found_image is not None and found_image.id == row.id, row.default_image


def test_launch_runtimes_read_their_identity_from_the_row():
    from sparktop.launch.runtimes import UnknownRuntime, runtime_id

    for runtime in RUNTIMES.values():
        row = engine_ids.get(runtime.id)
        assert type(runtime).row is row and not hasattr(runtime, "engine")
        assert (runtime.id, runtime.name, runtime.default_image) == (row.id, row.name, row.default_image)
        for alias in row.aliases:
            assert runtime_id(alias) == row.id and runtime_id(alias.upper()) == row.id
    assert runtime_id("llama-cpp") == "llama.cpp" and runtime_id(" LLAMA.CPP ") == "llama.cpp"
    with pytest.raises(UnknownRuntime, match=r"^tgi is not a runtime sparktop launches \(vllm, sglang, llama-cpp, "
                                             r"trtllm\)$"):
        runtime_id("tgi")
    with pytest.raises(UnknownRuntime, match="text-generation-inference is TGI, not a runtime sparktop launches"):
        runtime_id("text-generation-inference")
    with pytest.raises(UnknownRuntime, match="mlc is not a runtime sparktop launches"):
        runtime_id("mlc")


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
    # The programs it answers on a test host: its row's, then the helpers the registry lists beside it.
    for engine_id in DIALECTS:
        row, programs = engine_ids.get(engine_id), dialect_for(engine_id).programs
        assert programs[:len(row.programs)] == row.programs and programs == programs_of(engine_id)


def test_process_titles_make_the_same_process_pattern():
    from sparktop.observe.host_probe import SERVER_ARG

    assert engines.PROCESS_TITLES == ("VLLM::",) and engines.title_pattern() == "^VLL[M]::"
    assert engines.process_pattern() + r"|^VLL[M]::|(^|/)sparkto[p]$" == SERVER_ARG  # as it was written out


def test_inventory_images_are_keyed_by_engine_id_and_a_misspelt_key_is_an_error(tmp_path):
    from sparktop import settings
    from sparktop.errors import ConfigError

    path = tmp_path / "cluster.yaml"
    path.write_text("nodes: [spark-a]\ndefaults:\n  images:\n    llama-cpp: my/llama:1\n    trt-llm: my/trt:2\n")
    defaults = settings.load_inventory(path).defaults
    assert defaults.images == {"llama.cpp": "my/llama:1", "trtllm": "my/trt:2"}
    assert defaults.image_for("llama-cpp") == defaults.image_for("llama.cpp") == "my/llama:1"
    assert defaults.image_for("sglang") == engine_ids.get("sglang").default_image  # the row's where none is given
    assert defaults.image_for(DEFAULT) == defaults.image == engine_ids.get(DEFAULT).default_image
    path.write_text("nodes: [spark-a]\ndefaults:\n  images:\n    sglang: my/sglang:1\n    llamma-cpp: x\n")
    with pytest.raises(ConfigError) as info:
        settings.load_inventory(path)
    assert (info.value.line, info.value.key) == (5, "defaults.images.llamma-cpp")
    assert "names no engine sparktop knows (vllm, sglang, llama-cpp, trtllm)" in str(info.value)


def test_a_study_written_with_the_old_launch_id_resumes_under_the_engine_id():
    from sparktop.study.state import Study

    study = Study.from_dict({"id": "s", "recipe": "r", "model": "m", "levels": [1], "topologies": [
        {"name": "vLLM solo", "layout": "solo", "runtime": "vllm"},
        {"name": "llama.cpp solo", "layout": "solo", "runtime": "llama-cpp"}, {"name": "solo"}]})
    assert [t.runtime for t in study.topologies] == ["vllm", "llama.cpp", ""]


def test_a_stored_fit_written_under_the_old_model_id_reads_under_the_engine_id():
    from sparktop.model import runtimes

    old = {"runtimes": {"llama-cpp": {"factors": {"overhead": 2.0}},
                        "ollama": {"factors": {"overhead": 2.0}, "shared": {"overhead": "llama-cpp"}}}}
    assert runtimes._normalised(old)["runtimes"] == {
        "llama.cpp": {"factors": {"overhead": 2.0}},
        "ollama": {"factors": {"overhead": 2.0}, "shared": {"overhead": "llama.cpp"}}}
    assert "llama.cpp" in runtimes._stored()["runtimes"]


def test_a_runtimes_own_flags_key_in_another_runtimes_recipe_is_an_error(tmp_path):
    from sparktop.errors import ConfigError
    from sparktop.launch.catalog import load_recipe_file

    path = tmp_path / "r.yaml"
    path.write_text("name: r\nmodel: m\nruntime: sglang\ntopologies:\n  solo:\n    vllm: {max_num_seqs: 4}\n")
    with pytest.raises(ConfigError, match="topologies.solo.vllm: a sglang recipe gives its flags under args:"):
        load_recipe_file(path)
    path.write_text("name: r\nmodel: m\nruntime: llama-cpp\nvllm: {max_num_seqs: 4}\n")
    with pytest.raises(ConfigError, match="vllm: a llama.cpp recipe gives its flags under args:, in llama.cpp's"):
        load_recipe_file(path)
    path.write_text("name: r\nmodel: m\nvllm: {max_num_seqs: 4}\ntopologies:\n  solo:\n    vllm: {max_num_seqs: 8}\n")
    recipe = load_recipe_file(path)
    assert recipe.flags == {"max_num_seqs": 4} and recipe.topologies["solo"].flags == {"max_num_seqs": 8}


def test_spark_arena_files_carry_sparkruns_name_and_read_back_as_the_id():
    from sparktop.bench.arena import _engine_id, _sparkrun_name

    assert _sparkrun_name("llama.cpp") == _sparkrun_name("llama-cpp") == "llama-cpp"
    assert _sparkrun_name("vllm") == "vllm" and _sparkrun_name("mlc") == "mlc" and _sparkrun_name(None) is None
    assert _engine_id("llama-cpp") == "llama.cpp" and _engine_id("vllm-distributed") == "vllm"
    assert _engine_id("mlc") == "mlc" and _engine_id(None) is None
