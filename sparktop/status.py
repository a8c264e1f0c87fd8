"""`sparktop status`: one snapshot of every node and engine, and of what
sparktop launched there, for people and scripts.

Rates need two scrapes, so status watches for a couple of seconds (the
same poller the monitor uses) and prints what it saw: a table, or JSON.
Launches come from sparktop's state file, checked against the containers
the nodes actually run (a launch whose containers are gone says so).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sparktop.engine_ids import is_router
from sparktop.launch.state import LaunchRecord, LaunchState, api_key_for
from sparktop.observe.poller import Poller
from sparktop.observe.replicas import group_behind, group_latency, groups, replica_of
from sparktop.observe.snapshot import GIB, EngineSnapshot, NodeSnapshot
from sparktop.observe.state import ClusterState
from sparktop.observe.targets import engine_targets, node_targets
from sparktop.settings import Inventory, Preferences, load_preferences
from sparktop.tables import Column, fitted
from sparktop.units import ago

SETTLE_S = 30.0  # past the window, at most, for every node to answer once (an SSH command's own timeout)


async def _until(ready, limit: float = SETTLE_S) -> None:
    waited = 0.0
    while not ready() and waited < limit:
        await asyncio.sleep(0.1)
        waited += 0.1


async def collect(poller: Poller, seconds: float) -> ClusterState:
    """What `poller` saw over `seconds`, to one last poll at the end of them (the poll at `seconds`
    lands before the watch ends, so rates span the whole of it)."""
    state = ClusterState()
    # Nodes slower than a poll (a busy host, a slow link): the engines' watch begins once each node has
    # answered and its containers are read (or SETTLE_S has passed), so what is printed is whole, each engine
    # with where it runs and its layout, and its rates span the `seconds` asked, not a node's wait.
    await poller.start(settle_nodes=SETTLE_S)

    async def consume():
        async for event in poller.events():
            state.apply(event)

    task = asyncio.create_task(consume())
    try:
        await asyncio.sleep(seconds + min(0.5, poller.interval / 2))
        await _until(poller.settled, poller.interval * 2)  # an engine found on a node's first listing, late
        await asyncio.sleep(0)  # the last poll's events into the state
    finally:
        task.cancel()
        await poller.close()
    return state


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _when(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


def notices_json(state: ClusterState | None, *keys: str) -> list[dict]:
    if state is None:
        return []
    return [{**n.to_dict(), "time": _when(n.t)} for n in state.log(*keys)]


def _peer_json(state: ClusterState, node: str, device: str) -> dict | None:
    peer = state.peer_of(node, device)
    if peer is None:
        return None
    other, other_device, pair = peer
    return {"node": other, "rdma_device": other_device, "found_by": pair.how, "verified": pair.verified,
            "note": pair.note}


def _link_json(n: NodeSnapshot, state: ClusterState | None) -> dict | None:
    """The node's RDMA ports that are up: Gb/s each way over the last poll, RDMA (the NIC's vport counters,
    or its port counters x4) beside the kernel's own bytes for the same interface; the totals, the link's
    capacity each way, and a warning (NCCL on TCP sockets, one half of the cable idle) once it has held."""
    view = state.links.get(n.name) if state is not None else None
    if view is None:
        return None
    return {
        "ports": [{"rdma_device": p.rdma_device, "netdev": p.netdev, "speed_gbps": _r(p.speed_mbps / 1000)
                   if p.speed_mbps else None, "counters": p.source, "rdma_rx_gbps": _r(p.rdma_rx_gbps, 3),
                   "rdma_tx_gbps": _r(p.rdma_tx_gbps, 3), "kernel_rx_gbps": _r(p.kernel_rx_gbps, 3),
                   "kernel_tx_gbps": _r(p.kernel_tx_gbps, 3), "addresses": list(n.addresses.get(p.netdev or "", ())),
                   # the node and port it reaches (from addresses), verified: what one sends the other receives
                   "peer": _peer_json(state, n.name, p.rdma_device) if state is not None else None}
                  for p in view.ports],
        "unpaired": state.link_notes if state is not None else [],
        "rdma_rx_gbps": _r(view.rdma_rx_gbps, 3), "rdma_tx_gbps": _r(view.rdma_tx_gbps, 3),
        "kernel_rx_gbps": _r(view.kernel_rx_gbps, 3), "kernel_tx_gbps": _r(view.kernel_tx_gbps, 3),
        "capacity_gbps": _r(view.capacity_gbps, 1), "engines_spread_here": view.engines, "warning": view.warning,
    }


def node_json(n: NodeSnapshot, state: ClusterState | None = None, prefs: Preferences | None = None) -> dict:
    mem = n.memory
    energy = state.node_energy(n.name) if state is not None else None
    return {
        "name": n.name, "state": n.state, "reason": n.reason,
        # which machine, from DMI: "ASUS Ascent GX10", "DGX Spark", ... (null where DMI is not readable)
        "machine": None if n.machine is None else {"variant": n.machine.variant, "vendor": n.machine.vendor,
                                                   "product": n.machine.product, "gb10": n.machine.gb10},
        "link": _link_json(n, state),
        "memory_gib": None if mem is None else {
            "total": _r(mem.total / GIB), "used": _r(mem.used / GIB), "available": _r(mem.available / GIB),
            "page_cache": _r(mem.page_cache / GIB), "gpu_processes": _r(n.engines_mib / 1024),
            "swap_used": _r(mem.swap_used / GIB)},
        "cpu_pct": _r(n.cpu_pct, 1),
        "gpu": None if n.gpu is None else {"name": n.gpu.name, "util_pct": n.gpu.util, "temp_c": n.gpu.temp,
                                            "power_w": n.gpu.power, "sm_clock_mhz": n.gpu.sm_clock,
                                            "pstate": n.gpu.pstate,
                                            # why its clocks are held down (NVML's clock event reasons)
                                            "clocks_held_by": n.gpu.throttle},
        "gpu_status": n.gpu_status, "docker_status": n.docker_status,
        "containers": [{"name": c.name, "image": c.image, "state": c.state, "status": c.status}
                       for c in n.containers],
        # joules per token generated on this node: its GPU power (nvidia-smi) over the tokens of its engines
        "energy": None if energy is None else energy.to_dict(prefs.energy_price_per_kwh if prefs else None),
        "events": notices_json(state, n.name),
    }


def _predicted(e: EngineSnapshot, inventory: Inventory | None) -> Any:
    """The model's figures for this engine under its load now (`launch.prediction.predicted_now`)."""
    from sparktop.launch.prediction import predicted_now

    return predicted_now(e, inventory) if e.state == "ready" and not is_router(e.kind) else None


