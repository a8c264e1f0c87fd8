"""Every runtime's plan, as it will run: SGLang over `--nnodes`, llama.cpp with
`rpc-server` on the workers and `--rpc` on the head, TensorRT-LLM under
`mpirun` with its metrics turned on; recipes in each runtime's own flags
(sparktop's format and sparkrun's v2, read as they are: the files under
tests/fixtures/community/sparkrun/, sources in tests/fixtures/SOURCES.md);
what a runtime cannot do refused in a line."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from sparktop.errors import ConfigError
from sparktop.launch.catalog import find_recipe, load_recipe_file
from sparktop.launch.topology import PlanError, make_plan
from sparktop.layouts import parse_layout
from sparktop.settings import Inventory, Node

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "community" / "sparkrun"


def inventory(n: int = 2) -> Inventory:
    return Inventory(nodes=[Node(f"spark-{c}", host=f"spark-{c}", fabric_ip=f"10.0.0.{i + 1}", eth_if="enp1s0f1np1",
                                 ib_if=["rocep1s0f1"]) for i, c in enumerate("abcd"[:n])])


def argv_of(step) -> list[str]:
    return shlex.split(step.command)


def engine_args(step) -> list[str]:
    """The container's command after its image."""
    argv = argv_of(step)
    i = argv.index("--entrypoint")
    return argv[i + 1:i + 2] + argv[i + 3:]


def test_llama_cpp_over_two_nodes_runs_an_rpc_server_first_and_names_it_with_rpc():
    plan = make_plan(find_recipe("gpt-oss-120b-llama-cpp"), "pp=2", inventory())
    worker, head = [s for s in plan.steps if s.container]
    assert (worker.node, head.node) == ("spark-b", "spark-a")
    assert engine_args(worker) == ["rpc-server", "-H", "10.0.0.2", "-p", "50052"]  # on the image's PATH
    args = engine_args(head)
    assert args[0] == "llama-server" and args[args.index("--rpc") + 1] == "10.0.0.2:50052"
    assert args[args.index("-hf") + 1] == "ggml-org/gpt-oss-120b-GGUF" and "--metrics" in args
    assert args[args.index("--alias") + 1] == "gpt-oss-120b"
    assert "LLAMA_CACHE=/root/.cache/huggingface/llama.cpp" in head.command  # -hf downloads land in the HF cache
    (endpoint,) = plan.endpoints
    assert (endpoint.kind, endpoint.topology, plan.runtime) == ("llama.cpp", "pp=2", "llama.cpp")


def test_llama_cpp_refuses_tensor_parallel_across_nodes_and_says_what_it_does_instead():
    with pytest.raises(PlanError, match=r"llama.cpp spreads a model over nodes by its layers \(rpc-server\): "
                                        r"use pp=2 instead of tp=2"):
        make_plan(find_recipe("gpt-oss-120b-llama-cpp"), "cluster-mp", inventory())


def test_sglang_over_two_nodes_gives_every_rank_the_init_address_and_metrics_on():
    plan = make_plan(find_recipe("gpt-oss-120b-sglang"), "tp=2", inventory())
    worker, head = [s for s in plan.steps if s.container]
    for step, rank in ((worker, "1"), (head, "0")):
        args = engine_args(step)
        assert args[:3] == ["python3", "-m", "sglang.launch_server"]
        assert args[args.index("--dist-init-addr") + 1] == "10.0.0.1:29501"
        assert (args[args.index("--node-rank") + 1], args[args.index("--nnodes") + 1]) == (rank, "2")
        assert args[args.index("--tp-size") + 1] == "2" and "--enable-metrics" in args
        assert args[args.index("--mem-fraction-static") + 1] == "0.7"  # the recipe's own flag, as SGLang spells it
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1" in head.command
    with pytest.raises(PlanError, match="SGLang joins its nodes itself"):
        make_plan(find_recipe("gpt-oss-120b-sglang"), "tp=2,ray", inventory())


