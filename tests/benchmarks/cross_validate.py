"""Benchmark: how long `sparktop twin fit --cross-validate` takes, and how
close its linearised refits come to refitting each left-out model by the
simplex.

    python tests/benchmarks/cross_validate.py                 # linearised, every model
    python tests/benchmarks/cross_validate.py --exact gpt-oss-120b gemma4-26b-a4b

Prints the wall time and each model's leave-one-out decode/prefill/TTFT
error; with --exact, the simplex refit of the models named beside the
linearised one (each takes minutes).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sparktop.model import fit  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exact", nargs="*", metavar="MODEL", help="also refit these models out by the simplex")
    args = ap.parse_args()
    print(f"{os.cpu_count()} cpus; {len(fit.published_cells())} published cells")
    t0 = time.monotonic()
    cv = fit.cross_validate()
    print(f"linearised: {time.monotonic() - t0:.0f} s wall")
    print(fit.cross_validation_text(cv))
    if args.exact:
        t0 = time.monotonic()
        exact = fit.cross_validate(models=args.exact, exact=True)
        print(f"simplex for {len(args.exact)} model(s): {time.monotonic() - t0:.0f} s wall")
        for model in args.exact:
            a, b = cv[model], exact[model]
            print(f"  {model:30} " + "  ".join(f"{m} {a.get(m, 0):.1%} vs {b.get(m, 0):.1%}" for m in fit.HEADLINE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
