"""`sparktop setup` for the terminal: the setup's events printed with rich, and the questions asked.

Every command is printed before it runs (`$ host: command`); what changes a host is marked and asked for
first. `--yes` answers yes to every fix except trusting an unknown host key, which only a person at the
prompt or `--accept-new-host-keys` accepts. `--dry-run` prints what would run and runs nothing. The exit
status is non-zero when a check failed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from sparktop.errors import SparktopError
from sparktop.remote import LocalTransport
from sparktop.settings import Defaults, inventory_path, load_inventory
from sparktop.setup.discover import AVAHI, discover
from sparktop.setup.events import (
    CheckDone,
    CheckStarted,
    CommandShown,
    FixApplied,
    FixDeclined,
    FixProposed,
    InventoryDone,
    SetupEvent,
    SetupFinished,
)
from sparktop.setup.runner import Options, Setup

MARK = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}


class Printer:
    def __init__(self, console: Console, verbose: bool = True):
        self.console = console
        self.verbose = verbose

    def __call__(self, event: SetupEvent) -> None:
        c = self.console
        match event:
            case CheckStarted():
                pass  # the commands and the result say it
            case CommandShown(host=host, command=command, changes=changes, ran=ran):
                lead = "[magenta]change[/] " if changes else ""
                tail = "  [dim](not run: dry run)[/]" if not ran else ""
                if self.verbose or changes or not ran:
                    # All of it, however long: what runs is what was shown (a program's further lines indented).
                    text = "\n      ".join(command.splitlines() or [""])
                    c.print(f"  [dim]$ {escape(host)}:[/] {lead}{escape(text)}{tail}", highlight=False, soft_wrap=True)
            case CheckDone(host=host, check=check, status=status, reason=reason):
                c.print(f"{MARK[status]} {escape(host):10} {check:8} {escape(reason)}", highlight=False,
                        soft_wrap=True)
            case FixProposed(host=host, what=what, commands=commands):
                c.print(f"[bold]fix[/]  {escape(host):10} {escape(what)}", highlight=False, soft_wrap=True)
                for cmd in commands:
                    c.print(f"       would run: {escape(cmd)}", highlight=False, soft_wrap=True)
            case FixApplied(host=host, check=check, ok=ok, reason=reason):
                mark = "[green]done[/]" if ok else "[red]not done[/]"
                c.print(f"{mark} {escape(host):10} {check:8} {escape(reason)}", highlight=False, soft_wrap=True)
            case FixDeclined(host=host, check=check, reason=reason):
                c.print(f"[dim]skip[/] {escape(host):10} {check:8} {escape(reason)}", highlight=False)
            case InventoryDone(path=path, outcome=outcome, reason=reason, backup=backup):
                kept = f"; the old one is {backup}" if backup else ""
                c.print(f"inventory {escape(path)}: {outcome} ({escape(reason)}{escape(kept)})", highlight=False,
                        soft_wrap=True)
            case SetupFinished(ok=ok, changed=changed, warnings=warnings, failures=failures, dry_run=dry_run):
                if dry_run:
                    c.print("dry run: nothing was run and no connection opened; these are each node's checks, "
                            "then the link test, the nodes' ssh to each other, the fixes and the inventory follow "
                            "from what they find")
                elif not ok:
                    c.print(f"[red]setup failed[/]: {failures} check(s) failed, {warnings} warning(s)")
                elif warnings:
                    c.print(f"setup done with {warnings} warning(s){'' if changed else '; nothing changed'}")
                else:
                    c.print("[green]all is well[/]" + ("" if changed else ": nothing changed"))


def asker(console: Console, yes: bool, accept_new_host_keys: bool):
    async def decide(fix: FixProposed) -> bool:
        if fix.kind == "trust-host-key":
            if accept_new_host_keys:
                console.print("       accepted (--accept-new-host-keys)")
                return True
            if yes or not sys.stdin.isatty():
                console.print("       [red]refused[/]: an unknown host key is never accepted by --yes or without a "
                              "terminal; check the fingerprint, then add --accept-new-host-keys", highlight=False)
                return False
        elif yes:
            console.print("       yes (--yes)")
            return True
        elif not sys.stdin.isatty():
            console.print("       no (no terminal to ask on; --yes answers yes)")
            return False
        # Blocking on purpose: nothing else runs while a question waits, and Ctrl-C then stops at once (a prompt in
        # a thread would keep the process alive until Enter).
        try:
            answer = input("       Do it? [y/N] ")
        except EOFError:  # Ctrl-D, or the input closed: a no
            console.print()
            return False
        return answer.strip().lower() in ("y", "yes")

    return decide


def _discovered(console: Console) -> list[str]:
    """Hosts mDNS lists from this machine, the first the head (a SparktopError when there is none)."""
    console.print(f"  [dim]$ local:[/] {escape(AVAHI)}", highlight=False)
    found = asyncio.run(discover(LocalTransport("local")))
    for f in found:
        console.print(f"found {escape(f.host)} ({', '.join(f.addresses)} on {', '.join(f.interfaces)})",
                      highlight=False)
    console.print(f"[dim]{escape(found[0].host)} is the head (the first found); name the hosts to choose[/]",
                  highlight=False)
    return [f.host for f in found]


def cmd_setup(args) -> int:
    console = Console(highlight=False, soft_wrap=True)  # a line per event, however narrow the terminal
    hosts = list(args.hosts)
    if not hosts and args.discover:
        hosts = _discovered(console)
    if not hosts:
        print("sparktop setup: name the hosts to set up (`sparktop setup spark-a spark-b`), or --discover them "
              "over mDNS", file=sys.stderr)
        return 2
    path = Path(args.inventory).expanduser() if args.inventory else inventory_path()
    options = Options(hosts, path, user=args.user, dry_run=args.dry_run, hf_cache=_hf_cache_of(path))
    setup = Setup(options, asker(console, args.yes, args.accept_new_host_keys))
    ok = asyncio.run(setup.run(Printer(console, verbose=not args.quiet)))
    return 0 if ok else 1


def _hf_cache_of(path: Path) -> str:
    """The Hugging Face cache the inventory already at `path` names (checked for space, and written again as it
    is), else the default: a cluster whose weights live elsewhere keeps that."""
    if not path.is_file():
        return Defaults.hf_cache
    try:
        return load_inventory(path).defaults.hf_cache
    except (SparktopError, OSError):  # a file setup is about to offer to replace: its own error is said then
        return Defaults.hf_cache
