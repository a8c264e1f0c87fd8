"""`sparktop demo`: a twin cluster on this machine (two nodes, or up to eight
with --nodes), serving a model under a light background load, watched by
the real app. By default one solo engine runs on each node; `--layout L`
launches the model's recipe in that layout instead (`tp=4`, `2x tp=2`,
`4x solo,shuffle`, ...), through the same launcher, plan and preflight as
`sparktop launch`.

`--runtime` serves with another engine's twin (`sglang`, `llama-cpp`,
`trtllm`), or several that the nodes take in turn (`vllm,llama-cpp`).

The nodes live under the state directory (`demo/`), each with its own
stand-in `docker`, `nvidia-smi`, `vllm`, `ray` and `ping`; the engines start through
the twin's docker exactly as on a real node, and the monitor reaches them
the way it reaches real nodes: a shell per node, HTTP per engine.

`--no-wait` leaves the cluster running without the app: its load, and a
collector (`sparktop collect --inventory demo`) writing the demo's history
as the app would; `--stop` removes the engines, gives the collector a few
seconds to see them go (their sessions end "stopped"/"unreachable", not
"serving"), then stops it and the load.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sparktop.engine_ids import DEFAULT, HAPROXY, ROUTER, is_router
from sparktop.errors import SparktopError
from sparktop.layouts import MAX_NODES
from sparktop.remote import Transport
from sparktop.settings import Defaults, demo_history_path, demo_inventory_path, load_preferences, state_dir
from sparktop.twin.cluster import DEFAULT_IMAGE, RUNTIME_IMAGES, TwinCluster, wait_ready


def demo_root():
    return state_dir() / "demo"


LOAD_PID = "load.pid"  # the background load of a demo left running (--no-wait), for --stop
COLLECT_PID = "collect.pid"  # the collector writing a --no-wait demo's history, for --stop
COLLECT_LOG = "collect.log"  # what that collector says
COLLECT_SETTLE_S = 4.0  # after its engines are removed: the collector's polls see them go
COLLECT_STOP_S = 20.0  # how long a collector gets to write its minute in progress and exit on SIGTERM


def write_demo_inventory(cluster: TwinCluster) -> None:
    """The demo's nodes as an inventory file other commands reach with `--inventory demo` (`status`, `sweep`,
    `history`, `launch --dry-run`, `study`), with the demo's history file and pace."""
    import yaml

    inventory = cluster.inventory()
    doc = {
        "nodes": [{"name": n.name, "host": n.host, "fabric_ip": n.fabric_ip, "eth_if": n.eth_if, "ib_if": n.ib_if,
                   "bind": n.bind, "env": n.env} for n in inventory.nodes],
        "defaults": {"image": inventory.defaults.image, "twin_speed": inventory.defaults.twin_speed,
                     "history_file": str(demo_history_path())},
    }
    path = demo_inventory_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by `sparktop demo` for its twin nodes on this machine; other commands reach them\n"
                    "# with `--inventory demo`. Removed by `sparktop demo --stop`.\n"
                    + yaml.safe_dump(doc, sort_keys=False))


def forget_demo_inventory() -> None:
    demo_inventory_path().unlink(missing_ok=True)


def node_names(count: int) -> tuple[str, ...]:
    """spark-a, spark-b, ... for a demo of `count` nodes (2 to 8)."""
    if not 1 <= count <= MAX_NODES:
        raise SparktopError(f"--nodes {count}: a demo runs 1 to {MAX_NODES} nodes")
    return tuple(f"spark-{chr(ord('a') + i)}" for i in range(count))


def demo_recipes(model: str, kinds: list[str]) -> list:
    """The recipe of `model` each node's engine runs (the runtime's own recipe of it, in turn); [] when the
    model has no recipe for every one of them (a bare model card: its twins start from the card)."""
    from sparktop.launch.catalog import find_recipe, runtime_recipes

    try:
        base = find_recipe(model)
        return [runtime_recipes(base, kind)[kind] for kind in kinds]
    except (SparktopError, KeyError):
        return []


def recipe_images(recipes: list) -> list[str]:
    """The images the recipes' solo engines run (the recipe's own, else the default for its runtime)."""
    defaults = Defaults()
    return [r.settings("solo")[3] or defaults.image_for(r.runtime) for r in recipes]


