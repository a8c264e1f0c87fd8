"""`sparktop twin fit` and `sparktop twin cards` for the terminal and scripts."""

from __future__ import annotations

import json

from rich.console import Console


def cmd_fit(args) -> int:
    from sparktop.model import fit

    console = Console(stderr=True)
    k = None
    if args.refit:
        k = fit.refit(iterations=args.iterations,
                      progress=lambda it, v: console.print(f"iteration {it}: loss {v:.4f}") if it % 10 == 0 else None)
    rep = fit.report(k)
    cv = None
    if args.cross_validate:
        cv = fit.cross_validate(start=k, iterations=max(20, args.iterations // 2),
                                progress=lambda line: console.print(line))
    if k is not None:  # refitted
        fit.save_constants(k, rep.summary(), cross=cv)
        console.print(f"saved {fit.FITTED}")
    if args.json:
        print(json.dumps({"cells": [{"model": c.model, "topology": c.topology, "metric": c.metric,
                                     "concurrency": c.concurrency, "published": c.published, "predicted": p,
                                     "fits": f, "source": c.source, "engine": c.engine,
                                     "workload": list(c.workload)} for c, p, f in rep.rows],
                          **rep.summary(), "not_replayed": rep.skipped,
                          "cross_validation": cv or fit.load_fit_summary().get("cross_validation")}, indent=2))
        return 0
    print(rep.text())
    if cv:
        print()
        print("leave one model out (fit without it, predict it):")
        print(fit.cross_validation_text(cv))
    return 0


def cmd_cards(args) -> int:
    from sparktop.model.cards import CARDS
    from sparktop.model.fit import load_constants
    from sparktop.model.perf import PerfModel

    k = load_constants()
    for card in CARDS.values():
        m = PerfModel(card, k=k)
        print(f"{card.name:28} {card.architecture:24} {card.total_params_b:6.1f}B/{card.active_params_b:5.1f}B "
              f"{card.quant.scheme:12} {card.weights_gib:6.1f} GiB  c1 ~{m.decode_tps(1):5.1f} t/s "
              f"(roofline {m.roofline_decode_tps(1):5.1f})  {card.hf_id}")
    return 0
