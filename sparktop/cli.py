"""The `sparktop` command: argument parsing and dispatch, nothing else.

Every subcommand imports what it needs when it runs, so `sparktop status`
does not pay for Textual and `sparktop --help` is instant. Errors a user
can act on (SparktopError) print as one line and exit non-zero.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import sys

from sparktop import __version__, engine_ids
from sparktop.errors import SparktopError
from sparktop.twin.dialects import DIALECTS

# The engines help texts list, from the table: those the twin speaks besides vLLM; those sparktop launches (the
# runtimes sparkrun runs, `test_engine_names` holds them equal); those it recognises, in the names people type.
_TWIN_OTHERS = ", ".join(engine_ids.typed(engine_ids.get(d)) for d in DIALECTS if d != engine_ids.DEFAULT)
_LAUNCHED = [engine_ids.typed(r) for r in engine_ids.ROWS if r.sparkrun]
_WATCHED = ", ".join(engine_ids.typed(r) for r in engine_ids.KNOWN_ENGINES)


def cmd_demo(args) -> int:
    from sparktop.demo import run_demo

    return asyncio.run(run_demo(args))


def _inventory(args):
    from sparktop.settings import load_inventory

    return load_inventory(args.inventory)


def _history_file(args, inventory=None) -> str | None:
    """--file, else the inventory's `defaults.history_file` (the demo's names its own), else the default."""
    from sparktop.settings import DEMO_INVENTORY, demo_history_path

    if getattr(args, "file", None):
        return args.file
    if inventory is None and getattr(args, "inventory", None) == DEMO_INVENTORY:
        return str(demo_history_path())  # the demo's, whether a demo runs now or not
    if inventory is None and getattr(args, "inventory", None):
        inventory = _inventory(args)
    return inventory.defaults.history_file if inventory is not None else None


def _engines(args) -> list[str]:
    """`--engine` as given, each an address (a bare word is refused here, before anything is watched)."""
    from sparktop.observe.targets import check_engine_url

    return [check_engine_url(url) for url in args.engine or []]


def cmd_monitor(args) -> int:
    from sparktop.ui.run import main_monitor

    inventory = _inventory(args)
    return main_monitor(inventory, _engines(args), args.interval, args.record, args.recipes,
                        study=args.study, read_only=args.read_only, rate_window=args.rate_window,
                        history_path=inventory.defaults.history_file, canary=_canary_policy(args))


def cmd_web(args) -> int:
    from sparktop.web import main_web, resolve_token, session_command

    token = resolve_token(args.host, args.no_token)
    _inventory(args)  # a broken inventory is an error now, not in every browser session
    command = session_command(args.inventory, _engines(args), args.interval, read_only=not args.allow_control,
                              rate_window=args.rate_window)
    return main_web(args.host, args.port, command, token, read_only=not args.allow_control)


def cmd_status(args) -> int:
    from sparktop.settings import demo_inventory_path
    from sparktop.status import main_status

    code = main_status(_inventory(args), _engines(args), as_json=args.json, seconds=args.seconds)
    if args.inventory is None and demo_inventory_path().exists():
        # The demo's nodes are not this machine's inventory: say how to reach them (stderr: --json stays JSON).
        print("a demo is running: `sparktop status --inventory demo` shows its nodes", file=sys.stderr)
    return code


def _launch_inventory(args):
    from sparktop.settings import inventory_from_hosts, load_inventory

    if getattr(args, "nodes", None):
        inv = load_inventory(args.inventory) if args.inventory else None
        hosts = [h.strip() for h in args.nodes.split(",") if h.strip()]
        if inv is not None and all(any(n.name == h or n.host == h for n in inv.nodes) for h in hosts):
            return inv, [inv.node(h).name for h in hosts]
        return inventory_from_hosts(hosts), hosts
    return load_inventory(args.inventory), None


def cmd_sweep(args) -> int:
    from sparktop.bench.commands import cmd_sweep as run

    if args.inventory and not args.endpoint and not args.resume:
        _sweep_endpoint_from(args)
    return run(args)


def _sweep_endpoint_from(args) -> None:
    """`sweep --inventory FILE|demo [--node NAME]`: the endpoint is what serves there (a layout's router, else
    the one engine), its layout and node recorded, the node's power read."""
    from sparktop.errors import SparktopError
    from sparktop.settings import load_inventory
    from sparktop.status import engines_on

    inventory = load_inventory(args.inventory)
    if args.node and args.node not in {n.name for n in inventory.nodes}:
        raise SparktopError(f"--node {args.node}: no such node in {args.inventory} "
                            f"({', '.join(n.name for n in inventory.nodes)})")
    found = engines_on(inventory, args.node)
    where = f"{args.node} ({args.inventory})" if args.node else args.inventory
    if not found:
        raise SparktopError(f"nothing serves on {where}: `sparktop status --inventory {args.inventory}` shows "
                            "what runs there")
    if len(found) > 1:
        listed = ", ".join(f"{e.node} {e.url}" for e in found)
        raise SparktopError(f"{len(found)} engines serve on {where} ({listed}): pick one with --node NAME "
                            "or --endpoint URL")
    engine = found[0]
    args.endpoint = engine.url
    args.topology = args.topology or engine.topology
    args.nodes = args.nodes or engine.node
    args.inventory_loaded = inventory
    print(f"sweeping {engine.model or 'the engine'} at {engine.url} on {engine.node} ({args.inventory})",
          file=sys.stderr)


def cmd_compare(args) -> int:
    from sparktop.bench.commands import cmd_compare as run

    return run(args)


def cmd_export(args) -> int:
    """`sparktop export RUN --arena DIR`: the recipe that served is read here (bench may not import launch)."""
    from sparktop.bench.commands import cmd_export as run_export
    from sparktop.bench.results import load_run

    ref = args.recipe or load_run(args.run).meta.get("recipe")
    served: dict = {}
    text = None
    if ref:
        from sparktop.launch.catalog import find_recipe

        try:
            recipe = find_recipe(ref)
        except SparktopError:
            if args.recipe:
                raise
            recipe = None  # the name the run recorded is not a recipe here: exported without one
        if recipe is not None:
            text = recipe.path.read_text() if recipe.path else None
            served = {"image": recipe.image, "runtime": recipe.runtime, "hf_model": recipe.model}
    return run_export(args, text, served)


