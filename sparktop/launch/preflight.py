"""Checks run before anything is launched, each passing, warning or failing
with a one-line reason:

- every node answers;
- the memory vLLM will take (gpu_memory_utilization x the node's unified
  memory) fits in MemAvailable with room to spare, the weights fit in that
  share, and the KV cache left holds one max_model_len request (GB10 has no
  separate GPU memory: a Spark that runs out of memory freezes);
- the image is on every node, with the same ID on all of them for an engine
  over several nodes (a warning for replicas);
- the weights are in the HF cache on every node (warning: vLLM would
  download them at startup);
- the ports are free on the addresses the engines bind;
- the fabric, for cluster topologies: the interface named in the inventory
  is up, every node pings every other over it (NCCL's ring needs every
  pair) and their MTUs agree (a warning); where the inventory does not give `eth_if` and `fabric_ip`, each
  node's ConnectX-7 port that is up, its address, RoCE devices and MTU are
  detected (`observe/fabric.py`), every worker pings the head over it (and,
  with three nodes or more, every other worker: NCCL's ring needs every pair),
  one MTU on all of them (a warning), and
  what was found is returned for the plan (`Preflight.fabric`; the
  inventory's values win);
- nothing of sparktop's is already running there (warning, with the
  command that stops it).
"""

from __future__ import annotations

import asyncio
import ipaddress
import shlex
from dataclasses import dataclass, field

from sparktop import engine_ids
from sparktop.engine_ids import DEFAULT
from sparktop.launch.plan import Home, Plan
from sparktop.launch.recipe import Recipe
from sparktop.launch.runtimes import Runtime, runtime_for
from sparktop.layouts import parse_layout
from sparktop.model.gguf import is_gguf_path
from sparktop.observe.fabric import DETECT_SCRIPT, Fabric, NodeFabric, Port, pairs, parse_detect, parse_ping
from sparktop.observe.hostparse import parse_meminfo
from sparktop.remote import Transport, TransportError
from sparktop.settings import Inventory, Node

GIB = 1024**3
HEADROOM_FAIL = 4.0  # GiB the OS must keep
HEADROOM_WARN = 12.0  # GiB below which a GB10 gets close to freezing


@dataclass
class Check:
    name: str
    node: str
    status: str  # pass | warn | fail
    message: str
    # The sparktop command that fixes it (its arguments: `sync MODEL --to NODE`), where one does; `launch`
    # offers to run it at a terminal.
    fix: tuple[str, ...] = ()

    def line(self) -> str:
        mark = {"pass": "ok  ", "warn": "warn", "fail": "FAIL"}[self.status]
        return f"[{mark}] {self.node:10} {self.name:9} {self.message}"


@dataclass
class Preflight:
    checks: list[Check]
    # Per node, the fabric preflight detected where the inventory gave none:
    # make the plan again with it (`make_plan(..., fabric=preflight.fabric)`).
    fabric: dict[str, Fabric] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def render(self) -> str:
        return "\n".join(c.line() for c in self.checks)


def hf_dir(model: str) -> str:
    return "models--" + model.replace("/", "--")


def _listeners(ss_output: str) -> list[tuple[str, int]]:
    out = []
    for line in ss_output.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        local = parts[3] if parts[0] in ("LISTEN", "UNCONN") else parts[2] if len(parts) > 2 else ""
        host, _, port = local.rpartition(":")
        if port.isdigit():
            out.append((host.strip("[]").split("%")[0], int(port)))
    return out


def port_taken(listeners: list[tuple[str, int]], port: int, addresses: set[str]) -> bool:
    wildcard = {"0.0.0.0", "*", "::", ""}
    for host, p in listeners:
        if p != port:
            continue
        if host in wildcard or addresses & wildcard or host in addresses:
            return True
    return False


