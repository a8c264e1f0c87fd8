"""Topologies: how a recipe is laid out on the nodes, as a launch plan.

A layout (`layouts.py`) is replicas of one engine, each over some nodes;
each engine is started in its runtime's own commands (`launch/runtimes/`:
vLLM, SGLang, llama.cpp, TensorRT-LLM), and replicas sit behind a router on
the head: HAProxy `leastconn` (the default, `launch/haproxy.py`) or, where
the layout names one of its strategies (`shuffle`, `least-busy`), the
LiteLLM proxy; with `litellm`, both: LiteLLM in front (the endpoint clients
use, its features), HAProxy behind it on the next port splitting the
replicas. With vLLM:

| topology    | what runs                                                            |
|-------------|----------------------------------------------------------------------|
| solo        | one vLLM container on one node, TP=1                                 |
| cluster-ray | head container: `ray start --head`, wait for the worker, then        |
|             | `vllm serve -tp 2 --distributed-executor-backend ray`;               |
|             | worker container: `ray start --address HEAD --block`                 |
| cluster-mp  | worker: `vllm serve -tp 2 --nnodes 2 --node-rank 1 --headless`,      |
|             | then head: the same with `--node-rank 0` (PyTorch distributed)       |
| 2x solo     | solo on each node + HAProxy on the head, balance leastconn           |
| shuffle     | solo on each node + a LiteLLM proxy on the head, simple-shuffle      |
| least-busy  | the same with routing_strategy least-busy                            |

Every container runs with the flags a Spark needs (`--gpus all --ipc=host
--network host`, memlock and stack ulimits, the HF cache mounted) and is
labelled `sparktop.launch=<id>` so `stop` can find it even without the
state file. Cluster containers get the per-node network environment:
VLLM_HOST_IP, NCCL/GLOO/TP socket interfaces and the RoCE HCAs, from the
inventory (`fabric_ip`, `eth_if`, `ib_if`) or, where it gives none, from what
preflight detected (`make_plan(..., fabric=preflight.fabric)`); a detected
address is used between the nodes only (rendezvous, NCCL), the endpoints
keep the address sparktop reaches the node by. Secrets go through
`--env-file` (written 0600 from standard input), never `-e K=V`.
"""

from __future__ import annotations

import hashlib
import os
import time

import yaml

from sparktop.engine_ids import HAPROXY, ROUTER, is_router
from sparktop.errors import SparktopError
from sparktop.launch.haproxy import CONFIG as HAPROXY_CONFIG
from sparktop.launch.haproxy import haproxy_config
from sparktop.launch.plan import Endpoint, Home, HomeMount, Plan, Step, Wait
from sparktop.launch.recipe import Recipe
from sparktop.launch.runtimes import runtime_for
from sparktop.layouts import ALIASES, CHAINED, LayoutError, parse_layout, to_label
from sparktop.model.routers import litellm_strategy, router_for
from sparktop.observe.fabric import Fabric
from sparktop.settings import Inventory, Node

# The router's API key, by name: LiteLLM's master key, and the variable HAProxy's config reads it from too.
ROUTER_KEY_ENV = "LITELLM_MASTER_KEY"
SECRET_ENV = ("HF_TOKEN",)  # passed by name when set in the launching environment


class PlanError(SparktopError):
    pass


def launch_id(recipe: Recipe, topology: str, nodes: list[str], port: int) -> str:
    digest = hashlib.blake2b(f"{recipe.id}|{topology}|{','.join(nodes)}|{port}|{time.time()}".encode(),
                             digest_size=3).hexdigest()
    try:
        slug = parse_layout(topology).slug  # "tp=2,pp=2" cannot stand in a container's name
    except LayoutError:
        slug = topology
    return f"{recipe.id}-{slug}-{digest}"


def _network_env(fabric: Fabric, address: str, head_address: str) -> dict[str, str]:
    """What NCCL, Gloo, UCX and vLLM need to use the fast link on this node
    (as in NVIDIA's two-Spark playbook)."""
    env = {"VLLM_HOST_IP": address, "MASTER_ADDR": head_address}
    if fabric.eth_if:
        eth = fabric.eth_if
        env.update(NCCL_SOCKET_IFNAME=eth, GLOO_SOCKET_IFNAME=eth, TP_SOCKET_IFNAME=eth, UCX_NET_DEVICES=eth,
                   OMPI_MCA_btl_tcp_if_include=eth)
    if fabric.ib_if:
        env.update(NCCL_IB_HCA=",".join(fabric.ib_if), NCCL_IB_DISABLE="0")
    return env


