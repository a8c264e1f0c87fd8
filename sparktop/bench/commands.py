"""`sparktop sweep`, `sparktop compare` and `sparktop runs` for the terminal and scripts.

Progress is drawn on stderr when stdout is wanted for --json/--md/--csv, so
`sparktop sweep ... --json > run.json` works with a live display.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sparktop.bench import compare as cmp
from sparktop.bench import export
from sparktop.bench.events import (
    LevelContaminated,
    LevelDone,
    LevelStarted,
    MaxRateFound,
    RateLevelDone,
    RateLevelStarted,
    RequestDone,
    SweepEvent,
    SweepFinished,
    SweepStarted,
    WaitingForIdle,
)
from sparktop.bench.levels import SweepError, parse_depths, parse_levels
from sparktop.bench.results import import_llama_benchy, list_runs, load_run
from sparktop.bench.sweep import Sweep, SweepSettings, parse_extra_body
from sparktop.errors import SparktopError
from sparktop.observe.power import power_source
from sparktop.settings import load_preferences, results_dir
from sparktop.units import eta_text, fmt

EXIT_ERROR_RATE = 3


def cmd_sweep(args) -> int:
    if getattr(args, "rate", None) or getattr(args, "find_max_rate", False) or getattr(args, "trace", None):
        return cmd_rate_sweep(args)
    root = Path(args.results) if args.results else results_dir()
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    resume = None
    if args.resume:
        previous = load_run(args.resume)
        if previous.imported_levels is not None:
            raise SweepError(f"--resume {args.resume}: an imported llama-benchy file cannot be resumed")
        stored = dict(previous.meta.get("settings") or {})
        settings = SweepSettings(endpoint=args.endpoint or previous.meta.get("endpoint") or "",
                                 **{k: v for k, v in stored.items() if k in SweepSettings.__dataclass_fields__
                                    and k != "endpoint"})
        resume = previous.path
    else:
        if not args.endpoint:
            raise SweepError("--endpoint is required (http://HOST:PORT or http://HOST:PORT/v1)")
        depths = parse_depths(args.depth)
        settings = SweepSettings(
            endpoint=args.endpoint, levels=parse_levels(args.concurrency), runs=args.runs, pp=args.pp, tg=args.tg,
            depth=depths[0], depths=depths if len(depths) > 1 else None, prefix_cache=args.prefix_cache == "on",
            model=args.model, extra_body=parse_extra_body(args.extra_body), timeout=args.timeout,
            max_error_rate=args.max_error_rate, warmup=not args.no_warmup, exact_tg=args.exact_tg,
            tokenizer=args.tokenizer, latency_mode=args.latency_mode, recipe=args.recipe, topology=args.topology,
            nodes=[n for n in (args.nodes or "").split(",") if n], label=args.label)
        if getattr(args, "profile", None):
            from sparktop.bench.arena import profile

            prof = profile(args.profile)
            for key, value in prof.settings().items():  # levels, depths, cells, pp, tg, runs, prefix cache
                setattr(settings, key, value)
            settings.label = settings.label or prof.name
    _guard_options(args, settings)
    machine = args.json or args.md or args.csv
    console = Console(stderr=bool(machine))
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, transient=False)
    overall = progress.add_task("sweep", total=1, info="")
    level_task = progress.add_task("level", total=1, info="", visible=False)
    warned: set[str] = set()

    def show(event: SweepEvent) -> None:
        match event:
            case SweepStarted():
                progress.update(overall, total=event.total_requests, completed=event.resumed_requests,
                                description=f"sweep {event.model}")
                console.print(f"[bold]{event.run_id}[/] → {event.path}/requests.jsonl", soft_wrap=True)
            case LevelStarted(concurrency=c, warmup=warmup):
                progress.update(level_task, visible=True, completed=0, total=None if warmup else settings.runs * c,
                                description=f"c{c}" + (" warm-up" if warmup else ""), info="")
            case WaitingForIdle(concurrency=c):
                progress.update(level_task, visible=True, completed=0, total=None,
                                description=f"c{c} waiting for an idle engine",
                                info=f"{event.running:.0f} running, {event.waiting:.0f} waiting · "
                                     f"{event.waited_s:.0f}/{event.timeout_s:.0f} s")
            case LevelContaminated(concurrency=c, remeasuring=True):
                console.print(f"[yellow]c{c} contaminated: {event.reason}; measuring it again[/]")
            case RequestDone():
                progress.update(overall, completed=event.done, total=event.total, info=eta_text(event.eta_s))
                live = f"{event.live_tps:,.0f} t/s" if event.live_tps else ""
                progress.update(level_task, completed=event.level_done, total=event.level_total, info=live)
            case LevelDone(stats=lv):
                err = f"  [red]{lv.errors} errors[/]" if lv.errors else ""
                console.print(f"{'c' + format(lv.key):<5} tg {fmt(lv.tg_tps_total)} t/s  pp {fmt(lv.pp_tps_total)} t/s"
                              f"  TTFT {fmt(lv.ttft_ms_mean, 'ms')} ms{err}")
                if lv.contaminated:
                    console.print(f"[yellow]⚠ c{lv.concurrency} contaminated: {lv.contamination}[/]")
                if lv.tg_unmeasured:
                    console.print(f"[yellow]⚠ c{lv.concurrency}: {lv.tg_unmeasured} of {lv.requests} streams arrived "
                                  "in one piece, so they show no decode rate (a proxy buffered them, or this "
                                  "client was short of CPU)[/]")
                if lv.tg_approximate and "approximate" not in warned:
                    warned.add("approximate")
                    console.print("[yellow]⚠ decode rates are approximate: the server sends neither token ids nor "
                                  "usage, so each streamed chunk counts as one token (low when chunks hold "
                                  "more); --tokenizer FILE counts the streamed text instead[/]")

    power = power_source(getattr(args, "power", None), settings.endpoint, getattr(args, "inventory_loaded", None))
    prefs = load_preferences()  # the energy price: a bad settings file stops here, before any request
    sweep = Sweep(settings, root, resume=resume, api_key=api_key, power=power)

    result = _drive(sweep, progress, show, console, resumable=True)
    if result is None:
        return 130
    run = load_run(result.path)
    if args.json:
        print(json.dumps(with_guard(export.as_json(run, prefs.energy_price_per_kwh), run), indent=2, default=str))
    elif args.md:
        print(export.markdown(run, prefs), end="")
    elif args.csv:
        print(export.csv_text([run], prefs.energy_price_per_kwh), end="")
    else:
        console.print(export.rich_table(run, title=f"{run.meta.get('model')} · pp{settings.pp} tg{settings.tg}",
                                        prefs=prefs))
        for line in export.summary_lines(run):
            console.print(line)
    for line in guard_lines(run):
        console.print(f"[yellow]{line}[/]")
    if result.status != "done":
        console.print(f"[red]sweep {result.status}: {result.reason}[/]")
        return EXIT_ERROR_RATE
    return 0


def _one_depth(text: str | int) -> int:
    depths = parse_depths(text)
    if len(depths) > 1:
        raise SweepError("--depth: a rate sweep runs at one depth (sweep depths with -c levels, or run once per "
                         "depth)")
    return depths[0]


def _guard_options(args, settings: SweepSettings) -> None:
    """The guard's options, where the parser has them (--guard-url, --idle-timeout, --no-remeasure,
    --no-metrics)."""
    urls = getattr(args, "guard_url", None)
    if urls:
        settings.guard_urls = [u for item in urls for u in str(item).split(",") if u.strip()]
    idle = getattr(args, "idle_timeout", None)
    if idle is not None:
        settings.idle_timeout = float(idle)
    if getattr(args, "no_remeasure", False):
        settings.remeasure_contaminated = False
    if getattr(args, "no_metrics", False):
        settings.metrics = False


GUARD_KEYS = ("contaminated", "foreign_requests", "contamination", "remeasured")


def with_guard(report: dict, run) -> dict:
    """`sparktop sweep --json`: each level says whether foreign traffic spoiled it."""
    by_c = {lv.concurrency: lv for lv in run.levels()}
    for row in report.get("levels") or []:
        lv = by_c.get(row.get("concurrency"))
        if lv is not None:
            row.update({k: getattr(lv, k) for k in GUARD_KEYS})
    report.setdefault("contaminated_levels", [c for c, lv in sorted(by_c.items()) if lv.contaminated])
    return report


def guard_lines(run) -> list[str]:
    """Warnings for a person: levels measured with foreign traffic, or no guard at all."""
    out = [f"⚠ c{lv.concurrency} is contaminated: {lv.contamination}" for lv in run.levels() if lv.contaminated]
    guard = str(run.meta.get("guard") or "")
    if guard.startswith("off:") and "not read" not in guard:
        out.append(f"no clean-measurement guard ({guard[4:].strip()}): foreign traffic would go unnoticed")
    return out


def _drive(sweep: Sweep, progress: Progress, show, console: Console, resumable: bool) -> SweepFinished | None:
    """Run a sweep, each event shown as it comes; None when Ctrl-C ended it (what finished is kept)."""

    async def go() -> SweepFinished:
        finished = None
        with progress:
            async for event in sweep.events():
                show(event)
                finished = event
        assert isinstance(finished, SweepFinished)
        return finished

    try:
        with _runner() as runner:
            return runner.run(go())
    except KeyboardInterrupt:
        if sweep.writer is not None:
            console.print(f"interrupted: finished requests are in {sweep.writer.dir}/requests.jsonl"
                          + (f"; resume with: sparktop sweep --resume {sweep.writer.dir}" if resumable else ""))
        return None


def _runner() -> asyncio.Runner:
    """uvloop where it is installed: a third less client CPU per streamed
    token than asyncio's own loop (tests/benchmarks/sweep_client_cost.py)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def _runs(names: list[str]) -> list:
    return [load_run(n) for n in names]