async def start_recipe_solos(cluster: TwinCluster, recipes: list) -> list[str]:
    """On each node, its recipe as `sparktop launch RECIPE --topology solo --nodes NODE` starts it (the plan's
    `docker run`, with its image, flags and prediction labels), not waited for: the demo serves what
    `sparktop predict RECIPE` says for it, at the twins' pace."""
    from sparktop.launch.topology import make_plan

    inventory = cluster.inventory()  # the nodes run at the cluster's pace and start-up speed (their hosts')
    urls = []
    for i, node in enumerate(cluster.nodes):
        plan = make_plan(recipes[i % len(recipes)], "solo", inventory, node_names=[node.name])
        for step in plan.steps:
            result = await node.transport().run(step.command, timeout=60, input=step.stdin_text)
            if not result.ok:
                raise SparktopError(f"{node.name}: {step.title}: {result.first_error_line()}")
        urls += [e.url for e in plan.endpoints]
    return urls


def demo_engines(runtime: str | None) -> list[str]:
    """`--runtime sglang`, `--runtime vllm,llama-cpp` (the nodes take them in turn) -> engine ids."""
    from sparktop.launch.runtimes import UnknownRuntime, runtime_for

    out = []
    for name in (runtime or DEFAULT).split(","):
        try:
            out.append(runtime_for(name.strip()).id)
        except UnknownRuntime as exc:
            raise SparktopError(f"--runtime {name.strip()}: {exc}") from None
    return out


async def start_demo_cluster(model: str, speed: float = 1.0, startup_speed: float = 30.0,
                             wait: bool = True, nodes: int = 2, engines: bool = True,
                             runtime: str | None = None) -> tuple[TwinCluster, list[str]]:
    """The demo's nodes, fresh, and (`engines`) a solo engine on each, in `runtime` (vLLM; or
    `sglang`, `llama-cpp`, `trtllm`, or several the nodes take in turn)."""
    kinds = demo_engines(runtime)
    recipes = demo_recipes(model, kinds)
    # The images the inventory's recipes use are "pulled" too, so the launcher works in the demo.
    defaults = Defaults()
    root = demo_root()
    if root.exists():  # a demo left running: its engines go before its directories do
        left = tuple(sorted(p.name for p in root.glob("spark-*") if p.is_dir()))
        stop_detached_load(root)
        if left:
            await stop_everything(TwinCluster(root, names=left).setup(fresh=False))
        stop_collector(root, settle=COLLECT_SETTLE_S if left else 0.0)  # it holds the demo history's lock
    cluster = TwinCluster(root, names=node_names(nodes), speed=speed, startup_speed=startup_speed,
                          images=[DEFAULT_IMAGE, defaults.image, defaults.router_image, defaults.haproxy_image,
                                  *RUNTIME_IMAGES.values(), *recipe_images(recipes)]).setup()
    write_demo_inventory(cluster)
    if not engines:
        return cluster, []
    if recipes:
        urls = await start_recipe_solos(cluster, recipes)
    else:  # a model card with no recipe: its twin from the card, on the engine's default image
        urls = await cluster.run_solo(model=model, startup_speed=startup_speed, engines=kinds)
    if wait:
        await wait_ready(urls, timeout=180)
    return cluster, urls


def demo_inventory(speed: float = 1.0, startup_speed: float = 30.0):
    """The demo's two twin nodes as an inventory (set up when they are not),
    for `sparktop study --demo`: the study launches on them as on Sparks."""
    defaults = Defaults()
    root = demo_root()
    cluster = TwinCluster(root, speed=speed, startup_speed=startup_speed,
                          images=[DEFAULT_IMAGE, defaults.image, defaults.router_image, defaults.haproxy_image,
                                  *RUNTIME_IMAGES.values()])
    cluster.setup(fresh=not root.exists())
    _link_litellm(cluster)
    write_demo_inventory(cluster)
    return cluster.inventory()


def _link_litellm(cluster: TwinCluster) -> None:
    # The router topologies run the real LiteLLM proxy or HAProxy inside the twin's
    # "container": the ones on this machine (Debian's haproxy is in /usr/sbin), when there are.
    for program, found in (("litellm", shutil.which("litellm")),
                           ("haproxy", shutil.which("haproxy") or _executable("/usr/sbin/haproxy"))):
        link = cluster.root / "bin" / program
        if found and not link.exists():
            link.symlink_to(found)


def _executable(path: str) -> str | None:
    return path if os.access(path, os.X_OK) else None