def cmd_runs(args) -> int:
    from sparktop.bench.commands import cmd_runs as run

    return run(args)


def cmd_predict(args) -> int:
    from sparktop.launch.commands import cmd_predict as run

    return run(args)


def cmd_twin_fit(args) -> int:
    from sparktop.model.commands import cmd_fit as run

    return run(args)


def cmd_study(args) -> int:
    from sparktop.study.commands import cmd_study as run

    demo = args.demo
    if args.resume and not demo:
        from sparktop.settings import DEMO_INVENTORY
        from sparktop.study.state import load_study

        demo = load_study(args.resume).inventory == DEMO_INVENTORY
    if demo:
        from sparktop.demo import demo_inventory
        from sparktop.settings import DEMO_INVENTORY, demo_inventory_path, load_inventory
        from sparktop.study.commands import refuse_busy_demo
        from sparktop.study.planning import DEMO_RECIPE

        if not args.resume and demo_inventory_path().exists():
            # A demo left running: refused before its inventory is written again at this study's speed.
            refuse_busy_demo(load_inventory(DEMO_INVENTORY), args.recipe or DEMO_RECIPE)
        return run(args, demo_inventory(args.speed))
    return run(args)


def cmd_studies(args) -> int:
    from sparktop.study.commands import cmd_studies as run

    return run(args)


def cmd_report(args) -> int:
    from sparktop.study.commands import cmd_report as run

    return run(args)


def cmd_recipes(args) -> int:
    from sparktop.launch.commands import cmd_recipes as run

    return run(args.recipes, args.json)


def cmd_launch(args) -> int:
    from sparktop.launch.commands import cmd_launch as run

    inventory, nodes = _launch_inventory(args)
    if args.node:
        nodes = [inventory.node(args.node).name]
    topology = f"{args.topology},{args.router}" if args.router else args.topology
    return run(args.recipe, topology, inventory, nodes, args.set, args.port, args.dry_run, args.yes,
               args.timeout, args.recipes, watchdog=_watchdog_policy(args), hung_after=args.hung_after)


def _watchdog_policy(args):
    """`--watchdog`: the watchdog's policy (its defaults); None without it."""
    if not args.watchdog:
        return None
    from sparktop.launch.watchdog import Policy

    return Policy()


def _watchdog_options(parser, what: str) -> None:
    parser.add_argument("--watchdog", action="store_true", help=f"restart {what} when hung or dead (with backoff, "
                        "at most 3 restarts in 30 min, then it gives up and says so); nothing sparktop did not "
                        "launch is touched")
    # The default is observe.hang.HUNG_AFTER_S's (not imported here: every command would pay for it).
    parser.add_argument("--hung-after", type=float, metavar="S",
                        help="an engine that makes no tokens for S seconds while requests wait is hung (default 30)")


# observe.canary's defaults and least period (not imported here: every command would pay for aiohttp).
CANARY_EVERY_S, CANARY_MIN_EVERY_S, CANARY_TIMEOUT_S = 300.0, 30.0, 60.0


def _canary_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds (got {text!r})") from None
    if not value >= CANARY_MIN_EVERY_S:  # NaN too
        raise argparse.ArgumentTypeError(f"at least {CANARY_MIN_EVERY_S:g} seconds between canaries (got {text})")
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds (got {text})")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds (got {text!r})") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds (got {text})")
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds (got {text})")
    return value


def _canary_options(parser) -> None:
    parser.add_argument("--canary", nargs="?", type=_canary_seconds, const=CANARY_EVERY_S, metavar="S",
                        help=f"send each idle engine a 4-token request every S seconds (default "
                        f"{CANARY_EVERY_S:g}, at least {CANARY_MIN_EVERY_S:g}; never while it serves requests, "
                        "never to a router): one that gets no first token, or whose stream stalls, shows the "
                        "engine hung, which catches a hang with nothing asked of it; never counted as your traffic")
    parser.add_argument("--canary-timeout", type=_positive_seconds, default=CANARY_TIMEOUT_S, metavar="S",
                        help=f"seconds a canary waits for its first token, and for each chunk after it "
                        f"(default {CANARY_TIMEOUT_S:g})")


def _canary_policy(args):
    """`--canary [S]`: the canary's policy; None without it."""
    if getattr(args, "canary", None) is None:
        return None
    from sparktop.observe.canary import CanaryPolicy

    return CanaryPolicy(every=args.canary, first_token=args.canary_timeout, stall=args.canary_timeout)


def cmd_stop(args) -> int:
    from sparktop.launch.commands import cmd_stop as run

    inventory, _ = _launch_inventory(args)
    return run(inventory, args.launch, args.all)


def cmd_history(args) -> int:
    from sparktop.history.commands import main_history

    return main_history(args.since, args.until, args.engine, "json" if args.json else "csv" if args.csv else "table",
                        _history_file(args))


def cmd_collect(args) -> int:
    from sparktop.history.collect import install, main_collect, notify_from_env

    engines = _engines(args)  # a unit that watches a bare word is refused before it is written
    if args.install:
        return install([a for a in args.argv[args.argv.index("collect") + 1:] if a != "--install"])
    metrics = None
    if args.serve_metrics:
        from sparktop.history.exporter import parse_listen, resolve_metrics_token

        host, port = parse_listen(args.serve_metrics)
        # The web's rules: loopback needs no token; any other address one (SPARKTOP_METRICS_TOKEN, or a new one).
        token, generated = resolve_metrics_token(host)
        metrics = (host, port, token, generated)
    inventory = _inventory(args)
    return main_collect(inventory, engines, args.interval, args.rate_window, _history_file(args, inventory),
                        metrics, notify=notify_from_env(args.notify), alert_after=args.alert_after,
                        watchdog=_watchdog_policy(args), hung_after=args.hung_after, canary=_canary_policy(args))


def cmd_replay(args) -> int:
    from sparktop.ui.run import main_replay

    return main_replay(args.file, args.speed)


def cmd_sync(args) -> int:
    from sparktop.sync.commands import cmd_sync as run

    return run(args)