def engine_json(e: EngineSnapshot, state: ClusterState | None = None, prefs: Preferences | None = None,
                inventory: Inventory | None = None) -> dict:
    energy = state.engine_energy(e) if state is not None else None
    row = _predicted(e, inventory)
    return {
        "url": e.url, "state": e.state, "reason": e.reason, "error": e.error, "stage": e.stage, "node": e.node,
        # kind null: an address given that has not answered (what it is, nothing says yet)
        "kind": e.kind or None, "engine": e.engine, "recognised": e.recognised, "found": e.found,
        # figures this engine does not export (kv, running, waiting, prompt_tps, gen_tps, prefix, preemptions,
        # finished, ttft, itl, queue, e2e, spec): null in this object because the engine has none, not 0
        "not_exported": e.not_exported,
        "topology": e.topology, "container": e.container, "model": e.model, "version": e.version,
        "kv_cache_usage": _r(e.kv_usage, 4), "running": e.running, "waiting": e.waiting,
        "backends": e.backends,  # a router's replicas as it sees them (HAProxy: UP, DOWN, ...), null otherwise
        "prompt_tps": _r(e.prompt_tps, 1), "gen_tps": _r(e.gen_tps, 1),
        "ttft_p50_ms": _r(e.ttft_p50 * 1000 if e.ttft_p50 is not None else None, 1),
        "ttft_p95_ms": _r(e.ttft_p95 * 1000 if e.ttft_p95 is not None else None, 1),
        "itl_p50_ms": _r(e.itl_p50 * 1000 if e.itl_p50 is not None else None, 1),
        "itl_p95_ms": _r(e.itl_p95 * 1000 if e.itl_p95 is not None else None, 1),
        "prefix_hit_rate": _r(e.prefix_hit_rate, 4), "preemptions": e.preemptions,
        # vLLM 0.32 and later (null from older engines). sleep_level: 1 weights offloaded, 2 all
        # discarded, null while awake or when the sleep only released the KV cache.
        "sleep_level": e.sleep_level if e.state == "sleeping" else None,
        "waiting_by_reason": e.waiting_by_reason,
        "admission_rejections": e.rejections, "admission_rejections_by_reason": e.rejections_by_reason,
        "admission_rejection_rate": _r(e.rejection_rate, 3), "admission_rejections_recent": e.rejections_recent,
        "admission_rejections_recent_s": _r(e.rejections_span, 1),
        "mem_bw_gbs": _gbs(e.mem_bw), "mem_read_gbs": _gbs(e.mem_read_bps), "mem_write_gbs": _gbs(e.mem_write_bps),
        # requests finished per second by finished_reason (stop, length, abort, error, repetition) and since
        # the engine started; latency percentiles over the window (status: its --seconds; the monitor: a
        # minute) and a p95 over the last minute
        "finished_rate": _r(e.finished_rate, 3),
        "finished_rate_by_reason": None if e.finished_rate_by_reason is None else {
            k: _r(v, 3) for k, v in e.finished_rate_by_reason.items()},
        "finished_by_reason": e.finished_by_reason, "requests_total": e.requests,
        "prompt_tokens_total": e.prompt_tokens_total, "gen_tokens_total": e.gen_tokens_total,
        "started": _when(e.started_at),
        "latency_ms": None if e.latency is None else {
            name: {k: _ms(v) for k, v in figures.items()} for name, figures in e.latency.items()},
        "queue_over_5s": e.queue_slow,
        # speculative decoding over the same window: the share of drafted tokens accepted, tokens per step
        "spec_acceptance": _r(e.spec_acceptance, 4), "spec_accept_len": _r(e.spec_accept_len, 3),
        "slots": e.slots,
        "nodes": state.engine_nodes(e) if state is not None else ([e.node] if e.node else []),
        "peaks": None if state is None else state.peaks.get(e.key),
        "energy": None if energy is None else energy.to_dict(prefs.energy_price_per_kwh if prefs else None),
        "events": notices_json(state, e.key),
        # a replica behind a router: its share of the requests finished, and why it lags the others (or null)
        "replica": None if (rep := replica_of(state.engines.values(), e.key) if state is not None else None) is None
        else {"share": _r(rep.share, 3), "lagging": rep.lagging},
        # what the model predicts under the load it has now (the requests running, the mean prompt and output
        # of those finished), as `sparktop predict` would: null while it runs nothing or without a model card
        "predicted": None if row is None else {
            "concurrency": row.concurrency, "prompt_tokens": row.pp, "output_tokens": row.tg,
            "gen_tps": _r(row.decode_tps, 1), "ttft_ms": _r(row.ttft_ms, 1)},
    }


