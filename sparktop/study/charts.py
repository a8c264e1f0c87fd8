"""The study report's charts: a metric against concurrency, a line per topology.

Drawn with matplotlib's object API (no pyplot, no global backend: a
`Figure` saves through Agg for PNG and the SVG backend for SVG), imported
inside the functions so that `sparktop --help` never pays for it. The input
is `report.build`'s dict, so a chart shows exactly what the tables say:
measured values as solid lines with markers, the prediction as a dashed line
of the same colour, contaminated levels as hollow markers.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Chart:
    key: str  # the metric, as in LevelStats
    slug: str  # the file name, without suffix
    title: str
    ylabel: str
    higher_is_better: bool


CHARTS = (
    Chart("tg_tps_total", "decode-throughput", "Decode throughput, all requests together", "tokens / s", True),
    Chart("pp_tps_total", "prefill-throughput", "Prefill throughput, all requests together", "tokens / s", True),
    Chart("ttft_ms_mean", "ttft-mean", "Time to first token, mean", "milliseconds", False),
)

# The same colour for a topology in every chart of every report.
COLOURS = {
    "solo": "#1f77b4",
    "cluster-ray": "#ff7f0e",
    "cluster-mp": "#2ca02c",
    "shuffle": "#d62728",
    "least-busy": "#9467bd",
}
_MORE = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def colour(name: str, index: int) -> str:
    return COLOURS.get(name) or _MORE[index % len(_MORE)]


def _series(table: dict, name: str, what: str) -> tuple[list[int], list[float]]:
    """Against concurrency: at the shallowest depth a depth study ran (its depths have charts of their own)."""
    xs, ys = [], []
    shallow = min((row.get("depth", 0) for row in table["rows"]), default=0)
    for row in table["rows"]:
        if row.get("depth", 0) != shallow:
            continue
        v = row["values"].get(name, {}).get(what)
        if v is not None and v > 0:
            xs.append(row["concurrency"])
            ys.append(v)
    return xs, ys


def figure(data: dict, chart: Chart) -> Figure | None:
    """The chart as a matplotlib Figure (None: nothing measured for it)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    table = next((t for t in data["tables"] if t["key"] == chart.key), None)
    if table is None or not any(_series(table, n, "measured")[0] for n in data["columns"]):
        return None
    fig = Figure(figsize=(10, 4.8), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    handles: list[Any] = []
    predicted_any = False
    levels: set[int] = set()
    for i, name in enumerate(data["columns"]):
        c = colour(name, i)
        xs, ys = _series(table, name, "measured")
        levels.update(xs)
        if xs:
            (line,) = ax.plot(xs, ys, color=c, linewidth=2.2, marker="o", markersize=6, label=name, zorder=3)
            handles.append(line)
            dirty = [(x, y) for row in table["rows"] for x, y in [(row["concurrency"],
                     row["values"].get(name, {}).get("measured"))]
                     if y is not None and row["values"].get(name, {}).get("contaminated")]
            if dirty:
                ax.plot([x for x, _ in dirty], [y for _, y in dirty], linestyle="none", marker="o", markersize=10,
                        markerfacecolor="white", markeredgecolor=c, markeredgewidth=2, zorder=4)
        pxs, pys = _series(table, name, "predicted")
        if pxs:
            predicted_any = True
            levels.update(pxs)
            ax.plot(pxs, pys, color=c, linewidth=1.4, linestyle=(0, (5, 3)), alpha=0.75, zorder=2)
    ax.set_xscale("log", base=2)
    ticks = sorted(levels)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    if len(ticks) > 1:
        ax.set_xlim(ticks[0] / 1.25, ticks[-1] * 1.25)
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    better = "higher is better" if chart.higher_is_better else "lower is better"
    ax.set_title(f"{chart.title} ({better})", fontsize=14, fontweight="bold", loc="left")
    ax.set_xlabel("concurrent requests (log scale)", fontsize=11)
    ax.set_ylabel(chart.ylabel, fontsize=11)
    ax.grid(True, which="major", color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=10)
    if predicted_any:
        handles.append(Line2D([], [], color="#555555", linewidth=1.4, linestyle=(0, (5, 3)),
                              label="predicted (dashed, same colour)"))
    if any(row["values"].get(n, {}).get("contaminated") for row in table["rows"] for n in data["columns"]):
        handles.append(Line2D([], [], linestyle="none", marker="o", markersize=9, markerfacecolor="white",
                              markeredgecolor="#555555", markeredgewidth=2, label="contaminated level"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=10)
    return fig


def _svg_bytes(fig: Figure) -> bytes:
    import matplotlib

    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "sparktop"}):
        fig.savefig(buf, format="svg", metadata={"Date": None}, facecolor="white")
    return buf.getvalue()


def _style(ax, title: str, xlabel: str, ylabel: str) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.3g}" if v < 10 else f"{v:,.0f}"))
    ax.set_title(title, fontsize=14, fontweight="bold", loc="left")
    ax.set_xlabel(xlabel, fontsize=11)
    ax.set_ylabel(ylabel, fontsize=11)
    ax.grid(True, which="major", color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=10)