def cmd_cache(args) -> int:
    from sparktop.sync.commands import cmd_cache as run

    return run(args)


def cmd_twin_serve(args) -> int:
    return _twin_serve(args.rest)


def cmd_twin_node(args) -> int:
    from pathlib import Path

    from sparktop.twin.host import TwinHost
    from sparktop.twin.node import install

    host = TwinHost(Path(args.home).resolve())
    images = [i for i in (args.images or "").split(",") if i]
    host.setup(args.name, speed=args.speed, images=images or None, address=args.address)
    bin_dir = install(Path(args.bin).resolve() if args.bin else host.home / "bin")
    for key, value in host.env(bin_dir).items():
        print(f"export {key}={value}" if key != "PATH" else f"export PATH={bin_dir}:$PATH")
    return 0


def cmd_twin_cards(args) -> int:
    from sparktop.model.commands import cmd_cards as run

    return run(args)


def _watch_options(p, interval: bool = True) -> None:
    p.add_argument("--inventory", metavar="FILE", help="cluster inventory (default: "
                   "$XDG_CONFIG_HOME/sparktop/cluster.yaml; none: this node only)")
    p.add_argument("--engine", action="append", metavar="URL",
                   help="also watch this OpenAI-compatible endpoint (repeatable)")
    if interval:
        p.add_argument("-i", "--interval", type=float, default=1.0, help="seconds between polls (default 1)")
        _rate_window_option(p)


def _window_seconds(text: str) -> float:
    from sparktop.settings import window_problem

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds (got {text!r})") from None
    problem = window_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _rate_window_option(p) -> None:
    p.add_argument("--rate-window", type=_window_seconds, metavar="S", help="tokens/s and link rates over the "
                   "last S seconds (default 10, or rate_window_s in settings.yaml)")


def _add_watching(add, watch_options) -> None:
    """`sparktop monitor and demo`."""
    monitor = add("monitor", "watch nodes and engines live (the default)", cmd_monitor)
    watch_options(monitor)
    monitor.add_argument("--record", metavar="FILE", help="write every snapshot to FILE (JSON lines)")
    monitor.add_argument("--recipes", action="append", metavar="DIR", help="also offer recipes from DIR in the "
                         "launcher (l)")
    monitor.add_argument("--study", metavar="ID", help="attach to a study another process runs (sparktop study): "
                         "its screen over the monitor")
    monitor.add_argument("--read-only", action="store_true", help=argparse.SUPPRESS)  # sparktop web's sessions
    _canary_options(monitor)
    demo = add("demo", "start a twin cluster on this machine (two nodes, or --nodes N) and watch it", cmd_demo)
    demo.add_argument("--nodes", type=int, default=2, metavar="N", help="twin nodes, 1 to 8 (default 2): one engine "
                      "on each")
    demo.add_argument("--model", default="gpt-oss-120b", help="model card to serve (default: gpt-oss-120b); "
                      "with --layout, the recipe to launch")
    demo.add_argument("--layout", "-t", metavar="L", help="launch the recipe in this layout over the demo's nodes "
                      "instead of a solo engine on each (tp=4, 2x tp=2 behind HAProxy, 4x solo,shuffle behind "
                      "LiteLLM, ...)")
    demo.add_argument("--runtime", metavar="R", help=f"serve with the twin of another engine: {_TWIN_OTHERS}, or "
                                                     "several the nodes take in turn (vllm,llama-cpp)")
    demo.add_argument("--speed", type=float, default=1.0, help="run the twins this many times faster")
    demo.add_argument("--no-wait", action="store_true", help="print the endpoints and exit, leaving them running")
    demo.add_argument("--stop", action="store_true", help="stop a demo cluster left running with --no-wait")
    demo.add_argument("-i", "--interval", type=float, default=1.0, help="seconds between polls (default 1)")
    _rate_window_option(demo)
    demo.add_argument("--record", metavar="FILE", help="write every snapshot to FILE (JSON lines)")


def _add_launching(add) -> None:
    """`sparktop launch and stop`."""
    launch = add("launch", "launch a recipe in a topology (prints the plan, runs preflight, starts it)", cmd_launch)
    launch.add_argument("recipe", help="a recipe's name (see `sparktop recipes`) or a YAML file")
    launch.add_argument("--layout", "--topology", "-t", dest="topology", default="solo", metavar="LAYOUT",
                        help="solo, cluster-ray, cluster-mp, shuffle, least-busy, or a layout over more nodes: "
                             "tp=4, tp=4,ray, tp=2,pp=2, tp=2,ep, '2x tp=2', '2x solo' (default: solo)")
    launch.add_argument("--router", choices=["leastconn", "shuffle", "least-busy", "litellm"],
                        help="how requests are spread over replicas: leastconn (HAProxy, the default), LiteLLM's "
                             "shuffle or least-busy (for LiteLLM's own features), or litellm (LiteLLM in front of "
                             "HAProxy leastconn)")
    launch.add_argument("--inventory", metavar="FILE", help="cluster inventory (sparktop cluster.yaml, a sparkrun "
                        "cluster file, or eugr's .env)")
    launch.add_argument("--nodes", metavar="A,B", help="ssh hosts for a one-off launch (the first is the head)")
    launch.add_argument("--node", help="for solo: the node to run on (default: the head)")
    launch.add_argument("--port", type=int, help="the API port (default: the recipe's, else the inventory's)")
    launch.add_argument("--set", action="append", metavar="FLAG=VALUE",
                        help="override one of the engine's arguments, in its own name, e.g. --set max_num_seqs=64 "
                             "(repeatable)")
    launch.add_argument("--recipes", action="append", metavar="DIR", help="also read recipes from DIR")
    launch.add_argument("--dry-run", action="store_true", help="print the exact commands and stop")
    launch.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    launch.add_argument("--timeout", type=float, default=1800, help="seconds to wait for readiness (default 1800)")
    _watchdog_options(launch, "its engines, staying in the foreground once it is ready (Ctrl-C stops watching; "
                              "the engines keep running)")
    stop = add("stop", "stop what sparktop launched (containers, Ray, the router) on every node", cmd_stop)
    stop.add_argument("launch", nargs="?", help="the launch id (default: the one running)")
    stop.add_argument("--all", action="store_true", help="stop every launch")
    stop.add_argument("--inventory", metavar="FILE", help="the inventory it was launched on (default: "
                      "$XDG_CONFIG_HOME/sparktop/cluster.yaml)")
    stop.add_argument("--nodes", metavar="A,B", help="the ssh hosts of a one-off launch (`launch --nodes A,B`)")


