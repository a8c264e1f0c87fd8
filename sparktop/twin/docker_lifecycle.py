"""The `docker` commands that start and end containers: run, start, restart, exec, rm, stop and kill.

`run` records the container and starts its supervisor, a process of its own
(`python -m sparktop.twin.docker _supervise HOME NAME`) that runs the command
in a new session with the container's environment, writes its output to the
container's log and records its exit status. `stop` and `rm -f` signal that
process group and wait for everything in it to go, as Docker does. `start`
runs a stopped container's command again (a new supervisor, the same
environment, its log appended to, its start time new), and `restart` is
`stop` then `start`, as Docker's.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sparktop.twin.containers import (
    Containers,
    DockerError,
    container_env,
    follow_log,
    image_entrypoint,
    image_id,
)
from sparktop.twin.host import ENV_HOME, TwinHost, pid_alive, read_json

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


def runnable(command: list[str], path: str) -> list[str]:
    """What runs for a container's command on a twin host, where an image's
    software is the twin's stand-ins: `/app/llama-server` (an image's own
    path) is the `llama-server` on the PATH, and SGLang's module
    (`python3 -m sglang.launch_server`) is the `sglang serve` stand-in."""
    if len(command) >= 3 and os.path.basename(command[0]).startswith("python") and command[1:3] == [
            "-m", "sglang.launch_server"]:
        return ["sglang", "serve", *command[3:]]
    if len(command) >= 3 and command[:2] == ["sh", "-c"]:
        # A container's own set-up before its program (keys, directories inside the container): a twin
        # container is this host, so only the program runs — never the set-up, which would change the host.
        script = command[2]
        if script.rstrip().endswith('exec "$@"') and len(command) > 4:
            return runnable(command[4:], path)
        sshd = re.search(r"exec (?:/usr/sbin/)?sshd( .*)?$", script.strip())
        if sshd:
            return ["sshd", *shlex.split(sshd.group(1) or "")]
    head = command[0]
    if os.path.isabs(head) and not os.path.exists(head) and shutil.which(os.path.basename(head), path=path):
        return [os.path.basename(head), *command[1:]]
    return command


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
    log_path = host.home / "logs" / f"{name}.log"
    labels = dict(item.partition("=")[::2] for item in opts.get("--label", []) + opts.get("-l", []))
    record = {
        "id": cid, "name": name, "image": image, "image_id": image_id(host, image), "command": command,
        "env": env, "labels": labels, "created": time.time(), "started": time.time(), "state": "created",
        "exit_code": None, "finished": None, "pid": 0, "log": str(log_path),
        "network": (opts.get("--network") or opts.get("--net") or ["bridge"])[-1],
        "gpus": (opts.get("--gpus") or [""])[-1], "rm": "--rm" in opts, "execs": [],
    }
    if shutil.which(runnable(command, container_env(host, env, name, image, labels)["PATH"])[0],
                    path=container_env(host, env, name, image, labels)["PATH"]) is None:
        raise DockerError(f'Error response from daemon: failed to create task for container: failed to create '
                          f'shim task: OCI runtime create failed: exec: "{command[0]}": executable file not '
                          "found in $PATH: unknown", 127)
    containers.save(record)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    record.update(pid=_spawn_supervisor(host, name), state="running")
    containers.save(record)
    if "-d" in opts or "--detach" in opts:
        print(cid)
        return 0
    # Attached: follow the log until the container exits.
    return follow_log(containers, record, tail=None, follow=True, exit_code=True)


def _spawn_supervisor(host: TwinHost, name: str) -> int:
    """Start the supervisor of container `name` (its record saved already); its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparktop.twin.docker", "_supervise", str(host.home), name],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env={**os.environ, ENV_HOME: str(host.home)},
    )
    return proc.pid


