"""The twin's `docker`: containers as supervised processes on a simulated host.

Only what sparktop's launcher and monitor use: `run` (-d, --name, -e, -v,
--gpus, --ipc, --network, --ulimit, --entrypoint, ...), `exec`, `ps` (with
`--format`, `-a`, `-q`, `--filter`), `logs` (`-f`, `--tail`), `rm -f`,
`stop`, `kill`, `start`, `restart`, `inspect`, `image inspect`, `images`, `pull` (offline: only
images the host already has), `save` and `load` (twin/images.py: tar streams keeping the ID).
Messages and exit codes follow the Docker CLI's (125 for daemon errors, 127 for a missing executable, 1 otherwise).

A container is a supervisor process that runs the command in its own
session with the container's environment, writes its output to the
container's log and records its exit status. Values reach the command as
argv items: nothing here goes through a shell.

This module is the command line; the container records and how they are
shown live in containers.py, and run/exec/rm/stop with the supervisor in
docker_lifecycle.py.
"""

from __future__ import annotations

import json
import signal
import sys

from sparktop.twin.containers import (
    Containers,
    DockerError,
    follow_log,
    image_entrypoint,
    image_id,
    inspect_container,
    ps_row,
    render_template,
)
from sparktop.twin.docker_lifecycle import cmd_exec, cmd_restart, cmd_rm, cmd_run, cmd_start, cmd_stop, supervise
from sparktop.twin.host import TwinHost
from sparktop.twin.images import cmd_load, cmd_save, human_size, image_size

# What `sparktop.twin.docker` has always offered stays importable from here.
__all__ = ["Containers", "DockerError", "cmd_exec", "cmd_images", "cmd_inspect", "cmd_logs", "cmd_ps", "cmd_restart",
           "cmd_rm", "cmd_run", "cmd_start", "cmd_stop", "image_entrypoint", "image_id", "main", "render_template"]


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
            if key == "name" and val not in c["name"] or key == "status" and val != c["state"]:
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
            print(render_template(fmt, ps_row(c, no_trunc)))
        return 0
    print(f"{'CONTAINER ID':<15}{'IMAGE':<28}{'COMMAND':<23}{'CREATED':<18}{'STATUS':<22}{'PORTS':<7}NAMES")
    for c in rows:
        r = ps_row(c, no_trunc)
        print(f"{r['ID']:<15}{r['Image'][:26]:<28}{r['Command'][:21]:<23}{r['RunningFor'][:16]:<18}"
              f"{r['Status'][:20]:<22}{'':<7}{r['Names']}")
    return 0


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
    follow_log(containers, c, tail, follow)
    return 0


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
    # As docker does: every object found is printed, each one missing is an error line, and the exit code
    # is 1 when any was missing.
    results, missing = [], []
    for ref in names:
        if kind == "image":
            iid = image_id(host, ref)
            if not iid:
                missing.append(f"Error response from daemon: No such image: {ref}")
                continue
            results.append({"Id": iid, "RepoTags": [ref], "Size": image_size(host, ref),
                            "Config": {"Entrypoint": image_entrypoint(host, ref)}})
        else:
            try:
                results.append(inspect_container(Containers(host).find(ref)))
            except DockerError:
                missing.append(f"Error: No such object: {ref}")
    if fmt:
        for r in results:
            print(render_template(fmt, r))
    else:
        print(json.dumps(results, indent=4))
    for line in missing:
        print(line, file=sys.stderr)
    return 1 if missing else 0


def cmd_images(host: TwinHost, argv: list[str]) -> int:
    fmt = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--format"), None)
    fmt = fmt or next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), None)
    no_trunc = "--no-trunc" in argv
    if not fmt:
        print(f"{'REPOSITORY':<40}{'TAG':<20}{'IMAGE ID':<15}SIZE")
    for entry in host.images:
        name = entry["name"] if isinstance(entry, dict) else entry
        repo, _, tag = name.partition(":")
        iid = image_id(host, name)
        assert iid is not None  # name is one of host.images
        size = human_size(image_size(host, name))
        if fmt:  # the row as `docker images --format` sees it
            row = {"Repository": repo, "Tag": tag or "latest", "ID": iid if no_trunc else iid[7:19], "Size": size,
                   "CreatedSince": "N/A", "Digest": "<none>"}
            print(render_template("{{json .}}" if fmt == "json" else fmt, row))
        else:
            print(f"{repo:<40}{tag or 'latest':<20}{iid[7:19]:<15}{size}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_supervise":
        return supervise(argv[1], argv[2])
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
        if cmd == "start":
            return cmd_start(host, rest)
        if cmd == "restart":
            return cmd_restart(host, rest)
        if cmd == "inspect":
            return cmd_inspect(host, rest)
        if cmd == "image-inspect":
            return cmd_inspect(host, rest, kind="image")
        if cmd == "images":
            return cmd_images(host, rest)
        if cmd == "save":
            return cmd_save(host, rest)
        if cmd == "load":
            return cmd_load(host, rest)
        if cmd == "pull":
            image = rest[-1] if rest else ""
            if image_id(host, image):
                print(f"Status: Image is up to date for {image}")
                return 0
            raise DockerError("Error response from daemon: Get \"https://registry-1.docker.io/v2/\": dial tcp: "
                              "lookup registry-1.docker.io: no such host", 1)
        if cmd in ("version", "--version"):
            print("Docker version 28.2.2, build sparktop-twin")
            return 0
        if cmd == "info":
            if rest[:1] == ["--format"] and rest[1:2] == ["{{json .}}"]:  # what `sparktop setup` reads
                print(json.dumps({"Name": host.name, "ServerVersion": "28.2.2", "DefaultRuntime": "runc",
                                  "Runtimes": {"io.containerd.runc.v2": {"path": "runc"}, "nvidia": {
                                      "path": "nvidia-container-runtime"}, "runc": {"path": "runc"}},
                                  "DockerRootDir": "/var/lib/docker"}))
                return 0
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