@dataclass(frozen=True)
class Want:
    """What the plan asks of every node."""

    recipe: Recipe
    image: str
    util: float  # gpu_memory_utilization
    max_model_len: int | None
    hf_cache: str
    cluster: bool
    weights_per_node: float | None  # GiB
    kv_per_node_token: float | None  # bytes
    seq_state_gib: float | None
    detect_fabric: bool = False  # a cluster whose inventory lacks eth_if or fabric_ip somewhere
    runtime: str = DEFAULT
    share: str = "gpu_memory_utilization"  # what the runtime calls the memory share `util` stands for
    kv_tokens: int | None = None  # a KV cache of a fixed size (llama.cpp's -c) instead of a memory share
    memory: str = "share"  # how the runtime takes memory (`Runtime.memory`)
    engine: str = engine_ids.get(DEFAULT).name  # its name, for what the checks say


@dataclass
class NodeChecks:
    """One node's checks as they are made: where, what is wanted, what was found."""

    node: Node
    transport: Transport
    want: Want
    ports: list[int]
    checks: list[Check] = field(default_factory=list)
    found: NodeFabric | None = None  # what fabric detection saw here
    fabric_at: int | None = None  # where the fabric check goes once every node has been seen
    named_mtu: int | None = None  # the MTU of the inventory's eth_if, once it is found up
    named_up: str | None = None  # "enp1s0f1np1 is up, MTU 9000": the inventory's interface, found up

    def add(self, name: str, status: str, message: str, fix: tuple[str, ...] = ()) -> None:
        self.checks.append(Check(name, self.node.name, status, message, fix))

    def put_fabric(self, status: str, message: str) -> None:
        at = len(self.checks) if self.fabric_at is None else self.fabric_at
        self.checks.insert(at, Check("fabric", self.node.name, status, message))

    async def run(self, cmd, timeout: float = 20.0):
        return await self.transport.run(cmd, timeout=timeout)


async def check_node(node: Node, transport: Transport, want: Want, ports: list[int]) -> list[Check]:
    return (await _check_node(NodeChecks(node, transport, want, ports))).checks


async def _check_node(on: NodeChecks) -> NodeChecks:
    try:
        await on.run("true", timeout=15)
    except TransportError as exc:
        on.add("reachable", "fail", exc.message)
        return on
    on.add("reachable", "pass", "answers")
    for check in (_memory, _image, _weights, _ports, _fabric, _already_running):
        await check(on)
    return on


