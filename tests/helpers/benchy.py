"""llama-benchy 0.4.0 (the tool the articles used) run against a server,
offline: its book pre-seeded in its cache under a temporary HOME, the same
tokenizer.json as the other clients. Returns its JSON result by concurrency.

`run_pairs` runs it and `sparktop sweep` in alternating pairs against one
twin process that logs what it served (`--request-log`,
tests/helpers/request_log.py): each tool's levels beside the server's view
of that tool's requests."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.helpers.tokenizer import book_text
from tests.helpers.venvs import llama_benchy

if TYPE_CHECKING:
    from tests.helpers.request_log import Served

BOOK_URL = "http://book.invalid/book.txt"  # never fetched: the cache has it
MODEL = "llama-3.1-8b"
PP, TG, RUNS = 2048, 48, 3  # a TTFT of ~180 ms at Spark's speed
# The same work for both: every request generates TG tokens; and each level measured once (a level the sweep
# thought disturbed would be measured again, batches the server log would count twice).
EXACT = ["--exact-tg", "--no-remeasure"]


def run_llama_benchy(url: str, model: str, tokenizer: Path, workdir: Path, *, pp: int, tg: int,
                     levels: list[int], runs: int, exact_tg: bool = True,
                     prefix: list[str] | None = None, extra: list[str] | None = None,
                     raw: bool = False):
    """By concurrency; `raw`: every benchmark entry as llama-benchy wrote it (a depth run has one per depth,
    and a context-load entry per depth with --enable-prefix-caching). `extra`: more of its arguments;
    `prefix`: put before the command (e.g. taskset, to keep it off the server's core)."""
    benchy = llama_benchy()
    home = workdir / "benchy-home"
    cache = home / ".cache" / "llama-benchy"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / (hashlib.md5(BOOK_URL.encode()).hexdigest() + ".txt")).write_text(book_text())
    out = workdir / "benchy.json"
    env = dict(os.environ, HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    r = subprocess.run(
        [*(prefix or []), str(benchy), "--base-url", url + "/v1", "--model", model, "--tokenizer", str(tokenizer),
         "--book-url", BOOK_URL, "--pp", str(pp), "--tg", str(tg), "--concurrency", *map(str, levels),
         "--runs", str(runs), *(["--exact-tg"] if exact_tg else []), "--skip-coherence", "--format", "json",
         "--save-result", str(out), *(extra or [])],
        env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    entries = json.loads(out.read_text())["benchmarks"]
    return entries if raw else {b["concurrency"]: b for b in entries}


@dataclass
class Pair:
    """One level, one pair: sparktop's level, llama-benchy's entry, and the server's view of each tool's requests."""

    ours: object
    theirs: dict
    served_ours: list[Served]
    served_theirs: list[Served]


def sweep_argv(url: str, tokenizer: Path, results: Path, concurrency: list[int], extra: list[str], *,
               pp: int = PP, tg: int = TG, runs: int = RUNS) -> list[str]:
    return [sys.executable, "-m", "sparktop", "sweep", "--endpoint", url + "/v1", "--tokenizer", str(tokenizer),
            "--pp", str(pp), "--tg", str(tg), "-c", ",".join(map(str, concurrency)), "--runs", str(runs), *EXACT,
            *extra, "--json", "--results", str(results)]


def run_pairs(work: Path, pairs: int, concurrency: list[int], depths: list[int], sweep_extra: list[str],
              benchy_extra: list[str], *, speed: float = 1.0, pp: int = PP, tg: int = TG, runs: int = RUNS
              ) -> dict[tuple[int, int], list[Pair]]:
    """`pairs` alternating runs of both tools against one twin: {(depth, c): [Pair, ...]}."""
    from sparktop.bench.results import load_run
    from tests.helpers.request_log import RequestLog, levels
    from tests.helpers.tokenizer import train_shared_tokenizer
    from tests.helpers.twin_process import start_twin_process

    work.mkdir(parents=True, exist_ok=True)
    tokenizer = train_shared_tokenizer(work / "tokenizer.json")
    log = RequestLog(work / "requests.jsonl")
    keys = [(d, c) for d in depths for c in concurrency]
    out: dict[tuple[int, int], list[Pair]] = {k: [] for k in keys}
    twin, url = start_twin_process(MODEL, "--tokenizer", str(tokenizer), "--request-log", str(log.path),
                                   speed=speed, log=open(work / "twin.log", "w"))  # noqa: SIM115 - the twin's
    try:
        for i in range(pairs):
            got: dict[str, tuple] = {}
            for tool in ("benchy", "sparktop") if i % 2 == 0 else ("sparktop", "benchy"):
                if tool == "benchy":
                    entries = run_llama_benchy(url, MODEL, tokenizer, work / f"benchy-{i}", pp=pp, tg=tg,
                                               levels=concurrency, runs=runs, raw=True, extra=benchy_extra)
                    theirs = {(e["context_size"], e["concurrency"]): e for e in entries
                              if not e.get("is_context_prefill_phase")}
                    got["benchy"] = (theirs, levels(log.new(url), keys, pp, runs))
                else:
                    results = work / f"results-{i}"
                    argv = sweep_argv(url, tokenizer, results, concurrency, sweep_extra, pp=pp, tg=tg, runs=runs)
                    sp = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
                    if sp.returncode != 0:
                        raise RuntimeError(f"sparktop sweep failed: {sp.stderr[-2000:]}")
                    (run_dir,) = results.iterdir()
                    ours = {(lv.depth, lv.concurrency): lv for lv in load_run(run_dir).levels()}
                    got["sparktop"] = (ours, levels(log.new(url), keys, pp, runs))
            (ours, served_ours), (theirs, served_theirs) = got["sparktop"], got["benchy"]
            for key in keys:
                out[key].append(Pair(ours[key], theirs[key], served_ours[key], served_theirs[key]))
    finally:
        twin.terminate()
        twin.wait(10)
    return out