def supervise(home: str, name: str) -> int:
    host = TwinHost(home)
    containers = Containers(host)
    record = read_json(containers.path(name))
    if not record:
        return 1
    env = container_env(host, record["env"], name, record.get("image"), record.get("labels"))
    # The child gets its own copy of the log's descriptor: ours is only for an exec failure.
    with open(record["log"], "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(runnable(record["command"], env["PATH"]), stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=log, env=env)
        except OSError as exc:
            log.write(f"exec {record['command'][0]}: {exc.strerror}\n".encode())
            record.update(state="exited", exit_code=127, finished=time.time())
            containers.save(record)
            return 127

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

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
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


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
    """Whether any process of the group still runs. A zombie does not: it
    holds no memory, and where nothing reaps orphans (a container's PID 1
    that is not an init) it would otherwise keep `docker kill` waiting."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


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
        _stop_one(host, containers, c, timeout, sig)
        print(ref)
    return code


def _stop_one(host: TwinHost, containers: Containers, c: dict, timeout: int, sig: int = signal.SIGTERM) -> None:
    if c["state"] != "running":
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(c["pid"]), sig)  # the supervisor forwards it
    if sig == signal.SIGKILL or not _wait_gone(c, timeout):
        _kill(c, signal.SIGKILL)
        _wait_gone(c)
        current = read_json(containers.path(c["name"]))
        if current and current.get("state") == "running":
            current.update(state="exited", exit_code=137, finished=time.time())
            containers.save(current)
    _kill({"execs": c.get("execs", [])}, signal.SIGKILL)
    host.release(_pgids(c))


def _timeout_and_names(argv: list[str]) -> tuple[int, list[str]]:
    timeout, names = 10, []
    it = iter(argv)
    for arg in it:
        if arg in ("-t", "--time", "--timeout"):
            timeout = int(next(it, "10"))
        elif arg.startswith("--time=") or arg.startswith("--timeout="):
            timeout = int(arg.split("=", 1)[1])
        elif arg.startswith("-"):
            raise DockerError(f"unknown flag: {arg}\nSee 'docker --help'.", 125)
        else:
            names.append(arg)
    return timeout, names


def _start_one(host: TwinHost, containers: Containers, c: dict) -> None:
    """Run a stopped container's command again: a new supervisor, the same environment and log (appended to,
    as Docker keeps a container's log across its starts), a new start time; running already, nothing."""
    current = containers.refresh(read_json(containers.path(c["name"])) or c)
    if current["state"] == "running":
        return
    current.update(state="created", started=time.time(), exit_code=None, finished=None, pid=0, execs=[])
    containers.save(current)
    current.update(pid=_spawn_supervisor(host, current["name"]), state="running")
    containers.save(current)


def _each(host: TwinHost, argv: list[str], command: str, restart: bool) -> int:
    """`docker start|restart [-t S] NAME...`: each (stopped first, for restart: SIGTERM, then SIGKILL after S
    seconds) started; a name docker does not know is said and the others go on, as docker does."""
    timeout, names = _timeout_and_names(argv)
    if not names:
        raise DockerError(f'"docker {command}" requires at least 1 argument.', 1)
    containers = Containers(host)
    code = 0
    for ref in names:
        try:
            c = containers.find(ref)
        except DockerError as exc:
            print(exc, file=sys.stderr)
            code = 1
            continue
        if restart:
            _stop_one(host, containers, c, timeout)
        _start_one(host, containers, c)
        print(ref)
    return code


def cmd_start(host: TwinHost, argv: list[str]) -> int:
    return _each(host, argv, "start", restart=False)


def cmd_restart(host: TwinHost, argv: list[str]) -> int:
    return _each(host, argv, "restart", restart=True)


def cmd_exec(host: TwinHost, argv: list[str]) -> int:
    opts, rest = _parse_opts(argv)
    if len(rest) < 2:
        raise DockerError('"docker exec" requires at least 2 arguments.', 1)
    containers = Containers(host)
    c = containers.find(rest[0])
    if c["state"] != "running":
        raise DockerError(f"Error response from daemon: container {c['id']} is not running", 1)
    env = container_env(host, {**c["env"], **_env_from_opts(opts)}, c["name"], c.get("image"),
                        c.get("labels"))
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
