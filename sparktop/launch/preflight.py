"""Checks run before anything is launched, each passing, warning or failing
with a one-line reason:

- every node answers;
- the memory vLLM will take (gpu_memory_utilization x the node's unified
  memory) fits in MemAvailable with room to spare, the weights fit in that
  share, and the KV cache left holds one max_model_len request (GB10 has no
  separate GPU memory: a Spark that runs out of memory freezes);
- the image is on every node, with the same ID on both for a cluster;
- the weights are in the HF cache on every node (warning: vLLM would
  download them at startup);
- the ports are free on the addresses the engines bind;
- the fabric interface named in the inventory is up (cluster topologies);
- nothing of sparktop's is already running there (warning, with the
  command that stops it).
"""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass

from sparktop.launch.plan import Home, Plan
from sparktop.launch.recipe import Recipe
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

    def line(self) -> str:
        mark = {"pass": "ok  ", "warn": "warn", "fail": "FAIL"}[self.status]
        return f"[{mark}] {self.node:10} {self.name:9} {self.message}"


@dataclass
class Preflight:
    checks: list[Check]

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


async def _run(t: Transport, cmd, timeout: float = 20.0):
    return await t.run(cmd, timeout=timeout)


async def check_node(node: Node, t: Transport, recipe: Recipe, image: str, util: float,
                     max_model_len: int | None, hf_cache: str, ports: list[int], cluster: bool,
                     weights_per_node: float | None, kv_per_node_token: float | None,
                     seq_state_gib: float | None) -> list[Check]:
    checks: list[Check] = []
    name = node.name
    try:
        await _run(t, "true", timeout=15)
    except TransportError as exc:
        return [Check("reachable", name, "fail", exc.message)]
    checks.append(Check("reachable", name, "pass", "answers"))

    # Memory: what vLLM will take against what the node can give.
    r = await _run(t, 'cat "${SPARKTOP_PROC_ROOT:-/proc}/meminfo"')
    try:
        mem = parse_meminfo(r.stdout)
    except ValueError:
        checks.append(Check("memory", name, "warn", "cannot read /proc/meminfo"))
        mem = None
    if mem is not None:
        total = mem.total / GIB
        want = util * total
        left = mem.available / GIB - want
        share = f"gpu_memory_utilization {util:g} x {total:.1f} GiB = {want:.1f} GiB"
        if left < HEADROOM_FAIL:
            checks.append(Check("memory", name, "fail", f"{share}, but only {mem.available / GIB:.1f} GiB is "
                                                        "available: lower gpu_memory_utilization or stop what holds "
                                                        "memory"))
        elif left < HEADROOM_WARN:
            checks.append(Check("memory", name, "warn", f"{share} leaves {left:.1f} GiB free: a GB10 freezes when "
                                                        "memory runs out"))
        else:
            checks.append(Check("memory", name, "pass", f"{share}; {left:.1f} GiB stays free"))
        if weights_per_node is not None:
            kv = want - weights_per_node - 2.5
            if kv <= 0:
                checks.append(Check("fit", name, "fail", f"weights ({weights_per_node:.1f} GiB on this node) do not "
                                                         f"fit in the {want:.1f} GiB share: raise "
                                                         "gpu_memory_utilization or use two nodes"))
            elif kv_per_node_token and max_model_len:
                need = (max_model_len * kv_per_node_token) / GIB + (seq_state_gib or 0)
                if need > kv:
                    fits = int(max(0.0, kv - (seq_state_gib or 0)) * GIB / kv_per_node_token)
                    checks.append(Check("fit", name, "fail", f"one {max_model_len}-token request needs {need:.1f} GiB "
                                                             f"of KV cache, {kv:.1f} GiB is left: lower max_model_len"
                                                             f" (to about {fits}) or raise gpu_memory_utilization"))
                else:
                    checks.append(Check("fit", name, "pass", f"weights {weights_per_node:.1f} GiB, KV cache "
                                                             f"{kv:.1f} GiB ({int(kv * GIB / kv_per_node_token):,} "
                                                             "tokens)"))
            else:
                checks.append(Check("fit", name, "pass", f"weights {weights_per_node:.1f} GiB, KV cache ~{kv:.1f} GiB"))

    # The image, by ID (compared across nodes by the caller).
    r = await _run(t, ["docker", "image", "inspect", "--format", "{{.Id}}", image])
    if r.ok and r.stdout.strip():
        checks.append(Check("image", name, "pass", f"{image} {r.stdout.strip()[:19]}"))
    elif "command not found" in r.stderr or r.exit_status == 127:
        checks.append(Check("image", name, "fail", "docker is not installed"))
    else:
        checks.append(Check("image", name, "fail", f"{image} is not on this node: docker pull {image} (or copy "
                                                   f"it: docker save {image} | ssh {node.host} docker load)"))

    # Weights in the HF cache.
    cache = Home(f"{hf_cache}/hub/{hf_dir(recipe.model)}") if hf_cache.startswith("~/") else \
        f"{hf_cache}/hub/{hf_dir(recipe.model)}"
    test = f"test -d {cache.render() if isinstance(cache, Home) else shlex.quote(cache)}/snapshots"
    r = await _run(t, test)
    if r.ok:
        checks.append(Check("weights", name, "pass", f"{recipe.model} is in {hf_cache}"))
    else:
        size = f"~{weights_per_node:.0f} GiB" if weights_per_node else "the weights"
        checks.append(Check("weights", name, "warn", f"{recipe.model} is not in {hf_cache}: vLLM will download "
                                                     f"{size} at startup (or run `hf download {recipe.model}` "
                                                     "there first)"))

    # Ports on the address the engines bind.
    r = await _run(t, "ss -Hltn 2>/dev/null || netstat -ltn 2>/dev/null")
    listeners = _listeners(r.stdout)
    addresses = {node.bind, node.address}
    busy = [p for p in ports if port_taken(listeners, p, addresses)]
    if busy:
        checks.append(Check("ports", name, "fail", f"port{'s' if len(busy) > 1 else ''} "
                                                   f"{', '.join(map(str, busy))} already in use on {node.bind}"))
    elif r.stdout.strip() or r.ok:
        checks.append(Check("ports", name, "pass", f"{', '.join(map(str, ports))} free"))
    else:
        checks.append(Check("ports", name, "warn", "cannot list listening ports (no ss or netstat)"))

    # The fabric interface, for cluster topologies.
    if cluster:
        if not node.eth_if:
            checks.append(Check("fabric", name, "warn", "no eth_if in the inventory: NCCL and Gloo will pick an "
                                                        "interface themselves"))
        else:
            iface = shlex.quote(node.eth_if)
            r = await _run(t, f'cat "${{SPARKTOP_SYS_ROOT:-/sys}}"/class/net/{iface}/operstate')
            state = r.stdout.strip()
            if not r.ok:
                checks.append(Check("fabric", name, "fail", f"interface {node.eth_if} does not exist here (check "
                                                            "eth_if in the inventory)"))
            elif state in ("up", "unknown"):
                checks.append(Check("fabric", name, "pass", f"{node.eth_if} is {state}"))
            else:
                checks.append(Check("fabric", name, "fail", f"{node.eth_if} is {state}: is the QSFP cable in?"))

    # What sparktop already runs there.
    r = await _run(t, ["docker", "ps", "--filter", "label=sparktop.launch",
                       "--format", '{{.Label "sparktop.launch"}} {{.Names}}'])
    running = sorted({line.split()[0] for line in r.stdout.splitlines() if line.strip()})
    if running:
        checks.append(Check("running", name, "warn", f"already running: {', '.join(running)} — stop with "
                                                     f"`sparktop stop {running[0]}`, or run next to it if ports and "
                                                     "memory allow"))
    return checks


