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

from sparktop import engine_ids
from sparktop.launch.plan import Endpoint, Home, HomeMount, Step, Wait
from sparktop.launch.runtimes.base import Runtime
from sparktop.layouts import Layout

if TYPE_CHECKING:
    from sparktop.launch.topology import Builder
    from sparktop.settings import Node

SSH_PORT = 2233  # the playbook's sshd in the workers' containers
# The node user's ~/.ssh, read-only inside every container of a multi-node launch (the playbook mounts it so).
SSH_MOUNT = Home("~/.ssh:/tmp/.ssh:ro")
# OpenSSH where the image lacks it (the playbook's entrypoint installs it the same way).
_OPENSSH = ("{ command -v sshd >/dev/null || test -x /usr/sbin/sshd || { apt-get update -qq && "
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client >/dev/null; }; }")
# A worker: host keys made in its container, the user's authorized keys let in, sshd in the foreground.
WORKER_SSHD = (f"{_OPENSSH} && mkdir -p /run/sshd /root/.ssh && ssh-keygen -A >/dev/null && "
               "cp /tmp/.ssh/authorized_keys /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys && "
               f"exec /usr/sbin/sshd -D -p {SSH_PORT}")
# The head: the user's keys (and known hosts) where ssh looks for them.
HEAD_SSH = (f"{_OPENSSH} && mkdir -p /root/.ssh && cp /tmp/.ssh/id_* /root/.ssh/ 2>/dev/null; "
            "cp /tmp/.ssh/known_hosts /root/.ssh/ 2>/dev/null; chmod 600 /root/.ssh/id_* 2>/dev/null; true")
# The workers' host keys are made when their containers start, so no known_hosts can hold them yet: each is
# trusted on first use for this launch only (kept apart from the user's known_hosts), and said so in the plan.
RSH_ARGS = f"-p {SSH_PORT} -o StrictHostKeyChecking=accept-new -o UserKnownHostsFile=/root/.ssh/known_hosts.sparktop"
METRICS_ON = {"return_perf_metrics": True, "enable_iter_perf_stats": True}


class TrtllmRuntime(Runtime):
    row = engine_ids.get("trtllm")
    options_file = True  # --extra_llm_api_options
    memory = "left"  # kv_cache_config.free_gpu_memory_fraction: of the memory the weights leave
    programs = ("trtllm-serve", "serve")
    model_first = True
    sparkrun_defaults: ClassVar[dict[str, str]] = {
        "max_batch_size": "max_batch_size", "max_num_tokens": "max_num_tokens", "max_seq_len": "max_seq_len",
        "max_model_len": "max_seq_len"}
    sparkrun_config: ClassVar[dict[str, tuple[str, str]]] = {
        "free_gpu_memory_fraction": ("kv_cache_config", "free_gpu_memory_fraction"),
        "kv_cache_dtype": ("kv_cache_config", "dtype"),
        "cuda_graph_padding": ("cuda_graph_config", "enable_padding"),
        "moe_backend": ("moe_config", "backend")}
    flag_sep = "_"
    reserved = frozenset({"host", "port", "tp_size", "tensor_parallel_size", "pp_size", "pipeline_parallel_size",
                          "ep_size", "moe_expert_parallel_size", "extra_llm_api_options", "config", "backend"})
    form_flags: ClassVar[dict[str, str | None]] = {
        "gpu_memory_utilization": "kv_cache_free_gpu_memory_fraction", "max_model_len": "max_seq_len",
        "max_num_seqs": "max_batch_size"}
    serving_names: ClassVar[dict[str, str]] = {
        "max_batch_size": "max_num_seqs", "max_num_tokens": "max_num_batched_tokens", "max_seq_len": "max_model_len",
        "kv_cache_free_gpu_memory_fraction": "kv_cache_free_fraction"}

    def listen_ports(self, layout: Layout, defaults: Any, head: bool) -> list[int]:
        return [] if head or not layout.spans_nodes else [SSH_PORT]  # the sshd mpirun reaches each worker by

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
        serve += [*self.flag_args(b.flags), *b.extra, "--extra_llm_api_options", options]
        mount = _mount(options)
        if k == 1:
            entry, args = serve[0], serve[1:]
        else:
            # As NVIDIA's playbook does: each worker's container runs sshd on 2233 and lets in the keys of the
            # node user's ~/.ssh (mounted read-only); the head's mpirun reaches them with the user's own key.
            for rank, node in enumerate(nodes[1:], 1):
                wname, wargv = b.docker_run(node, f"mpi{rank}{suffix}", {**b.env, **b.network_env(node, head)},
                                            "sh", ["-c", WORKER_SSHD], volumes=[SSH_MOUNT])
                b.steps.append(Step(node.name, wargv, f"start sshd for mpirun on {node.name} (port {SSH_PORT})",
                                    container=wname, wait=Wait("running", container=wname), role="worker"))
            hosts = ",".join(f"{b.peer_address(n)}:1" for n in nodes)
            forwarded = [a for name in b.secrets for a in ("-x", name)]
            mpirun = ["mpirun", "--allow-run-as-root", "-np", str(k), "-H", hosts, "-mca", "plm_rsh_args", RSH_ARGS,
                      *forwarded, "trtllm-llmapi-launch", *serve]
            entry, args = "sh", ["-c", HEAD_SSH + ' && exec "$@"', "sh", *mpirun]
        env = {**b.env, **(b.network_env(head, head) if k > 1 else {})}
        name, argv = b.docker_run(head, f"trtllm{suffix}", env, entry, args, endpoint=url, kind=self.id,
                                  volumes=[mount, *([SSH_MOUNT] if k > 1 else [])])
        b.steps.append(Step(head.name, argv, f"start trtllm-serve ({b.recipe.served_name}, {b.describe()}) on "
                                             f"{head.name}", container=name, wait=Wait("running", container=name),
                            role="engine"))
        # TensorRT-LLM lists the model by the name it was given: the recipe's model, not a served alias.
        endpoint = Endpoint(url, self.id, head.name, b.recipe.model, b.topology, name)
        b.endpoints.append(endpoint)
        return endpoint

    def served_name(self, b: Builder) -> str:
        return b.recipe.model

    def serving_flags(self, args: dict[str, Any]) -> dict[str, Any]:
        return super().serving_flags(args)


def _mount(path: Home) -> HomeMount:
    """`~/dir/file:~/dir/file:ro`, the options file at the same path inside."""
    return HomeMount(f"{path}:{path}:ro")
