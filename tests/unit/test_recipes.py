"""Recipes: the shipped ones, validation errors that name file, line and key,
and the community formats people already have."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparktop.errors import ConfigError
from sparktop.launch.catalog import discover, find_recipe, load_recipe_file
from sparktop.launch.recipe import flag_args

COMMUNITY = Path(__file__).resolve().parents[1] / "fixtures" / "community"
SHIPPED = ["gpt-oss-120b", "gemma4-26b-a4b", "nemotron-3-super-120b-a12b", "qwen3-235b-a22b",
           "nemotron-nano-9b-v2", "llama-3.1-8b", "llama-3.1-70b", "nemotron-super-49b-v1.5"]


def test_every_shipped_recipe_loads_with_no_errors():
    recipes, errors = discover()
    assert errors == []
    assert set(SHIPPED) <= set(recipes)
    for rid in SHIPPED:
        assert recipes[rid].twin_card() is not None, rid  # the twin and predictions know every one


def test_the_articles_settings_are_in_the_recipes():
    gpt = find_recipe("gpt-oss-120b")
    assert "--enforce-eager" not in flag_args(gpt.flags) and gpt.flags["max_cudagraph_capture_size"] >= 1024
    gemma = find_recipe("gemma4-26b-a4b")
    assert gemma.flags["attention_backend"] == "TRITON_ATTN" and gemma.flags["kv_cache_dtype"] == "fp8"
    assert gemma.settings("cluster-mp")[0]["max_model_len"] == 262144
    assert gemma.settings("solo")[0]["max_model_len"] == 131072
    nemo = find_recipe("nemotron-3-super-120b-a12b")
    assert nemo.env["VLLM_NVFP4_GEMM_BACKEND"] == "cutlass" and nemo.env["VLLM_USE_FLASHINFER_MOE_FP4"] == "0"
    assert nemo.settings("solo")[0]["max_num_seqs"] < nemo.settings("cluster-ray")[0].get("max_num_seqs", 256)
    qwen = find_recipe("qwen3-235b-a22b")
    assert qwen.allowed_topologies(2) == ["cluster-ray", "cluster-mp"] and qwen.flags["enable_expert_parallel"]
    assert find_recipe("nemotron-nano-9b-v2").allowed_topologies(2) == ["solo"]


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


BASE = "name: x\nmodel: org/model\n"


@pytest.mark.parametrize("body, line, message", [
    ("vllm:\n  gpu_memory_utilization: 1.7\n", 4,
     "vllm.gpu_memory_utilization: gpu_memory_utilization must be between 0 and 1, got 1.7"),
    ("modle: y\n", 3, "modle: unknown key; did you mean 'model'?"),
    ("vllm:\n  max_model_len: lots\n", 4, "vllm.max_model_len: must be a positive integer, got 'lots'"),
    ("vllm:\n  port: 9000\n", 4, "vllm.port: is set by sparktop from the topology"),
    ("env:\n  HF_TOKEN: hf_abc123\n", 4, "env.HF_TOKEN: looks like a secret"),
    ("runtime: llama-cpp\nargs:\n  api_key: sk-local-123\n", 5, "args.api_key: looks like a secret"),
    ("topologies:\n  clustr-mp: {}\n", 4, "topologies.clustr-mp: unknown key; did you mean 'cluster-mp'?"),
    ("limits:\n  solo_only: yes please\n", 4, "limits.solo_only: must be true or false"),
    ("port: 70000\n", 3, "port: must be between 1 and 65535, got 70000"),
])
def test_recipe_errors_name_file_line_and_key(tmp_path, body, line, message):
    path = write(tmp_path, BASE + body)
    with pytest.raises(ConfigError) as info:
        load_recipe_file(path)
    text = str(info.value)
    assert text.startswith(f"{path}:{line}: "), text
    assert message in text
    assert "\n" not in text


def test_missing_required_key(tmp_path):
    with pytest.raises(ConfigError, match="model: is required"):
        load_recipe_file(write(tmp_path, "name: x\n"))


def test_flags_render_as_vllm_expects():
    assert flag_args({"gpu_memory_utilization": 0.7, "enforce_eager": True, "trust_remote_code": False,
                      "speculative_config": {"method": "mtp", "num_speculative_tokens": 1},
                      "served_model_name": None}) == [
        "--gpu-memory-utilization", "0.7", "--enforce-eager",
        "--speculative-config", '{"method":"mtp","num_speculative_tokens":1}']


def test_eugrs_recipe_version_1():
    # eugr/spark-vllm-docker recipes/gemma4-26b-a4b.yaml, verbatim
    recipe = load_recipe_file(COMMUNITY / "eugr" / "gemma4-26b-a4b.yaml")
    assert (recipe.format, recipe.name, recipe.model, recipe.image) == (
        "eugr-v1", "Gemma4-26B-A4B", "google/gemma-4-26B-A4B-it", "vllm-thor-tf5")
    assert recipe.flags == {
        "max_model_len": 262144, "gpu_memory_utilization": 0.7, "load_format": "fastsafetensors",
        "enable_prefix_caching": True, "enable_auto_tool_choice": True, "tool_call_parser": "gemma4",
        "reasoning_parser": "gemma4", "quantization": "fp8", "kv_cache_dtype": "fp8",
        "max_num_batched_tokens": 8192}
    assert recipe.port == 8000
    assert "mods/fix-gemma4-tool-parser" in recipe.description  # not silently dropped
    assert recipe.allowed_topologies(2) == ["solo", "cluster-ray", "cluster-mp", "shuffle", "least-busy"]


def test_eugr_placeholder_without_a_default(tmp_path):
    path = write(tmp_path, 'recipe_version: "1"\nname: n\ncontainer: c\ndefaults: {port: 1}\ncommand: |\n'
                           '  vllm serve m \\\n    --port {port} \\\n    --max-model-len {ctx}\n')
    with pytest.raises(ConfigError) as info:
        load_recipe_file(path)
    assert str(info.value).startswith(f"{path}:8: command.{{ctx}}: placeholder has no value in defaults")


def test_sparkruns_version_2_recipes():
    # scitrera/sparkrun recipes, verbatim; no recipe_version means version 2
    small = load_recipe_file(COMMUNITY / "sparkrun" / "qwen3-1.7b-vllm.yaml")
    assert (small.format, small.model, small.image, small.served_name) == (
        "sparkrun-v2", "Qwen/Qwen3-1.7B", "scitrera/dgx-spark-vllm:0.16.0-t5", "qwen3-1.7b")
    assert small.flags == {"gpu_memory_utilization": 0.3, "reasoning_parser": "deepseek_r1", "trust_remote_code": True}
    assert small.params_b == 1.7 and small.bits == 16
    assert "solo" in small.allowed_topologies(2)
    big = load_recipe_file(COMMUNITY / "sparkrun" / "nemotron3-nano-30b-vllm.yaml")
    assert big.cluster_only and big.min_nodes == 2
    assert big.allowed_topologies(2) == ["cluster-ray", "cluster-mp"]
    assert big.flags["tool_call_parser"] == "qwen3_coder" and big.flags["max_model_len"] == 200000
    assert big.env == {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}


def test_sparkrun_env_reference_is_passed_by_name(tmp_path):
    path = write(tmp_path, "model: m\ncontainer: c\ncommand: vllm serve {model}\nenv:\n  HF_TOKEN: ${HF_TOKEN}\n")
    recipe = load_recipe_file(path)
    assert recipe.pass_env == ["HF_TOKEN"] and "HF_TOKEN" not in recipe.env


def test_a_users_folder_is_read_and_wins_on_a_name_clash(tmp_path):
    (tmp_path / "llama-3.1-8b.yaml").write_text("name: mine\nmodel: me/llama\n")
    (tmp_path / "broken.yaml").write_text("name: b\n")
    recipes, errors = discover([tmp_path])
    assert recipes["llama-3.1-8b"].model == "me/llama"
    assert any("broken.yaml" in e and "model: is required" in e for e in errors)


def test_find_recipe_by_path_and_did_you_mean(tmp_path):
    assert find_recipe(str(COMMUNITY / "eugr" / "gemma4-26b-a4b.yaml")).format == "eugr-v1"
    with pytest.raises(ConfigError, match="did you mean 'gpt-oss-120b'"):
        find_recipe("gpt-oss-12b")