def _add_status(add, watch_options) -> None:
    """`sparktop status`."""
    status = add("status", "print one snapshot of nodes and engines (table or --json)", cmd_status)
    watch_options(status, interval=False)
    status.add_argument("--json", action="store_true", help="print JSON for scripts")
    status.add_argument("--seconds", type=float, default=2.2,
                        help="how long to watch before printing: token rates and latency percentiles are "
                        "over these seconds (default 2.2; 10 or more under bursty load)")


def _add_web(add, watch_options) -> None:
    """`sparktop web`."""
    web = add("web", "serve the monitor to a browser (a token guards it; read-only unless --allow-control)",
              cmd_web)
    watch_options(web)
    web.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: reach it "
                     "through an ssh tunnel)")
    web.add_argument("--port", type=int, default=8765, help="port to listen on (default 8765)")
    web.add_argument("--allow-control", action="store_true", help="let browser sessions launch, stop and sweep "
                     "(default: read-only)")
    web.add_argument("--no-token", action="store_true", help="ask no token (only on a loopback --host); by "
                     "default one is generated, or taken from SPARKTOP_WEB_TOKEN, and printed in the URL")


def _add_history(add, watch_options) -> None:
    """`sparktop history` and `sparktop collect`."""
    history = add("history", "what happened while you were away: serving sessions, daily totals, peaks, events",
                  cmd_history)
    history.add_argument("--since", default="24h", metavar="WHEN", help="from this long ago (24h, 7d, 90m) or this "
                         "local date and time (2026-11-20, '2026-11-20 08:00'); default 24h")
    history.add_argument("--until", metavar="WHEN", help="up to (default: now)")
    history.add_argument("--engine", metavar="X", help="only engines whose URL, model or engine name contains X")
    out = history.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON for scripts")
    out.add_argument("--csv", action="store_true", help="print CSV (a section column first)")
    history.add_argument("--file", metavar="PATH", help="the history file (default: the inventory's "
                         "defaults.history_file, else $XDG_DATA_HOME/sparktop/history.sqlite)")
    history.add_argument("--inventory", metavar="FILE", help="the cluster whose history to read (its "
                         "defaults.history_file; `demo`: the demo's)")
    collect = add("collect", "write the history without a screen (and serve metrics to Prometheus)", cmd_collect)
    watch_options(collect)
    collect.add_argument("--file", metavar="PATH", help="the history file (default: "
                         "$XDG_DATA_HOME/sparktop/history.sqlite)")
    collect.add_argument("--serve-metrics", metavar="HOST:PORT", help="serve every figure in Prometheus' format "
                         "on HOST:PORT/metrics (e.g. 127.0.0.1:9109; any other address than loopback needs a token)")
    collect.add_argument("--notify", action="append", metavar="URL", help="post every alert as it fires and "
                         "resolves, and a heartbeat at start, to this webhook (repeatable): a JSON body, or Slack's, "
                         "Discord's or ntfy's format by its host or a slack:/discord:/ntfy:/json: prefix")
    collect.add_argument("--alert-after", type=float, metavar="S", help="how long a condition holds before its "
                         "alert fires, and is gone before it resolves (default 30 s; some rules wait longer)")
    collect.add_argument("--install", action="store_true", help="write a systemd user unit that runs this collector "
                         "(with the other options given) and print how to enable it")
    _watchdog_options(collect, "the engines of sparktop's launches (what `sparktop launch` started on this "
                               "inventory)")
    _canary_options(collect)