async def _memory(on: NodeChecks) -> None:
    """What vLLM will take against what the node can give, and whether the model fits in it."""
    w = on.want
    r = await on.run('cat "${SPARKTOP_PROC_ROOT:-/proc}/meminfo"')
    try:
        mem = parse_meminfo(r.stdout)
    except ValueError:
        on.add("memory", "warn", "cannot read /proc/meminfo")
        return
    total = mem.total / GIB
    if w.memory == "fixed" and not (w.kv_tokens and w.weights_per_node is not None and w.kv_per_node_token):
        held = f"the weights ({w.weights_per_node:.1f} GiB)" if w.weights_per_node is not None else "the weights"
        cache = f"a KV cache of {w.kv_tokens:,} tokens" if w.kv_tokens else "a KV cache of the model's context"
        on.add("memory", "pass", f"{w.engine} holds {held} and {cache} (its size needs a model card); "
                                 f"{mem.available / GIB:.1f} GiB is available")
        return
    if w.kv_tokens is not None and w.weights_per_node is not None and w.kv_per_node_token:
        # llama.cpp allocates what it is told: the weights and a KV cache of -c tokens, no share of memory.
        kv_gib = w.kv_tokens * w.kv_per_node_token / GIB
        want = w.weights_per_node + kv_gib + 1.5
        share = f"weights {w.weights_per_node:.1f} GiB + KV cache of {w.kv_tokens:,} tokens {kv_gib:.1f} GiB"
        left = mem.available / GIB - want
        if left < HEADROOM_FAIL:
            on.add("memory", "fail", f"{share}, but only {mem.available / GIB:.1f} GiB is available: lower "
                                     "ctx_size or stop what holds memory")
        elif left < HEADROOM_WARN:
            on.add("memory", "warn", f"{share} leaves {left:.1f} GiB free: a GB10 freezes when memory runs out")
        else:
            on.add("memory", "pass", f"{share}; {left:.1f} GiB stays free")
        return
    if w.memory == "left" and w.weights_per_node is not None:
        # TensorRT-LLM loads the weights, then gives its KV cache that share of the memory still free.
        free = mem.available / GIB - w.weights_per_node
        want = w.weights_per_node + max(0.0, w.util * free) + 2.0  # its runtime and activations
        share = (f"weights {w.weights_per_node:.1f} GiB + {w.share} {w.util:g} x the {free:.1f} GiB they leave "
                 f"= {want:.1f} GiB")
        total = want  # the share the fit below is taken from
    else:
        want = w.util * total
        share = f"{w.share} {w.util:g} x {total:.1f} GiB = {want:.1f} GiB"
    left = mem.available / GIB - want
    if left < HEADROOM_FAIL:
        on.add("memory", "fail", f"{share}, but only {mem.available / GIB:.1f} GiB is available: lower "
                                 f"{w.share} or stop what holds memory")
    elif left < HEADROOM_WARN:
        on.add("memory", "warn", f"{share} leaves {left:.1f} GiB free: a GB10 freezes when memory runs out")
    else:
        on.add("memory", "pass", f"{share}; {left:.1f} GiB stays free")
    if w.weights_per_node is None:
        return
    kv = want - w.weights_per_node - 2.5
    if kv <= 0:
        on.add("fit", "fail", f"weights ({w.weights_per_node:.1f} GiB on this node) do not fit in the {want:.1f} "
                              f"GiB share: raise {w.share} or use two nodes")
    elif w.kv_per_node_token and w.max_model_len:
        state = w.seq_state_gib or 0
        need = (w.max_model_len * w.kv_per_node_token) / GIB + state
        if need > kv:
            fits = int(max(0.0, kv - state) * GIB / w.kv_per_node_token)
            on.add("fit", "fail", f"one {w.max_model_len}-token request needs {need:.1f} GiB of KV cache, "
                                  f"{kv:.1f} GiB is left: lower max_model_len (to about {fits}) or raise "
                                  f"{w.share}")
        else:
            on.add("fit", "pass", f"weights {w.weights_per_node:.1f} GiB, KV cache {kv:.1f} GiB "
                                  f"({int(kv * GIB / w.kv_per_node_token):,} tokens)")
    else:
        on.add("fit", "pass", f"weights {w.weights_per_node:.1f} GiB, KV cache ~{kv:.1f} GiB")


async def _image(on: NodeChecks) -> None:
    """The image, by ID (compared across nodes by the caller)."""
    image = on.want.image
    r = await on.run(["docker", "image", "inspect", "--format", "{{.Id}}", image])
    if r.ok and r.stdout.strip():
        on.add("image", "pass", f"{image} {r.stdout.strip()[:19]}")
    elif "command not found" in r.stderr or r.exit_status == 127:
        on.add("image", "fail", "docker is not installed")
    else:
        on.add("image", "fail", f"{image} is not on this node: docker pull {image} (or copy it from a node that "
                                f"has it: sparktop sync {image} --to {on.node.name})",
               fix=("sync", image, "--image", "--to", on.node.name))


async def _weights(on: NodeChecks) -> None:
    """The weights in the Hugging Face cache (a GGUF: on the node, or in the cache llama-server downloads to)."""
    model, hf_cache = on.want.recipe.model, on.want.hf_cache
    if runtime_for(on.want.runtime).weights == "gguf":
        await _gguf(on, model, hf_cache)
        return
    where = f"{hf_cache}/hub/{hf_dir(model)}"
    cache = Home(where).render() if hf_cache.startswith("~/") else shlex.quote(where)
    r = await on.run(f"test -d {cache}/snapshots")
    engine = runtime_for(on.want.runtime).name
    if r.ok:
        on.add("weights", "pass", f"{model} is in {hf_cache}")
    else:
        size = f"~{on.want.weights_per_node:.0f} GiB" if on.want.weights_per_node else "the weights"
        on.add("weights", "warn", f"{model} is not in {hf_cache}: {engine} will download {size} at startup (or run "
                                  f"`hf download {model}` there first, or copy it from a node that has it: "
                                  f"`sparktop sync {model} --to {on.node.name}`)",
               fix=("sync", model, "--model", "--to", on.node.name))