class Builder:
    def __init__(self, recipe: Recipe, topology: str, inventory: Inventory, nodes: list[Node],
                 overrides: dict | None = None, port: int | None = None, lid: str | None = None,
                 fabric: dict[str, Fabric] | None = None):
        self.recipe = recipe
        self.runtime = runtime_for(recipe.runtime)  # how each engine of the layout is started
        self.detected = dict(fabric or {})  # node -> what preflight found where the inventory gives nothing
        self.layout = parse_layout(topology)
        self.topology = self.layout.name  # the alias of a two-node layout, else its spelling
        self.written = topology  # as it was asked for: does it name its router?
        self.inv = inventory
        self.nodes = nodes
        flags, extra, env, image, recipe_port = recipe.settings(topology)
        flags.update(overrides or {})
        self.flags, self.extra, self.env = flags, extra, env
        # The inventory's image is vLLM's unless it says otherwise: another runtime takes its own by default.
        self.image = image or inventory.defaults.image_for(self.runtime.id)
        self.port = port or recipe_port or inventory.defaults.port
        self.lid = lid or launch_id(recipe, topology, [n.name for n in nodes], self.port)
        self.state_dir = f"~/.local/state/sparktop/launches/{self.lid}"
        # Engines get HF_TOKEN and what the recipe passes by name; the router
        # alone gets its master key (a file of its own on the head).
        self.secrets = list(dict.fromkeys(n for n in (*SECRET_ENV, *recipe.pass_env) if os.environ.get(n)))
        self.router_secrets = [ROUTER_KEY_ENV] if self.layout.router else []
        self.steps: list[Step] = []
        self.endpoints: list[Endpoint] = []
        self.containers: dict[str, list[str]] = {}
        self.overrides = dict(overrides or {})
        self._predicted_labels: list[str] | None = None

    # -- pieces ------------------------------------------------------------------

    @property
    def secrets_file(self) -> Home:
        return Home(f"{self.state_dir}/secrets.env")

    @property
    def router_secrets_file(self) -> Home:
        return Home(f"{self.state_dir}/router.env")

    def name(self, role: str) -> str:
        return f"sparktop-{self.lid}-{role}"

    def url(self, node: Node, port: int) -> str:
        return f"http://{node.address}:{port}"

    def fabric(self, node: Node) -> Fabric:
        """This node's fabric: the inventory's values, else what preflight detected."""
        found = self.detected.get(node.name, Fabric())
        return Fabric(node.eth_if or found.eth_if, node.fabric_ip or found.ip, tuple(node.ib_if) or found.ib_if,
                      found.mtu)

    def peer_address(self, node: Node) -> str:
        """The address the other nodes reach this one at (rendezvous, Ray, NCCL)."""
        return self.fabric(node).ip or node.address

    def network_env(self, node: Node, head: Node) -> dict[str, str]:
        return _network_env(self.fabric(node), self.peer_address(node), self.peer_address(head))

    def fabric_notes(self) -> list[str]:
        if not self.layout.spans_nodes:
            return []
        notes = []
        for n in self.nodes:
            found = self.detected.get(n.name) or Fabric()
            if (found.eth_if and not n.eth_if) or (found.ip and not n.fabric_ip) or (found.ib_if and not n.ib_if):
                f = self.fabric(n)
                notes.append(f"fabric on {n.name}: {f.eth_if or '?'} {f.ip or n.address}"
                             + (f", RoCE {','.join(f.ib_if)}" if f.ib_if else "") + (f", MTU {f.mtu}" if f.mtu else "")
                             + " (what the inventory does not give was detected by preflight)")
            elif not (n.eth_if and n.fabric_ip):
                missing = " and ".join(k for k, v in (("eth_if", n.eth_if), ("fabric_ip", n.fabric_ip)) if not v)
                notes.append(f"fabric on {n.name}: detected at launch (the inventory gives no {missing}): "
                             "preflight finds its ConnectX-7 port that is up, the port's address and RoCE devices, "
                             "checks the nodes reach each other over it, and the launch uses them in place of "
                             f"{n.address!r} below" + ("" if n.eth_if else
                                                       " and adds the NCCL, Gloo and UCX interface settings"))
        return notes

    def labels(self, role: str, endpoint: str | None = None, kind: str | None = None) -> list[str]:
        # kind: what answers at the endpoint (its `engine_ids` id; ROUTER for the router), given with it
        out = ["--label", f"sparktop.launch={self.lid}", "--label", f"sparktop.recipe={self.recipe.id}",
               "--label", f"sparktop.topology={to_label(self.topology)}", "--label", f"sparktop.role={role}",
               "--label", f"sparktop.model={self.recipe.served_name}"]
        if endpoint:
            if kind is None:
                raise ValueError(f"{role}: a container with an endpoint is labelled with its kind")
            out += ["--label", f"sparktop.endpoint={endpoint}", "--label", f"sparktop.kind={kind}"]
        if not is_router(kind):
            out += self.predicted_labels()
        return out

    def predicted_labels(self) -> list[str]:
        """The card, its format and the vLLM stack the engine is predicted with (`launch.prediction`): a twin
        started from the plan reads them and serves that prediction."""
        if self._predicted_labels is None:
            import dataclasses

            from sparktop.launch.prediction import labels_for, subject_for_recipe

            try:
                subject = subject_for_recipe(self.recipe, self.inv, self.overrides)
            except SparktopError:  # no card for the model: nothing to predict with
                self._predicted_labels = []
            else:
                subject = dataclasses.replace(subject, image=self.image)
                self._predicted_labels = [item for key, value in labels_for(subject, self.topology).items()
                                          for item in ("--label", f"{key}={value}")]
        return self._predicted_labels

    def docker_run(self, node: Node, role: str, env: dict[str, str], entrypoint: str, args: list,
                   endpoint: str | None = None, kind: str | None = None, gpu: bool = True,
                   volumes: list | None = None, image: str | None = None,
                   env_file: Home | None = None) -> tuple[str, list]:
        name = self.name(role)
        argv: list = ["docker", "run", "-d", "--name", name, *self.labels(role, endpoint, kind), "--network", "host"]
        if gpu:
            argv += ["--gpus", "all", "--ipc=host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
                     "-v", Home(f"{self.inv.defaults.hf_cache}:/root/.cache/huggingface")
                     if self.inv.defaults.hf_cache.startswith("~/") else
                     f"{self.inv.defaults.hf_cache}:/root/.cache/huggingface"]
        for volume in volumes or []:
            argv += ["-v", volume]
        if env_file is not None:
            argv += ["--env-file", env_file]
        elif gpu and self.secrets:
            argv += ["--env-file", self.secrets_file]
        for key, value in {**self.inv.defaults.container_env, **env}.items():
            argv += ["-e", f"{key}={value}"]
        argv += ["--entrypoint", entrypoint, image or self.image, *args]
        self.containers.setdefault(node.name, []).append(name)
        return name, argv

    def write_secrets(self, node: Node, names: list[str], file: str = "secrets.env") -> None:
        if not names:
            return
        argv = ["sh", "-c", f'umask 077 && mkdir -p "$1" && cat > "$1/{file}"', "sh", Home(self.state_dir)]
        self.steps.append(Step(node.name, argv, f"write {file} ({', '.join(names)}) on {node.name}",
                               stdin_secrets=list(names), role="setup"))

    def wait_ready(self, endpoint: Endpoint, key_env: str | None = None) -> None:
        """Readiness: /health and the model in /v1/models (the last step waits on it).
        A Ray engine has a step of its own for that already (its head starts
        vLLM only once every worker has joined)."""
        if any(s.role == "wait" and s.wait.url == endpoint.url for s in self.steps):
            return
        step = next(s for s in reversed(self.steps) if s.container == endpoint.container)
        step.wait = Wait("http", container=endpoint.container, url=endpoint.url, model=endpoint.model,
                         api_key_env=key_env)

    def build(self) -> Plan:
        head = self.nodes[0]
        for node in self.nodes:
            self.write_secrets(node, self.secrets)
        self.write_secrets(head, self.router_secrets, "router.env")
        groups = self.layout.engines([n.name for n in self.nodes])
        by_name = {n.name: n for n in self.nodes}
        engines = []
        for group in groups:
            nodes = [by_name[name] for name in group]
            # Replicas tell their containers apart by their head's name; one engine keeps the plain roles.
            suffix = f"-{nodes[0].name}" if self.layout.replicas > 1 else ""
            before = len(self.steps)
            endpoint = self.runtime.engine_steps(self, nodes, suffix)
            endpoint.members = self.started_by(self.steps[before:])
            engines.append(endpoint)
        notes = []
        if self.layout.router:
            notes.append(self.router(engines))
        else:
            self.wait_ready(engines[0])
        notes += self.fabric_notes()
        return Plan(self.lid, self.recipe.id, self.recipe.name, self.topology, [n.name for n in self.nodes],
                    self.steps, self.endpoints, self.containers, self.secrets + self.router_secrets, self.state_dir,
                    flags=dict(self.flags), image=self.image, notes=notes, runtime=self.runtime.id)

    @staticmethod
    def started_by(steps: list[Step]) -> list[tuple[str, str]]:
        """The containers these steps start, (node, name), in their order."""
        return list(dict.fromkeys((s.node, s.container) for s in steps if s.container and s.argv))

    def describe(self) -> str:
        """"TP=2" (the two-node names), "TP=2 x PP=2", "TP=4, expert parallel"."""
        parts = [f"TP={self.layout.tp}"] + ([f"PP={self.layout.pp}"] if self.layout.pp > 1 else [])
        text = " x ".join(parts)
        return text + (", expert parallel" if self.layout.ep else "")

    def wait_for(self, endpoint: Endpoint) -> None:
        """A step of its own that waits for an engine to serve: vLLM on a Ray
        head starts once every worker has joined, and replicas load their
        weights side by side before the first is waited for."""
        self.steps.append(Step(endpoint.node, [], f"wait for {self.runtime.name} on {endpoint.node} to serve",
                               container=None,
                               wait=Wait("http", container=endpoint.container, url=endpoint.url,
                                         model=endpoint.model), role="wait"))

    def router(self, backends: list[Endpoint]) -> str:
        """The router's steps; returns the plan's line saying which router and why."""
        # Every engine has started (each loads its weights on its own nodes); now wait for each to serve.
        for endpoint in backends:
            self.wait_for(endpoint)
        assert self.layout.router is not None
        row = router_for(self.layout.router)
        written = self.written.strip().lower()
        said = written in ALIASES and "," in ALIASES[written] or \
            self.layout.router in [p.strip() for p in written.split(",")]
        if row.engine == HAPROXY:
            self.haproxy(backends)
            why = ("as the layout says" if said else "the default for replicas") + \
                f": it counts each replica's requests in flight exactly, so a burst of c splits c/{len(backends)} " \
                "each (`,least-busy` or `,shuffle` puts LiteLLM there instead, `,litellm` LiteLLM in front of it)"
        elif self.layout.router == CHAINED:
            port = self.inv.defaults.router_port + 1
            balancer = self.haproxy(backends, port=port, behind_litellm=True)
            # LiteLLM's one deployment is HAProxy, reached with the router's key (both read it from router.env).
            self.litellm([balancer], word="shuffle", backend_key=f"os.environ/{ROUTER_KEY_ENV}",
                         what="in front of HAProxy")
            # The front first: what clients, studies and the demo's load use.
            self.endpoints[-2], self.endpoints[-1] = self.endpoints[-1], self.endpoints[-2]
            why = ("as the layout says: LiteLLM's keys, spend tracking and features in front, HAProxy leastconn "
                   f"behind it on port {port}, so a burst of c still splits c/{len(backends)} each")
        else:
            self.litellm(backends)
            why = "as the layout names it (LiteLLM's routing, spend tracking and keys; HAProxy leastconn, " \
                "the default without a router word, splits bursts exactly)"
        return f"router: {row.product} {row.strategy} on {self.nodes[0].name}, {why}"

    def haproxy(self, backends: list[Endpoint], port: int | None = None, behind_litellm: bool = False) -> Endpoint:
        head = self.nodes[0]
        role = "balancer" if behind_litellm else "router"
        port = port or self.inv.defaults.router_port
        text = haproxy_config(head.bind, port, [(e.node, e.url) for e in backends], ROUTER_KEY_ENV,
                              self.runtime.ready_path())
        config_path = Home(f"{self.state_dir}/{HAPROXY_CONFIG}")
        # Readable by all (it holds no secret): the official image runs HAProxy as its own user (uid 99), which
        # must read it whatever the node's umask.
        self.steps.append(Step(head.name, ["sh", "-c", f'umask 022 && mkdir -p "$1" && cat > "$1/{HAPROXY_CONFIG}"',
                                           "sh",
                                           Home(self.state_dir)],
                               f"write the HAProxy config (leastconn over {len(backends)} replicas) on {head.name}",
                               stdin_text=text, role="setup"))
        url = self.url(head, port)
        # Its own program, not the image's entrypoint script: -W (master-worker) -db (foreground, logs to the
        # container's output); the config mounted at the same path inside, the key from the env file.
        name, argv = self.docker_run(
            head, role, {}, "haproxy", ["-W", "-db", "-f", config_path], endpoint=url, kind=HAPROXY,
            gpu=False, volumes=[_home_mount(self.state_dir, HAPROXY_CONFIG)], image=self.inv.defaults.haproxy_image,
            env_file=self.router_secrets_file)
        said = "balancer behind LiteLLM" if behind_litellm else "router"
        self.steps.append(Step(head.name, argv, f"start the HAProxy {said} (leastconn) on {head.name}",
                               container=name, role="router"))
        self.endpoints.append(Endpoint(url, HAPROXY, head.name, self.recipe.served_name, self.topology, name,
                                       api_key_env=ROUTER_KEY_ENV, members=[(head.name, name)]))
        self.wait_ready(self.endpoints[-1], key_env=ROUTER_KEY_ENV)
        return self.endpoints[-1]

    def litellm(self, backends: list[Endpoint], word: str | None = None, backend_key: str = "none",
                what: str | None = None) -> None:
        head = self.nodes[0]
        word = word or self.layout.router
        strategy = what or litellm_strategy(word)
        text = yaml.safe_dump(litellm_config(self.recipe.served_name, word,
                                             [(f"{self.runtime.router_provider}/{e.model}", e.url) for e in backends],
                                             backend_key),
                              sort_keys=False)
        config_path = Home(f"{self.state_dir}/litellm.yaml")
        self.steps.append(Step(head.name, ["sh", "-c", 'mkdir -p "$1" && cat > "$1/litellm.yaml"', "sh",
                                           Home(self.state_dir)],
                               f"write the LiteLLM config ({strategy}) on {head.name}", stdin_text=text,
                               role="setup"))
        port = self.inv.defaults.router_port
        url = self.url(head, port)
        # Mounted at the same path inside the container, so one path works either way.
        name, argv = self.docker_run(
            # Offline Hub: LiteLLM looks up a tokenizer for the served name on every streamed reply, and
            # without Internet each lookup stalls the stream ~23 s (it falls back to tiktoken after).
            head, "router", {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}, "litellm",
            ["--config", config_path, "--host", head.bind, "--port", str(port)], endpoint=url, kind=ROUTER,
            gpu=False, volumes=[_home_mount(self.state_dir, "litellm.yaml")], image=self.inv.defaults.router_image,
            env_file=self.router_secrets_file)
        self.steps.append(Step(head.name, argv, f"start the LiteLLM router ({strategy}) on {head.name}",
                               container=name, role="router"))
        self.endpoints.append(Endpoint(url, ROUTER, head.name, self.recipe.served_name, self.topology, name,
                                       api_key_env=ROUTER_KEY_ENV, members=[(head.name, name)]))
        self.wait_ready(self.endpoints[-1], key_env=ROUTER_KEY_ENV)