def _add_sweeping(add) -> None:
    """`sparktop sweep, compare and runs`."""
    sweep = add("sweep", "run a concurrency sweep against an endpoint (live progress, results kept as they "
                "arrive)", cmd_sweep)
    sweep.add_argument("--endpoint", "-e", metavar="URL", help="http://HOST:PORT or http://HOST:PORT/v1")
    sweep.add_argument("--inventory", metavar="FILE", help="instead of --endpoint: sweep what serves on this "
                       "inventory's nodes (`demo`: the running demo's), a layout's router or its one engine")
    sweep.add_argument("--node", metavar="NAME", help="with --inventory: the node whose engine is swept")
    sweep.add_argument("-c", "--concurrency", default="1,2,4,8,16,32,64", metavar="LEVELS",
                       help="concurrency levels (default 1,2,4,8,16,32,64)")
    sweep.add_argument("--runs", type=int, default=5, help="batches per level (default 5; the articles used 50)")
    sweep.add_argument("--pp", type=int, default=1024, help="prompt tokens per request (default 1024)")
    sweep.add_argument("--tg", type=int, default=128, help="tokens to generate per request (default 128)")
    sweep.add_argument("--depth", default="0", metavar="TOKENS", help="context tokens before the prompt (default 0); "
                       "several (0,4096,16384,65536) sweep each concurrency at each depth; --prefix-cache on shares "
                       "one context per depth (reused from the engine's cache), off sends a new one each time")
    sweep.add_argument("--prefix-cache", choices=["on", "off"], default="off",
                       help="with --depth: one shared context every request reuses (on), or one each (off); the "
                            "prefill figures count only the tokens not served from the cache")
    sweep.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    sweep.add_argument("--extra-body", action="append", metavar="KEY=VALUE",
                       help="add to every request, e.g. reasoning_effort=low (repeatable, or a JSON object)")
    sweep.add_argument("--timeout", type=float, help="seconds per request (default: grows with tg and concurrency)")
    sweep.add_argument("--max-error-rate", type=float, default=0.10,
                       help="stop when more than this fraction of a level fails (default 0.10)")
    sweep.add_argument("--no-warmup", action="store_true", help="skip the warm-up batch per level")
    sweep.add_argument("--guard-url", action="append", metavar="URL",
                       help="the engine(s) whose /metrics prove the sweep had the engine to itself (default: "
                            "the endpoint; give the engines when the endpoint is a router; repeatable)")
    sweep.add_argument("--idle-timeout", type=float, default=60.0,
                       help="seconds to wait for an idle engine before each level (default 60)")
    sweep.add_argument("--no-remeasure", action="store_true",
                       help="report a level with foreign traffic as contaminated without measuring it again")
    sweep.add_argument("--no-metrics", action="store_true",
                       help="read nothing from the engine's /metrics while measuring, as AIPerf and vLLM's client do "
                            "(no KV/queue figures, no guard against foreign traffic): on a server whose API process "
                            "shares a busy core, each read delays the tokens it is streaming")
    sweep.add_argument("--exact-tg", action="store_true", help="ask for exactly --tg tokens (ignore_eos)")
    sweep.add_argument("--tokenizer", metavar="FILE", help="a local tokenizer.json: exact prompt lengths, and the "
                       "streamed text counted in tokens when the server sends neither usage nor token ids "
                       "(default: calibrate against the server)")
    sweep.add_argument("--latency-mode", choices=["api", "none"], default="api",
                       help="network latency subtracted from prefill time (default: api, as llama-benchy)")
    sweep.add_argument("--api-key-env", metavar="VAR", default="OPENAI_API_KEY",
                       help="environment variable holding the API key (default OPENAI_API_KEY)")
    sweep.add_argument("--recipe", help="record the recipe that is serving (for compare)")
    sweep.add_argument("--topology", help="record the topology that is serving, e.g. cluster-mp (for compare)")
    sweep.add_argument("--nodes", metavar="A,B", help="record the nodes that are serving")
    sweep.add_argument("--power", metavar="A,B",
                       help="read these nodes' GPU power (nvidia-smi, over ssh; inventory names, ssh hosts or "
                            "'local') during each level for its energy and cost per token (default: the inventory "
                            "nodes the endpoint's host names; 'none' turns it off)")
    rate = sweep.add_argument_group("request rates (instead of lockstep concurrency levels)")
    rate.add_argument("--rate", metavar="RATES", help="requests per second per level, e.g. 1,2,4,8: requests "
                      "leave on a schedule (AIPerf's and vLLM bench's way), not in lockstep batches")
    rate.add_argument("--arrivals", choices=["poisson", "constant"], default="poisson",
                      help="how requests arrive at a rate (default poisson: exponential gaps, seeded)")
    rate.add_argument("--requests", type=int, metavar="N", help="requests per rate level (default: --duration's "
                      "worth, 20 at least)")
    rate.add_argument("--duration", type=float, default=30.0, metavar="S", help="seconds of sending per rate level "
                      "(default 30: long enough for a queue to build where the server cannot keep up)")
    rate.add_argument("--max-concurrency", type=int, metavar="N", help="at most N requests in flight (a request "
                      "due while N are out waits for a slot; the wait is reported apart from the client's lag)")
    rate.add_argument("--seed", type=int, default=0, help="random seed of the arrivals (default 0)")
    rate.add_argument("--slo", metavar="TARGETS", help="service-level targets, e.g. ttft_p95=2s,itl_p95=100ms: "
                      "goodput (requests/s meeting them) and the share meeting them per level")
    rate.add_argument("--trace", metavar="FILE", help="replay a trace: JSON lines of timestamp (ms), input_length, "
                      "output_length[, hash_ids] (the Mooncake format AIPerf and GuideLLM read), each request at its "
                      "own time with its own lengths")
    rate.add_argument("--find-max-rate", action="store_true", help="search for the highest rate meeting --slo "
                      "(doubling from the first --rate, default 1, then halving the gap)")
    sweep.add_argument("--profile", metavar="NAME", help="a published profile, run as published: spark-arena-v2 "
                       "(depths 0-100000 x concurrency 1,2,5,10, pp 2048, tg 128, 3 runs, prefix caching on, its 28 "
                       "cells in its heat-aware order); it sets -c, --pp, --tg, --runs and the depths itself")
    sweep.add_argument("--label", help="a name for this run in compare tables")
    sweep.add_argument("--results", metavar="DIR", help="where runs are written (default: the results dir)")
    sweep.add_argument("--resume", metavar="RUN", help="finish a run that was interrupted (its id or directory)")
    out = sweep.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the run as JSON")
    out.add_argument("--md", action="store_true", help="print the run as a Markdown table")
    out.add_argument("--csv", action="store_true", help="print the levels as CSV")
    compare = add("compare", "compare sweep runs side by side: winners per level and crossovers", cmd_compare)
    compare.add_argument("runs", nargs="+", metavar="RUN",
                         help="a run id, a run directory, or a llama-benchy JSON file")
    compare.add_argument("--label", action="append", help="column name per run, in order (repeatable)")
    cout = compare.add_mutually_exclusive_group()
    cout.add_argument("--json", action="store_true", help="print JSON for scripts")
    cout.add_argument("--md", action="store_true", help="Markdown, like the articles' tables")
    cout.add_argument("--csv", action="store_true", help="print CSV")
    runs = add("runs", "list sweep runs, or import a llama-benchy JSON result or Spark Arena files as a run",
               cmd_runs)
    runs.add_argument("--import", dest="import_file", metavar="FILE|DIR", help="a llama-benchy --format json "
                      "output, or a directory of Spark Arena files (recipe.yaml, benchmark.csv, metadata.json)")
    runs.add_argument("--label", help="name for the imported run")
    runs.add_argument("--json", action="store_true", help="print JSON for scripts")
    export = add("export", "write a run as Spark Arena's submission files (nothing is uploaded)", cmd_export)
    export.add_argument("run", metavar="RUN", help="a run id, a run directory, or a llama-benchy JSON file")
    export.add_argument("--arena", metavar="DIR", required=True,
                        help="write recipe.yaml, benchmark.csv (llama-benchy 0.4's CSV) and metadata.json here, "
                             "and print what to run to submit them")
    export.add_argument("--recipe", help="the recipe that served, a name or a YAML file (default: the one the "
                        "run recorded)")


