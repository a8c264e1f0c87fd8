"""The cache screen (`c`): what each node has cached, the models in its Hugging Face cache (size, revision,
complete or why not) and its Docker images, the same rows `sparktop cache` prints (`sync.cached.rows`).

It reads the nodes when it opens and when `r` asks again, in a worker (one shell round trip per node for each of
the two listings); it does not follow the cluster state, so it is a plain `Screen`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Static

from sparktop.sync.cached import COLUMNS, NodeCache, rows
from sparktop.ui.footer import KeyFooter

LEVEL_STYLE = {"ok": "", "warn": "yellow", "error": "red"}
HINT = "sparktop sync NAME copies what a node lacks"
NARROW = 110  # below this many columns a row says less: "complete" without its revision, an image ID's 12 digits


def _narrow(state: str) -> str:
    """A state as the 80-column table shows it, so the row fits whole."""
    if state.startswith("complete, revision "):
        return "complete"
    if state.startswith("sha256:"):
        return state[len("sha256:"):][:12]
    return state


class CacheScreen(Screen):
    """Each node's cached models and images, read on demand."""

    BINDINGS = [Binding("escape,q,c", "app.pop_screen", "Back"), Binding("r", "reread", "Refresh")]

    def __init__(self, read: Callable[[], Awaitable[list[NodeCache]]] | None, note: str | None = None):
        """`read` lists every node's cache (None: there are no nodes to read, `note` says why)."""
        super().__init__()
        self.read = read
        self.note = note
        self.caches: list[NodeCache] | None = None
        self.reads = 0

    def compose(self) -> ComposeResult:
        yield Static(id="cache-head")
        yield DataTable(id="cache-table", cursor_type="row", zebra_stripes=True)
        yield KeyFooter()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for column in COLUMNS:
            table.add_column(column, key=column)
        self.action_reread()

    def action_reread(self) -> None:
        head = self.query_one("#cache-head", Static)
        if self.read is None:
            head.update(Text(self.note or "no nodes to read", style="yellow"))
            return
        head.update(Text("reading each node's Hugging Face cache and docker images…", style="dim"))
        self.run_worker(self._read(), exclusive=True, group="cache")

    def on_resize(self) -> None:
        if self.caches:
            self.show(self.caches)

    async def _read(self) -> None:
        assert self.read is not None
        self.caches = await self.read()
        self.reads += 1
        self.show(self.caches)

    def show(self, caches: list[NodeCache]) -> None:
        table = self.query_one(DataTable)
        table.clear()
        narrow = self.size.width < NARROW
        for *cells, level in rows(caches):
            style = LEVEL_STYLE[level]
            state = _narrow(cells[4]) if narrow else cells[4]
            table.add_row(*(Text(c) for c in cells[:4]), Text(state, style=style))
        models = sum(len(c.models) for c in caches)
        images = sum(len(c.images) for c in caches)
        unread = [c.node for c in caches if c.error]
        def count(n: int, what: str) -> str:
            return f"{n} {what}" + ("" if n == 1 else "s")

        head = Text(f"{count(len(caches), 'node')}: {count(models, 'model')}, {count(images, 'image')}", style="bold")
        if unread:
            head.append(f" · not read: {', '.join(unread)}", style="red")
        head.append(f" · {HINT}", style="dim")
        self.query_one("#cache-head", Static).update(head)