def cmd_compare(args) -> int:
    runs = _runs(args.runs)
    if args.label:
        if len(args.label) != len(runs):
            raise SparktopError(f"--label given {len(args.label)} times for {len(runs)} runs")
        for run, label in zip(runs, args.label, strict=False):
            run.meta["label"] = label
    modes = {r.mode for r in runs}
    if len(modes) > 1:
        raise SparktopError("compare: rate sweeps and concurrency sweeps measure different things; compare "
                            "each kind with its own")
    if modes == {"rate"}:
        if args.json:
            names, _, _ = cmp.rate_table(runs)
            print(json.dumps({"runs": [{"id": r.id, "label": n, **cmp._meta(r)} for n, r in zip(names, runs,
                                                                                                  strict=False)],
                              "levels": {n: [lv.as_dict() for lv in r.rate_levels()] for n, r in zip(names, runs,
                                                                                                      strict=False)},
                              "max_rates": {n: r.meta.get("max_rate") for n, r in zip(names, runs, strict=False)}},
                             indent=2, default=str))
            return 0
        text = cmp.rate_markdown(runs)
        if args.md or args.csv:
            print(text, end="")
        else:
            from rich.markdown import Markdown

            Console().print(Markdown(text))
        return 0
    if args.json:
        print(json.dumps(cmp.as_json(runs), indent=2, default=str))
    elif args.csv:
        print(export.csv_text(runs), end="")
    else:
        text = cmp.markdown(runs)
        if args.md:
            print(text, end="")
        else:
            from rich.markdown import Markdown

            Console().print(Markdown(text))
    return 0


