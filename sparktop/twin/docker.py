"""The twin's `docker`: containers as supervised processes on a simulated host.

Only what sparktop's launcher and monitor use: `run` (-d, --name, -e, -v,
--gpus, --ipc, --network, --ulimit, --entrypoint, ...), `exec`, `ps` (with
`--format`, `-a`, `-q`, `--filter`), `logs` (`-f`, `--tail`), `rm -f`,
`stop`, `kill`, `inspect`, `image inspect`, `images`, `pull` (offline: only
images the host already has). Messages and exit codes follow the Docker
CLI's (125 for daemon errors, 127 for a missing executable, 1 otherwise).

A container is a supervisor process that runs the command in its own
session with the container's environment, writes its output to the
container's log and records its exit status. Values reach the command as
argv items: nothing here goes through a shell.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sparktop.twin.host import ENV_HOME, ENV_PROC_ROOT, TwinHost, pid_alive, read_json, write_json

# Options of `docker run` / `docker exec` that take a value.
VALUE_OPTS = {
    "--name", "-e", "--env", "--env-file", "-v", "--volume", "--gpus", "--ipc", "--network", "--net",
    "--ulimit", "--shm-size", "--entrypoint", "-p", "--publish", "-w", "--workdir", "--label", "-l",
    "--pull", "--runtime", "--restart", "-u", "--user", "--memory", "-m", "--cpus", "--hostname", "-h",
    "--device", "--cap-add", "--security-opt", "--mount", "--add-host", "--log-driver", "--log-opt",
    "--platform", "--pid", "--uts", "--stop-signal", "--stop-timeout",
}
FLAG_OPTS = {"-d", "--detach", "--rm", "-i", "--interactive", "-t", "--tty", "-it", "-ti", "--privileged",
             "--init", "-P", "--publish-all", "--read-only", "--no-healthcheck"}


class DockerError(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


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


def _parse_opts(argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Split `[options] IMAGE-or-NAME [ARGS...]` docker-style."""
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        if "=" in arg and arg.startswith("--"):
            key, value = arg.split("=", 1)
            opts.setdefault(key, []).append(value)
        elif arg in VALUE_OPTS:
            if i + 1 >= len(argv):
                raise DockerError(f"flag needs an argument: {arg}", 125)
            opts.setdefault(arg, []).append(argv[i + 1])
            i += 1
        elif arg in FLAG_OPTS:
            for flag in (["-i", "-t"] if arg in ("-it", "-ti") else [arg]):
                opts.setdefault(flag, []).append("true")
        else:
            raise DockerError(f"unknown flag: {arg}\nSee 'docker --help'.", 125)
        i += 1
    return opts, argv[i:]