def test_tensorrt_llm_writes_its_options_with_metrics_on_and_runs_under_mpirun_over_nodes():
    plan = make_plan(find_recipe("gpt-oss-120b-trtllm"), "tp=2", inventory())
    (options,) = [s for s in plan.steps if s.stdin_text]
    assert "return_perf_metrics: true" in options.stdin_text and "enable_iter_perf_stats: true" in options.stdin_text
    assert "free_gpu_memory_fraction: 0.9" in options.stdin_text  # the recipe's config kept
    worker, head = [s for s in plan.steps if s.container]
    # The worker's container runs sshd on 2233 for mpirun (OpenSSH installed if the image lacks it, host keys
    # made inside, the node user's authorized keys let in, as NVIDIA's playbook does), ~/.ssh mounted read-only.
    script = engine_args(worker)
    assert script[:2] == ["sh", "-c"] and script[2].endswith("exec /usr/sbin/sshd -D -p 2233")
    assert "cp /tmp/.ssh/authorized_keys /root/.ssh/authorized_keys" in script[2]
    assert '"$HOME"/.ssh:/tmp/.ssh:ro' in worker.command
    wrapper = engine_args(head)
    assert wrapper[:2] == ["sh", "-c"] and wrapper[2].endswith('exec "$@"') and wrapper[3] == "sh"
    args = wrapper[4:]
    assert args[:2] == ["mpirun", "--allow-run-as-root"]
    # Each worker's fresh host key is trusted on first use, for this launch only, and the plan says so.
    rsh = args[args.index("plm_rsh_args") + 1]
    assert "-p 2233" in rsh and "StrictHostKeyChecking=accept-new" in rsh and "known_hosts.sparktop" in rsh
    assert args[args.index("-H") + 1] == "10.0.0.1:1,10.0.0.2:1"
    serve = args[args.index("trtllm-llmapi-launch") + 1:]
    assert serve[:2] == ["trtllm-serve", "openai/gpt-oss-120b"]
    assert serve[serve.index("--tp_size") + 1] == "2" and serve[serve.index("--max_batch_size") + 1] == "64"
    assert serve[serve.index("--extra_llm_api_options") + 1].endswith("/trtllm.yaml")
    solo = make_plan(find_recipe("gpt-oss-120b-trtllm"), "solo", inventory())
    assert engine_args([s for s in solo.steps if s.container][0])[0] == "trtllm-serve"


def test_replicas_of_any_runtime_sit_behind_the_router_with_the_right_provider():
    plan = make_plan(find_recipe("llama-3.1-8b-sglang"), "shuffle", inventory())
    (config,) = [s for s in plan.steps if s.stdin_text and "model_list" in s.stdin_text]
    assert "model: openai/llama-3.1-8b" in config.stdin_text  # not hosted_vllm/: this is no vLLM
    kinds = [e.kind for e in plan.endpoints]
    assert kinds == ["sglang", "sglang", "router"]


def test_sparkrun_recipes_of_every_runtime_are_read_as_they_are():
    sglang = load_recipe_file(FIX / "qwen3-1.7b-sglang.yaml")
    assert (sglang.runtime, sglang.served_name) == ("sglang", "qwen3-1.7b")
    assert sglang.flags == {"mem_fraction_static": 0.3, "reasoning_parser": "deepseek-r1", "trust_remote_code": True}
    llama = load_recipe_file(FIX / "qwen3-1.7b-llama-cpp.yaml")
    assert (llama.runtime, llama.model, llama.solo_only) == ("llama.cpp", "Qwen/Qwen3-1.7B-GGUF:Q8_0", True)
    assert llama.flags["ctx_size"] == 8192 and llama.flags["flash_attn"] == "on"
    big = load_recipe_file(FIX / "qwen3.5-397b-gguf-q3km-llama-cpp.yaml")
    assert big.cluster_only and big.why_not_layout(parse_layout("pp=2"), 2) is None
    plan = make_plan(big, "pp=2", inventory())
    head = [s for s in plan.steps if s.container][-1]
    assert "-hf" in engine_args(head) and "--split-mode" in engine_args(head)
    trt = load_recipe_file(FIX / "trtllm-docs-example-extra-config.yaml")
    assert trt.runtime == "trtllm"
    assert trt.engine_config == {"kv_cache_config": {"free_gpu_memory_fraction": 0.85, "dtype": "fp8_e5m2"},
                                 "cuda_graph_config": {"enable_padding": True}, "moe_config": {"backend": "cutlass"}}


@pytest.mark.parametrize(("text", "key", "message"), [
    ("runtime: tgi\n", "runtime", "tgi is not a runtime sparktop launches (vllm, sglang, llama-cpp, trtllm)"),
    ("runtime: sglang\nvllm: {max_num_seqs: 8}\n", "vllm", "a sglang recipe gives its flags under args:"),
    ("runtime: sglang\nargs: {tp_size: 2}\n", "args.tp_size", "is set by sparktop from the topology"),
    ("runtime: llama-cpp\nargs: {rpc: a:1}\n", "args.rpc", "is set by sparktop from the topology"),
    ("runtime: sglang\nargs: {mem_fraction_static: 1.5}\n", "args.mem_fraction_static", "between 0 and 1"),
    ("runtime: vllm\nconfig: {a: 1}\n", "config", "is an options file (TensorRT-LLM's); this recipe's runtime, vllm"),
])
def test_a_recipe_of_a_runtime_is_checked_in_that_runtimes_terms(tmp_path, text, key, message):
    path = tmp_path / "r.yaml"
    path.write_text("name: r\nmodel: org/m\n" + text)
    with pytest.raises(ConfigError) as raised:
        load_recipe_file(path)
    assert raised.value.key == key and message in str(raised.value)
    assert str(path) in str(raised.value)