def _gbs(bytes_per_s: float | None) -> float | None:
    """GB/s (10^9 bytes, as memory bandwidth is quoted: a GB10's 273 GB/s)."""
    return None if bytes_per_s is None else round(bytes_per_s / 1e9, 2)


def engine_state(e: EngineSnapshot, note: int | None = None) -> Text:
    """The state as the table says it: with the sleep level, a pointer to the
    note under the table that says why (a reason is a sentence; in a cell it
    would stand the row ten lines tall); and requests refused by a queue
    limit while status watched, in red (each one is an error a client got)."""
    if e.state == "sleeping":
        text = Text(e.sleep_text, style="sky_blue1")
    else:
        text = Text(e.state + (f" ({note})" if note is not None else ""))
    if e.rejections_recent:
        text.append(f", {e.rejections_recent:.0f} rejected", style="bold red")
    return text


def launch_health(record: LaunchRecord, state: ClusterState) -> str:
    """running | partial (some containers gone) | gone | unknown (a node did not answer)."""
    expected = running = 0
    for node, names in record.containers.items():
        snap = state.nodes.get(node)
        if snap is None or snap.state == "down" or snap.docker_status not in (None, "ok"):
            return "unknown"
        live = {c.name for c in snap.containers if c.state == "running"}
        expected += len(names)
        running += sum(1 for name in names if name in live)
    if expected and running == expected:
        return "running"
    return "partial" if running else "gone"




def launch_json(record: LaunchRecord, state: ClusterState, now: float) -> dict:
    return {"id": record.id, "recipe": record.recipe, "topology": record.topology, "nodes": record.nodes,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(record.started)),
            "uptime_s": round(now - record.started), "status": record.status,
            "containers": launch_health(record, state),
            "endpoints": [e["url"] for e in record.endpoints]}