async def launch_layout(cluster: TwinCluster, recipe_id: str, layout: str, say=print):
    """Launch `recipe_id` in `layout` over every node of the demo, as
    `sparktop launch --yes` would: the plan, preflight (stopping on a
    failure), then each step. Returns the launcher (to stop it) and the
    launched plan; a layout that cannot run raises SparktopError."""
    from sparktop.launch.catalog import find_recipe
    from sparktop.launch.session import Launcher, LaunchRequest

    recipe = find_recipe(recipe_id)
    _link_litellm(cluster)
    launcher = Launcher(cluster.inventory())
    try:
        request = LaunchRequest(recipe, layout)
        plan = launcher.plan(request)
        for e in plan.endpoints:
            if e.kind == HAPROXY and not (cluster.root / "bin" / "haproxy").exists():
                raise SparktopError(f"--layout {layout}: the router needs HAProxy on this machine "
                                    "(apt-get install haproxy), or name LiteLLM's: --layout '2x solo,least-busy'")
            if e.kind == ROUTER and not (cluster.root / "bin" / "litellm").exists():
                raise SparktopError(f"--layout {layout}: the router needs LiteLLM on this machine "
                                    "(pip install 'litellm[proxy]')")
        result = await launcher.preflight(plan, recipe)
        if not result.ok:
            failed = result.failures[0]
            raise SparktopError(f"--layout {layout}: preflight failed on {failed.node}: {failed.message}")
        launcher.begin(plan)
        async for _event in launcher.follow():
            pass
        run = launcher.run
        assert run is not None
        if run.status != "ready":
            raise SparktopError(f"--layout {layout}: the launch failed: {run.reason}")
        say(f"  {run.plan.launch_id} ready in {run.seconds:.1f} s on {', '.join(run.plan.nodes)}")
        return launcher, run.plan
    except BaseException:
        await launcher.close()
        raise


def start_load(urls: list[str], low: int = 1, high: int = 6, key: str | None = None,
               detached: bool = False) -> subprocess.Popen:
    # Same process group as the app, and it exits when its parent does, so a closed terminal never leaves
    # load running against the next demo; `detached` (--no-wait): its own session, stopped by --stop.
    env = {**os.environ, "SPARKTOP_LOAD_API_KEY": key} if key else None  # a router's key: never on argv
    parent = [] if detached else ["--parent", str(os.getpid())]
    return subprocess.Popen([sys.executable, "-m", "sparktop.twin.load", *urls, "--min", str(low),
                             "--max", str(high), "--step-aside", *parent],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=detached)


def stop_detached_load(root) -> None:
    """The load a demo left running (--no-wait) goes with its engines."""
    pid_file = root / LOAD_PID
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass
    pid_file.unlink(missing_ok=True)


def start_collector(root: Path, interval: float = 1.0) -> subprocess.Popen:
    """`sparktop collect --inventory demo` in its own session, so a `--no-wait` demo has history as one
    watched by the app does (the demo's history file, from the inventory); stopped by `demo --stop`."""
    with open(root / COLLECT_LOG, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sparktop", "collect", "--inventory", "demo",
                                 "-i", f"{interval:g}"], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    (root / COLLECT_PID).write_text(str(proc.pid))
    return proc


