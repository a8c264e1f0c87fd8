"""Small text renderings shared by the cards: bars, sparklines, numbers.

Rich `Text` only, so cards stay single widgets that repaint cheaply.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console
from rich.text import Span, Text

BLOCKS = " ▁▂▃▄▅▆▇█"
GIB = 1024**3


def spark(values: list[float], width: int, top: float | None = None, style: str = "cyan") -> Text:
    """The last `width` values as a sparkline; `top` fixes the scale (e.g. 100
    for a percentage), otherwise the largest value is the top. Zero draws the
    baseline so an idle engine still shows a line."""
    values = values[-width:] if width > 0 else []
    if not values:
        return Text("·" * max(0, width), style="dim")
    hi = top if top is not None else max(values)
    cells = []
    for v in values:
        if hi <= 0 or v <= 0:
            cells.append(BLOCKS[1])
        else:
            cells.append(BLOCKS[min(8, max(2, round(v / hi * 8)))])
    text = Text(" " * (width - len(cells)), style="dim")
    text.append("".join(cells), style=style)
    return text


def spark_rows(values: list[float], width: int, rows: int, top: float | None = None,
               style: str = "cyan") -> list[Text]:
    """A sparkline `rows` lines tall (top line first): taller screens get finer history."""
    if rows <= 1:
        return [spark(values, width, top, style)]
    values = values[-width:] if width > 0 else []
    hi = top if top is not None else (max(values) if values else 0)
    levels = []
    for v in values:
        if hi <= 0 or v <= 0:
            levels.append(1)  # the baseline
        else:
            levels.append(max(2, round(v / hi * 8 * rows)))
    out = []
    for row in range(rows - 1, -1, -1):  # top row first
        cells = []
        for level in levels:
            part = level - row * 8
            cells.append(BLOCKS[max(0, min(8, part))] if part > 0 else " ")
        text = Text(" " * (width - len(cells)))
        text.append("".join(cells), style=style)
        out.append(text)
    return out


def _spark_parts(values: list[float], width: int, rows: int, top: float | None) -> list[tuple[str, str]]:
    """Each row of `spark_rows(values, width, rows, top)` (top row first) as
    (padding, cells): the strings it joins, without making Texts."""
    if rows <= 1:
        values = values[-width:] if width > 0 else []
        if not values:
            return [("·" * max(0, width), "")]
        hi = top if top is not None else max(values)
        cells = "".join(BLOCKS[1] if hi <= 0 or v <= 0 else BLOCKS[min(8, max(2, round(v / hi * 8)))]
                        for v in values)
        return [(" " * (width - len(cells)), cells)]
    values = values[-width:] if width > 0 else []
    hi = top if top is not None else (max(values) if values else 0)
    levels = [1 if hi <= 0 or v <= 0 else max(2, round(v / hi * 8 * rows)) for v in values]
    pad = " " * (width - len(levels))
    if not levels:
        return [(pad, "")] * rows
    # Each column top to bottom (a level of eighths of a row: full rows, a part
    # of one, blanks above), then the rows read across the columns.
    column: dict[int, str] = {}
    for level in levels:
        if level not in column:
            full, part = min(rows, level // 8), level % 8
            tip = BLOCKS[part] if part and full < rows else ""
            column[level] = " " * (rows - full - len(tip)) + tip + BLOCKS[8] * full
    return [(pad, "".join(cells)) for cells in zip(*[column[level] for level in levels], strict=True)]


def labelled_sparks(left: tuple, right: tuple, rows: int) -> list[Text]:
    """Two sparklines side by side, each (values, width, rows' labels, top,
    style), a row a Text: what `side_by_side` makes of `Text(label,
    style="dim") + spark_rows(...)[i]` for each side, the same text and the
    same spans, built in one go (a tall chart redraws a dozen rows at once,
    and the Texts those steps make and copy were most of its cost)."""
    sides = []
    for values, width, labels, top, style in (left, right):
        sides.append((labels, style, rows <= 1, _spark_parts(values, width, rows, top)))
    (labels_l, style_l, one_l, parts_l), (labels_r, style_r, one_r, parts_r) = sides

    def side(label: str, style: str, one: bool, pad: str, cells: str, at: int, spans: list[Span]) -> str:
        # `Text(label, style="dim") + chart`: the chart's own style over all of it (a one-row spark's "dim"
        # padding), then its cells' style.
        chart = len(pad) + len(cells)
        if chart:
            start = at + len(label)
            if one:
                spans.append(Span(start, start + chart, "dim"))
            if cells and style:
                spans.append(Span(start + len(pad), start + chart, style))
        return label + pad + cells

    lefts = []
    for label, (pad, cells) in zip(labels_l, parts_l, strict=True):
        spans: list[Span] = []
        plain = side(label, style_l, one_l, pad, cells, 0, spans)
        lefts.append((plain, cell_len(label) + len(pad) + len(cells), spans))  # blocks and "·" take a cell each
    width = max((cells for _, cells, _ in lefts), default=0)
    out = []
    for (plain, length, spans), label, (pad, cells) in zip(lefts, labels_r, parts_r, strict=True):
        plain += " " * (width - length + 1)
        at = len(plain)
        right = label + pad + cells
        spans.append(Span(at, at + len(right), "dim"))  # the right side's own style, as `append_text` adds it
        out.append(Text(plain + side(label, style_r, one_r, pad, cells, at, spans), style="dim", spans=spans))
    return out


def side_by_side(left: list[Text], right: list[Text], gap: int = 1) -> list[Text]:
    width = max((t.cell_len for t in left), default=0)
    out = []
    for i in range(max(len(left), len(right))):
        line = left[i].copy() if i < len(left) else Text()
        line.append(" " * (width - line.cell_len + gap))
        if i < len(right):
            line.append_text(right[i])
        out.append(line)
    return out


def bar(fraction: float | None, width: int, style: str = "green", empty: str = "grey35") -> Text:
    fraction = 0.0 if fraction is None else max(0.0, min(1.0, fraction))
    full = round(fraction * width)
    if fraction > 0 and full == 0:
        full = 1  # anything in use shows
    text = Text("█" * full, style=style)
    text.append("░" * (width - full), style=empty)
    return text


def flow(parts: list[Text], width: int, gap: str = "  ") -> list[Text]:
    """Lay `parts` out left to right, starting a new line when the next one
    would not fit, so a narrow card wraps between fields, not inside one."""
    lines: list[Text] = []
    line = Text()
    for part in parts:
        if line.cell_len and line.cell_len + len(gap) + part.cell_len > width:
            lines.append(line)
            line = Text()
        if line.cell_len:
            line.append(gap)
        line.append_text(part)
    if line.cell_len:
        lines.append(line)
    return lines


def wrap(text: Text, width: int, max_lines: int) -> list[Text]:
    """`text` cut into lines of `width` cells, at most `max_lines` (the last ends in …)."""
    width = max(1, width)
    lines = [text[i:i + width] for i in range(0, len(text.plain), width)][:max_lines]
    if len(text.plain) > width * max_lines:
        lines[-1] = lines[-1][: width - 1] + Text("…", style=text.style)
    return lines


_WRAPPER = Console(width=1000, legacy_windows=False, no_color=True)  # wraps text; never prints


def wrap_words(text: Text, width: int, max_lines: int) -> list[Text]:
    """`text` in lines of at most `width` cells, broken between words, at most
    `max_lines` (the last ends in … when some is left out)."""
    width = max(1, width)
    lines: list[Text] = []
    for line in text.wrap(_WRAPPER, width):
        line.rstrip()
        lines.append(line)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        last = lines[-1]
        lines[-1] = (last[: width - 1] if last.cell_len >= width else last) + Text("…", style=text.style)
    return lines


def field(label: str, value: str, style: str = "") -> Text:
    text = Text(label + " ", style="bold")
    text.append(value, style=style)
    return text


def memory_bar(total: int, vllm: int, used: int, cache: int, width: int, used_style: str) -> Text:
    """Unified memory: the engines' share (their GPU processes), other used memory, page cache, free."""
    if total <= 0 or width <= 0:
        return Text(" " * max(0, width))
    vllm = min(vllm, used)
    cells_vllm = round(vllm / total * width)
    cells_used = max(0, round(used / total * width) - cells_vllm)
    cells_cache = max(0, min(width - cells_vllm - cells_used, round(cache / total * width)))
    cells_free = max(0, width - cells_vllm - cells_used - cells_cache)
    text = Text("█" * cells_vllm, style="magenta")
    text.append("█" * cells_used, style=used_style)
    text.append("▒" * cells_cache, style="grey42")
    text.append("░" * cells_free, style="grey30")
    return text