def cmd_export(args, recipe_text: str | None = None, served: dict | None = None) -> int:
    """`sparktop export RUN --arena DIR` (the recipe read by cli.py, which may look recipes up)."""
    from sparktop.bench.arena import submit_instructions, write_arena

    run = load_run(args.run)
    for key, value in (served or {}).items():
        if value and not run.meta.get(key):
            run.meta[key] = value
    out = write_arena(run, args.arena, recipe_text=recipe_text)
    print(f"wrote {out / 'recipe.yaml'}, {out / 'benchmark.csv'} and {out / 'metadata.json'}")
    for line in submit_instructions(out):
        print(line)
    return 0


def cmd_runs(args) -> int:
    if args.import_file and Path(args.import_file).is_dir():
        import shutil

        from sparktop.bench.arena import FILES, read_arena

        src = Path(args.import_file)
        arena = read_arena(src)  # says which file is missing or wrong, and where
        dest = results_dir() / (args.label or arena.id)
        dest.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            shutil.copyfile(src / name, dest / name)
        meta = {"id": dest.name, "label": args.label or arena.label, "model": arena.meta.get("model"),
                "status": "imported", "source": str(src.resolve())}
        (dest / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        print(f"imported {src} (Spark Arena files) as {dest.name} ({len(arena.levels())} cells)")
        return 0
    if args.import_file:
        run = import_llama_benchy(Path(args.import_file), label=args.label)
        dest = results_dir() / (args.label or run.id)
        dest.mkdir(parents=True, exist_ok=True)
        meta = dict(run.meta, id=dest.name, source=str(Path(args.import_file).resolve()))
        (dest / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        (dest / "llama-benchy.json").write_text(Path(args.import_file).read_text())
        print(f"imported {args.import_file} as {dest.name} ({len(run.levels())} levels)")
        return 0
    runs = list_runs()
    if args.json:
        print(json.dumps([{"id": r.id, "path": str(r.path), **cmp._meta(r)} for r in runs], indent=2, default=str))
        return 0
    from rich.table import Table

    t = Table(box=None, header_style="bold")
    for col in ("run", "model", "topology", "levels", "status"):
        t.add_column(col)
    for r in runs:
        levels = r.levels()
        t.add_row(r.id, str(r.meta.get("model") or ""), str(r.meta.get("topology") or r.meta.get("label") or ""),
                  " ".join(f"c{lv.concurrency}" for lv in levels), str(r.meta.get("status") or ""))
    Console().print(t if runs else f"no runs yet in {results_dir()}")
    return 0


# -- rate sweeps (bench/load.py) --------------------------------------------------------------------------


def rate_table(levels: list, title: str, width: int = 120):
    from rich.table import Table

    from sparktop.bench.load import rate_texts

    t = Table(title=title, title_justify="left", header_style="bold underline", box=None, pad_edge=False)
    slo = any(lv.slo for lv in levels)
    # Times in ms, short headers; under 110 columns the client's own figures (sent/s, lag, in flight) go so
    # the table reads at 80, except the lag where a level fell behind (it takes e2e95's place).
    wide = width >= 110
    behind = any(lv.behind for lv in levels)
    cols = ["rate", "sent/s", "req/s", "tok/s", "TTFT50", "TTFT95", "ITL50", "ITL95", "e2e95", "lag95", "busy"]
    if not wide:
        gone = ("sent/s", "busy", "e2e95") if behind else ("sent/s", "lag95", "busy")
        cols = [c for c in cols if c not in gone]
    if slo:
        cols += ["good/s", "met", "SLO"]
    for c in cols:
        t.add_column(c, justify="right", no_wrap=True)
    for lv in levels:
        cells = rate_texts(lv)
        cells["lag95"] = ("[red]" if lv.behind else "") + cells["lag95"]
        cells["SLO"] = "[green]yes" if lv.passes else "[red]no"
        t.add_row(*(cells[c] for c in cols))
    t.caption = ("times in ms" + (" · busy: requests in flight, mean" if wide else "")
                 + (" · lag95: sends behind schedule, p95 (red: behind)" if wide or behind else ""))
    return t


def rate_json(run, levels: list, max_rate) -> dict:
    return {"run": run.id, "path": str(run.path), "mode": "rate", "model": run.meta.get("model"),
            "endpoint": run.meta.get("endpoint"), "settings": run.meta.get("settings"),
            "slo": run.meta.get("slo"), "status": run.meta.get("status"), "reason": run.meta.get("reason"),
            "levels": [lv.as_dict() for lv in levels],
            "max_rate": None if max_rate is None else {**max_rate.__dict__, "text": max_rate.text}}


def cmd_rate_sweep(args) -> int:
    """`sparktop sweep --rate 1,2,4` (or --find-max-rate): requests on a schedule, goodput under --slo."""
    from sparktop.bench.load import RateSweep, ms_text, parse_rates

    if not args.endpoint:
        raise SweepError("--endpoint is required (http://HOST:PORT or http://HOST:PORT/v1)")
    if args.resume:
        raise SweepError("--resume: a rate sweep is measured afresh (its finished requests stay in its run)")
    rates = parse_rates(args.rate) if args.rate else [1.0]
    if args.trace:
        from sparktop.bench.trace import load_trace

        if args.rate or args.find_max_rate:
            raise SweepError("--trace replays the trace's own times: leave --rate and --find-max-rate out")
        load_trace(args.trace)  # a bad line is an error now, before anything is sent
    root = Path(args.results) if args.results else results_dir()
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    settings = SweepSettings(
        endpoint=args.endpoint, rates=rates, arrivals=args.arrivals, requests=args.requests, duration=args.duration,
        max_concurrency=args.max_concurrency, seed=args.seed, slo=args.slo, find_max_rate=args.find_max_rate,
        trace=args.trace,
        prefix_cache=args.prefix_cache == "on", pp=args.pp, tg=args.tg, depth=_one_depth(args.depth),
        model=args.model,
        extra_body=parse_extra_body(args.extra_body), timeout=args.timeout, max_error_rate=args.max_error_rate,
        warmup=not args.no_warmup, exact_tg=args.exact_tg, tokenizer=args.tokenizer, latency_mode=args.latency_mode,
        recipe=args.recipe, topology=args.topology, nodes=[n for n in (args.nodes or "").split(",") if n],
        label=args.label)
    _guard_options(args, settings)
    machine = args.json or args.md or args.csv
    console = Console(stderr=bool(machine))
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, transient=False)
    level_task = progress.add_task("level", total=1, info="", visible=False)
    sweep = RateSweep(settings, root, api_key=api_key)
    found = []

    def show(event: SweepEvent) -> None:
        match event:
            case SweepStarted():
                console.print(f"[bold]{event.run_id}[/] → {event.path}/requests.jsonl", soft_wrap=True)
            case RateLevelStarted(rate=rate, requests=n):
                progress.update(level_task, visible=True, completed=0, total=n, info="",
                                description=f"{rate:g} requests/s ({settings.arrivals})" if rate is not None
                                else f"replaying {settings.trace}")
            case RequestDone():
                progress.update(level_task, completed=event.level_done, total=event.level_total)
            case RateLevelDone(stats=lv):
                slo = ""
                if lv.slo:
                    if lv.passes:
                        verdict = "[green]meets the SLO[/]"
                    elif not lv.meets_slo:
                        verdict = "[red]misses the SLO[/]"
                    else:
                        but = "the client fell behind" if lv.behind else "the queue grew"
                        verdict = f"[red]fails: its percentiles meet the SLO, but {but}[/]"
                    slo = f"  goodput {fmt(lv.goodput, '/s')}/s ({lv.slo_share:.0%} met) {verdict}"
                console.print(f"{lv.label:>8}  {fmt(lv.request_throughput, '/s')} req/s  {fmt(lv.output_tps)} t/s  "
                              f"TTFT p95 {ms_text(lv.ttft_p95)} ms  ITL p95 {ms_text(lv.itl_p95)} ms{slo}"
                              + (f"  [red]{lv.errors} errors[/]" if lv.errors else ""))
                if lv.behind:
                    console.print(f"[yellow]⚠ {lv.label}: the client fell behind its schedule ({lv.behind})[/]")
                if lv.saturated:
                    console.print(f"[yellow]⚠ {lv.label}: {lv.saturated}[/]")
            case MaxRateFound(result=result):
                found.append(result)

    result = _drive(sweep, progress, show, console, resumable=False)
    if result is None:
        return 130
    run = load_run(result.path)
    levels = run.rate_levels()
    max_rate = found[0] if found else None
    if args.json:
        print(json.dumps(rate_json(run, levels, max_rate), indent=2, default=str))
    else:
        what = (f"replay of {settings.trace}" if settings.trace
                else f"pp{settings.pp} tg{settings.tg} · {settings.arrivals} arrivals")
        console.print(rate_table(levels, f"{run.meta.get('model')} · {what}"
                                 + (f" · SLO {settings.slo}" if settings.slo else ""), console.width))
        if max_rate is not None:
            console.print(f"[bold]{max_rate.text}[/]")
    if result.status != "done":
        console.print(f"[red]sweep {result.status}: {result.reason}[/]")
        return EXIT_ERROR_RATE
    return 0