def _is_collector(pid: int) -> bool:
    """The pid is still a sparktop collector (not a number the system gave to another process since)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"collect" in argv and any(b"sparktop" in a for a in argv)


def stop_collector(root: Path, settle: float = 0.0, sleep=time.sleep) -> bool:
    """Stop the collector a `--no-wait` demo left running, after `settle` seconds (its engines just removed:
    it sees them go); SIGTERM, so it ends its sessions and writes its minute in progress. Whether one ran."""
    pid_file = root / COLLECT_PID
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        pid_file.unlink(missing_ok=True)
        return False
    pid_file.unlink(missing_ok=True)
    if not _is_collector(pid):
        return False
    if settle > 0:
        sleep(settle)
    try:
        os.kill(pid, signal.SIGTERM)
        waited = 0.0
        while _is_collector(pid) and waited < COLLECT_STOP_S:
            try:  # our own child (a test, the same process that started it): reap it
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            except ChildProcessError:
                pass
            sleep(0.1)
            waited += 0.1
        if _is_collector(pid):
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    return True


async def stop_everything(cluster: TwinCluster) -> int:
    """Remove everything on the demo's nodes: a launched layout as `sparktop
    stop` removes it (containers, Ray, router, its state directory with the
    router's key, its record), then any container left (the solo engines);
    how many containers were removed."""
    from sparktop.launch.session import running_launch_ids, stop_launches
    from sparktop.launch.state import LaunchState

    state = LaunchState(cluster.inventory())
    transports: dict[str, Transport] = {node.name: node.transport() for node in cluster.nodes}
    launches = await running_launch_ids(state, transports)
    removed = 0
    if launches:
        removed += sum((await stop_launches(state, launches, transports)).values())
    for transport in transports.values():
        names = (await transport.run(["docker", "ps", "-a", "--format", "{{.Names}}"], timeout=30)).stdout.split()
        if names:
            await transport.run(["docker", "rm", "-f", *names], timeout=60)
            removed += len(names)
    return removed


async def run_demo(args) -> int:
    layout = getattr(args, "layout", None)
    if args.stop:
        # As many nodes as the demo left running had.
        names = tuple(sorted(p.name for p in demo_root().glob("spark-*") if p.is_dir())) or node_names(2)
        cluster = TwinCluster(demo_root(), names=names).setup(fresh=False)
        stop_detached_load(cluster.root)
        removed = await stop_everything(cluster)
        # The collector sees the engines go (their sessions end), then writes what it has and exits.
        collected = stop_collector(cluster.root, settle=COLLECT_SETTLE_S if removed else 0.0)
        forget_demo_inventory()
        print(f"Stopped the demo cluster ({removed} container{'s' * (removed != 1)} removed"
              + (", its history collector stopped" if collected else "") + ").")
        return 0
    count = getattr(args, "nodes", 2) or 2
    runtime = getattr(args, "runtime", None)
    kinds = demo_engines(runtime)
    recipe_id = args.model
    if layout and runtime:
        # The layout launches the runtime's own recipe of the model (gpt-oss-120b-sglang), as a study would.
        if len(kinds) > 1:
            raise SparktopError("--layout takes one --runtime: a layout launches one recipe")
        from sparktop.launch.catalog import find_recipe, runtime_recipes
        from sparktop.launch.runtimes import runtime_id

        recipe_id = runtime_recipes(find_recipe(args.model), runtime)[runtime_id(runtime)].id
    what = f"a {count}-node twin cluster" if count != 2 else "a two-node twin cluster"
    how = "" if kinds == [DEFAULT] else " with " + ", ".join(dict.fromkeys(kinds))
    print(f"Starting {what} serving {args.model}{how}" + (f" as {layout}" if layout else "") + " ...", flush=True)
    if layout:
        cluster, _ = await start_demo_cluster(args.model, args.speed, wait=False, nodes=count, engines=False)
        launcher, plan = await launch_layout(cluster, recipe_id, layout)
        await launcher.close()
        served = [e for e in plan.endpoints if is_router(e.kind)] or plan.endpoints
        urls = [e.url for e in served]
        key = launcher.state.key(plan.launch_id) if served[0].api_key_env else None
    else:
        cluster, urls = await start_demo_cluster(args.model, args.speed, wait=args.no_wait, nodes=count,
                                                 runtime=runtime)
        key = None
    if args.no_wait:
        if layout:
            for e in plan.endpoints:
                print(f"  {e.kind:6} {e.node:8} {e.url}/v1")
        else:
            for node, url in zip(cluster.nodes, urls, strict=False):
                print(f"  {node.name:8} {url}/v1   (metrics: {url}/metrics)")
        # The light load goes on without the screen (a sweep still gets the node to itself), so figures move.
        load = start_load(urls, key=key, detached=True)
        (cluster.root / LOAD_PID).write_text(str(load.pid))
        # Its history too, as the app would write it: `sparktop history --inventory demo` reads it.
        collector = start_collector(cluster.root, args.interval)
        print(f"History: collected (pid {collector.pid}) into {demo_history_path()}; "
              "sparktop history --inventory demo")
        print("Left running under a light load; from any shell: sparktop status --inventory demo "
              "(and sweep, history, launch --dry-run, study with --inventory demo)")
        print(f"Stop with: sparktop demo --stop  (state in {cluster.root})")
        return 0

    from sparktop.launch.state import api_key_for
    from sparktop.observe.poller import NodeTarget, Poller
    from sparktop.ui.run import run_monitor

    prefs = load_preferences()
    load = start_load(urls, key=key)
    poller = Poller([NodeTarget(n.name, n.transport(), n.address) for n in cluster.nodes],
                    interval=args.interval, default_port=None, router_key=api_key_for,
                    rate_window=getattr(args, "rate_window", None) or prefs.rate_window_s,
                    latency_window=prefs.latency_window_s)
    try:
        await run_monitor(cluster.inventory(), [], label=f"demo: twin cluster serving {args.model}",
                          poller=poller, record=args.record,
                          # The twins' history stays apart from the user's own (h shows it; `sparktop
                          # history --inventory demo` reads it), and outlives the demo's nodes.
                          history_path=str(demo_history_path()))
    finally:
        load.send_signal(signal.SIGTERM)
        try:
            load.wait(5)
        except subprocess.TimeoutExpired:
            load.kill()
        await stop_everything(cluster)
        forget_demo_inventory()
    return 0