def _env_from_opts(opts: dict[str, list[str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for path in opts.get("--env-file", []):
        for line in Path(path).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                key, sep, value = line.partition("=")
                if sep:
                    env[key] = value
                elif key in os.environ:
                    env[key] = os.environ[key]
    for item in opts.get("-e", []) + opts.get("--env", []):
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
        elif key in os.environ:  # `-e NAME` passes the caller's value by name
            env[key] = os.environ[key]
    return env


def _container_env(host: TwinHost, env: dict[str, str], name: str) -> dict[str, str]:
    # A container sees only its own environment, plus what makes it run on
    # this simulated host (the twin's commands first on PATH, its state dir).
    base = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "HOSTNAME": name[:12],
        ENV_HOME: str(host.home),
        ENV_PROC_ROOT: str(host.home / "proc"),
        "SPARKTOP_TWIN_CONTAINER": name,  # daemons started inside stay in the container's process group
    }
    if "PYTHONPATH" in os.environ:
        base["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return {**base, **env}


def cmd_run(host: TwinHost, argv: list[str]) -> int:
    opts, rest = _parse_opts(argv)
    if not rest:
        raise DockerError('"docker run" requires at least 1 argument.', 125)
    image, args = rest[0], rest[1:]
    if not image_id(host, image):
        print(f"Unable to find image '{image}' locally", file=sys.stderr)
        raise DockerError(f"Error response from daemon: pull access denied for {image.split(':')[0]}, "
                          "repository does not exist or may require 'docker login'", 125)
    containers = Containers(host)
    name = (opts.get("--name") or [f"twin_{secrets.token_hex(4)}"])[-1]
    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name):
        raise DockerError(f'Error response from daemon: Invalid container name ({name}), only '
                          '[a-zA-Z0-9][a-zA-Z0-9_.-] are allowed.', 125)
    existing = read_json(containers.path(name))
    if existing:
        raise DockerError(f'Error response from daemon: Conflict. The container name "/{name}" is already in '
                          f'use by container "{existing["id"]}". You have to remove (or rename) that container '
                          "to be able to reuse that name.", 125)
    entry = opts.get("--entrypoint")
    command = ([entry[-1]] if entry else image_entrypoint(host, image)) + args
    if not command:
        raise DockerError("Error response from daemon: No command specified", 125)
    env = _env_from_opts(opts)
    cid = secrets.token_hex(32)
    labels = dict(item.partition("=")[::2] for item in opts.get("--label", []) + opts.get("-l", []))
    record = {
        "id": cid, "name": name, "image": image, "image_id": image_id(host, image), "command": command,
        "env": env, "labels": labels, "created": time.time(), "started": time.time(), "state": "created",
        "exit_code": None, "finished": None, "pid": 0, "log": str(host.home / "logs" / f"{name}.log"),
        "network": (opts.get("--network") or opts.get("--net") or ["bridge"])[-1],
        "gpus": (opts.get("--gpus") or [""])[-1], "rm": "--rm" in opts, "execs": [],
    }
    if shutil.which(command[0], path=_container_env(host, env, name)["PATH"]) is None:
        raise DockerError(f'Error response from daemon: failed to create task for container: failed to create '
                          f'shim task: OCI runtime create failed: exec: "{command[0]}": executable file not '
                          "found in $PATH: unknown", 127)
    containers.save(record)
    Path(record["log"]).parent.mkdir(parents=True, exist_ok=True)
    Path(record["log"]).write_bytes(b"")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparktop.twin.docker", "_supervise", str(host.home), name],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env={**os.environ, ENV_HOME: str(host.home)},
    )
    record.update(pid=proc.pid, state="running")
    containers.save(record)
    if "-d" in opts or "--detach" in opts:
        print(cid)
        return 0
    # Attached: follow the log until the container exits.
    return _follow(containers, record, tail=None, follow=True, exit_code=True)


def _supervise(home: str, name: str) -> int:
    host = TwinHost(home)
    containers = Containers(host)
    record = read_json(containers.path(name))
    if not record:
        return 1
    env = _container_env(host, record["env"], name)
    log = open(record["log"], "ab", buffering=0)
    try:
        child = subprocess.Popen(record["command"], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
    except OSError as exc:
        log.write(f"exec {record['command'][0]}: {exc.strerror}\n".encode())
        record.update(state="exited", exit_code=127, finished=time.time())
        containers.save(record)
        return 127

    def forward(signum, _frame):
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = child.wait()
    if code < 0:
        code = 128 - code
    current = read_json(containers.path(name))
    if current:
        current.update(state="exited", exit_code=code, finished=time.time())
        if current.get("rm"):
            containers.path(name).unlink(missing_ok=True)
        else:
            containers.save(current)
    # When a container's main process ends, everything else in it dies with
    # it (Ray daemons, engine cores), as in a real container's PID namespace.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.killpg(os.getpgid(0), signal.SIGKILL)
    return code


def _kill(record: dict, sig: int) -> None:
    pids = [int(record.get("pid") or 0)] + [int(p) for p in record.get("execs", [])]
    for pid in pids:
        if pid <= 0:
            continue
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def cmd_rm(host: TwinHost, argv: list[str]) -> int:
    force = any(a in ("-f", "--force") for a in argv)
    names = [a for a in argv if not a.startswith("-")]
    if not names:
        raise DockerError('"docker rm" requires at least 1 argument.', 1)
    containers = Containers(host)
    code = 0
    for ref in names:
        try:
            c = containers.find(ref)
        except DockerError as exc:
            print(exc, file=sys.stderr)
            code = 1
            continue
        if c["state"] == "running":
            if not force:
                print(f"Error response from daemon: cannot remove container \"/{c['name']}\": container is "
                      "running: stop the container before removing or force remove", file=sys.stderr)
                code = 1
                continue
            _kill(c, signal.SIGKILL)
            _wait_gone(c)
            host.release(_pgids(c))
        containers.path(c["name"]).unlink(missing_ok=True)
        print(ref)
    return code


def _pgids(record: dict) -> set[int]:
    return {int(p) for p in [record.get("pid") or 0, *record.get("execs", [])] if int(p) > 0}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_gone(record: dict, timeout: float = 5.0) -> bool:
    """Until the container's main process and, like Docker, every process it
    started (its process group: Ray daemons, engine cores) are gone."""
    deadline = time.time() + timeout
    pid = int(record.get("pid") or 0)
    while time.time() < deadline:
        if pid <= 0 or (not pid_alive(pid) and not _group_alive(pid)):
            return True
        time.sleep(0.05)
    return False


def cmd_stop(host: TwinHost, argv: list[str], sig: int = signal.SIGTERM) -> int:
    timeout = 10
    names = []
    it = iter(argv)
    for arg in it:
        if arg in ("-t", "--time", "--timeout"):
            timeout = int(next(it, "10"))
        elif arg.startswith("--time=") or arg.startswith("--timeout="):
            timeout = int(arg.split("=", 1)[1])
        elif arg.startswith("-s") or arg.startswith("--signal"):
            continue
        else:
            names.append(arg)
    containers = Containers(host)
    code = 0
    for ref in names:
        try:
            c = containers.find(ref)
        except DockerError as exc:
            print(exc, file=sys.stderr)
            code = 1
            continue
        if c["state"] == "running":
            try:
                os.kill(int(c["pid"]), sig)  # the supervisor forwards it
            except ProcessLookupError:
                pass
            if sig == signal.SIGKILL or not _wait_gone(c, timeout):
                _kill(c, signal.SIGKILL)
                _wait_gone(c)
                current = read_json(containers.path(c["name"]))
                if current and current.get("state") == "running":
                    current.update(state="exited", exit_code=137, finished=time.time())
                    containers.save(current)
            _kill({"execs": c.get("execs", [])}, signal.SIGKILL)
            host.release(_pgids(c))
        print(ref)
    return code


def _status(c: dict) -> str:
    if c["state"] == "running":
        return f"Up {_ago(time.time() - c['started'])}"
    if c["state"] == "exited":
        return f"Exited ({c['exit_code']}) {_ago(time.time() - (c['finished'] or time.time()))} ago"
    return "Created"


def _ps_row(c: dict, no_trunc: bool) -> dict:
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


def cmd_ps(host: TwinHost, argv: list[str]) -> int:
    show_all = quiet = no_trunc = False
    fmt = None
    filters: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg in ("-a", "--all"):
            show_all = True
        elif arg in ("-q", "--quiet"):
            quiet = True
        elif arg == "--no-trunc":
            no_trunc = True
        elif arg == "--format":
            fmt = next(it, "")
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1]
        elif arg in ("-f", "--filter"):
            filters.append(next(it, ""))
        elif arg.startswith("--filter="):
            filters.append(arg.split("=", 1)[1])
        elif arg in ("-aq", "-qa"):
            show_all = quiet = True
        else:
            raise DockerError(f"unknown flag: {arg}", 125)
    rows = []
    for c in Containers(host).all():
        if not show_all and c["state"] != "running":
            continue
        ok = True
        for f in filters:
            key, _, val = f.partition("=")
            if key == "name" and val not in c["name"]:
                ok = False
            elif key == "status" and val != c["state"]:
                ok = False
            elif key == "label":
                lk, _, lv = val.partition("=")
                if lk not in c.get("labels", {}) or (lv and c["labels"][lk] != lv):
                    ok = False
            elif key == "ancestor" and val != c["image"]:
                ok = False
        if ok:
            rows.append(c)
    if quiet:
        for c in rows:
            print(c["id"] if no_trunc else c["id"][:12])
        return 0
    if fmt == "json":
        fmt = "{{json .}}"
    if fmt:
        for c in rows:
            print(render_template(fmt, _ps_row(c, no_trunc)))
        return 0
    print(f"{'CONTAINER ID':<15}{'IMAGE':<28}{'COMMAND':<23}{'CREATED':<18}{'STATUS':<22}{'PORTS':<7}NAMES")
    for c in rows:
        r = _ps_row(c, no_trunc)
        print(f"{r['ID']:<15}{r['Image'][:26]:<28}{r['Command'][:21]:<23}{r['RunningFor'][:16]:<18}"
              f"{r['Status'][:20]:<22}{'':<7}{r['Names']}")
    return 0


def _follow(containers: Containers, c: dict, tail: int | None, follow: bool, exit_code: bool = False) -> int:
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


def cmd_logs(host: TwinHost, argv: list[str]) -> int:
    follow = False
    tail = None
    names = []
    it = iter(argv)
    for arg in it:
        if arg in ("-f", "--follow"):
            follow = True
        elif arg in ("-n", "--tail"):
            value = next(it, "all")
            tail = None if value == "all" else int(value)
        elif arg.startswith("--tail="):
            value = arg.split("=", 1)[1]
            tail = None if value == "all" else int(value)
        elif arg in ("-t", "--timestamps"):
            continue
        elif arg in ("--since", "--until"):
            next(it, None)
        else:
            names.append(arg)
    if len(names) != 1:
        raise DockerError('"docker logs" requires exactly 1 argument.', 1)
    containers = Containers(host)
    c = containers.find(names[0])
    _follow(containers, c, tail, follow)
    return 0


def cmd_exec(host: TwinHost, argv: list[str]) -> int:
    opts, rest = _parse_opts(argv)
    if len(rest) < 2:
        raise DockerError('"docker exec" requires at least 2 arguments.', 1)
    containers = Containers(host)
    c = containers.find(rest[0])
    if c["state"] != "running":
        raise DockerError(f"Error response from daemon: container {c['id']} is not running", 1)
    env = _container_env(host, {**c["env"], **_env_from_opts(opts)}, c["name"])
    command = rest[1:]
    if shutil.which(command[0], path=env["PATH"]) is None:
        raise DockerError(f'OCI runtime exec failed: exec failed: unable to start container process: exec: '
                          f'"{command[0]}": executable file not found in $PATH: unknown', 127)
    if "-d" in opts or "--detach" in opts:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        current = read_json(containers.path(c["name"])) or c
        current.setdefault("execs", []).append(proc.pid)
        containers.save(current)
        return 0
    return subprocess.call(command, env=env)


def _inspect_container(c: dict) -> dict:
    return {
        "Id": c["id"],
        "Created": dt.datetime.fromtimestamp(c["created"], dt.timezone.utc).isoformat(),
        "Path": c["command"][0],
        "Args": c["command"][1:],
        "State": {
            "Status": c["state"], "Running": c["state"] == "running", "Pid": c.get("pid", 0),
            "ExitCode": c.get("exit_code") or 0,
            "StartedAt": dt.datetime.fromtimestamp(c["started"], dt.timezone.utc).isoformat(),
            "FinishedAt": (dt.datetime.fromtimestamp(c["finished"], dt.timezone.utc).isoformat()
                           if c.get("finished") else "0001-01-01T00:00:00Z"),
        },
        "Image": c["image_id"],
        "Name": "/" + c["name"],
        "Config": {"Image": c["image"], "Env": [f"{k}={v}" for k, v in c["env"].items()],
                   "Cmd": c["command"], "Labels": c.get("labels", {})},
        "HostConfig": {"NetworkMode": c.get("network", "bridge")},
    }


def cmd_inspect(host: TwinHost, argv: list[str], kind: str = "container") -> int:
    fmt = None
    names = []
    it = iter(argv)
    for arg in it:
        if arg in ("-f", "--format"):
            fmt = next(it, "")
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1]
        elif arg.startswith("--type"):
            continue
        else:
            names.append(arg)
    results = []
    for ref in names:
        if kind == "image":
            iid = image_id(host, ref)
            if not iid:
                if fmt is None:
                    print("[]")
                print(f"Error response from daemon: No such image: {ref}", file=sys.stderr)
                return 1
            results.append({"Id": iid, "RepoTags": [ref], "Config": {"Entrypoint": image_entrypoint(host, ref)}})
        else:
            try:
                results.append(_inspect_container(Containers(host).find(ref)))
            except DockerError as exc:
                if fmt is None:
                    print("[]")
                print(f"Error: No such object: {ref}", file=sys.stderr)
                return 1
    if fmt:
        for r in results:
            print(render_template(fmt, r))
    else:
        print(json.dumps(results, indent=4))
    return 0


