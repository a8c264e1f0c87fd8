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
    xs, ys = [], []
    for row in table["rows"]:
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


def write(data: dict, out_dir: Path) -> list[dict]:
    """Each chart as SVG and PNG under `out_dir`; what was written, per chart
    (`key`, `title`, `svg`, `png` — paths relative to `out_dir`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
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
    out = []
    for chart in CHARTS:
        fig = figure(data, chart)
        if fig is not None:
            out.append({"key": chart.key, "title": chart.title, "svg": inline_svg(fig)})
    return out
