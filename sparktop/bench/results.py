"""Sweep results on disk: one directory per run, written as they arrive.

`<results>/<run-id>/meta.json` says what ran (endpoint, model, vLLM and
sparktop versions, recipe, topology, nodes, settings, start and end);
`requests.jsonl` gets one line per finished request the moment it finishes
(flushed, so a crash loses nothing). Everything else — level statistics,
tables, comparisons — is computed from those two files. llama-benchy's
JSON output is read as a run too, so older measurements can be compared.
What is read back is a `bench.run.Run`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path

from sparktop.bench.arena import read_arena
from sparktop.bench.request import RequestRecord
from sparktop.bench.run import Run
from sparktop.bench.stats import EngineWatch, LevelKey, LevelStats, percentile
from sparktop.errors import SparktopError as UserError

META = "meta.json"
REQUESTS = "requests.jsonl"
ENGINE = "engine.jsonl"


def new_run_id(model: str, topology: str | None, when: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when or time.time()))
    short = re.sub(r"[^A-Za-z0-9.]+", "-", model.split("/")[-1]).strip("-").lower()[:40] or "model"
    return f"{stamp}-{short}-{topology or 'endpoint'}"


class RunWriter:
    """Appends to a run directory. Every request line is flushed and synced
    to the OS as it is written."""

    def __init__(self, root: Path, run_id: str, meta: dict, resume: bool = False):
        self.dir = Path(root) / run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.meta = meta
        self.meta["id"] = run_id
        if resume and (self.dir / META).exists():
            old = json.loads((self.dir / META).read_text())
            old.setdefault("sessions", []).append({"resumed": meta.get("started")})
            old.pop("ended", None)
            old["status"] = "running"
            self.meta = old
        self._write_meta()
        # Kept open for the run's life: each record is appended (and flushed) as it finishes.
        self._requests = open(self.dir / REQUESTS, "a", encoding="utf-8")  # noqa: SIM115
        self._engine = open(self.dir / ENGINE, "a", encoding="utf-8")  # noqa: SIM115

    def _write_meta(self) -> None:
        tmp = self.dir / (META + ".tmp")
        tmp.write_text(json.dumps(self.meta, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.dir / META)

    def append(self, record: RequestRecord) -> None:
        self._requests.write(record.to_json() + "\n")
        self._requests.flush()

    def engine_level(self, concurrency: int, watch: EngineWatch) -> None:
        depth = getattr(concurrency, "depth", 0)
        extra = {"depth": depth} if depth else {}
        self._engine.write(json.dumps({"concurrency": int(concurrency), **extra, **watch.__dict__}) + "\n")
        self._engine.flush()

    def update(self, **fields) -> None:
        self.meta.update(fields)
        self._write_meta()

    def close(self, status: str, reason: str | None = None) -> None:
        self.update(status=status, reason=reason, ended=time.time())
        for f in (self._requests, self._engine):
            with contextlib.suppress(OSError):
                os.fsync(f.fileno())
            f.close()


def _read_jsonl(path: Path) -> list[dict]:
    out: list[dict] = []
    if not path.exists():
        return out
    with open(path, encoding="utf-8") as f:
        for _n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                # The last line of a run killed mid-write may be cut short:
                # everything before it is still good.
                continue
    return out


def load_run(path: str | Path) -> Run:
    """A run directory, a run id under the results dir, or a llama-benchy JSON file."""
    from sparktop.settings import results_dir

    p = Path(path)
    if not p.exists() and (results_dir() / str(path)).exists():
        p = results_dir() / str(path)
    if not p.exists():
        raise UserError(f"{path}: no such run (not a directory, a run id under {results_dir()}, "
                        "or a llama-benchy JSON file)")
    if p.is_file():
        return import_llama_benchy(p)
    meta_path = p / META
    if (p / "benchmark.csv").is_file() and (p / "metadata.json").is_file():  # Spark Arena's files
        run = read_arena(p)
        run.meta.update(json.loads(meta_path.read_text()) if meta_path.exists() else {})
        return run
    if (p / "llama-benchy.json").exists():  # imported with `sparktop runs --import`
        run = import_llama_benchy(p / "llama-benchy.json")
        run.path = p
        run.meta.update(json.loads(meta_path.read_text()) if meta_path.exists() else {})
        return run
    if not meta_path.exists():
        raise UserError(f"{p}: not a sweep run (no {META})")
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as e:
        raise UserError(f"{meta_path}:{e.lineno if hasattr(e, 'lineno') else 1}: not valid JSON ({e})") from None
    records = []
    for d in _read_jsonl(p / REQUESTS):
        try:
            records.append(RequestRecord.from_dict(d))
        except TypeError:
            continue
    engine: dict[int, EngineWatch] = {}
    for d in _read_jsonl(p / ENGINE):
        c = d.pop("concurrency", None)
        if isinstance(c, int):
            key = LevelKey(c, int(d.pop("depth", 0) or 0))
            engine[key] = EngineWatch(**{k: v for k, v in d.items() if k in EngineWatch.__dataclass_fields__})
    return Run(p, meta, records, engine)


def list_runs(root: Path | None = None) -> list[Run]:
    from sparktop.settings import results_dir

    root = root or results_dir()
    runs = []
    if root.exists():
        for d in sorted(root.iterdir()):
            if (d / META).exists():
                try:
                    runs.append(load_run(d))
                except UserError:
                    continue
    return runs


def import_llama_benchy(path: Path, label: str | None = None) -> Run:
    """llama-benchy's `--format json` output: levels only (it keeps no requests)."""
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise UserError(f"{path}: not a llama-benchy JSON result (no 'benchmarks' list)")

    def mean(run: dict, key: str, scale: float = 1.0) -> float | None:
        m = run.get(key)
        return m["mean"] * scale if isinstance(m, dict) and m.get("mean") is not None else None

    def std(run: dict, key: str) -> float | None:
        m = run.get(key)
        return m.get("std") if isinstance(m, dict) else None

    levels = []
    pp = tg = None
    for b in data["benchmarks"]:
        if b.get("is_context_prefill_phase"):
            continue
        c = int(b.get("concurrency") or 1)
        pp, tg = b.get("prompt_size"), b.get("response_size")
        ttft = (b.get("e2e_ttft") or {}).get("values") or []
        runs = len((b.get("tg_throughput") or {}).get("values") or [])
        levels.append(LevelStats(
            concurrency=c, runs=runs if c > 1 else 0, requests=len(ttft), errors=0, timeouts=0,
            pp_tps_total=mean(b, "pp_throughput"), pp_tps_req=mean(b, "pp_req_throughput"),
            tg_tps_total=mean(b, "tg_throughput"), tg_tps_req=mean(b, "tg_req_throughput"),
            # llama-benchy's decode is its own (N-1 tokens) figure: keep it under its name too
            tg_tps_total_llama_benchy=mean(b, "tg_throughput"),
            tg_tps_req_llama_benchy=mean(b, "tg_req_throughput"),
            ttft_ms_mean=mean(b, "e2e_ttft"), ttft_ms_p50=percentile(ttft, 0.5),
            ttft_ms_p95=percentile(ttft, 0.95), ttft_ms_std=std(b, "e2e_ttft"),
            peak_tps=mean(b, "peak_throughput"), tg_tps_total_std=std(b, "tg_throughput"),
            pp_tps_total_std=std(b, "pp_throughput"),
        ))
    meta = {"id": Path(path).stem, "label": label or Path(path).stem, "model": data.get("model"),
            "tool": f"llama-benchy {data.get('version', '?')}", "started": data.get("timestamp"),
            "settings": {"pp": pp, "tg": tg, "levels": [lv.concurrency for lv in levels]},
            "latency_s": (data.get("latency_ms") or 0) / 1000, "status": "imported"}
    return Run(Path(path), meta, [], {}, sorted(levels, key=lambda lv: lv.concurrency))
