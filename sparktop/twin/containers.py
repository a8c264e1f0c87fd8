"""The twin's container store: what `docker` knows about containers and images.

A container is a JSON record under the simulated host's home (name, image,
command, environment, state, supervisor pid, log path). This module reads and
writes those records, builds the environment a container's processes see,
looks images up in the host's image list, and shows containers the way the
Docker CLI does: `ps` rows and statuses, `inspect` objects, Go-style
`--format` templates, and the log as `docker logs` prints it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

from sparktop.twin.host import ENV_HOME, ENV_PROC_ROOT, TwinHost, pid_alive, read_json, write_json


class DockerError(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} seconds" if seconds != 1 else "1 second"
    if seconds < 3600:
        m = seconds // 60
        return f"{m} minutes" if m != 1 else "About a minute"
    h = seconds // 3600
    if h < 48:
        return f"{h} hours" if h != 1 else "About an hour"
    return f"{h // 24} days"


def image_id(host: TwinHost, image: str) -> str | None:
    for entry in host.images:
        name = entry["name"] if isinstance(entry, dict) else entry
        if name == image or (":" not in image and name == f"{image}:latest"):
            given = entry.get("id") if isinstance(entry, dict) else None
            return given or "sha256:" + hashlib.sha256(name.encode()).hexdigest()
    return None


def image_entrypoint(host: TwinHost, image: str) -> list[str]:
    for entry in host.images:
        if isinstance(entry, dict) and entry.get("name") == image:
            return list(entry.get("entrypoint") or [])
    # The official vLLM image runs `vllm serve` with the container's arguments.
    if "vllm-openai" in image:
        return ["vllm", "serve"]
    return []


class Containers:
    def __init__(self, host: TwinHost):
        self.host = host
        self.dir = host.home / "containers"
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.dir / f"{name}.json"

    def all(self) -> list[dict]:
        out = []
        for p in sorted(self.dir.glob("*.json")):
            c = read_json(p)
            if c:
                out.append(self.refresh(c))
        return out

    def refresh(self, c: dict) -> dict:
        """Mark a container exited if its supervisor is gone without saying so."""
        if c.get("state") == "running" and not pid_alive(int(c.get("pid", 0))):
            c = read_json(self.path(c["name"]), c)
            if c.get("state") == "running":
                c.update(state="exited", exit_code=c.get("exit_code", 137), finished=time.time())
                write_json(self.path(c["name"]), c)
        return c

    def find(self, ref: str) -> dict:
        ref = ref.lstrip("/")
        for c in self.all():
            if c["name"] == ref or c["id"].startswith(ref):
                return c
        raise DockerError(f"Error response from daemon: No such container: {ref}")

    def save(self, c: dict) -> None:
        write_json(self.path(c["name"]), c)


def image_env(host: TwinHost, image: str | None) -> dict[str, str]:
    """The ENV an image sets (an image entry of the host's config with `env`):
    e.g. SPARKTOP_REAL_VLLM, which makes its `vllm serve` a real vLLM."""
    for entry in host.images:
        if isinstance(entry, dict) and entry.get("name") == image:
            return {str(k): str(v) for k, v in (entry.get("env") or {}).items()}
    return {}


ENV_IMAGE = "SPARKTOP_TWIN_IMAGE"
ENV_LABELS = "SPARKTOP_TWIN_LABELS"


def container_env(host: TwinHost, env: dict[str, str], name: str, image: str | None = None,
                  labels: dict[str, str] | None = None) -> dict[str, str]:
    # A container sees only its own environment, plus what makes it run on
    # this simulated host (the twin's commands first on PATH, its state dir);
    # the image's ENV comes first and `-e` overrides it, as with Docker.
    base = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "HOSTNAME": name[:12],
        ENV_HOME: str(host.home),
        ENV_PROC_ROOT: str(host.home / "proc"),
        "SPARKTOP_TWIN_CONTAINER": name,  # daemons started inside stay in the container's process group
    }
    # What the container runs and is labelled with (the card, its format, the vLLM stack a plan predicts
    # with): a twin engine serves the prediction they name (twin/startup.py).
    if image:
        base[ENV_IMAGE] = image
    if labels:
        base[ENV_LABELS] = json.dumps(labels, sort_keys=True)
    if "PYTHONPATH" in os.environ:
        base["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return {**base, **image_env(host, image), **env}


def _status(c: dict) -> str:
    if c["state"] == "running":
        return f"Up {_ago(time.time() - c['started'])}"
    if c["state"] == "exited":
        return f"Exited ({c['exit_code']}) {_ago(time.time() - (c['finished'] or time.time()))} ago"
    return "Created"


def ps_row(c: dict, no_trunc: bool) -> dict:
    command = " ".join(c["command"])
    if not no_trunc and len(command) > 20:
        command = command[:19] + "…"
    created = dt.datetime.fromtimestamp(c["created"]).astimezone()
    return {
        "Command": json.dumps(command),
        "CreatedAt": created.strftime("%Y-%m-%d %H:%M:%S %z %Z"),
        "ID": c["id"] if no_trunc else c["id"][:12],
        "Image": c["image"],
        "Labels": ",".join(f"{k}={v}" for k, v in c.get("labels", {}).items()),
        "LocalVolumes": "0",
        "Mounts": "",
        "Names": c["name"],
        "Networks": c.get("network", "bridge"),
        "Ports": "",
        "RunningFor": f"{_ago(time.time() - c['created'])} ago",
        "Size": "0B",
        "State": c["state"],
        "Status": _status(c),
    }


_TEMPLATE = re.compile(r"\{\{\s*(json\s+)?\.([A-Za-z.]*)\s*(\"[^\"]*\")?\s*\}\}")


def render_template(template: str, row: dict) -> str:
    """The Go-template forms people use with docker: {{json .}}, {{.Names}},
    {{.State.Running}}, {{.Label "key"}}, {{json .Config.Env}}."""
    template = template.replace("\\t", "\t").replace("\\n", "\n")
    if template.strip().startswith("table"):
        template = template.strip()[len("table"):].strip()

    def value(match: re.Match) -> str:
        as_json, path, arg = match.group(1), match.group(2), match.group(3)
        obj = row
        if path == "Label" and arg:
            labels = row.get("Labels", "")
            if isinstance(labels, str):
                labels = dict(p.partition("=")[::2] for p in labels.split(",") if p)
            return str(labels.get(arg.strip('"'), ""))
        for part in [p for p in path.split(".") if p]:
            obj = obj.get(part, "") if isinstance(obj, dict) else ""
        if as_json:
            return json.dumps(obj, separators=(",", ":"))
        if isinstance(obj, bool):
            return "true" if obj else "false"
        return str(obj)

    return _TEMPLATE.sub(value, template)


def follow_log(containers: Containers, c: dict, tail: int | None, follow: bool, exit_code: bool = False) -> int:
    path = Path(c["log"])
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    lines = data.splitlines(keepends=True)
    if tail is not None:
        lines = lines[-tail:] if tail > 0 else []
    out = sys.stdout.buffer
    out.write(b"".join(lines))
    out.flush()
    if not follow:
        return 0
    offset = len(data)
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except OSError:
            chunk = b""
        if chunk:
            offset += len(chunk)
            out.write(chunk)
            out.flush()
        current = read_json(containers.path(c["name"]))
        if not current:
            return 0
        current = containers.refresh(current)
        if current["state"] != "running" and not chunk:
            return int(current.get("exit_code") or 0) if exit_code else 0
        time.sleep(0.1)


def inspect_container(c: dict) -> dict:
    return {
        "Id": c["id"],
        "Created": dt.datetime.fromtimestamp(c["created"], dt.UTC).isoformat(),
        "Path": c["command"][0],
        "Args": c["command"][1:],
        "State": {
            "Status": c["state"], "Running": c["state"] == "running", "Pid": c.get("pid", 0),
            "ExitCode": c.get("exit_code") or 0,
            "StartedAt": dt.datetime.fromtimestamp(c["started"], dt.UTC).isoformat(),
            "FinishedAt": (dt.datetime.fromtimestamp(c["finished"], dt.UTC).isoformat()
                           if c.get("finished") else "0001-01-01T00:00:00Z"),
        },
        "Image": c["image_id"],
        "Name": "/" + c["name"],
        "Config": {"Image": c["image"], "Env": [f"{k}={v}" for k, v in c["env"].items()],
                   "Cmd": c["command"], "Labels": c.get("labels", {})},
        "HostConfig": {"NetworkMode": c.get("network", "bridge")},
    }
