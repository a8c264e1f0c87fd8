"""What a read-only session says and leaves out (`sparktop web` without
--allow-control): the notice a refused key shows, and the help without the
keys that change something on the nodes."""

from __future__ import annotations

import re

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from sparktop.ui.screens import HELP, HelpScreen, help_text

# The app's actions a read-only session refuses, and how the notice names them.
READ_ONLY_ACTIONS = {"launch": "launching", "stop": "stopping", "sweep": "sweeping", "study": "studying"}
OFF_KEYS = {"l", "x", "s", "b", "y"}  # their lines in the help

ALLOW = "start `sparktop web --allow-control` to allow it"


def refusal(action: str) -> str:
    what = READ_ONLY_ACTIONS.get(action, action)
    return f"read-only: {what} is off in this browser session ({ALLOW})"


def read_only_help(text: str = HELP) -> str:
    """The help without the lines of the refused keys (a key's line and the
    lines indented under it), and a line that says why."""
    out: list[str] = []
    dropping = False
    for line in text.splitlines():
        key = re.match(r" {2}\[b\](.+?)\[/b\]", line)
        if key:
            dropping = key.group(1).strip() in OFF_KEYS
        elif not line.startswith("   "):
            dropping = False
        if not dropping:
            out.append(line)
    note = ("[b]read-only[/b]: this browser session only watches; launching, stopping, sweeping and studies\n"
            "are off (`sparktop web --allow-control` allows them)")
    # After the title line: the first thing read.
    return "\n".join([*out[:1], "", note, *out[1:]]) + "\n"


class ReadOnlyHelpScreen(HelpScreen):
    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(help_text(read_only_help()))
