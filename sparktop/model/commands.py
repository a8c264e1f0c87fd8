"""`sparktop twin fit` and `sparktop twin cards` for the terminal and scripts."""

from __future__ import annotations

import json

from rich.console import Console


def cmd_fit(args) -> int:
    from sparktop.model import fit

    console = Console(stderr=True)
    if getattr(args, "runs", None):
        return _fit_runs(args, console)
    k = None
    stacks = None
    if args.refit:
        k = fit.refit(iterations=args.iterations or 120,
                      progress=lambda it, v: console.print(f"iteration {it}: loss {v:.4f}") if it % 10 == 0 else None)
    if getattr(args, "stacks", None) is not None:
        k, entries = fit.fit_stacks(k=k, iterations=args.iterations or 60, only=args.stacks or None,
                                    progress=lambda line: console.print(line))
        stored = fit.load_fit_summary().get("stacks") or {}
        stacks = {**stored, **entries}
    rep = fit.report(k)
    cv = None
    if args.cross_validate:
        cv = fit.cross_validate(start=k, iterations=max(20, (args.iterations or 120) // 2),
                                progress=lambda line: console.print(line), exact=getattr(args, "exact", False))
    if k is not None:  # refitted
        fit.save_constants(k, fit.fit_summary(rep), cross=cv, stacks=stacks)
        console.print(f"saved {fit.FITTED}")
    elif getattr(args, "save_summary", False):  # the constants as they are: what `predict` states of each card
        fit.save_summary(rep, cross=cv)
        console.print(f"saved each card's error{', the cross-validation and its bands' if cv else ''} and the "
                      f"figures' digest in {fit.FITTED}")
    if args.json:
        print(json.dumps({"cells": [{"model": c.model, "topology": c.topology, "metric": c.metric,
                                     "concurrency": c.concurrency, "published": c.published, "predicted": p,
                                     "fits": f, "source": c.source, "engine": c.engine,
                                     "workload": list(c.workload)} for c, p, f in rep.rows],
                          **rep.summary(), "not_replayed": rep.skipped, "inconsistent": rep.inconsistent,
                          "per_stack": rep.by(lambda c: c.stack), "per_source": rep.by(lambda c: c.source),
                          "stacks": fit.load_fit_summary().get("stacks"),
                          "cross_validation": cv or fit.load_fit_summary().get("cross_validation")}, indent=2))
        return 0
    print(rep.text())
    saved = cv or fit.load_fit_summary().get("cross_validation")
    if saved:  # computed now, or as saved (`--cross-validate` computes it again)
        print()
        print(fit.cross_validation_text(saved) + ("" if cv else "\n(as saved in "
                                                   f"{fit.FITTED.name}; `--cross-validate` computes it again)"))
    return 0


def _fit_runs(args, console: Console) -> int:
    """`twin fit --runs STUDY...`: the shipped constants refitted with the
    user's own measurements, saved for their inventory only."""
    from sparktop.model import fit

    key = None
    if getattr(args, "inventory", None):
        from sparktop.settings import load_inventory

        key = fit.inventory_key(load_inventory(args.inventory))
    # Each iteration predicts every published cell again: 40 take a few minutes on a Spark's CPU.
    iterations = getattr(args, "iterations", None) or 40
    result = fit.fit_studies(list(args.runs), key=key, iterations=iterations,
                             progress=lambda it, v: console.print(f"iteration {it}: loss {v:.4f}")
                             if it % 10 == 0 else None)
    if getattr(args, "json", False):
        print(json.dumps({"inventory_key": result.key, "sources": result.sources, "cells": result.cells,
                          "path": str(result.path) if result.path else None, "before": result.before,
                          "after": result.after}, indent=2))
        return 0
    print(result.text())
    print(f"`sparktop predict` uses these constants for inventory {result.key}; everywhere else the published ones")
    return 0


def cmd_cards(args) -> int:
    from sparktop.model.cards import CARDS
    from sparktop.model.forecast import Subject, resolve

    for card in CARDS.values():
        m = resolve(Subject(card)).perf("solo")  # the shared constants, no stack: a card, not an image
        print(f"{card.name:28} {card.architecture:24} {card.total_params_b:6.1f}B/{card.active_params_b:5.1f}B "
              f"{card.quant.scheme:12} {card.weights_gib:6.1f} GiB  c1 ~{m.decode_tps(1):5.1f} t/s "
              f"(roofline {m.roofline_decode_tps(1):5.1f})  {card.hf_id}")
    return 0