def litellm_config(served_name: str, router: str | None, backends: list[tuple[str, str]],
                   api_key: str = "none") -> dict:
    """The LiteLLM proxy's config for replicas behind `router` (a layout's `shuffle` / `least-busy`): one
    deployment per backend, (LiteLLM's `provider/model`, the engine's base URL), under the served name.
    `api_key`: what LiteLLM sends its backends (`os.environ/NAME` for the HAProxy behind it: the name, never
    the key)."""
    return {
        "model_list": [
            {"model_name": served_name,
             "litellm_params": {"model": model, "api_base": f"{url}/v1", "api_key": api_key}}
            for model, url in backends
        ],
        "router_settings": {"routing_strategy": litellm_strategy(router)},
        "litellm_settings": {"drop_params": True},
        "general_settings": {"master_key": f"os.environ/{ROUTER_KEY_ENV}"},
    }


def _home_mount(state_dir: str, file: str) -> HomeMount:
    path = f"{state_dir}/{file}"
    return HomeMount(f"{path}:{path}:ro")


def make_plan(recipe: Recipe, topology: str, inventory: Inventory, node_names: list[str] | None = None,
              overrides: dict | None = None, port: int | None = None, lid: str | None = None,
              fabric: dict[str, Fabric] | None = None) -> Plan:
    """The plan for `recipe` in a layout (`topology`: one of the five names
    or a layout's spelling, see `layout.py`) on the inventory's first nodes
    (or `node_names`, the head first); `fabric` is what preflight detected
    per node, used where the inventory gives no eth_if, fabric_ip or ib_if."""
    try:
        layout = parse_layout(topology)
    except LayoutError as exc:
        raise PlanError(str(exc)) from None
    nodes = [inventory.node(n) for n in node_names] if node_names else list(inventory.nodes)
    why = recipe.why_not_layout(layout, len(nodes))
    if why:
        raise PlanError(f"{recipe.id}: {why}")
    return Builder(recipe, topology, inventory, nodes[: layout.nodes], overrides, port, lid, fabric).build()