def test_study_overrides_are_spoken_in_each_runtimes_own_flags():
    """`sparktop study gpt-oss-120b --runtimes vllm,sglang,llama-cpp --set ...`: the launcher's settings reach
    each runtime in its own flag; a flag of one runtime alone is refused in a line, not passed to the others
    (llama-server would refuse --gpu-memory-utilization and the study would fail at every launch)."""
    from sparktop.errors import SparktopError
    from sparktop.launch.session import overrides_for

    asked = {"max_model_len": 32768, "max_num_seqs": 8}
    assert overrides_for(asked, "vllm", "vllm") == asked
    assert overrides_for(asked, "vllm", "llama-cpp") == {"ctx_size": 32768, "parallel": 8}
    assert overrides_for({"gpu_memory_utilization": 0.8}, "vllm", "sglang") == {"mem_fraction_static": 0.8}
    with pytest.raises(SparktopError, match=r"^--set gpu_memory_utilization: llama.cpp has no such setting"):
        overrides_for({"gpu_memory_utilization": 0.8}, "vllm", "llama-cpp")
    with pytest.raises(SparktopError, match=r"^--set enforce_eager: SGLang has no such setting"):
        overrides_for({"enforce_eager": True}, "vllm", "sglang")


def test_llama_servers_short_flags_in_a_sparkrun_recipe_become_its_long_flags(tmp_path):
    """`llama-server -hf M -ngl 99 -c 8192 -fa on -np 2` as people write it: read as ctx_size, parallel ...,
    launched as llama-server's own long flags (it has no `--c` or `--np`)."""
    path = tmp_path / "tiny-llama-cpp.yaml"
    path.write_text("model: Qwen/Qwen3-1.7B-GGUF:Q8_0\nruntime: llama-cpp\n"
                    "container: scitrera/dgx-spark-llama-cpp:b8094\ndefaults:\n  port: 8000\n  host: 0.0.0.0\n"
                    "command: llama-server -hf {model} --host {host} --port {port} -ngl 99 -c 8192 -fa on -np 2\n")
    recipe = load_recipe_file(path)
    assert recipe.flags == {"n_gpu_layers": 99, "ctx_size": 8192, "flash_attn": "on", "parallel": 2}
    args = engine_args([s for s in make_plan(recipe, "solo", inventory()).steps if s.container][-1])
    for flag, value in (("--n-gpu-layers", "99"), ("--ctx-size", "8192"), ("--flash-attn", "on"), ("--parallel", "2")):
        assert args[args.index(flag) + 1] == value
    assert not {"--c", "--np", "--ngl", "--fa"} & set(args)
    assert recipe.serving("solo", {}).max_num_seqs == 2  # the performance model reads its slots


@pytest.mark.parametrize("recipe, layout, nodes", [
    ("gpt-oss-120b", "solo", 1), ("gpt-oss-120b", "cluster-mp", 2), ("gpt-oss-120b", "cluster-ray", 2),
    ("gpt-oss-120b", "2x tp=2", 4), ("gpt-oss-120b-sglang", "tp=2", 2), ("gpt-oss-120b-llama-cpp", "pp=2", 2),
    ("gpt-oss-120b-trtllm", "tp=2", 2),
])
def test_each_endpoint_names_the_containers_of_its_engine_in_the_order_the_plan_starts_them(recipe, layout, nodes):
    """What the watchdog restarts for an engine (`Endpoint.members`): every container of that engine and no
    other's (a replica's its own, the router its own), each once, in the order of the plan's steps (vLLM's
    headless workers before the head that waits for them, a Ray head before the workers that join it)."""
    plan = make_plan(find_recipe(recipe), layout, inventory(nodes))
    started = [(s.node, s.container) for s in plan.steps if s.container and s.argv]
    members = [m for e in plan.endpoints for m in e.members]
    assert sorted(members) == sorted(started) and len(set(members)) == len(members)
    for e in plan.endpoints:
        assert e.members == [m for m in started if m in e.members]  # the plan's order
        assert (e.node, e.container) in e.members  # its own container among them
    engine = plan.endpoints[0]
    roles = {s.container: s.role for s in plan.steps if s.container}
    if layout == "cluster-mp":
        assert [roles[c] for _, c in engine.members] == ["worker", "engine"]
    if layout == "cluster-ray":
        assert [roles[c] for _, c in engine.members] == ["ray-head", "ray-worker"]
