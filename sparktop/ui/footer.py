"""The footer every screen shows: the keys a user needs, in the room there is.

Textual's footer lays the keys out in a row in the order the bindings come
(the screen's own first, then the app's in `SparktopApp.BINDINGS` order) and
cuts what does not fit. So the order is the priority, and below 110 columns
the keys go compact (no padding around them) and the command palette's key
(ctrl+p still opens it; ? lists every key) gives up its place: at 80 columns
the monitor shows every key it has.
"""

from __future__ import annotations

from textual import events
from textual.widgets import Footer

COMPACT_BELOW = 110  # the screens' -narrow width class
PALETTE_FROM = 100  # the command palette's key shows from this many columns


class KeyFooter(Footer):
    def __init__(self) -> None:
        super().__init__(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self._fit(self.app.size.width)

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.width)

    def _fit(self, width: int) -> None:
        self.compact = width < COMPACT_BELOW
        palette = width >= PALETTE_FROM
        if palette != self.show_command_palette:
            self.show_command_palette = palette
            self.call_after_refresh(self.recompose)  # (before the bindings are known it composes nothing)