def cmd_images(host: TwinHost, argv: list[str]) -> int:
    print(f"{'REPOSITORY':<40}{'TAG':<20}{'IMAGE ID':<15}SIZE")
    for entry in host.images:
        name = entry["name"] if isinstance(entry, dict) else entry
        repo, _, tag = name.partition(":")
        print(f"{repo:<40}{tag or 'latest':<20}{image_id(host, name)[7:19]:<15}20GB")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_supervise":
        return _supervise(argv[1], argv[2])
    host = TwinHost.from_env()
    if host is None:
        print("docker (sparktop twin): SPARKTOP_TWIN_HOME is not set", file=sys.stderr)
        return 1
    if not argv:
        print("Usage:  docker [OPTIONS] COMMAND", file=sys.stderr)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in ("container", "image") and rest:
        if cmd == "image" and rest[0] == "inspect":
            cmd, rest = "image-inspect", rest[1:]
        elif cmd == "image" and rest[0] in ("ls", "list"):
            cmd, rest = "images", rest[1:]
        else:
            cmd, rest = rest[0], rest[1:]
    try:
        if cmd == "run":
            return cmd_run(host, rest)
        if cmd == "ps" or cmd == "ls":
            return cmd_ps(host, rest)
        if cmd == "logs":
            return cmd_logs(host, rest)
        if cmd == "exec":
            return cmd_exec(host, rest)
        if cmd == "rm":
            return cmd_rm(host, rest)
        if cmd == "stop":
            return cmd_stop(host, rest)
        if cmd == "kill":
            return cmd_stop(host, rest, signal.SIGKILL)
        if cmd == "inspect":
            return cmd_inspect(host, rest)
        if cmd == "image-inspect":
            return cmd_inspect(host, rest, kind="image")
        if cmd == "images":
            return cmd_images(host, rest)
        if cmd == "pull":
            image = rest[-1] if rest else ""
            if image_id(host, image):
                print(f"Status: Image is up to date for {image}")
                return 0
            raise DockerError(f"Error response from daemon: Get \"https://registry-1.docker.io/v2/\": dial tcp: "
                              "lookup registry-1.docker.io: no such host", 1)
        if cmd in ("version", "--version"):
            print("Docker version 28.2.2, build sparktop-twin")
            return 0
        if cmd == "info":
            print(f"Server Version: 28.2.2\nName: {host.name}\nRuntimes: nvidia runc")
            return 0
    except DockerError as exc:
        print(f"docker: {exc}" if exc.code == 125 or exc.code == 127 else str(exc), file=sys.stderr)
        return exc.code
    except BrokenPipeError:
        return 0
    print(f"docker: '{cmd}' is not a docker command.\nSee 'docker --help'", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
