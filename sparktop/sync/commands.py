"""`sparktop sync` and `sparktop cache` for the terminal: the sync's events drawn with rich (a bar per transfer),
each node's cache as one table or JSON."""

from __future__ import annotations

import asyncio
import json
import sys

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from sparktop.remote import Transport, transport_for
from sparktop.settings import Inventory, load_inventory
from sparktop.sync.cached import COLUMNS, NodeCache, cluster_cache, rows
from sparktop.sync.events import (
    CommandShown,
    Found,
    Refused,
    Skipped,
    SyncEvent,
    TransferDone,
    TransferProgress,
    TransferStarted,
)
from sparktop.sync.hfcache import looks_like_repo_id
from sparktop.sync.transfer import Syncer, SyncRequest, human_bytes


def _transports(inventory: Inventory) -> dict[str, Transport]:
    return {n.name: transport_for(n) for n in inventory.nodes}


async def _close(transports: dict[str, Transport]) -> None:
    await asyncio.gather(*(t.close() for t in transports.values()), return_exceptions=True)


def kind_of(what: str, forced: str | None) -> str:
    """A model (`org/name`) or an image (`repo:tag`, `registry/org/name`, `name@sha256:...`); --image or --model
    decide where the name could be either."""
    if forced:
        return forced
    return "model" if looks_like_repo_id(what) else "image"


class _Renderer:
    """Prints a sync's events: what was found, each command, a bar per transfer, how each ended."""

    def __init__(self, console: Console, verbose: bool = True):
        self.console = console
        self.verbose = verbose  # print every command (--dry-run, -v); else only what was found and what happened
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}
        self.links: dict[str, float | None] = {}

    def _bar(self) -> Progress:
        if self.progress is None:
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                     TransferSpeedColumn(), TextColumn("{task.fields[link]}"), TimeRemainingColumn(),
                                     console=self.console, transient=False)
            self.progress.start()
        return self.progress

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def show(self, event: SyncEvent) -> None:
        match event:
            case Found(what=what, kind=kind, source=source, states=states):
                self.console.print(f"{kind} {escape(what)}: copying from {source}")
                for node, state in states:
                    self.console.print(f"  {node:12} {escape(state)}")
            case CommandShown(node=node, command=command) if self.verbose:
                self.console.print(f"[dim]+ {node}:[/dim] {escape(command)}", soft_wrap=True)
            case TransferStarted(target=target, source=source, total=total, via=via, link_bps=link, resumed=resumed):
                self.links[target] = link
                more = f", {human_bytes(resumed)} already staged" if resumed else ""
                self.console.print(f"{source} → {target} ({escape(via)}): {human_bytes(total)}{more}")
                self.tasks[target] = self._bar().add_task(f"{source}→{target}", total=total or None, link="")
            case TransferProgress(target=target, done=done, total=total, rate=rate):
                link = self.links.get(target)
                share = f"{100 * rate / link:.2g}% of {link * 8 / 1e9:.0f} Gb/s" if link and rate else ""
                if target in self.tasks:
                    self._bar().update(self.tasks[target], completed=done, total=total or None, link=share)
            case TransferDone(target=target, total=total, sent=sent, detail=detail):
                if target in self.tasks:
                    self._bar().update(self.tasks[target], completed=total)
                self.stop()
                sent_text = f", {human_bytes(sent)} sent ({sent:,} bytes)" if sent is not None else ""
                self.console.print(f"[green]done[/green] {target}: {escape(detail)}{sent_text}", soft_wrap=True)
            case Skipped(reason=reason):
                self.console.print(f"[dim]skip[/dim] {escape(reason)}", soft_wrap=True)
            case Refused(reason=reason):
                self.stop()
                self.console.print(f"[red]FAIL[/red] {escape(reason)}", soft_wrap=True)


def cmd_sync(args) -> int:
    inventory = load_inventory(args.inventory)
    request = SyncRequest(args.what, kind_of(args.what, args.kind), args.source, list(args.targets or []),
                          args.dry_run, args.bwlimit)
    console = Console(highlight=False)
    renderer = _Renderer(console, verbose=args.verbose or args.dry_run)

    async def run() -> int:
        transports = _transports(inventory)
        syncer = Syncer(inventory, transports)
        try:
            async for event in syncer.events(request):
                renderer.show(event)
        finally:
            renderer.stop()
            await _close(transports)
        if args.dry_run:
            console.print("dry run: nothing was copied (the listings above were read from the nodes)")
        return 1 if syncer.failed else 0

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        print("sparktop: sync interrupted: the copy under way is left in its target's staging folder, never half "
              "in the cache; run it again to resume it", file=sys.stderr)
        return 130


def _table(caches: list[NodeCache]) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in COLUMNS:
        table.add_column(column, justify="right" if column == "size" else "left")
    style = {"ok": "", "warn": "yellow", "error": "red"}
    for *cells, level in rows(caches):
        table.add_row(*(escape(c) for c in cells[:4]), f"[{style[level]}]{escape(cells[4])}[/]" if style[level]
                      else escape(cells[4]))
    return table


def cmd_cache(args) -> int:
    inventory = load_inventory(args.inventory)

    async def read() -> list[NodeCache]:
        transports = _transports(inventory)
        try:
            return await cluster_cache(inventory, transports)
        finally:
            await _close(transports)

    caches = asyncio.run(read())
    if args.json:
        print(json.dumps([c.as_dict() for c in caches], indent=2))
    else:
        console = Console(highlight=False)
        if not console.is_terminal:  # piped or captured: whole rows, one a line, not wrapped at 80 columns
            console = Console(highlight=False, width=240)
        console.print(_table(caches))
    return 1 if any(c.error for c in caches) else 0
