"""The inventory `sparktop setup` writes: `settings.load_inventory`'s format, every value with a comment saying
what it is and where it came from.

The text depends only on what was found (no date in it), so a second run over an unchanged cluster renders the
same bytes and leaves the file alone. A file that differs is replaced only when the user says so, and the old
one is kept beside it first (`<name>.bak-<time>`), written to a temporary file and renamed so no reader sees
half of it.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from sparktop.settings import Defaults

HEADER = ("# sparktop's inventory, written by `sparktop setup` from what it found on the nodes.\n"
          "# Edit it freely; `sparktop setup` shows what it would change and asks before it replaces this file.\n"
          "# The first node is the head.\n")


@dataclass
class NodeEntry:
    name: str
    host: str
    user: str | None = None
    fabric_ip: str | None = None
    eth_if: str | None = None
    ib_if: tuple[str, ...] = ()
    # Where each value came from, for its comment: key -> words ("ip -br addr", "given on the command line").
    sources: dict[str, str] = field(default_factory=dict)


_PLAIN = re.compile(r"[A-Za-z0-9_./~@:+-]+")
_YAML_WORDS = {"yes", "no", "on", "off", "true", "false", "null", "y", "n", "~"}


def scalar(value: str) -> str:
    """A YAML scalar that reads back as this string (JSON's quoting where plain text could mean something else)."""
    plain = (_PLAIN.fullmatch(value) and value.lower() not in _YAML_WORDS and not value.startswith(("-", ":", "@"))
             and not re.fullmatch(r"[-+]?(\d[\d_]*)?(\.\d*)?([eE][-+]?\d+)?", value))
    return value if plain else json.dumps(value)


def _line(indent: str, key: str, value: str, comment: str) -> str:
    text = f"{indent}{key}: {value}"
    return f"{text:<40} # {comment}" if comment else text


def render(nodes: list[NodeEntry], hf_cache: str = Defaults.hf_cache) -> str:
    lines = [HEADER.rstrip("\n"), "defaults:",
             _line("  ", "hf_cache", scalar(hf_cache), "where every node keeps Hugging Face weights (checked for "
                                                       "free space)"),
             "nodes:"]
    for i, node in enumerate(nodes):
        role = "the head" if i == 0 else "a worker"
        lines.append(_line("  - ", "name", scalar(node.name), f"{role}; {node.sources.get('name', 'the name given')}"))
        lines.append(_line("    ", "host", scalar(node.host), node.sources.get("host", "how ssh reaches it "
                                                                               "(as given; ~/.ssh/config applies)")))
        if node.user:
            lines.append(_line("    ", "user", scalar(node.user), node.sources.get("user", "the ssh user (--user)")))
        if node.fabric_ip:
            lines.append(_line("    ", "fabric_ip", scalar(node.fabric_ip),
                               node.sources.get("fabric_ip", "its address on the ConnectX-7 link")))
        if node.eth_if:
            lines.append(_line("    ", "eth_if", scalar(node.eth_if),
                               node.sources.get("eth_if", "the ConnectX-7 interface NCCL and Gloo use")))
        if node.ib_if:
            listing = "[" + ", ".join(scalar(d) for d in node.ib_if) + "]"
            lines.append(_line("    ", "ib_if", listing,
                               node.sources.get("ib_if", "RoCE devices whose port is up (NCCL_IB_HCA)")))
    return "\n".join(lines) + "\n"


def backup_name(path: Path, now: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(now))
    candidate = path.with_name(f"{path.name}.bak-{stamp}")
    n = 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.bak-{stamp}-{n}")
    return candidate


def write(path: Path, text: str) -> Path | None:
    """Write `text` to `path` (atomically), keeping what was there as a backup; the backup's path, if any."""
    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if path.exists():
        backup = backup_name(path)
        backup.write_bytes(path.read_bytes())
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return backup