async def run_preflight(plan: Plan, recipe: Recipe, inventory: Inventory, transports: dict[str, Transport]) -> Preflight:
    from sparktop.model.perf import PerfModel

    vllm, image = plan.vllm, plan.image or inventory.defaults.image
    util = float(vllm.get("gpu_memory_utilization", 0.9))
    max_model_len = vllm.get("max_model_len")
    cluster = plan.topology in ("cluster-ray", "cluster-mp")
    tp = len(plan.nodes) if cluster else 1
    weights = recipe.estimated_weights_gib()
    weights_per_node = weights / tp if weights else None
    kv_token = seq_state = None
    card = recipe.twin_card()
    if card is not None:
        kv_dtype = 1 if str(vllm.get("kv_cache_dtype", "auto")).startswith("fp8") else None
        model = PerfModel(card, tp=tp, kv_dtype_bytes=kv_dtype)
        kv_token = model.kv_bytes_per_token
        seq_state = model.seq_state_bytes / GIB
        if max_model_len is None:
            max_model_len = card.max_model_len
    head = plan.nodes[0]
    jobs = []
    for node_name in plan.nodes:
        node = inventory.node(node_name)
        ports = sorted({int(e.url.rsplit(":", 1)[1]) for e in plan.endpoints if e.node == node_name})
        if plan.topology == "cluster-mp" and node_name == head:
            ports.append(inventory.defaults.master_port)
        if plan.topology == "cluster-ray" and node_name == head:
            ports.append(inventory.defaults.ray_port)
        jobs.append(check_node(node, transports[node_name], recipe, image, util, max_model_len,
                               inventory.defaults.hf_cache, ports, cluster, weights_per_node, kv_token, seq_state))
    results = await asyncio.gather(*jobs)
    checks = [c for node_checks in results for c in node_checks]
    if cluster or plan.topology in ("shuffle", "least-busy"):
        ids = {c.node: c.message.split()[-1] for c in checks if c.name == "image" and c.status == "pass"}
        if len(set(ids.values())) > 1:
            checks.append(Check("image", "all", "fail" if cluster else "warn",
                                "the image differs between nodes (" + ", ".join(f"{n}: {i}" for n, i in ids.items())
                                + "): copy the head's image to the others"))
    return Preflight(checks)

