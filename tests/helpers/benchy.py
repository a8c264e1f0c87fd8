"""llama-benchy 0.4.0 (the tool the articles used) run against a server,
offline: its book pre-seeded in its cache under a temporary HOME, the same
tokenizer.json as the other clients. Returns its JSON result by concurrency."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from tests.helpers.tokenizer import book_text
from tests.helpers.venvs import llama_benchy

BOOK_URL = "http://book.invalid/book.txt"  # never fetched: the cache has it


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
