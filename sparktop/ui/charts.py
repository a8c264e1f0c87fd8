"""Longer history charts for the detail view, drawn with plotext into text;
and what a chart shows while it has nothing to draw."""

from __future__ import annotations

from rich.text import Text


def line_chart(title: str, series: list[tuple[str, list[float], list[float]]], width: int, height: int,
               ylabel: str = "", ymin: float | None = None, ymax: float | None = None) -> Text:
    """`series` is (label, t, values); t in epoch seconds, shown as seconds
    before the newest point (not the wall clock, so a replay reads the same)."""
    if not any(ts for _, ts, _ in series):
        return empty_chart(title, width, height)
    import plotext as plt  # only the detail view needs it

    plt.clear_figure()
    plt.limitsize(False, False)  # the size asked for: plotext would cap it at the process's terminal (80x24 headless)
    plt.plotsize(max(20, width), max(6, height))
    plt.theme("pro")
    plt.title(title)
    now = max((ts[-1] for _, ts, _ in series if ts), default=0.0)
    for label, ts, values in series:
        if not ts:
            continue
        xs = [t - now for t in ts]
        plt.plot(xs, values, label=label, marker="braille")
    if ymin is not None or ymax is not None:
        plt.ylim(ymin, ymax)
    plt.xlabel("seconds ago")
    if ylabel:
        plt.ylabel(ylabel)
    return Text.from_ansi(plt.build())


NO_DATA = "no data yet"


def empty_chart(title: str, width: int, height: int, note: str = NO_DATA) -> Text:
    """A chart with nothing to draw: its title over an empty frame that says
    so, the size a drawn chart would take (plotext's would make up axes from
    -1 to 1 around a point at 0)."""
    width, height = max(20, width), max(6, height)
    inner = width - 2
    out = Text(title[:width].center(width).rstrip())
    rows = height - 3  # the title and the frame's top and bottom
    out.append("\n┌" + "─" * inner + "┐", style="dim")
    for row in range(rows):
        out.append("\n│", style="dim")
        if row == (rows - 1) // 2:
            out.append(note[:inner].center(inner), style="italic dim")
        else:
            out.append(" " * inner)
        out.append("│", style="dim")
    out.append("\n└" + "─" * inner + "┘", style="dim")
    return out
