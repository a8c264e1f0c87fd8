"""What a sync reports as it goes: one small frozen dataclass per step, `SyncEvent` their union.

The CLI renders them (`sync/commands.py`, rich progress bars); tests collect
them. A transfer is named by what is copied and the node it goes to.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Found:
    """Where the thing is: the source, and each node's state ("has it", "lacks it", "incomplete", ...)."""

    what: str  # a repo id or an image
    kind: str  # model | image
    source: str | None
    states: tuple[tuple[str, str], ...]  # (node, what it has)


@dataclass(frozen=True)
class CommandShown:
    """A command about to run on a node (or, with --dry-run, that would run)."""

    node: str
    command: str


@dataclass(frozen=True)
class TransferStarted:
    target: str
    source: str
    total: int  # bytes expected
    via: str  # the address the bytes go to
    link_bps: float | None  # the source's link rate in bytes per second, where it says
    resumed: int = 0  # bytes already in the target's staging folder


@dataclass(frozen=True)
class TransferProgress:
    target: str
    done: int
    total: int
    rate: float | None  # bytes per second


@dataclass(frozen=True)
class TransferDone:
    target: str
    total: int  # bytes of the snapshot or image
    sent: int | None  # bytes sent as data (rsync's Literal data; the stream's bytes for an image)
    detail: str  # what was checked: "12 files, sizes equal", "image ID sha256:..."


@dataclass(frozen=True)
class Skipped:
    target: str
    reason: str


@dataclass(frozen=True)
class Refused:
    """A transfer that did not happen or did not finish, with the one-line reason; nothing was put in the cache."""

    target: str
    reason: str


SyncEvent = Found | CommandShown | TransferStarted | TransferProgress | TransferDone | Skipped | Refused
