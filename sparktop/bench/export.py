"""One run's levels as a rich table, Markdown, CSV or JSON."""

from __future__ import annotations

import csv
import io

from rich.console import JustifyMethod
from rich.table import Table

from sparktop.bench.run import Run
from sparktop.bench.stats import LevelStats, knee
from sparktop.settings import Preferences
from sparktop.units import fmt

COLUMNS: tuple[tuple[str, str, JustifyMethod], ...] = (  # key, header, justify
    ("concurrency", "c", "right"),
    ("pp_tps_total", "pp t/s", "right"),
    ("pp_tps_req", "pp/req", "right"),
    ("tg_tps_total", "tg t/s", "right"),
    ("tg_tps_req", "tg/req", "right"),
    ("peak_tps", "peak", "right"),
    ("ttft_ms_mean", "TTFT", "right"),
    ("ttft_ms_p50", "p50", "right"),
    ("ttft_ms_p95", "p95", "right"),
    ("kv_cache_usage_max", "KV", "right"),
    ("waiting_max", "queue", "right"),
    ("errors", "err", "right"),
)
JSON_KEYS = ("concurrency", "depth", "cached_prompt_tokens", "requests", "errors", "pp_tps_total", "pp_tps_req",
             "tg_tps_total", "tg_tps_req",
             "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p95", "peak_tps", "kv_cache_usage_max",
             "e2e_tps_total", "e2e_tps_req", "wall_s_mean",
             # llama-benchy's own decode figures (its N-1 count), to compare like with like
             "tg_tps_req_llama_benchy", "tg_tps_total_llama_benchy", "tg_approximate", "tg_unmeasured",
             # the clean-measurement guard
             "contaminated", "foreign_requests", "contamination", "remeasured",
             # energy: the nodes' GPU power during the level (nvidia-smi), per generated token
             "power_w", "j_per_token", "wh_per_mtok")
ENERGY_COLUMNS: tuple[tuple[str, str, JustifyMethod], ...] = (("power_w", "W", "right"),
                                                             ("j_per_token", "J/tok", "right"))
COST_COLUMN: tuple[str, str, JustifyMethod] = ("cost_per_mtok", "cost/Mtok", "right")


def columns(levels: list[LevelStats], prefs: Preferences | None = None) -> tuple[tuple[str, str, JustifyMethod], ...]:
    """The table's columns: energy ones when some level has a power reading,
    and the cost per million tokens when a price is set."""
    base = COLUMNS
    if any(lv.depth for lv in levels):  # a depth sweep: each level's context before its concurrency
        base = (("depth", "depth", "right"), *COLUMNS)
    if not any(lv.j_per_token is not None for lv in levels):
        return base
    extra = ENERGY_COLUMNS
    if prefs is not None and prefs.energy_price_per_kwh is not None:
        extra += (COST_COLUMN,)
    return base + extra


def cell(lv: LevelStats, key: str, prefs: Preferences | None = None) -> str:
    if key == "cost_per_mtok":
        cost = lv.cost_per_mtok(prefs.energy_price_per_kwh if prefs else None)
        return "—" if cost is None or prefs is None else prefs.money(cost)
    v = getattr(lv, key)
    if key == "power_w":
        return "—" if v is None else f"{v:.0f}"
    if key == "j_per_token":
        return "—" if v is None else f"{v:.2f}" if v < 10 else f"{v:.0f}"
    if key == "concurrency":
        return f"c{v}"
    if key == "depth":
        return f"{v:,}"
    if key == "errors":
        if not lv.requests:
            return "—"
        return f"{v}/{lv.requests}" if v else "0"
    if key == "kv_cache_usage_max":
        return "—" if v is None else f"{v:.0%}"
    if key == "waiting_max":
        return "—" if v is None else f"{v:.0f}"
    return fmt(v, "ms" if key.startswith("ttft") else "t/s")


def rich_table(run: Run, title: str | None = None, prefs: Preferences | None = None) -> Table:
    t = Table(title=title, header_style="bold", box=None, pad_edge=False, padding=(0, 1, 0, 1))
    levels = run.levels()
    cols = columns(levels, prefs)
    for _key, head, justify in cols:
        t.add_column(head, justify=justify, no_wrap=True, min_width=len(head))
    for lv in levels:
        t.add_row(*(cell(lv, k, prefs) for k, _, _ in cols), style="red" if lv.errors else None)
    return t


