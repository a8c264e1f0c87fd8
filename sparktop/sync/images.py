"""Docker images as `docker images --format '{{json .}}'` lists them, and the sizes it prints.

Docker prints sizes in powers of 1000 (`20.1GB`, `512MB`, `1.2kB`), one
JSON object per image with `Repository`, `Tag`, `ID` and `Size`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

LIST_COMMAND = "docker images --no-trunc --format '{{json .}}'"
_SIZE = re.compile(r"^\s*([\d.]+)\s*([kKMGT]?B)\s*$")
_UNITS = {"B": 1, "kB": 1000, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}


@dataclass(frozen=True)
class Image:
    name: str  # repository:tag
    id: str
    size: int | None  # bytes


def parse_size(text: str) -> int | None:
    m = _SIZE.match(text or "")
    return round(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


def parse_images(text: str) -> list[Image]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        repo, tag = row.get("Repository", ""), row.get("Tag", "")
        name = repo if tag in ("", "<none>") else f"{repo}:{tag}"
        out.append(Image(name, str(row.get("ID", "")), parse_size(str(row.get("Size", "")))))
    return out