async def _gguf(on: NodeChecks, model: str, hf_cache: str) -> None:
    if is_gguf_path(model):
        r = await on.run(["test", "-f", model])
        if r.ok:
            on.add("weights", "pass", f"{model} is on this node")
        else:
            on.add("weights", "fail", f"{model} is not on this node: copy the GGUF there (llama-server's -m)")
        return
    repo, _, quant = model.partition(":")
    roots = [f"{hf_cache}/llama.cpp", f"{hf_cache}/hub/{hf_dir(repo)}"]
    paths = " ".join(Home(r).render() if r.startswith("~/") else shlex.quote(r) for r in roots)
    # The GGUF files there, whichever layout llama-server wrote them in.
    r = await on.run(f"find {paths} -iname '*.gguf' 2>/dev/null")
    stem = repo.rsplit("/", 1)[-1].lower().removesuffix("-gguf")
    found = [line for line in r.stdout.splitlines() if stem in line.lower() and (not quant or quant.lower()
                                                                                 in line.lower())]
    if found:
        on.add("weights", "pass", f"{model} is in {hf_cache} ({found[0].rsplit('/', 1)[-1]})")
    else:
        size = f"~{on.want.weights_per_node:.0f} GiB" if on.want.weights_per_node else "the GGUF"
        on.add("weights", "warn", f"{model} is not in {hf_cache}: llama-server will download {size} at startup "
                                  f"(-hf {model})")


LISTENING = "ss -Hltn 2>/dev/null || netstat -ltn 2>/dev/null"


async def ports_in_use(node: Node, transport: Transport, ports: list[int]) -> list[int] | None:
    """Which of `ports` something listens on where the node's engines bind;
    None when the node cannot list its listening ports."""
    r = await transport.run(LISTENING, timeout=20.0)
    if not (r.stdout.strip() or r.ok):
        return None
    listeners = _listeners(r.stdout)
    return [p for p in ports if port_taken(listeners, p, {node.bind, node.address})]


def plan_ports(plan: Plan, inventory: Inventory) -> dict[str, list[int]]:
    """The ports each node of the plan listens on: its engines' APIs and, for
    an engine over several nodes, vLLM's rendezvous or Ray's GCS on the head,
    llama.cpp's rpc-server or the sshd TensorRT-LLM's mpirun uses on the
    workers (`Runtime.listen_ports`)."""
    runtime = runtime_for(plan.runtime)
    layout = parse_layout(plan.topology)
    heads = {group[0] for group in layout.engines(plan.nodes)} if layout.spans_nodes else set()
    out: dict[str, list[int]] = {}
    for node_name in plan.nodes:
        ports = sorted({int(e.url.rsplit(":", 1)[1]) for e in plan.endpoints if e.node == node_name})
        out[node_name] = ports + runtime.listen_ports(layout, inventory.defaults, node_name in heads)
    return out


