"""Which engines a sweep is measuring now, for other load on this machine to step aside.

A sweep (and so a study) writes a small file per run under the state directory naming the endpoint it
measures and its process; it removes the file when it ends (a file whose process is gone counts for
nothing). The demo's background load reads them and sends nothing to a node being measured until the
sweep is over, so a sweep started from the demo measures the engine, not the demo's own traffic.
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from sparktop.settings import state_dir


def _dir() -> Path:
    return state_dir() / "measuring"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def host_of(url: str) -> str:
    """The node part of an endpoint (`http://127.0.0.2:8000/v1` -> `127.0.0.2`): load on one node's engines
    disturbs a measurement of another engine there too."""
    return (urlsplit(url if "//" in url else "//" + url).hostname or url).lower()


@contextlib.contextmanager
def measuring(url: str, what: str = "sweep") -> Iterator[Path | None]:
    """While the block runs, `url` is being measured by this process (`what`: a sweep, a study)."""
    path: Path | None = None
    try:
        folder = _dir()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{os.getpid()}-{zlib.crc32(url.encode()):08x}.json"
        path.write_text(json.dumps({"url": url, "pid": os.getpid(), "what": what}))
    except OSError:
        path = None  # a read-only state directory must not stop a sweep: the load just does not know
    try:
        yield path
    finally:
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()


def measured_now() -> list[dict]:
    """The measurements running now on this machine: {"url", "pid", "what"} each (stale files skipped)."""
    out = []
    with contextlib.suppress(OSError):
        for path in sorted(_dir().glob("*.json")):
            try:
                entry = json.loads(path.read_text())
                if isinstance(entry, dict) and _alive(int(entry["pid"])):
                    out.append(entry)
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return out


def measured_hosts() -> set[str]:
    return {host_of(str(e.get("url", ""))) for e in measured_now()}
