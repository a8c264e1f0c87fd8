"""TensorRT-LLM: `trtllm-serve` in NVIDIA's container
(`nvcr.io/nvidia/tensorrt-llm/release`), PyTorch backend, with an options
file sparktop writes (`--extra_llm_api_options`): the recipe's `config:`
plus `return_perf_metrics: true` and `enable_iter_perf_stats: true`, without
which it exports no Prometheus metrics. Flags are TensorRT-LLM's own, with
underscores (`max_batch_size`, `kv_cache_free_gpu_memory_fraction`).

Over several nodes (NVIDIA's two-Spark playbook): every worker's container
runs sshd on port 2233, and the head runs `mpirun -np N -H head,worker ...
trtllm-llmapi-launch trtllm-serve --tp_size N`; mpirun reaches the workers'
containers over SSH, so their host keys must be known to the head's
container (the playbook's entrypoint sets that up; sparktop does not turn
host-key checking off).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import yaml

from sparktop.launch.plan import Endpoint, Home, Step, Wait
from sparktop.launch.runtimes.base import Runtime
from sparktop.layouts import Layout

if TYPE_CHECKING:
    from sparktop.launch.topology import Builder
    from sparktop.settings import Node

SSH_PORT = 2233  # the playbook's sshd in the workers' containers
METRICS_ON = {"return_perf_metrics": True, "enable_iter_perf_stats": True}


class TrtllmRuntime(Runtime):
    id = "trtllm"
    engine = "trtllm"
    name = "TensorRT-LLM"
    default_image = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc13"
    flag_sep = "_"
    reserved = frozenset({"host", "port", "tp_size", "tensor_parallel_size", "pp_size", "pipeline_parallel_size",
                          "ep_size", "moe_expert_parallel_size", "extra_llm_api_options", "config", "backend"})
    form_flags: ClassVar[dict[str, str | None]] = {
        "gpu_memory_utilization": "kv_cache_free_gpu_memory_fraction", "max_model_len": "max_seq_len",
        "max_num_seqs": "max_batch_size"}
    serving_names: ClassVar[dict[str, str]] = {
        "max_batch_size": "max_num_seqs", "max_num_tokens": "max_num_batched_tokens", "max_seq_len": "max_model_len",
        "kv_cache_free_gpu_memory_fraction": "kv_cache_free_fraction"}

    def why_not(self, layout: Layout) -> str | None:
        if layout.backend == "ray":
            return "TensorRT-LLM joins its nodes with mpirun, not Ray: drop ,ray"
        if layout.pp > 1:
            return "sparktop launches TensorRT-LLM tensor parallel over nodes (tp=N); pp is not offered"
        return None

    def options(self, b: Builder) -> str:
        """The options file: the recipe's `config`, and the metrics switched on."""
        config = dict(b.recipe.engine_config or {})
        config.update(METRICS_ON)
        return yaml.safe_dump(config, sort_keys=False)

    def engine_steps(self, b: Builder, nodes: list[Node], suffix: str) -> Endpoint:
        head = nodes[0]
        url = b.url(head, b.port)
        options = Home(f"{b.state_dir}/trtllm{suffix}.yaml")
        b.steps.append(Step(head.name, ["sh", "-c", f'mkdir -p "$1" && cat > "$1/trtllm{suffix}.yaml"', "sh",
                                        Home(b.state_dir)],
                            f"write TensorRT-LLM's options (metrics on) on {head.name}", stdin_text=self.options(b),
                            role="setup"))
        k = len(nodes)
        serve = ["trtllm-serve", b.recipe.model, "--host", head.bind, "--port", str(b.port), "--backend", "pytorch",
                 "--tp_size", str(b.layout.tp if k > 1 else 1)]
        if b.layout.ep and k > 1:
            serve += ["--ep_size", str(b.layout.tp)]
        serve += [*self.flag_args(b.vllm), *b.extra, "--extra_llm_api_options", options]
        mount = _mount(options)
        if k == 1:
            entry, args = serve[0], serve[1:]
        else:
            for rank, node in enumerate(nodes[1:], 1):
                wname, wargv = b.docker_run(node, f"mpi{rank}{suffix}", {**b.env, **b.network_env(node, head)},
                                            "sshd", ["-D", "-p", str(SSH_PORT)])
                b.steps.append(Step(node.name, wargv, f"start sshd for mpirun on {node.name} (port {SSH_PORT})",
                                    container=wname, wait=Wait("running", container=wname), role="worker"))
            hosts = ",".join(f"{b.peer_address(n)}:1" for n in nodes)
            forwarded = [a for name in b.secrets for a in ("-x", name)]
            entry, args = "mpirun", ["--allow-run-as-root", "-np", str(k), "-H", hosts, "-mca", "plm_rsh_args",
                                     f"-p {SSH_PORT}", *forwarded, "trtllm-llmapi-launch", *serve]
        env = {**b.env, **(b.network_env(head, head) if k > 1 else {})}
        name, argv = b.docker_run(head, f"trtllm{suffix}", env, entry, args, endpoint=url, kind=self.engine,
                                  volumes=[mount])
        b.steps.append(Step(head.name, argv, f"start trtllm-serve ({b.recipe.served_name}, {b.describe()}) on "
                                             f"{head.name}", container=name, wait=Wait("running", container=name),
                            role="engine"))
        # TensorRT-LLM lists the model by the name it was given: the recipe's model, not a served alias.
        endpoint = Endpoint(url, self.engine, head.name, b.recipe.model, b.topology, name)
        b.endpoints.append(endpoint)
        return endpoint

    def served_name(self, b: Builder) -> str:
        return b.recipe.model

    def serving_flags(self, args: dict[str, Any]) -> dict[str, Any]:
        return super().serving_flags(args)


def _mount(path: Home) -> Home:
    """`~/dir/file:~/dir/file:ro`, the options file at the same path inside."""
    from sparktop.launch.topology import _HomeMount

    return _HomeMount(f"{path}:{path}:ro")