def replica_groups_json(state: ClusterState) -> list[dict]:
    """Each model served as replicas behind a router (`2x tp=2`): its router, its replicas, and the
    percentiles of all their requests over the window, from their histograms summed (never a mean of
    theirs: `replicas.group_latency`), with how many observations and replicas went in, and what was left
    out."""
    engines = list(state.engines.values())
    routers = {tuple(e.key for e in group): router.url for router in engines if is_router(router.kind)
               and (group := group_behind(engines, router)) is not None}
    out = []
    for (model, topology), group in groups(engines).items():
        merged = group_latency(group)
        out.append({
            "model": model, "topology": topology, "router": routers.get(tuple(e.key for e in group)),
            "replicas": [e.url for e in group],
            "latency_ms": {name: {k: _ms(v) for k, v in m.figures.items()} for name, m in merged.latency.items()},
            # per latency: the observations summed (requests; tokens for itl) and the replicas they came from
            "merged": {name: {"observations": m.count, "replicas": m.replicas} for name, m in merged.latency.items()},
            "notes": merged.notes,
        })
    return out


def status_json(state: ClusterState, launches: list[LaunchRecord] | None = None,
                prefs: Preferences | None = None, window_s: float | None = None,
                inventory: Inventory | None = None) -> dict:
    now = time.time()
    # window_s: the seconds token rates and latency percentiles were taken over (status --seconds)
    return {"window_s": window_s, "nodes": [node_json(n, state, prefs) for n in state.ordered_nodes()],
            "engines": [engine_json(e, state, prefs, inventory) for e in state.ordered_engines()],
            "replica_groups": replica_groups_json(state),
            "launches": [launch_json(r, state, now) for r in launches or []]}


def _pred_cell(row: Any) -> str:
    """The gen t/s the model predicts for the load an engine has now: `sparktop predict`'s figure."""
    return "—" if row is None or row.decode_tps is None else f"{row.decode_tps:.1f}"


def _waiting(e: EngineSnapshot) -> str:
    if e.waiting is None:
        return "—"
    return f"{e.waiting:.0f} ({e.deferred:.0f} deferred)" if e.deferred > 0 else f"{e.waiting:.0f}"


NODE_COLUMNS = (Column("node", 0), Column("state", 0), Column("mem used / total", 1), Column("avail", 4),
                Column("gpu", 2), Column("temp", 5), Column("power", 3), Column("cpu", 4), Column("containers", 6))
# The endpoint is how a user tells engines apart, its state and generation rate what they came for.
ENGINE_COLUMNS = (Column("endpoint", 0), Column("engine", 3), Column("model", 2), Column("state", 0),
                  Column("KV", 4), Column("run", 2), Column("wait", 4), Column("prompt t/s", 5),
                  Column("gen t/s", 1), Column("pred", 3), Column("TTFT p50", 4), Column("ITL p50", 6))