def _add_studying(add) -> None:
    """`sparktop study, studies and report`."""
    study = add("study", "launch, sweep and stop every topology of a recipe in turn, unattended and resumable; "
                "then report which serves best", cmd_study)
    study.add_argument("recipe", nargs="?", help="a recipe's name (see `sparktop recipes`) or a YAML file")
    study.add_argument("--topologies", "--layouts", dest="topologies", default="all",
                       metavar="all|solo,cluster-mp,...",
                       help="which layouts: all (the five two-node names the recipe allows on the nodes, the "
                            "default) or a list, e.g. solo,cluster-mp or 'tp=4,2x tp=2,4x solo'")
    study.add_argument("--runtimes", metavar="R,R", help=f"compare runtimes too: {','.join(_LAUNCHED)} — each "
                                                         "with its recipe of the same model, in every layout it runs")
    study.add_argument("-c", "--concurrency", default="1,2,4,8,16,32,64", metavar="LEVELS",
                       help="concurrency levels (default 1,2,4,8,16,32,64)")
    study.add_argument("--runs", type=int, default=5, help="batches per level (default 5)")
    load = study.add_argument_group("request rates and depth (instead of lockstep concurrency, or besides it)")
    load.add_argument("--rate", metavar="RATES", help="sweep each topology at these request rates (per second) "
                      "instead of concurrency levels")
    load.add_argument("--slo", metavar="TARGETS", help="e.g. ttft_p95=2s,itl_p95=100ms: goodput per topology")
    load.add_argument("--find-max-rate", action="store_true", help="find each topology's highest rate meeting "
                      "--slo: the report ranks them by it")
    load.add_argument("--arrivals", choices=["poisson", "constant"], default="poisson",
                      help="how requests arrive at a rate (default poisson: exponential gaps, seeded)")
    load.add_argument("--requests", type=int, metavar="N", help="requests per rate level (default: --duration's)")
    load.add_argument("--duration", type=float, default=30.0, metavar="S", help="seconds per rate level (30)")
    load.add_argument("--depth", default="0", metavar="TOKENS", help="context depths to sweep (0,4096,16384)")
    load.add_argument("--prefix-cache", choices=["on", "off"], default="off",
                      help="with --depth: load each context into the cache before the measured request")
    study.add_argument("--pp", type=int, default=1024, help="prompt tokens per request (default 1024)")
    study.add_argument("--tg", type=int, default=128, help="tokens to generate per request (default 128)")
    study.add_argument("--extra-body", action="append", metavar="KEY=VALUE",
                       help="add to every request, e.g. reasoning_effort=low (repeatable)")
    study.add_argument("--set", action="append", metavar="FLAG=VALUE",
                       help="override one of the engine's arguments for every topology (repeatable; with "
                            "--runtimes, the launcher's settings, translated for each runtime)")
    study.add_argument("--inventory", metavar="FILE", help="cluster inventory (default: sparktop's cluster.yaml)")
    study.add_argument("--nodes", metavar="A,B", help="the nodes to use (default: the inventory's)")
    study.add_argument("--demo", action="store_true", help="study on the demo's two twin nodes (127.0.0.2/.3) "
                       "instead of an inventory")
    study.add_argument("--speed", type=float, default=1.0, help="with --demo: run the twins this many times faster "
                       "(their figures are then that many times a GB10's)")
    study.add_argument("--port", type=int, help="the API port (default: the recipe's, else the inventory's)")
    study.add_argument("--recipes", action="append", metavar="DIR", help="also read recipes from DIR")
    study.add_argument("--timeout", type=float, default=1800, help="seconds to wait for each start-up (default 1800)")
    study.add_argument("--max-error-rate", type=float, default=0.10,
                       help="a topology fails when more than this fraction of a level fails (default 0.10)")
    study.add_argument("--resume", metavar="ID", help="continue a study that was interrupted (removes what it "
                       "left running first; nothing measured is measured again)")
    study.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    studies = add("studies", "list studies and their state", cmd_studies)
    studies.add_argument("--json", action="store_true", help="print JSON for scripts")
    report = add("report", "a study's report: tables per metric, winners, crossovers, charts, what ran", cmd_report)
    report.add_argument("study", help="a study id (see `sparktop studies`) or directory")
    rout = report.add_mutually_exclusive_group()
    rout.add_argument("--md", action="store_true", help="Markdown with chart files (the default)")
    rout.add_argument("--html", metavar="FILE", help="one self-contained HTML file")
    rout.add_argument("--json", action="store_true", help="print the report as JSON for scripts")


def _add_recipes_and_predict(add) -> None:
    """`sparktop recipes and predict`."""
    recipes = add("recipes", "list the recipes sparktop can launch (shipped, yours, and --recipes DIR)", cmd_recipes)
    recipes.add_argument("--recipes", action="append", metavar="DIR", help="also read recipes from DIR")
    recipes.add_argument("--json", action="store_true", help="print JSON for scripts")
    pred = add("predict", "predict decode, prefill and TTFT per topology before launching", cmd_predict)
    pred.add_argument("recipe", nargs="?", help="a recipe (name or YAML file), a model card, or a config.json")
    pred.add_argument("--model", help="a model card instead of a recipe (see `sparktop twin cards`), or a path "
                      "to any model's config.json")
    pred.add_argument("--layout", "--topology", dest="topology", metavar="LAYOUTS",
                      help="layouts, comma-separated (solo,cluster-mp or tp=4,2x tp=2), or all: every layout "
                           "the inventory's nodes allow (default: what the recipe allows "
                      "on the inventory's nodes)")
    pred.add_argument("-c", "--concurrency", default="1,2,4,8,16,32,64", metavar="LEVELS",
                      help="concurrency levels (default 1,2,4,8,16,32,64)")
    pred.add_argument("--pp", type=int, default=1024, help="prompt tokens per request (default 1024)")
    pred.add_argument("--tg", type=int, default=128, help="tokens to generate per request (default 128)")
    pred.add_argument("--inventory", metavar="FILE", help="the nodes to predict for: how many (the layouts), "
                      "the constants fitted to them, defaults.twin_speed (default: sparktop's cluster.yaml)")
    pred.add_argument("--recipes", action="append", metavar="DIR", help="also read recipes from DIR")
    pred.add_argument("--set", action="append", metavar="FLAG=VALUE",
                      help="a vLLM flag as launch takes it (max_num_seqs=64, kv_cache_dtype=fp8, "
                           "gpu_memory_utilization=0.8, enforce_eager=true ...); the recipe's own by default")
    pred.add_argument("--quant", help="the checkpoint's format instead of the card's (bf16, fp8, nvfp4, mxfp4, int4, "
                                      "q4_k_m, q8_0)")
    pred.add_argument("--runtime", help=f"the engine to predict for: {_WATCHED} (default: the recipe's; "
                                        f"{engine_ids.name_of(engine_ids.DEFAULT)} for a card); one without published "
                                        "Spark figures is said so")
    pred.add_argument("--stack", metavar="ID", help="the vLLM build to predict for (eugr-vllm-node, "
                      "eugr-vllm-node-mxfp4, ngc-vllm, vllm-openai, vllm-openai-marlin, ...; default: the one the "
                      "recipe's image is, see model/data/stacks.yaml)")
    pred.add_argument("--speed", type=float, default=None, metavar="S",
                      help="nodes S times a GB10's pace (twins at --speed S): rates times S, times divided by it "
                           "(default: the inventory's defaults.twin_speed, 1 for real nodes)")
    pred.add_argument("--json", action="store_true", help="print JSON for scripts")