async def ports_released(plan: Plan, inventory: Inventory, transports: dict[str, Transport],
                         within: float = 60.0) -> list[str]:
    """Wait until nothing listens on the ports a stopped plan's engines took,
    on any of its nodes, for at most `within` seconds; what still holds one
    then ("spark-a:8000"), which the next preflight will name."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    wanted = plan_ports(plan, inventory)
    while True:
        held = [f"{name}:{p}" for name, ports in wanted.items()
                for p in (await ports_in_use(inventory.node(name), transports[name], ports) or [])]
        if not held or loop.time() >= deadline:
            return held
        await asyncio.sleep(0.5)


async def _ports(on: NodeChecks) -> None:
    """The ports the engines listen on, on the address they bind."""
    busy = await ports_in_use(on.node, on.transport, on.ports)
    if busy is None:
        on.add("ports", "warn", "cannot list listening ports (no ss or netstat)")
    elif busy:
        on.add("ports", "fail", f"port{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy))} already in use "
                                f"on {on.node.bind}")
    else:
        on.add("ports", "pass", f"{', '.join(map(str, on.ports))} free")


async def _fabric(on: NodeChecks) -> None:
    """The fabric interface, for cluster topologies."""
    if not on.want.cluster:
        return
    if on.want.detect_fabric:
        # What the node has; the check is made when every node has been seen.
        r = await on.run(DETECT_SCRIPT, timeout=20)
        on.found = parse_detect(r.stdout)
        on.fabric_at = len(on.checks)
        return
    eth = on.node.eth_if
    if not eth:
        on.add("fabric", "warn", "no eth_if in the inventory: NCCL and Gloo will pick an interface themselves")
        return
    net = f'"${{SPARKTOP_SYS_ROOT:-/sys}}"/class/net/{shlex.quote(eth)}'
    r = await on.run(f"cat {net}/operstate && (cat {net}/mtu 2>/dev/null || echo -)")
    state, _, mtu = r.stdout.strip().partition("\n")
    if not r.ok:
        on.add("fabric", "fail", f"interface {eth} does not exist here (check eth_if in the inventory)")
    elif state in ("up", "unknown"):
        # The check is made once every node has been seen and the pairs pinged (`named_pairs`).
        on.named_mtu = int(mtu) if mtu.strip().isdigit() else None
        on.named_up = f"{eth} is {state}" + (f", MTU {on.named_mtu}" if on.named_mtu else "")
        on.fabric_at = len(on.checks)
    else:
        on.add("fabric", "fail", f"{eth} is {state}: is the QSFP cable in?")


async def _already_running(on: NodeChecks) -> None:
    """What sparktop already runs there."""
    r = await on.run(["docker", "ps", "--filter", "label=sparktop.launch",
                      "--format", '{{.Label "sparktop.launch"}} {{.Names}}'])
    running = sorted({line.split()[0] for line in r.stdout.splitlines() if line.strip()})
    if running:
        on.add("running", "warn", f"already running: {', '.join(running)} — stop with `sparktop stop "
                                  f"{running[0]}`, or run next to it if ports and memory allow")


def _kv_tokens(memory: str, flags: dict, max_model_len: int | None) -> int | None:
    """A fixed KV cache's size in tokens (llama.cpp's -c), else the model's whole context; None for a runtime
    that takes a share of memory."""
    if memory != "fixed":
        return None
    tokens = flags.get("kv_tokens") or max_model_len
    return int(tokens) if tokens else None


def _share(runtime: Runtime, flags: dict, recipe: Recipe) -> float:
    """The memory share the runtime is told to take (its default when the recipe says nothing)."""
    if runtime.memory == "left":  # TensorRT-LLM: a flag, else its options file
        given = flags.get("kv_cache_free_fraction") or (recipe.engine_config.get("kv_cache_config") or {}).get(
            "free_gpu_memory_fraction")
    else:
        given = flags.get("gpu_memory_utilization")
    return float(given) if isinstance(given, (int, float)) and not isinstance(given, bool) else runtime.share_default


async def run_preflight(plan: Plan, recipe: Recipe, inventory: Inventory,
                        transports: dict[str, Transport]) -> Preflight:
    from sparktop.model.perf import PerfModel

    runtime = runtime_for(plan.runtime)
    serving, image = runtime.serving_flags(plan.flags), plan.image or inventory.defaults.image_for(runtime.id)
    util = _share(runtime, serving, recipe)
    max_model_len = serving.get("max_model_len")
    layout = parse_layout(plan.topology)
    cluster = layout.spans_nodes
    tp = layout.nodes_per_engine  # the weights (and the KV cache) split over tp x pp ranks, one per node
    weights = recipe.estimated_weights_gib()
    weights_per_node = layout.weights_per_node_gib(weights) if weights else None
    kv_token = seq_state = None
    card = recipe.twin_card()
    if card is not None:
        kv_dtype = 1 if str(serving.get("kv_cache_dtype", "auto")).startswith("fp8") else None
        model = PerfModel(card, tp=tp, kv_dtype_bytes=kv_dtype)
        kv_token = model.kv_bytes_per_token
        seq_state = model.seq_state_bytes / GIB
        if max_model_len is None:
            max_model_len = card.max_model_len
    detect = cluster and any(not (n.eth_if and n.fabric_ip) for n in map(inventory.node, plan.nodes))
    share = runtime.form_flags.get("gpu_memory_utilization") or "gpu_memory_utilization"  # its own name for it
    want = Want(recipe, image, util, max_model_len, inventory.defaults.hf_cache, cluster, weights_per_node,
                kv_token, seq_state, detect_fabric=detect, runtime=runtime.id, share=share,
                kv_tokens=_kv_tokens(runtime.memory, serving, max_model_len), memory=runtime.memory,
                engine=runtime.name)
    jobs = [_check_node(NodeChecks(inventory.node(name), transports[name], want, ports))
            for name, ports in plan_ports(plan, inventory).items()]
    results = list(await asyncio.gather(*jobs))
    fabric = await resolve_fabric(results) if detect else {}
    if cluster and not detect:
        await named_pairs(results)
    checks = [c for on in results for c in on.checks]
    if len(plan.nodes) > 1:
        ids = {c.node: c.message.split()[-1] for c in checks if c.name == "image" and c.status == "pass"}
        if len(set(ids.values())) > 1:
            checks.append(Check("image", "all", "fail" if cluster else "warn",
                                "the image differs between nodes (" + ", ".join(f"{n}: {i}" for n, i in ids.items())
                                + f"): copy the head's image to the others (sparktop sync {image} --from "
                                f"{plan.nodes[0]})", fix=("sync", image, "--image", "--from", plan.nodes[0])))
    return Preflight(checks, fabric)


# -- the fabric, detected ----------------------------------------------------------

PING_TRIES = 3  # subnet-sharing pairs tried before the link is called down


def _candidates(on: NodeChecks) -> tuple[list[Port], str, str]:
    """The ports this node could use, the inventory's values first; when
    there are none, a status (warn or fail) and why."""
    node, found = on.node, on.found
    assert found is not None
    if node.fabric_ip:
        name = node.eth_if or found.holding(node.fabric_ip)
        if name is None:
            if not found.interfaces:
                return [], "warn", (f"cannot list this node's addresses (no `ip` command) to check fabric_ip "
                                    f"{node.fabric_ip}")
            return [], "fail", (f"fabric_ip {node.fabric_ip} (inventory) is on no interface of this node: check "
                                "fabric_ip in the inventory")
        if (name in found.interfaces or name in found.net) and not found.is_up(name):
            return [], "fail", f"{name} is down: is the QSFP cable in?"
        held = [p for p in found.ports(only=name) if str(p.address.ip) == node.fabric_ip]
        if held:
            return held, "", ""
        # The inventory says so: its address, the prefix unknown.
        address = ipaddress.IPv4Interface(f"{node.fabric_ip}/32")
        return [Port(name, address, found.mtu(name), prefix_known=False)], "", ""
    if node.eth_if:
        eth = node.eth_if
        if eth not in found.interfaces and eth not in found.net:
            return [], "fail", f"interface {eth} does not exist here (check eth_if in the inventory)"
        if not found.is_up(eth):
            return [], "fail", f"{eth} is down: is the QSFP cable in?"
        ports = found.ports(only=eth)
        if not ports:
            return [], "warn", (f"{eth} has no IPv4 address: give it one (NVIDIA's connect-two-sparks playbook: "
                                "netplan, link-local) or set fabric_ip in the inventory")
        return ports, "", ""
    ports = found.ports()
    if not ports:
        return [], "warn", (f"no ConnectX-7 port is up with an IPv4 address ({found.describe()}): NCCL and Gloo "
                            "will pick an interface themselves; cable a QSFP port and address it (NVIDIA's "
                            "connect-two-sparks playbook), or set eth_if and fabric_ip in the inventory")
    return ports, "", ""


def _fabric_of(on: NodeChecks, port: Port) -> Fabric:
    found = on.found
    ib = tuple(on.node.ib_if) or (found.roce if found is not None else ())
    return Fabric(port.netdev, str(port.address.ip), ib, port.mtu)


def _port_text(port: Port) -> str:
    return str(port.address) if port.prefix_known else str(port.address.ip)


def _ports_text(ports: list[Port]) -> str:
    return ", ".join(f"{p.netdev} {_port_text(p)}" for p in ports)


def _source(on: NodeChecks) -> str:
    if on.node.eth_if and on.node.fabric_ip:
        return "inventory"
    found = on.found
    return "detected: " + ", ".join(x for x in ((found.source if found else ""), "ip -br addr") if x)


async def _ping(on: NodeChecks, netdev: str, address: str) -> tuple[bool | None, str]:
    """From this node over interface `netdev` to `address`: reached (None: cannot tell), and what ping said."""
    r = await on.run(f"LC_ALL=C ping -c1 -W2 -I {shlex.quote(netdev)} {shlex.quote(address)}", timeout=15)
    if r.exit_status == 127:
        return None, "not checked: ping is not installed here"
    result = parse_ping(r.stdout + "\n" + r.stderr, r.exit_status)
    if result.ok:
        return True, f"ping ok ({result.rtt_ms:g} ms)" if result.rtt_ms is not None else "ping ok"
    return False, result.error or result.summary or r.first_error_line()


async def _link(on: NodeChecks, head: str, options: list[tuple[Port, Port]]) -> tuple[str, str, Port | None,
                                                                                        Port | None]:
    """The first head/worker pair the worker reaches the head over: status,
    what was found, and the pair."""
    tried = []
    for h, w in options[:PING_TRIES]:
        reached, said = await _ping(on, w.netdev, str(h.address.ip))
        if reached is False:
            tried.append(f"ping -I {w.netdev} {h.address.ip}: {said}")
            continue
        status = "pass" if reached else "warn"
        text = f"{w.netdev} {w.address.ip} ↔ {head} {h.address.ip}, {said}"
        if w.mtu and h.mtu and w.mtu != h.mtu:
            status, text = "warn", f"{text}, MTU {w.mtu} here but {h.mtu} on {head}: set the same MTU on both ends"
        elif w.mtu:
            text += f", MTU {w.mtu}"
        return status, text, h, w
    return ("fail", f"does not reach {head} over the fabric ({'; '.join(tried)}): check the QSFP cable, that both "
                    "ports are up and addressed in one subnet, or set eth_if and fabric_ip in the inventory",
            None, None)


async def resolve_fabric(ons: list[NodeChecks]) -> dict[str, Fabric]:
    """Each node's fabric from what was detected (the inventory's values
    win), and one check per node saying what: the head's port, address,
    RoCE devices and MTU; each worker's, and whether it reaches the head
    over it (a ping from the worker). Detected values are used only when
    every node has one and every worker reaches the head."""
    if any(on.found is None for on in ons):
        return {}  # a node did not answer: preflight fails on that already
    head, workers = ons[0], ons[1:]
    cands: dict[str, list[Port]] = {}
    for on in ons:
        ports, status, why = _candidates(on)
        if ports:
            cands[on.node.name] = ports
        else:
            on.put_fabric(status, why)
    if len(cands) < len(ons):
        missing = ", ".join(on.node.name for on in ons if on.node.name not in cands)
        for on in ons:
            if on.node.name in cands:
                on.put_fabric("pass", f"{_ports_text(cands[on.node.name])} ({_source(on)}; not used: {missing} "
                                      "has none)")
        return {}
    head_ports = cands[head.node.name]
    chosen: dict[str, Port] = {}
    links: dict[str, tuple[str, str]] = {}  # worker -> (status, message)
    for on in workers:
        options = pairs(head_ports, cands[on.node.name])
        if not options:
            links[on.node.name] = ("fail", f"no address here ({_ports_text(cands[on.node.name])}) shares a subnet "
                                           f"with {head.node.name}'s ({_ports_text(head_ports)}): address both "
                                           "ends of the cable in one subnet")
            continue
        status, text, h, w = await _link(on, head.node.name, options)
        links[on.node.name] = (status, text)
        if h is not None and w is not None:
            head_ports, chosen[on.node.name] = [h], w  # the next workers reach the head there too
    if any(status == "fail" for status, _ in links.values()):
        for on in workers:
            on.put_fabric(*links[on.node.name])
        head.put_fabric("pass", f"{_ports_text(head_ports)} ({_source(head)})")
        return {}
    chosen[head.node.name] = head_ports[0]
    # Tensor parallel over three nodes or more rings every node to its neighbours, not only to the head:
    # each worker pings every later worker over the ports chosen (all of a node's pings go at once).
    if len(workers) > 1:
        async def peers(i: int, on: NodeChecks) -> list[str]:
            missed = []
            for other in workers[i + 1:]:
                target = str(chosen[other.node.name].address.ip)
                reached, said = await _ping(on, chosen[on.node.name].netdev, target)
                if reached is False:
                    missed.append(f"{other.node.name} {target} ({said})")
            return missed
        unreached = await asyncio.gather(*(peers(i, on) for i, on in enumerate(workers)))
        if any(unreached):
            for on, missed in zip(workers, unreached, strict=True):
                status, text = links[on.node.name]
                if missed:
                    status, text = "fail", (f"{text}; but does not reach {', '.join(missed)} over the fabric: "
                                            "every pair of nodes must reach each other (NCCL's ring)")
                on.put_fabric(status, text)
            head.put_fabric("pass", f"{_ports_text(head_ports)} ({_source(head)})")
            return {}
    fabric = {on.node.name: _fabric_of(on, chosen[on.node.name]) for on in ons}
    # One MTU on every port: NCCL over RoCE between ports that disagree stalls or falls back.
    mtus = {name: f.mtu for name, f in fabric.items() if f.mtu}
    mismatch = (f"; the MTU differs between nodes ({', '.join(f'{n} {m}' for n, m in mtus.items())}): "
                "set one MTU on every node's port") if len(set(mtus.values())) > 1 else ""
    for on in ons:
        f = fabric[on.node.name]
        roce = f", RoCE {','.join(f.ib_if)}" if f.ib_if else ""
        if on is head:
            mtu = f", MTU {f.mtu}" if f.mtu else ""
            on.put_fabric("warn" if mismatch else "pass", f"{head_ports[0].netdev} {_port_text(head_ports[0])}{roce}"
                                                          f"{mtu} ({_source(on)}){mismatch}")
        else:
            status, text = links[on.node.name]
            on.put_fabric("warn" if mismatch and status == "pass" else status,
                          f"{text}{roce} ({_source(on)}){mismatch}")
    # The inventory's nodes keep their own values; the plan needs only what was detected.
    return {on.node.name: fabric[on.node.name] for on in ons if not (on.node.eth_if and on.node.fabric_ip)}


# -- the fabric the inventory names ---------------------------------------------

async def named_pairs(ons: list[NodeChecks]) -> None:
    """Every pair of nodes over the inventory's eth_if and fabric_ip, both
    ways (a link can fail one way), and one MTU on all of them. The answers
    go into each node's fabric check; nothing is pinged when an interface
    is already down or missing (that check has failed and says why)."""
    named = [on for on in ons if on.named_up is not None]
    if len(named) < len(ons):  # a node down or an interface missing: its own check says so
        for on in named:
            on.put_fabric("pass", f"{on.named_up} ({_source(on)})")
        return

    async def pings(on: NodeChecks) -> tuple[list[str], list[str], bool]:
        reached: list[str] = []
        missed: list[str] = []
        unchecked = False
        for other in named:
            if other is on:
                continue
            ok, said = await _ping(on, str(on.node.eth_if), str(other.node.fabric_ip))
            if ok is None:
                unchecked = True
                break
            (reached if ok else missed).append(f"{other.node.name} {other.node.fabric_ip}"
                                               + ("" if ok else f" ({said})"))
        return reached, missed, unchecked

    answers = await asyncio.gather(*(pings(on) for on in named))
    mtus = {on.node.name: on.named_mtu for on in named if on.named_mtu}
    mismatch = (f"; the MTU differs between nodes ({', '.join(f'{n} {m}' for n, m in mtus.items())}): "
                "set one MTU on every node's port") if len(set(mtus.values())) > 1 else ""
    for on, (reached, missed, unchecked) in zip(named, answers, strict=True):
        status, text = "pass", f"{on.named_up} ({_source(on)})"
        if missed:
            status = "fail"
            text += (f"; does not reach {', '.join(missed)} over {on.node.eth_if}: every pair of nodes must reach "
                     "each other over the fabric (check the cables and the switch, and fabric_ip in the inventory)")
        elif unchecked:
            status = "warn"
            text += "; the other nodes not pinged: ping is not installed here"
        elif reached:
            text += f"; reaches {', '.join(reached)}"
        if mismatch and status == "pass":
            status = "warn"
        on.put_fabric(status, text + mismatch)