def print_tables(state: ClusterState, console: Console, launches: list[LaunchRecord] | None = None,
                 inventory: Inventory | None = None) -> None:
    rows: list[list[object]] = []
    for n in state.ordered_nodes():
        mem = n.memory
        rows.append([
            n.name, n.state if not n.reason else f"{n.state}: {n.reason}",
            f"{mem.used / GIB:.1f} / {mem.total / GIB:.1f} GiB" if mem else "—",
            f"{mem.available / GIB:.1f} GiB" if mem else "—",
            f"{n.gpu.util:.0f}%" if n.gpu and n.gpu.util is not None else n.gpu_status,
            f"{n.gpu.temp:.0f}°C" if n.gpu and n.gpu.temp is not None else "—",
            f"{n.gpu.power:.0f} W" if n.gpu and n.gpu.power is not None else "—",
            f"{n.cpu_pct:.0f}%" if n.cpu_pct is not None else "—",
            "\n".join(c.name for c in n.containers if c.state == "running") or "—",
        ])
    console.print(fitted("nodes", NODE_COLUMNS, rows, console.width))
    columns = {"kv", "running", "waiting", "prompt_tps", "gen_tps", "ttft", "itl"}  # the figures it shows
    caption = "n/e: not exported by that engine" if any(
        columns.intersection(e.not_exported) for e in state.engines.values() if not is_router(e.kind)) else None
    notes: list[str] = []
    rows = []
    for e in state.ordered_engines():
        def cell(figure: str, value: str, e: EngineSnapshot = e) -> str:
            return value if e.exports(figure) or is_router(e.kind) else "n/e"

        why = e.error or e.reason
        if why and e.state != "sleeping":
            notes.append(f"({len(notes) + 1}) {e.url}: {why}")
        rows.append([
            e.url.removeprefix("http://"), f"{e.engine or e.kind} {e.version or ''}".strip() or "—",
            (e.model or "—").rsplit("/", 1)[-1],
            engine_state(e, len(notes) if why and e.state != "sleeping" else None),
            cell("kv", f"{e.kv_usage * 100:.1f}%" if e.kv_usage is not None else "—"),
            cell("running", f"{e.running:.0f}" if e.running is not None else "—"),
            cell("waiting", _waiting(e)),
            cell("prompt_tps", f"{e.prompt_tps:.1f}" if e.prompt_tps is not None else "—"),
            cell("gen_tps", f"{e.gen_tps:.1f}" if e.gen_tps is not None else "—"),
            _pred_cell(_predicted(e, inventory)),
            cell("ttft", f"{e.ttft_p50 * 1000:.0f} ms" if e.ttft_p50 is not None else "—"),
            cell("itl", f"{e.itl_p50 * 1000:.0f} ms" if e.itl_p50 is not None else "—"),
        ])
    predicted = [r for r in rows if r[9] not in ("", "—")]
    if predicted:
        # A prediction for the requests each engine runs at this moment, beside a rate over the whole window:
        # under a load that comes and goes the two part (the sweep holds the load steady and they meet).
        said = "pred: gen t/s `sparktop predict` gives for the requests it runs now (a steady load; the window's " \
               "rate moves with a load that comes and goes)"
        caption = f"{caption}; {said}" if caption else said
    engines = fitted("engines", ENGINE_COLUMNS, rows, console.width, caption)
    console.print(engines)
    for note in notes:
        console.print(note, highlight=False, soft_wrap=False)
    if launches:
        table = Table(title="launched by sparktop", title_justify="left")
        for col in ("launch", "recipe", "topology", "nodes", "since", "state", "endpoints"):
            table.add_column(col)
        now = time.time()
        for r in launches:
            health = launch_health(r, state)
            shown = r.status if health == "running" else f"{r.status}, containers {health}"
            table.add_row(r.id, r.recipe, r.topology, ", ".join(r.nodes),
                          time.strftime("%H:%M", time.localtime(r.started)) + f" ({ago(now - r.started)} ago)",
                          shown, " ".join(e["url"] for e in r.endpoints))
        console.print(table)
        if any(launch_health(r, state) in ("gone", "partial") for r in launches):
            console.print("[yellow]some launched containers are gone[/]: `sparktop stop ID` clears what is left")


def engines_on(inventory: Inventory, node: str | None = None, seconds: float = 2.2) -> list[EngineSnapshot]:
    """What serves on the inventory's nodes (or on `node` only), for `sweep --inventory` to pick its endpoint
    from: a layout's router where there is one (what its users call), else every engine that answers."""
    poller = Poller(node_targets(inventory), [], interval=1.0, default_port=inventory.defaults.port,
                    router_key=api_key_for, rate_window=seconds, latency_window=seconds, histogram_every=0.0)
    state = asyncio.run(collect(poller, seconds))
    found = [e for e in state.engines.values() if e.state not in ("unreachable", "failed")
             and (node is None or e.node == node)]
    routers = [e for e in found if is_router(e.kind)]
    return routers or sorted(found, key=lambda e: (e.node or "", e.url))


def main_status(inventory: Inventory, engines: list[str], as_json: bool = False, seconds: float = 2.2) -> int:
    prefs = load_preferences()  # a bad settings file is an error before anything is polled
    # Rates and percentiles over the whole watch, not between its last two polls: a real engine's counters
    # move in bursts, and two polls a second apart can both fall between two of them.
    poller = Poller(node_targets(inventory), engine_targets(engines), interval=1.0,
                    default_port=inventory.defaults.port, router_key=api_key_for,
                    rate_window=seconds, latency_window=seconds, histogram_every=0.0)
    state = asyncio.run(collect(poller, seconds))
    launches = LaunchState(inventory).active()
    if as_json:
        json.dump(status_json(state, launches, prefs, window_s=seconds, inventory=inventory), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_tables(state, Console(), launches, inventory)
    return 0
