"""What `sparktop setup` reports as it goes: one small frozen dataclass per step.

A check starts, shows each command before it runs (`CommandShown`; `changes` when it changes the host), and
ends ok, warn or fail with a one-line reason. A fix is proposed (what it does and its commands) and then
applied, or declined. The inventory is written, left as it was, or kept because the user said no.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class CheckStarted:
    host: str
    check: str


@dataclass(frozen=True)
class CommandShown:
    host: str
    check: str
    command: str
    changes: bool = False  # it changes the host (or this machine's known_hosts)
    ran: bool = True  # False: shown only (--dry-run)


@dataclass(frozen=True)
class CheckDone:
    host: str
    check: str
    status: Status
    reason: str


@dataclass(frozen=True)
class FixProposed:
    host: str
    check: str
    what: str
    commands: tuple[str, ...] = ()
    kind: str = "change"  # "trust-host-key": accepted only by a person or --accept-new-host-keys


@dataclass(frozen=True)
class FixApplied:
    host: str
    check: str
    ok: bool
    reason: str


@dataclass(frozen=True)
class FixDeclined:
    host: str
    check: str
    reason: str


@dataclass(frozen=True)
class InventoryDone:
    path: str
    outcome: Literal["written", "unchanged", "kept", "not written"]
    reason: str
    backup: str | None = None


@dataclass(frozen=True)
class SetupFinished:
    ok: bool  # no check failed
    changed: bool  # something was changed (on a host, in known_hosts or the inventory)
    warnings: int
    failures: int
    dry_run: bool = False  # nothing ran: the commands shown are the checks' first ones


SetupEvent = (CheckStarted | CommandShown | CheckDone | FixProposed | FixApplied | FixDeclined | InventoryDone
              | SetupFinished)