def _add_replay(add) -> None:
    """`sparktop replay`."""
    replay = add("replay", "play back a recorded monitor session (sparktop --record FILE)", cmd_replay)
    replay.add_argument("file", help="a recording made with --record")
    replay.add_argument("--speed", type=float, default=1.0, help="playback speed (default 1)")


def _add_sync(add) -> None:
    """`sparktop sync` and `sparktop cache`."""
    sync = add("sync", "copy a Hugging Face model or a Docker image from the node that has it to the nodes that "
               "lack it (rsync over SSH; docker save | docker load), resumable, checked on arrival", cmd_sync)
    sync.add_argument("what", metavar="MODEL_OR_IMAGE", help="a model's repo id (org/name, as in the HF cache) or an "
                      "image (repo:tag)")
    sync.add_argument("--from", dest="source", metavar="NODE", help="the node to copy from (default: the first that "
                      "has it whole)")
    sync.add_argument("--to", dest="targets", action="append", metavar="NODE", help="a node to copy to (repeat; "
                      "default: every other node)")
    sync.add_argument("--inventory", metavar="FILE", help="the nodes (default: sparktop's cluster.yaml)")
    sync.add_argument("-n", "--dry-run", action="store_true", help="show every command that would change a node, "
                      "run none (the nodes' caches are still read, to know what to copy)")
    sync.add_argument("-v", "--verbose", action="store_true", help="print every command before it runs")
    sync.add_argument("--bwlimit", metavar="RATE", help="rsync's --bwlimit for a model's copy (e.g. 500M: bytes per "
                      "second, K/M/G suffixes)")
    kind = sync.add_mutually_exclusive_group()
    kind.add_argument("--model", dest="kind", action="store_const", const="model",
                      help="MODEL_OR_IMAGE is a model (where it could be either)")
    kind.add_argument("--image", dest="kind", action="store_const", const="image",
                      help="MODEL_OR_IMAGE is a Docker image")
    cache = add("cache", "what each node has cached: the models in its Hugging Face cache and its Docker images",
                cmd_cache)
    cache.add_argument("--inventory", metavar="FILE", help="the nodes (default: sparktop's cluster.yaml)")
    cache.add_argument("--json", action="store_true", help="print JSON for scripts")


def _add_twin(sub) -> None:
    """`sparktop twin serve, node, fit and cards`."""
    twin = sub.add_parser("twin", help="the digital twin of a Spark node (serve, node, cards)",
                          description="the digital twin of a Spark node running "
                                      + engine_ids.listing([engine_ids.name_of(d) for d in DIALECTS], "or"))
    twin_sub = twin.add_subparsers(dest="twin_command", metavar="TWIN_COMMAND", required=True)
    serve = twin_sub.add_parser("serve", help=f"serve a model like `vllm serve` (or --engine {_TWIN_OTHERS} "
                                "and that engine's flags) on a simulated GB10",
                                add_help=False)
    serve.add_argument("rest", nargs=argparse.REMAINDER, help="the engine's own flags (`sparktop twin serve --help` "
                       "lists them)")
    serve.set_defaults(func=cmd_twin_serve)
    node = twin_sub.add_parser("node", help="set up a simulated host: state dir and stand-in commands")
    node.add_argument("--home", required=True, help="the host's state directory")
    node.add_argument("--name", required=True, help="the host's name")
    node.add_argument("--address", default="127.0.0.1", help="the host's address")
    node.add_argument("--bin", help="where to write vllm/docker/ray/nvidia-smi (default HOME/bin)")
    node.add_argument("--images", help="comma-separated images the host already has")
    node.add_argument("--speed", type=float, default=1.0, help="run the host's engines this many times faster than "
                      "a GB10 (default 1)")
    node.set_defaults(func=cmd_twin_node)
    fitp = twin_sub.add_parser("fit", help="the performance model fitted to the published Spark figures")
    fitp.add_argument("--report", action="store_true", help="published vs predicted per cell, then the saved "
                      "leave-one-model-out and leave-one-source-out tables and bands (the default)")
    fitp.add_argument("--refit", action="store_true", help="run the fit again and save the constants")
    fitp.add_argument("--save-summary", action="store_true",
                      help="save each card's error beside the constants without refitting (what `predict` states; "
                           "needed after the published figures change)")
    fitp.add_argument("--iterations", type=int, help="fit iterations (default 120; 40 with --runs)")
    fitp.add_argument("--cross-validate", action="store_true",
                      help="leave each model out, then each source, fit, predict it: the error band to expect for "
                           "an unmeasured model and how many left-out figures it holds (minutes: each refit "
                           "linearised around the fitted constants; saved beside the constants with --refit or "
                           "--save-summary, where `predict` reads it)")
    fitp.add_argument("--exact", action="store_true", help="with --cross-validate: refit each model out by the "
                      "simplex instead (about an hour on 2 cores)")
    fitp.add_argument("--stacks", nargs="*", metavar="STACK",
                      help="fit each software stack's factors on its own figures (all, or these), the shared "
                           "constants held, and save them (model/data/stacks.yaml says which source ran which)")
    fitp.add_argument("--runs", nargs="+", metavar="STUDY",
                      help="also fit to these studies' measurements (weighted above the published figures) and "
                           "save the constants for their inventory")
    fitp.add_argument("--inventory", metavar="FILE", help="the inventory the fitted constants are for")
    fitp.add_argument("--json", action="store_true", help="print JSON for scripts")
    fitp.set_defaults(func=cmd_twin_fit)
    cards = twin_sub.add_parser("cards", help="list the model cards the twin knows")
    cards.set_defaults(func=cmd_twin_cards)


