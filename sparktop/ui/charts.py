"""Longer history charts for the detail view, drawn with plotext into text."""

from __future__ import annotations

from rich.text import Text


def line_chart(title: str, series: list[tuple[str, list[float], list[float]]], width: int, height: int,
               ylabel: str = "", ymin: float | None = None, ymax: float | None = None) -> Text:
    """`series` is (label, t, values); t in epoch seconds, shown as seconds
    before the newest point (not the wall clock, so a replay reads the same)."""
    import plotext as plt  # only the detail view needs it

    plt.clear_figure()
    plt.limitsize(False, False)  # the size asked for: plotext would cap it at the process's terminal (80x24 headless)
    plt.plotsize(max(20, width), max(6, height))
    plt.theme("pro")
    plt.title(title)
    now = max((ts[-1] for _, ts, _ in series if ts), default=0.0)
    drawn = False
    for label, ts, values in series:
        if not ts:
            continue
        xs = [t - now for t in ts]
        plt.plot(xs, values, label=label, marker="braille")
        drawn = True
    if not drawn:
        plt.plot([0], [0])
    if ymin is not None or ymax is not None:
        plt.ylim(ymin, ymax)
    plt.xlabel("seconds ago")
    if ylabel:
        plt.ylabel(ylabel)
    return Text.from_ansi(plt.build())
