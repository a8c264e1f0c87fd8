"""Terminal tables that fit their width: columns left out by priority, never cut into `vL… gp…`.

`fit_columns` chooses which columns of a table fit, by priority: the sweep screen's tables (ui/sweep.py),
`recipes` and `status` (through `fitted`, a Rich table) ask it. At 80 columns the least important go first,
whole, and the caption names what was left out, so every cell shown is readable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text


def fit_columns(widths: Mapping[str, int], keep: Sequence[str], room: int, gap: int = 0) -> tuple[str, ...]:
    """The columns of a table that fit `room` cells, in the table's order: `widths` is each column's width
    (its padding in it) in that order, `keep` the columns by priority, the first kept longest (one not named
    goes before any named); `gap` is what the table puts between two columns. The first column of `keep`
    stays, whatever the room."""
    order = [c for c in keep if c in widths] + [c for c in widths if c not in keep]
    shown = order
    while len(shown) > 1 and sum(widths[c] for c in shown) + gap * (len(shown) - 1) > room:
        shown = shown[:-1]
    return tuple(c for c in widths if c in shown)



@dataclass(frozen=True)
class Column:
    header: str
    keep: int = 5  # 0: never left out; higher: left out sooner
    justify: str = "left"


def _width(value: object) -> int:
    text = value.plain if isinstance(value, Text) else str(value)
    return max((cell_len(line) for line in text.splitlines()), default=0)


def fitted(title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[object]], width: int,
           caption: str | None = None) -> Table:
    """A table of `rows` with as many of `columns` as fit `width` whole (each cell and header on one line),
    the least kept left out first and named in the caption."""
    need = []
    for i, col in enumerate(columns):
        need.append(max([cell_len(col.header), *(_width(r[i]) for r in rows)]))
    # `│ cell ` per column, and the table's last border
    widths = {str(i): need[i] + 3 for i in range(len(columns))}
    keep = [str(i) for i in sorted(range(len(columns)), key=lambda i: (columns[i].keep, i))]
    shown = [int(i) for i in fit_columns(widths, keep, width - 1)]
    left_out = [columns[i].header for i in range(len(columns)) if i not in shown]
    notes = [caption] if caption else []
    if left_out:
        notes.append(f"left out at {width} columns: {', '.join(left_out)} (a wider terminal, or --json)")
    table = Table(title=title, title_justify="left", caption="\n".join(notes) or None, caption_justify="left")
    for i in shown:
        col = columns[i]
        table.add_column(col.header, justify=col.justify, no_wrap=True,  # type: ignore[arg-type]
                         min_width=need[i])
    for row in rows:
        table.add_row(*(cell if isinstance(cell, Text) else str(cell) for cell in (row[i] for i in shown)))
    return table
