"""How numbers and durations read, the same in every table and screen."""

from __future__ import annotations


def fmt(value: float | None, unit: str = "t/s") -> str:
    """The articles' style: 16.29 t/s, 1,328 t/s, 777 ms."""
    if value is None:
        return "—"
    if abs(value) >= 1000 or (unit == "ms" and abs(value) >= 10):
        return f"{value:,.0f}"
    return f"{value:.2f}"


def ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "ETA …"
    seconds = int(seconds)
    return f"ETA {seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"ETA {seconds}s"
