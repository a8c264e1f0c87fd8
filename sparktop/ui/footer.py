"""The footer every screen shows: the keys a user needs, in the room there is.

Textual's footer lays the keys out in a row in the order the bindings come
(the focused widget's, the screen's own, then the app's in `SparktopApp.BINDINGS`
order) and cuts what does not fit, mid-word ("p Pau"). So the order is the
priority, and here the first key that does not fit is left out whole, with
every key after it: a screen's own keys first, then the app's.
Below 110 columns the keys go compact (no padding around them, the shorter
labels of `SHORT`) and the command palette's key (ctrl+p still opens it; ?
lists every key) gives up its place: at 80 columns the monitor shows every
key it has, and every other screen its own keys, then as many of the app's
as fit.
"""

from __future__ import annotations

from rich.cells import cell_len
from textual import events
from textual.widgets import Footer
from textual.widgets._footer import FooterKey, FooterLabel, KeyGroup

COMPACT_BELOW = 110  # the screens' -narrow width class
PALETTE_FROM = 100  # the command palette's key shows from this many columns
# Compact labels: a key's description below COMPACT_BELOW columns.
SHORT = {
    "Past runs": "Runs",
    "Cancel sweep": "Cancel",
}


class KeyFooter(Footer):
    def __init__(self) -> None:
        super().__init__(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self._fit(self.app.size.width)

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.width)
        self.call_after_refresh(self.recompose)  # the keys chosen again for the new width

    def _fit(self, width: int) -> None:
        self.compact = width < COMPACT_BELOW
        palette = width >= PALETTE_FROM
        if palette != self.show_command_palette:
            self.show_command_palette = palette
            self.call_after_refresh(self.recompose)  # (before the bindings are known it composes nothing)

    async def recompose(self) -> None:
        await super().recompose()
        if self.compact:
            for key in self.query(FooterKey):
                if key.description in SHORT:
                    key.description = SHORT[key.description]
                    key.refresh(layout=True)
        self.leave_out()  # before the first paint: no key is ever drawn cut

    def units(self) -> list[list]:
        """The footer's keys as they are laid out: a key alone, or a group's keys with its label after them."""
        units: list[list] = []
        for child in self.children:
            if "-command-palette" in child.classes:
                continue
            if isinstance(child, FooterLabel) and units and isinstance(units[-1][0], KeyGroup):
                units[-1].append(child)
            else:
                units.append([child])
        return units

    def estimated_widths(self) -> list[tuple[int, int]]:
        """Each unit's (width, margin after it) as the footer's CSS lays it out, from its text alone, so the
        keys are chosen before anything is drawn: a key is its key and its description, padded unless compact; a
        group is its keys, a cell between and around them, and its label."""
        compact = self.compact
        out = []
        for unit in self.units():
            head = unit[0]
            if isinstance(head, KeyGroup):
                keys = [k for k in head.children if isinstance(k, FooterKey)]
                width = sum(cell_len(k.key_display) for k in keys) + len(keys) + 1
                label = unit[1] if len(unit) > 1 else None
                text = cell_len(str(label.content)) if isinstance(label, FooterLabel) else 0
                out.append((width + text + (0 if compact else 1), 0 if compact else 1))
            elif isinstance(head, FooterKey):
                desc = cell_len(head.description)
                if compact:
                    out.append((cell_len(head.key_display) + (1 + desc if desc else 0) + 1, 1))
                else:
                    out.append((cell_len(head.key_display) + 2 + (desc + 1 if desc else 0), 0))
            else:
                out.append((head.outer_size.width, 0))
        return out

    def leave_out(self) -> None:
        """Hide the first key that does not fit whole and every key after it (what is shown stays where it
        was laid out). The last key shown needs no room for its margin after it."""
        if not self.is_attached:
            return
        room = self.size.width or self.app.size.width
        for child in self.children:
            if isinstance(child, FooterKey) and "-command-palette" in child.classes and child.display:
                # ("▏^p palette": its key, its description and the border before it, padded unless compact)
                room -= cell_len(child.key_display) + cell_len(child.description) + 2 + (0 if self.compact else 2)
        used = 0
        fits = True
        for unit, (width, after) in zip(self.units(), self.estimated_widths(), strict=True):
            fits = fits and used + width - after <= room
            for w in unit:
                w.display = fits
            used += width
