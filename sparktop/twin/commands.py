"""`sparktop predict` and `sparktop twin fit` for the terminal and scripts."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from sparktop.bench.commands import parse_levels
from sparktop.bench.compare import fmt
from sparktop.errors import SparktopError
from sparktop.twin.simulate import TOPOLOGIES


def cmd_predict(args) -> int:
    from sparktop.launch.recipe import find_recipe
    from sparktop.settings import load_inventory
    from sparktop.twin.cards import find_card
    from sparktop.twin.predict import crossover_lines, recommend, rows_for, uncertainty

    if bool(args.recipe) == bool(args.model):
        raise SparktopError("predict: give a RECIPE or --model CARD (one of them)")
    recipe = find_recipe(args.recipe, args.recipes) if args.recipe else None
    if recipe is not None:
        card = recipe.twin_card()
        if card is None:
            raise SparktopError(f"{recipe.path}: model {recipe.model!r} has no twin card; add params_b and bits "
                                "to the recipe, or see `sparktop twin cards`")
    else:
        card = find_card(args.model)
    inventory = load_inventory(args.inventory) if args.inventory else load_inventory()
    nodes = len(inventory.nodes)
    note = None
    if args.topology == "all":
        topologies = [t for t in TOPOLOGIES if recipe is None or t in recipe.allowed_topologies(2)]
    elif args.topology:
        topologies = [t.strip() for t in args.topology.split(",")]
        for t in topologies:
            if t not in TOPOLOGIES:
                raise SparktopError(f"--topology {t!r}: one of {', '.join(TOPOLOGIES)} or all")
            if recipe is not None and t not in recipe.allowed_topologies(2):
                raise SparktopError(f"--topology {t}: {recipe.why_not(t, 2)}")
    else:
        topologies = recipe.allowed_topologies(nodes) if recipe else (list(TOPOLOGIES) if nodes > 1 else ["solo"])
        if nodes < 2:
            note = "this inventory has one node; --topology all adds the two-node topologies"
    if not topologies:
        raise SparktopError(f"{recipe.id}: no topology fits {nodes} node(s); try --topology all")
    rows = rows_for(card, topologies, parse_levels(args.concurrency), args.pp, args.tg, recipe)
    recs = recommend(rows)
    cross = crossover_lines(rows) if len(topologies) > 1 else []
    unsure = uncertainty(card)
    if args.json:
        print(json.dumps({"rows": [r.as_dict() for r in rows], "recommendation": recs, "crossovers": cross,
                          "uncertainty": unsure}, indent=2))
        return 0
    console = Console()
    table = Table(title=f"{card.name} · pp{args.pp} tg{args.tg} · predicted", box=None, header_style="bold",
                  title_justify="left")
    for col in ("topology", "c", "decode t/s", "per req", "prefill t/s", "TTFT ms", "KV", "fits"):
        table.add_column(col, justify="left" if col == "topology" else "right")
    for r in rows:
        table.add_row(r.topology, f"c{r.concurrency}", fmt(r.decode_tps), fmt(r.per_request_tps),
                      fmt(r.prefill_tps), fmt(r.ttft_ms, "ms"), f"{r.kv_cache_usage:.0%}",
                      "yes" if r.fits else "[red]no: KV cache full[/]", end_section=r is not rows[-1]
                      and rows[rows.index(r) + 1].topology != r.topology)
    console.print(table)
    for rec in recs:
        margin = f" (+{rec['margin']:.0%} over the next)" if rec["margin"] and rec["metric"] != "ttft_ms" else \
            (f" ({-rec['margin']:.0%} lower than the next)" if rec["margin"] else "")
        cs = "/".join(f"c{c}" for c in rec["concurrency"])
        console.print(f"[bold]{rec['workload']}[/] ({cs}): {rec['topology']}{margin}")
    for line in cross:
        console.print(f"  {line}")
    if note:
        console.print(f"[dim]{note}[/]")
    console.print(f"[dim]{unsure}[/]")
    return 0


def cmd_fit(args) -> int:
    from sparktop.twin import fit

    if args.refit:
        console = Console(stderr=True)
        k = fit.refit(iterations=args.iterations,
                      progress=lambda it, v: console.print(f"iteration {it}: loss {v:.4f}") if it % 10 == 0 else None)
        rep = fit.report(k)
        fit.save_constants(k, rep.summary())
        console.print(f"saved {fit.FITTED}")
    else:
        rep = fit.report()
    if args.json:
        print(json.dumps({"cells": [{"model": c.model, "topology": c.topology, "metric": c.metric,
                                     "concurrency": c.concurrency, "published": c.published, "predicted": p,
                                     "fits": f} for c, p, f in rep.rows], **rep.summary()}, indent=2))
    else:
        print(rep.text())
    return 0
