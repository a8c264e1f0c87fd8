"""vLLM: `vllm serve` in a container; over several nodes either with
`--nnodes/--node-rank` (PyTorch distributed, workers `--headless`) or over
Ray (a Ray head and workers, then `vllm serve` as the Ray driver on the
head, in the same container so its log is the container's log).

| layout       | what runs                                                             |
|--------------|-----------------------------------------------------------------------|
| solo         | one vLLM container on one node, TP=1                                  |
| tp=N         | workers: `vllm serve -tp N --nnodes N --node-rank R --headless`,      |
|              | then the head with `--node-rank 0` (no Ray)                           |
| tp=N,ray     | head: `ray start --head`, wait for the workers, `vllm serve -tp N     |
|              | --distributed-executor-backend ray`; workers: `ray start --address`   |
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any, ClassVar

from sparktop.launch.plan import Endpoint, Step, Wait, render
from sparktop.launch.runtimes.base import Runtime, number

if TYPE_CHECKING:
    from sparktop.launch.topology import Builder
    from sparktop.settings import Node

RESERVED = frozenset({
    "host", "port", "tensor_parallel_size", "tp", "distributed_executor_backend", "nnodes", "node_rank",
    "master_addr", "master_port", "headless", "model", "served_model_name", "data_parallel_size",
    "pipeline_parallel_size",
})

# sparkrun's built-in `defaults:` that are vLLM's flags (`SPARKRUN_SWITCHES`: switches), for its recipes
# without a command.
SPARKRUN_FLAGS = ("port", "host", "gpu_memory_utilization", "max_model_len", "max_num_batched_tokens",
                  "max_num_seqs", "served_model_name", "dtype", "quantization", "kv_cache_dtype")
SPARKRUN_SWITCHES = ("enforce_eager", "enable_prefix_caching", "trust_remote_code", "enable_auto_tool_choice")


class VllmRuntime(Runtime):
    flags_key = "vllm"  # its recipes' flags: `vllm:` (or `args:`)
    reserved = RESERVED
    serving_names: ClassVar[dict[str, str]] = {k: k for k in (
        "gpu_memory_utilization", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype",
        "enable_prefix_caching", "enforce_eager", "enable_chunked_prefill", "quantization", "moe_backend",
        "linear_backend", "async_scheduling")}
    router_provider = "hosted_vllm"
    ray = True
    # `vllm serve MODEL ...` or `python -m vllm.entrypoints.openai.api_server --model MODEL ...`
    programs = ("vllm", "serve", "python", "python3", "-m", "vllm.entrypoints.openai.api_server")
    model_first = True
    model_flags = ("model",)
    served_flags = ("served_model_name",)
    short_flags: ClassVar[dict[str, str]] = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size"}
    value_prefix = "--"
    verbatim = True

    def serving_flags(self, args: dict) -> dict:
        return dict(args)  # vLLM's own names

    def sparkrun_flags(self, defaults: dict[str, Any]) -> dict[str, Any]:
        """sparkrun's built-in `defaults:` -> flags table, for its vLLM recipes without a command."""
        flags = {k: number(defaults[k]) for k in SPARKRUN_FLAGS if k in defaults and k not in ("port", "host")}
        flags.update({k: True for k in SPARKRUN_SWITCHES if defaults.get(k) is True})
        return flags

    def serve_args(self, b: Builder, node: Node, extra: list[str]) -> list[str]:
        args = ["serve", b.recipe.model, "--served-model-name", b.recipe.served_name,
                "--host", node.bind, "--port", str(b.port)]
        return args + extra + self.flag_args(b.flags) + b.extra

    def engine_steps(self, b: Builder, nodes: list[Node], suffix: str) -> Endpoint:
        if len(nodes) == 1:
            return self.solo(b, nodes[0], f"vllm{suffix}")
        if b.layout.backend == "ray":
            return self.cluster_ray(b, nodes, suffix)
        return self.cluster_mp(b, nodes, suffix)

    def solo(self, b: Builder, node: Node, role: str = "vllm") -> Endpoint:
        url = b.url(node, b.port)
        name, argv = b.docker_run(node, role, b.env, "vllm", self.serve_args(b, node, []), endpoint=url,
                                  kind=self.id)
        b.steps.append(Step(node.name, argv, f"start vLLM ({b.recipe.served_name}, TP=1) on {node.name}",
                            container=name, wait=Wait("running", container=name), role="engine"))
        endpoint = Endpoint(url, self.id, node.name, b.recipe.served_name, "solo" if b.topology == "solo"
                            else b.topology, name)
        b.endpoints.append(endpoint)
        return endpoint

    def parallel_args(self, b: Builder) -> list[str]:
        """--tensor-parallel-size, --pipeline-parallel-size and expert parallel
        (unless the recipe already asks for it) for an engine over nodes."""
        flags = b.layout.vllm_flags()
        flags.pop("distributed-executor-backend", None)  # mp is vLLM's default; Ray is set where it runs
        if b.flags.get("enable_expert_parallel") or b.flags.get("enable-expert-parallel"):
            flags.pop("enable-expert-parallel", None)
        args: list[str] = []
        for flag, value in flags.items():
            args += [f"--{flag}"] if value is True else [f"--{flag}", str(value)]
        return args

    def cluster_mp(self, b: Builder, nodes: list[Node], suffix: str = "") -> Endpoint:
        head, workers = nodes[0], nodes[1:]
        k = len(nodes)
        dist = [*self.parallel_args(b), "--nnodes", str(k), "--master-addr", b.peer_address(head),
                "--master-port", str(b.inv.defaults.master_port)]
        # Workers first: the head waits for them at the master address.
        for rank, node in enumerate(workers, 1):
            args = ["serve", b.recipe.model, *dist, "--node-rank", str(rank), "--headless",
                    *self.flag_args(b.flags), *b.extra]
            name, argv = b.docker_run(node, f"worker{rank}{suffix}", {**b.env, **b.network_env(node, head)},
                                      "vllm", args)
            b.steps.append(Step(node.name, argv, f"start vLLM worker rank {rank} (headless) on {node.name}",
                                container=name, wait=Wait("running", container=name), role="worker"))
        url = b.url(head, b.port)
        args = self.serve_args(b, head, [*dist, "--node-rank", "0"])
        name, argv = b.docker_run(head, f"vllm{suffix}", {**b.env, **b.network_env(head, head)}, "vllm",
                                  args, endpoint=url, kind=self.id)
        b.steps.append(Step(head.name, argv, f"start vLLM head rank 0 ({b.describe()}, no Ray) on {head.name}",
                            container=name, role="engine"))
        endpoint = Endpoint(url, self.id, head.name, b.recipe.served_name, b.topology, name)
        b.endpoints.append(endpoint)
        return endpoint

    def cluster_ray(self, b: Builder, nodes: list[Node], suffix: str = "") -> Endpoint:
        head, workers = nodes[0], nodes[1:]
        k = len(nodes)
        ray_port = str(b.inv.defaults.ray_port)
        url = b.url(head, b.port)
        serve = ["vllm", *self.serve_args(b, head, [*self.parallel_args(b), "--distributed-executor-backend",
                                                    "ray"])]
        script = (
            f"ray start --head --port {shlex.quote(ray_port)} --node-ip-address {shlex.quote(b.peer_address(head))}"
            f" --disable-usage-stats && "
            f"until [ \"$(ray status 2>/dev/null | grep -c ' node_')\" -ge {k} ]; do "
            f"echo 'waiting for {k - 1} Ray worker node(s) to join'; sleep 2; done && "
            f"exec {render(serve)}"
        )
        # Ray's memory monitor kills workers on unified memory that looks full to it.
        ray_env = {"RAY_memory_monitor_refresh_ms": "0"}
        name, argv = b.docker_run(head, f"vllm{suffix}", {**b.env, **b.network_env(head, head), **ray_env},
                                  "sh", ["-c", script], endpoint=url, kind=self.id)
        b.steps.append(Step(head.name, argv, f"start the Ray head and vLLM ({b.describe()}, Ray) on {head.name}",
                            container=name, wait=Wait("running", container=name), role="ray-head"))
        for rank, node in enumerate(workers, 1):
            args = ["start", "--address", f"{b.peer_address(head)}:{ray_port}", "--node-ip-address",
                    b.peer_address(node), "--disable-usage-stats", "--block"]
            wname, wargv = b.docker_run(node, f"ray{rank}{suffix}",
                                        {**b.env, **b.network_env(node, head), **ray_env}, "ray", args)
            b.steps.append(Step(node.name, wargv, f"join {node.name} to the Ray cluster", container=wname,
                                wait=Wait("ray-nodes", container=name, count=rank + 1), role="ray-worker"))
        endpoint = Endpoint(url, self.id, head.name, b.recipe.served_name, b.topology, name)
        b.endpoints.append(endpoint)
        if b.layout.replicas == 1:  # replicas are waited for once they have all started (`router`)
            b.wait_for(endpoint)
        return endpoint