def goodput_figure(data: dict) -> Figure | None:
    """A rate study: goodput against the rate offered, a line per topology, the offered rate as the diagonal
    (what a server that keeps up and meets the SLO serves); hollow markers where the SLO was missed."""
    rates = data.get("rates")
    if not rates or not rates.get("rows"):
        return None
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    fig = Figure(figsize=(10, 4.8), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    offered = [r["rate"] for r in rates["rows"]]
    ax.plot(offered, offered, color="#999999", linewidth=1, linestyle=(0, (2, 2)), label="rate offered")
    for i, name in enumerate(data["columns"]):
        pts = [(r["rate"], v.get("goodput") if v.get("goodput") is not None else v.get("request_throughput"),
                v.get("meets")) for r in rates["rows"] if (v := r["values"].get(name))]
        pts = [p for p in pts if p[1] is not None]
        if not pts:
            continue
        c = colour(name, i)
        ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], color=c, linewidth=2.2, label=name, zorder=3)
        for x, y, ok in pts:
            ax.plot([x], [y], marker="o", markersize=7, color=c, markerfacecolor=c if ok else "white",
                    markeredgewidth=2, zorder=4)
    ax.set_xscale("log", base=2)
    # Powers of two labelled; a search's rates between them (bisections) as unlabelled ticks, so they never
    # print over each other.
    lo, hi = min(offered), max(offered)
    powers = [2.0**k for k in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1) if lo <= 2.0**k <= hi]
    ax.xaxis.set_major_locator(FixedLocator(powers or sorted(set(offered))))
    ax.xaxis.set_minor_locator(FixedLocator(sorted(set(offered) - set(powers))) if powers else NullLocator())
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda _v, _pos: ""))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.3g}"))
    slo = ", ".join(rates.get("slo") or [])
    _style(ax, "Goodput against the rate offered (hollow: the SLO missed)",
           f"requests/s offered (log scale) · SLO {slo}", "requests / s meeting the SLO")
    return fig


def depth_figures(data: dict) -> list[tuple[str, str, str, Figure]]:
    """A depth study: decode throughput and TTFT against the context's depth, a line per topology and
    concurrency."""
    from matplotlib.figure import Figure

    out = []
    for key, slug, title, ylabel in (("tg_tps_total", "decode-by-depth", "Decode throughput against context "
                                      "depth (higher is better)", "tokens / s"),
                                     ("ttft_ms_mean", "ttft-by-depth", "Time to first token against context "
                                      "depth (lower is better)", "milliseconds")):
        table = next((t for t in data["tables"] if t["key"] == key), None)
        if table is None or len({row.get("depth", 0) for row in table["rows"]}) < 2:
            continue
        fig = Figure(figsize=(10, 4.8), dpi=110, layout="constrained")
        ax = fig.add_subplot()
        styles = ["-", "--", ":", "-."]
        for i, name in enumerate(data["columns"]):
            for j, c in enumerate(sorted({row["concurrency"] for row in table["rows"]})):
                pts = sorted((row.get("depth", 0), v) for row in table["rows"] if row["concurrency"] == c
                             and (v := row["values"].get(name, {}).get("measured")) is not None)
                if len(pts) > 1:
                    ax.plot([d for d, _ in pts], [v for _, v in pts], color=colour(name, i), marker="o",
                            linestyle=styles[j % len(styles)], linewidth=2, label=f"{name} c{c}")
        ax.set_xlim(left=0)
        _style(ax, title, "context tokens before the prompt", ylabel)
        out.append((key + "_by_depth", slug, title, fig))
    return out


def _extra(data: dict) -> list[tuple[str, str, str, Figure]]:
    out = depth_figures(data)
    fig = goodput_figure(data)
    if fig is not None:
        out.insert(0, ("goodput", "goodput", "Goodput against the rate offered", fig))
    return out


def write(data: dict, out_dir: Path) -> list[dict]:
    """Each chart as SVG and PNG under `out_dir`; what was written, per chart
    (`key`, `title`, `svg`, `png` — paths relative to `out_dir`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key, slug, title, extra in _extra(data):
        svg, png = f"{slug}.svg", f"{slug}.png"
        (out_dir / svg).write_bytes(_svg_bytes(extra))
        extra.savefig(out_dir / png, format="png", dpi=110, facecolor="white", metadata={"Software": None})
        written.append({"key": key, "title": title, "svg": svg, "png": png})
    for chart in CHARTS:
        fig = figure(data, chart)
        if fig is None:
            continue
        svg, png = f"{chart.slug}.svg", f"{chart.slug}.png"
        (out_dir / svg).write_bytes(_svg_bytes(fig))
        fig.savefig(out_dir / png, format="png", dpi=110, facecolor="white", metadata={"Software": None})
        written.append({"key": chart.key, "title": chart.title, "svg": svg, "png": png})
    return written


_PROLOGUE = re.compile(r"^.*?(?=<svg\b)", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)
_XMLNS = re.compile(r'\s+xmlns(?::\w+)?="[^"]*"')


def inline_svg(fig: Figure) -> str:
    """The chart as an `<svg>` element to put straight into HTML: no XML
    prologue, doctype, metadata or namespace URLs (HTML's parser knows SVG
    and xlink:href by itself), so the page refers to nothing outside."""
    text = _svg_bytes(fig).decode()
    text = _PROLOGUE.sub("", text, count=1)
    text = _METADATA.sub("", text)
    text = _XMLNS.sub("", text)
    # A fixed width from matplotlib would not shrink on a narrow window.
    text = re.sub(r'(<svg\b[^>]*?)\swidth="[^"]*"\s+height="[^"]*"', r'\1 class="chart" role="img"', text, count=1)
    return text


def inline(data: dict) -> list[dict]:
    """Each chart as inline SVG: `key`, `title`, `svg`."""
    out = [{"key": key, "title": title, "svg": inline_svg(fig)} for key, _slug, title, fig in _extra(data)]
    for chart in CHARTS:
        fig = figure(data, chart)
        if fig is not None:
            out.append({"key": chart.key, "title": chart.title, "svg": inline_svg(fig)})
    return out