def gib(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value / GIB:.{digits}f}"


def rate(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 10_000:
        return f"{value / 1000:.1f}k"
    if value >= 1000:
        return f"{value / 1000:.2f}k"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    value = seconds * 1000
    if value >= 1000:
        return f"{value / 1000:.1f}s"
    return f"{value:.0f}ms"


def pct(fraction: float | None, digits: int = 1) -> str:
    return "—" if fraction is None else f"{fraction * 100:.{digits}f}%"


def num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "—" if value is None else fmt.format(value)


def nodes_named(nodes: list[str], width: int) -> str:
    """"spark-a" / "spark-a, spark-b" / "spark-a +3": the nodes an engine
    runs on, the head first, in `width` cells at most."""
    if not nodes:
        return ""
    every = ", ".join(nodes)
    if len(every) <= width or len(nodes) == 1:
        return every
    return f"{nodes[0]} +{len(nodes) - 1}"


STATE_STYLES = {
    "ok": "green", "ready": "green", "starting": "yellow", "connecting": "grey62", "stale": "yellow",
    "down": "bold red", "unreachable": "bold red", "failed": "bold red", "unrecognised": "yellow",
    "hung": "bold red",
}


def state_badge(state: str) -> Text:
    return Text(f"● {state}", style=STATE_STYLES.get(state, "white"))


