"""What sparktop has launched, so a new session (or `sparktop stop`) knows.

One JSON file per inventory under the state directory. Each launch records
its recipe, topology, nodes, containers, endpoints, when it started and how
it is doing. A router's master key is kept apart, in a 0600 file of its
own, and never in the launches file or any log.

Containers also carry `sparktop.launch=<id>` labels, so stopping still
works when this file is lost.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from sparktop.settings import Inventory, state_dir


@dataclass
class LaunchRecord:
    id: str
    recipe: str
    topology: str
    nodes: list[str]
    containers: dict[str, list[str]]
    endpoints: list[dict]
    started: float = field(default_factory=time.time)
    status: str = "starting"  # starting | ready | failed | stopped
    reason: str | None = None
    state_dir: str = ""
    # The watchdog's (`launch.watchdog`): when it restarted an engine of this launch (epoch seconds), and why
    # it gave up on it, if it did. Kept here so every watchdog (`launch --watchdog`, `collect --watchdog`)
    # counts the same restarts.
    restarts: list[float] = field(default_factory=list)
    gave_up: str | None = None


_FIELDS = {f.name for f in fields(LaunchRecord)}


def inventory_key(inventory: Inventory) -> str:
    if inventory.path is None:
        names = ",".join(n.host for n in inventory.nodes)
        return "adhoc-" + hashlib.blake2b(names.encode(), digest_size=4).hexdigest()
    return "inv-" + hashlib.blake2b(str(Path(inventory.path).resolve()).encode(), digest_size=4).hexdigest()


class LaunchState:
    def __init__(self, inventory: Inventory, root: Path | None = None):
        self.root = root or state_dir() / "launches"
        self.path = self.root / f"{inventory_key(inventory)}.json"

    def _read(self) -> list[dict]:
        try:
            return json.loads(self.path.read_text()).get("launches", [])
        except (OSError, ValueError):
            return []

    def _write(self, rows: list[dict]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"launches": rows}, indent=1))
        os.replace(tmp, self.path)

    def all(self) -> list[LaunchRecord]:
        # A field a later sparktop added is left out, not an error.
        return [LaunchRecord(**{k: v for k, v in row.items() if k in _FIELDS}) for row in self._read()]

    def active(self) -> list[LaunchRecord]:
        return [r for r in self.all() if r.status in ("starting", "ready")]

    def get(self, launch_id: str) -> LaunchRecord | None:
        return next((r for r in self.all() if r.id == launch_id), None)

    def save(self, record: LaunchRecord) -> None:
        rows = [row for row in self._read() if row["id"] != record.id]
        rows.append(asdict(record))
        self._write(rows[-50:])  # keep recent history only

    def update(self, launch_id: str, **changes) -> None:
        record = self.get(launch_id)
        if record is not None:
            for key, value in changes.items():
                setattr(record, key, value)
            self.save(record)

    # -- the router's master key ------------------------------------------------

    def _key_path(self, launch_id: str) -> Path:
        return self.root / "keys" / f"{launch_id}.key"

    def save_key(self, launch_id: str, key: str) -> None:
        path = self._key_path(launch_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key)

    def key(self, launch_id: str) -> str | None:
        try:
            return self._key_path(launch_id).read_text().strip() or None
        except OSError:
            return None

    def drop_key(self, launch_id: str) -> None:
        self._key_path(launch_id).unlink(missing_ok=True)


def api_key_for(url: str) -> str | None:
    """The master key of a sparktop-launched router at `url`, from any inventory's state."""
    root = state_dir() / "launches"
    for path in root.glob("*.json"):
        try:
            rows = json.loads(path.read_text()).get("launches", [])
        except (OSError, ValueError):
            continue
        live = [row for row in rows if row.get("status") in ("starting", "ready")]
        for row in reversed(live):  # the newest launch at that address
            for endpoint in row.get("endpoints", []):
                if endpoint.get("url", "").rstrip("/") == url.rstrip("/") and endpoint.get("api_key_env"):
                    try:
                        return (root / "keys" / f"{row['id']}.key").read_text().strip() or None
                    except OSError:
                        return None
    return None
