"""What `sparktop collect` does with alerts: checks the rules after each snapshot (`observe.alerts`), records
each alert that fires or resolves in the history as an event, and posts it to every `--notify` target
(`history.notify`), with a heartbeat when the collector starts."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from sparktop.history.notify import Notifier, Target, parse_target
from sparktop.observe.alerts import AFTER_S, AlertWatch
from sparktop.observe.snapshot import EngineSnapshot, NodeSnapshot, Notice

if TYPE_CHECKING:
    from collections.abc import Callable

    from sparktop.observe.state import ClusterState


class CollectAlerts:
    def __init__(self, notify: list[str], say: Callable[[str], None] = print, after_s: float = AFTER_S,
                 host: str | None = None):
        self.targets: list[Target] = [parse_target(t) for t in notify]  # a bad URL is an error before polling
        self.watch = AlertWatch(after_s=after_s, clear_s=after_s)
        self.host = host or socket.gethostname()
        self.notifier = Notifier(self.targets, say=say, host=self.host)
        self.say = say

    async def start(self, now: float, nodes: int, engines: int) -> None:
        if self.targets:
            self.say("alerts go to " + ", ".join(t.shown for t in self.targets))
        await self.notifier.start(Notice(now, "node", self.host, "heartbeat", "info",
                                         f"collector started on {self.host}: watching {nodes} node"
                                         f"{'s' * (nodes != 1)}" + (f" and {engines} engine{'s' * (engines != 1)}"
                                                                    if engines else "")))

    def after(self, event: object, state: ClusterState, paused: str | None = None) -> list[Notice]:
        """The alerts that fire or resolve now (after `event` was applied to `state`), sent on their way; the
        caller applies them to the state and the history like any notice. `paused`: why the history file
        does not take rows now (a full disk), or None."""
        if not isinstance(event, NodeSnapshot | EngineSnapshot):
            return []
        self.watch.history(paused, state.now)
        out = self.watch.check(state)
        for notice in out:
            self.notifier.send(notice)
        return out

    async def close(self) -> None:
        await self.notifier.close()