def _twin_serve(argv: list[str]) -> int:
    """`sparktop twin serve [--engine sglang|llama-cpp|trtllm] [that engine's flags]`."""
    from sparktop import engine_ids
    from sparktop.twin.dialects import DIALECTS, dialect_for, speaks
    from sparktop.twin.server import serve_main

    engine = engine_ids.DEFAULT
    if argv[:1] == ["--engine"] or (argv and argv[0].startswith("--engine=")):
        asked = argv[1] if argv[0] == "--engine" and len(argv) > 1 else argv[0].partition("=")[2]
        argv = argv[2:] if argv[0] == "--engine" else argv[1:]
        if not speaks(asked):
            print(f"sparktop twin serve: --engine {asked!r}: the twin speaks {', '.join(sorted(DIALECTS))}",
                  file=sys.stderr)
            return 2
        engine = engine_ids.runtime_id(asked)
    if not any(a == "--host" or a.startswith("--host=") for a in argv) and not {"-h", "--help"} & set(argv):
        # A twin started by hand stays on this machine unless told (the engines' own default, 0.0.0.0, puts it
        # on every address, where every demo node would find it).
        argv = [*argv, "--host", "127.0.0.1"]
    # what its usage lines say
    prog = "sparktop twin serve" if engine == engine_ids.DEFAULT else dialect_for(engine).prog
    try:
        return serve_main(argv, prog=prog, engine=engine)
    except SystemExit as exc:
        if exc.code in (0, None) and {"-h", "--help"} & set(argv):  # the engine's parser printed its flags
            print("\n" + _twin_serve_own_help(), end="")
        raise


def _twin_serve_own_help() -> str:
    """What `twin serve --help` adds under the engine's own flags: sparktop's --engine, which comes first."""
    own = argparse.ArgumentParser(usage=argparse.SUPPRESS, add_help=False)
    group = own.add_argument_group("sparktop's own option (first, before the engine's flags)")
    group.add_argument("--engine", metavar="ENGINE", help=f"serve as the twin of another engine ({_TWIN_OTHERS}) "
                       "instead of vLLM, with that engine's own flags after it (`--engine sglang --help` lists them)")
    own.add_argument_group("where it listens", "127.0.0.1 unless --host is given (the engines' own default, "
                           "0.0.0.0, would serve on every address of this machine)")
    return own.format_help()


def cmd_setup(args) -> int:
    from sparktop.setup.commands import cmd_setup as run

    return run(args)


def _add_setup(add) -> None:
    setup = add("setup", "check and fix what a cluster of Sparks needs (ssh, the ConnectX-7 link, clocks, disk, "
                         "Docker) and write its inventory", cmd_setup)
    setup.add_argument("hosts", nargs="*", metavar="HOST", help="the nodes, the head first (ssh names or addresses, "
                       "[user@]host)")
    setup.add_argument("--discover", action="store_true", help="with no HOST: the Sparks mDNS lists (avahi-browse "
                       "_ssh._tcp, as NVIDIA's discover-sparks)")
    setup.add_argument("--user", help="the ssh user on every node (default: ~/.ssh/config's, else yours)")
    setup.add_argument("--inventory", metavar="FILE", help="the inventory to write (default: "
                       "$XDG_CONFIG_HOME/sparktop/cluster.yaml)")
    setup.add_argument("--yes", "-y", action="store_true", help="answer yes to every fix (not to an unknown host key)")
    setup.add_argument("--accept-new-host-keys", action="store_true",
                       help="trust a host key that is not in known_hosts yet (its fingerprint is printed)")
    setup.add_argument("--dry-run", action="store_true", help="print every command it would run; run none")
    setup.add_argument("--quiet", "-q", action="store_true", help="print only results, fixes and changing commands")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparktop",
        description=f"Watch, launch and benchmark {engine_ids.listing([e.name for e in engine_ids.KNOWN_ENGINES])} "
                    "on NVIDIA DGX Spark nodes.",
    )
    parser.add_argument("--version", action="version", version=f"sparktop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help_text: str, func):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    # In the order `sparktop --help` lists them.
    _add_watching(add, _watch_options)
    _add_setup(add)
    _add_launching(add)
    _add_status(add, _watch_options)
    _add_web(add, _watch_options)
    _add_history(add, _watch_options)
    _add_sweeping(add)
    _add_studying(add)
    _add_recipes_and_predict(add)
    _add_replay(add)
    _add_sync(add)
    _add_twin(sub)
    return parser


SIGPIPE_EXIT = 141  # what a shell reports for a command killed by SIGPIPE (128 + 13), as `yes | head -1` gives


def main(argv: list[str] | None = None) -> int:
    """Every command; one whose reader went away (`sparktop twin cards | head -2`) stops quietly."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # what is still buffered fails here (after --help too), not in the interpreter's exit
    except BrokenPipeError:
        # Python's "Note on SIGPIPE": what is left to write goes nowhere, so the exit's own flush cannot fail.
        with contextlib.suppress(OSError, ValueError):  # a stdout that is no file (captured) has nothing to redirect
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return SIGPIPE_EXIT


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["twin", "serve"]:
        # Everything after `twin serve` belongs to the engine's own parser (vLLM's unless --engine names another).
        return _twin_serve(argv[2:])
    parser = build_parser()
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["monitor", *argv]  # `sparktop` alone, or with monitor options, watches
    args = parser.parse_args(argv)
    args.argv = argv  # as typed: `collect --install` writes the same options into its unit
    try:
        return int(args.func(args) or 0)
    except SparktopError as exc:
        print(f"sparktop: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