def summary_lines(run: Run) -> list[str]:
    levels = run.levels()
    out = []
    depths = sorted({lv.depth for lv in levels})
    for depth in depths:
        # A knee is a concurrency's: within one depth (a deeper context is another workload).
        here = [lv for lv in levels if lv.depth == depth]
        k = knee(here)
        if k and len(here) > 1:
            out.append(k.describe("decode") + (f" at depth {depth:,}" if len(depths) > 1 else ""))
    best = max((lv for lv in levels if lv.tg_tps_total), key=lambda lv: lv.tg_tps_total or 0.0, default=None)
    if best:
        out.append(f"best decode {fmt(best.tg_tps_total)} t/s total at c{best.key}")
    if len(depths) > 1:
        for c in sorted({lv.concurrency for lv in levels}):
            row = [lv for lv in levels if lv.concurrency == c and lv.tg_tps_total]
            if len(row) > 1 and row[0].tg_tps_total:
                last = row[-1]
                out.append(f"c{c}: decode {fmt(last.tg_tps_total)} t/s at depth {last.depth:,}, "
                           f"{(last.tg_tps_total or 0) / row[0].tg_tps_total - 1:+.0%} from depth {row[0].depth:,}")
    frugal = min((lv for lv in levels if lv.j_per_token), key=lambda lv: lv.j_per_token or 0.0, default=None)
    if frugal is not None and frugal.j_per_token is not None and frugal.wh_per_mtok is not None:
        out.append(f"least energy per token at c{frugal.key}: {frugal.j_per_token:.2f} J/token, "
                   f"{frugal.wh_per_mtok:.0f} Wh per million (the nodes' GPU power, nvidia-smi)")
    return out


def markdown(run: Run, prefs: Preferences | None = None) -> str:
    m = run.meta
    s = m.get("settings") or {}
    what = " · ".join(str(x) for x in (m.get("model"), m.get("topology") or m.get("endpoint"),
                                       f"pp{s.get('pp')} tg{s.get('tg')}", f"{s.get('runs')} runs",
                                       m.get("vllm_version") and f"vLLM {m['vllm_version']}") if x)
    levels = run.levels()
    cols = columns(levels, prefs)
    head = [h for _, h, _ in cols]
    lines = [f"## {run.id}", "", what, "", f"| {' | '.join(head)} |", "|" + "---:|" * len(head)]
    for lv in levels:
        lines.append(f"| {' | '.join(cell(lv, k, prefs) for k, _, _ in cols)} |")
    extra = summary_lines(run)
    if extra:
        lines += [""] + [f"- {x}" for x in extra]
    return "\n".join(lines) + "\n"


def csv_text(runs: list[Run], price_per_kwh: float | None = None) -> str:
    buf = io.StringIO()
    fields = ["run", "label", "model", "topology", *LevelStats.__dataclass_fields__, "cost_per_mtok"]
    fields.remove("error_reasons")
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for run in runs:
        for lv in run.levels():
            w.writerow({"run": run.id, "label": run.label, "model": run.meta.get("model"),
                        "topology": run.meta.get("topology"), **lv.as_dict(),
                        "cost_per_mtok": lv.cost_per_mtok(price_per_kwh)})
    return buf.getvalue()


def as_json(run: Run, price_per_kwh: float | None = None) -> dict:
    meta = {k: v for k, v in run.meta.items()}
    meta["path"] = str(run.path) if run.path else None
    levels = []
    for lv in run.levels():
        d = lv.as_dict()
        row = {k: d[k] for k in JSON_KEYS}
        row.update(timeouts=lv.timeouts, runs=lv.runs, ttft_ms_std=lv.ttft_ms_std, waiting_max=lv.waiting_max,
                   running_max=lv.running_max, preemptions=lv.preemptions, error_reasons=lv.error_reasons,
                   cost_per_mtok=lv.cost_per_mtok(price_per_kwh),
                   # the engine's own per-request rates where it sends them (llama.cpp's timings), else null
                   server_pp_tps_req=lv.server_pp_tps_req, server_tg_tps_req=lv.server_tg_tps_req)
        levels.append(row)
    k = knee(run.levels())
    meta["levels"] = levels
    meta["knee"] = None if k is None else {"concurrency": k.concurrency, "next_gain": k.next_gain,
                                           "falls": k.falls, "text": k.describe()}
    return meta
