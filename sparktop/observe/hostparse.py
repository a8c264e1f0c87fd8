"""Pure parsers for what a node prints: /proc/meminfo, /proc/stat,
`nvidia-smi` (CSV queries and the default table), `docker ps --format
'{{json .}}'`, `free`, `df -P`, and the engines' servers in the process list.

GB10 quirks handled here: memory fields are `[N/A]`, `N/A` or "Not
Supported"; CSV values may carry units (`96 %`) unless `nounits` was given;
process names in the table can be truncated with a leading `...`.
"""

from __future__ import annotations

import json
import re

from sparktop.engine_ids import DEFAULT
from sparktop.observe import engines
from sparktop.observe.argv import flag_value
from sparktop.observe.machine import throttle_reasons
from sparktop.observe.snapshot import Container, Disk, Gpu, GpuProcess, Memory, ServerProcess

NA = {"[n/a]", "n/a", "not supported", "[not supported]", "", "[unknown error]", "[insufficient permissions]"}


def na(value: str | None) -> bool:
    return value is None or value.strip().lower() in NA


def number(value: str | None) -> float | None:
    """A number from an nvidia-smi field, with or without units; None for N/A."""
    if value is None or na(value):
        return None
    match = re.match(r"\s*(-?\d+(?:\.\d+)?)", value)
    return float(match.group(1)) if match else None


# -- /proc ----------------------------------------------------------------------


def parse_meminfo(text: str) -> Memory:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            amount = int(parts[0])
        except ValueError:
            continue
        unit = parts[1].lower() if len(parts) > 1 else ""
        values[key.strip()] = amount * 1024 if unit == "kb" else amount
    if "MemTotal" not in values:
        raise ValueError("no MemTotal in meminfo")
    total = values["MemTotal"]
    free = values.get("MemFree", 0)
    # Kernels before 3.14 have no MemAvailable; estimate it as they did.
    available = values.get("MemAvailable", free + values.get("Buffers", 0) + values.get("Cached", 0))
    return Memory(
        total=total, available=available, free=free, buffers=values.get("Buffers", 0),
        cached=values.get("Cached", 0), swap_total=values.get("SwapTotal", 0), swap_free=values.get("SwapFree", 0),
    )


def parse_proc_stat_cpu(text: str) -> tuple[int, int] | None:
    """(busy, total) jiffies from the first `cpu` line of /proc/stat."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = [int(x) for x in line.split()[1:]]
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
            total = sum(fields[:8])  # guest time is already counted in user
            return total - idle, total
    return None


def cpu_percent(prev: tuple[int, int] | None, cur: tuple[int, int] | None) -> float | None:
    if prev is None or cur is None:
        return None
    busy, total = cur[0] - prev[0], cur[1] - prev[1]
    if total <= 0 or busy < 0:
        return None
    return 100.0 * busy / total


# -- nvidia-smi -------------------------------------------------------------------

GPU_FIELDS = ("utilization.gpu", "temperature.gpu", "power.draw", "clocks.sm", "pstate")


_HEADER_CELL = re.compile(r"^[a-z][a-z0-9_.]*(\s*\[[^\]]*\])?$")
# What nvidia-smi writes in the header for a field queried by another name.
HEADER_ALIASES = {"clocks.sm": "clocks.current.sm", "clocks.gr": "clocks.current.graphics",
                  "clocks.mem": "clocks.current.memory", "used_memory": "used_gpu_memory"}


def is_header(parts: list[str], fields: list[str]) -> bool:
    """A header row: every cell a field name with an optional `[unit]`
    (`utilization.gpu [%]`, `clocks.current.sm [MHz]`), one of them a field
    that was asked for. No value looks like that: numbers, `[N/A]`, `P0`,
    names with spaces or `::`."""
    names = {f.lower() for f in fields} | {HEADER_ALIASES.get(f, f).lower() for f in fields}
    bare = [re.sub(r"\s*\[[^\]]*\]$", "", p).lower() for p in parts]
    return (all(_HEADER_CELL.match(p.lower()) for p in parts if p) and any(b in names for b in bare)
            and not any(p.lower() in NA for p in parts))


def parse_csv_query(text: str, fields: list[str]) -> list[dict[str, str | None]]:
    """Rows of a `--query-*=... --format=csv[,noheader][,nounits]` answer,
    keyed by the requested field names; N/A values become None. A header
    row is skipped wherever it appears (several answers may be joined)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if is_header(parts, fields):
            continue
        if len(parts) < len(fields):
            continue
        if len(parts) > len(fields):
            # A process name containing commas: keep the extra parts in the name column.
            extra = len(parts) - len(fields)
            idx = fields.index("process_name") if "process_name" in fields else 0
            parts = parts[:idx] + [", ".join(parts[idx:idx + extra + 1])] + parts[idx + extra + 1:]
        rows.append({f: (None if na(v) else v) for f, v in zip(fields, parts, strict=False)})
    return rows


def parse_gpu_query(text: str, fields: tuple[str, ...] = GPU_FIELDS) -> Gpu:
    rows = parse_csv_query(text, list(fields))
    if not rows:
        raise ValueError("nvidia-smi printed no GPU row")
    row = rows[0]
    return Gpu(
        name=row.get("name"),
        util=number(row.get("utilization.gpu")),
        temp=number(row.get("temperature.gpu")),
        power=number(row.get("power.draw")),
        sm_clock=number(row.get("clocks.sm") or row.get("clocks.current.sm")),
        pstate=row.get("pstate"),
        throttle=throttle_reasons(row.get("clocks_event_reasons.active") or "")
        if "clocks_event_reasons.active" in fields else None,
    )


def parse_max_clock(text: str) -> float | None:
    """`nvidia-smi --query-gpu=clocks.max.sm --format=csv[,noheader][,nounits]`: the SM clock's ceiling in MHz;
    None for N/A or anything else."""
    rows = parse_csv_query(text, ["clocks.max.sm"])
    return number(rows[0]["clocks.max.sm"]) if rows else None


def parse_compute_apps(text: str) -> list[GpuProcess]:
    out = []
    for row in parse_csv_query(text, ["pid", "process_name", "used_memory"]):
        pid = number(row["pid"])
        if pid is None:
            continue
        used = number(row["used_memory"])
        out.append(GpuProcess(int(pid), row["process_name"] or "?", int(used) if used is not None else None))
    return out


# -- disks ------------------------------------------------------------------------

# What lives on a filesystem the probe reads (`host_probe._SCRIPT_DISK` prints each as `<role> <path>`).
DISK_ROLES = ("root", "hf_cache", "docker")
# A `df -P` row: the filesystem, its total, used and available blocks, the capacity used and where it is
# mounted. POSIX's format never wraps a row; a name or a mount point may hold spaces, so it is read around the
# numbers (GNU df writes "-" for the capacity of a filesystem of no size).
_DF_ROW = re.compile(r"^(?P<device>.*?)\s+(?P<total>\d+)\s+\d+\s+(?P<free>\d+)\s+(?:\d+%|-)\s+(?P<mount>/.*)$")
_DF_HEADER = re.compile(r"^Filesystem\s+(?P<size>\d+)(?P<k>K?)-blocks\s")


def parse_disks(text: str) -> list[Disk]:
    """The probe's `@@disk` section: the role and path of each place it asked about (`root /`,
    `hf_cache /home/u/.cache/huggingface`), then `df -Pk` of those paths, a row per path in their order
    (the header says the block size: 1024 with -k, 512 where POSIXLY_CORRECT is set without it). One `Disk`
    per filesystem, in bytes, with the roles it holds; a path df could not read (absent) is left out (where the rows
    no longer line up with the paths, each path goes to the filesystem mounted on its longest prefix)."""
    paths: list[tuple[str, str]] = []
    rows: list[tuple[str, int, int, str]] = []
    unread: set[str] = set()  # `df: /var/lib/docker: No such file or directory`: not there, so held by none
    block = 1024
    for line in text.splitlines():
        role, _, path = line.partition(" ")
        if role in DISK_ROLES and path.startswith("/"):
            paths.append((role, path))
        elif line.startswith("df: ") and ": " in line[4:]:
            unread.add(line[4:].rsplit(": ", 1)[0].strip("'‘’\""))
        elif header := _DF_HEADER.match(line):
            block = int(header["size"]) * (1024 if header["k"] else 1)
        elif row := _DF_ROW.match(line):
            rows.append((row["device"].strip(), int(row["total"]), int(row["free"]), row["mount"]))
    disks: dict[tuple[str, str], Disk] = {}
    for device, total, free, mount in rows:
        disks.setdefault((device, mount), Disk(mount=mount, total=total * block, free=free * block, device=device))
    found = list(disks.values())
    readable = [(role, path) for role, path in paths if path not in unread]
    for i, (role, path) in enumerate(readable):
        if len(rows) == len(readable):
            disk: Disk | None = disks[(rows[i][0], rows[i][3])]
        else:
            under = [d for d in found if path == d.mount or path.startswith(d.mount.rstrip("/") + "/")]
            disk = max(under, key=lambda d: len(d.mount), default=None)
        if disk is not None and role not in disk.holds:
            disk.holds.append(role)
    return found


# -- docker -----------------------------------------------------------------------


def parse_labels(text: str) -> dict[str, str]:
    labels = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep:
            labels[key.strip()] = value
    return labels


def parse_docker_ps(text: str) -> list[Container]:
    """`docker ps --format '{{json .}}'`: one JSON object per line."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        command = row.get("Command", "")
        if command.startswith('"') and command.endswith('"'):
            try:
                command = json.loads(command)
            except ValueError:
                command = command.strip('"')
        state = row.get("State") or ("running" if str(row.get("Status", "")).startswith("Up") else "exited")
        out.append(Container(
            name=row.get("Names", ""), image=row.get("Image", ""), state=state, status=row.get("Status", ""),
            id=row.get("ID", ""), command=command, running_for=row.get("RunningFor", ""),
            labels=parse_labels(row.get("Labels", "") or ""),
        ))
    return out


# -- engine servers in the process list -------------------------------------------

# A process in a container (Docker, containerd, Kubernetes, Podman): docker discovery finds it.
_CONTAINER_CGROUP = re.compile(r"docker|containerd|kubepods|libpod")
_PROC_LINE = re.compile(r"^/proc/(\d+)/(cmdline|cgroup|rss):(.*)$", re.S)
_FD_HEADER = re.compile(r"^/proc/(\d+)/fd:$")
_FD_ERROR = re.compile(r"^ls: .*'/proc/(\d+)/fd'")
_SOCKET = re.compile(r" -> socket:\[(\d+)\]$")


# What the docker CLI says when it cannot list containers, in the words a card has room for: the CLI's own
# sentence ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon
# running?") runs across the card and says less.
_DOCKER_PROBLEMS = (
    ("cannot connect to the docker daemon", "not running"),
    ("is the docker daemon running", "not running"),
    ("permission denied", "permission denied"),
    ("context deadline exceeded", "not answering"),
    ("timeout", "not answering"),
    ("timed out", "not answering"),
    ("no such host", "unknown DOCKER_HOST"),
    ("client version", "client and daemon versions differ"),
)


def docker_problem(line: str | None, status: int | None) -> str:
    """A failed `docker ps` in a few words ("not running", "permission denied"), from its first line of output."""
    text = (line or "").strip()
    lowered = text.lower()
    for needle, words in _DOCKER_PROBLEMS:
        if needle in lowered:
            return words
    if not text:
        return f"docker exited {status}"
    text = text.removeprefix("Error response from daemon: ").removeprefix("error during connect: ")
    return text if len(text) <= 40 else text[:39] + "…"


def server_command(argv: list[str]) -> tuple[str, str] | None:
    """(engine id, what its server is called) for an engine's API server
    command line: `vllm serve`, vLLM's API server module, `sglang
    launch_server`, `llama-server`, `trtllm-serve`, `ollama serve`, ... or
    sparktop's twin (`sparktop twin serve`, speaking vLLM); None otherwise."""
    for i, arg in enumerate(argv):
        if arg.rsplit("/", 1)[-1] == "sparktop" and argv[i + 1:i + 3] == ["twin", "serve"]:
            named = engines.by_id(flag_value(argv, "--engine") or DEFAULT)  # `twin serve --engine llama-cpp`
            return (named.id if named is not None else DEFAULT), "sparktop twin serve"
    found = engines.for_command(argv)
    return (found[0].id, found[1]) if found is not None else None


def _listening(line: str) -> tuple[int, int] | None:
    """(socket inode, port) from a listening row of `ss -ltnHe` or of /proc/net/tcp{,6}."""
    if line.startswith("/proc/net/tcp"):
        fields = line.split(":", 1)[1].split()
        if len(fields) < 10 or fields[3] != "0A":  # 0A: TCP_LISTEN
            return None
        try:
            return int(fields[9]), int(fields[1].rsplit(":", 1)[1], 16)
        except (ValueError, IndexError):
            return None
    fields = line.split()
    if len(fields) < 4 or fields[0] != "LISTEN":
        return None
    inode = next((f[4:] for f in fields if f.startswith("ino:")), None)
    try:
        return (int(inode), int(fields[3].rsplit(":", 1)[1])) if inode else None
    except (ValueError, IndexError):
        return None


_CONTAINER_ID = re.compile(r"(?:docker-|/docker/|containerd-|cri-containerd-|libpod-)([0-9a-f]{12,64})")


def parse_pid_cgroups(text: str) -> dict[int, str]:
    """`PID:CGROUP-LINE` lines -> the id of the container each process runs in (those in none: absent)."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        pid, sep, cgroup = line.partition(":")
        if not sep or not pid.strip().isdigit():
            continue
        match = _CONTAINER_ID.search(cgroup)
        if match is not None:
            out[int(pid)] = match.group(1)
    return out


def servers_memory_mib(text: str) -> float | None:
    """Resident memory (MiB) of the engine processes outside containers in a `@@servers` section (their
    `/proc/PID/rss:KB` lines): what a node's engines hold when nvidia-smi lists no processes. None when
    none was read."""
    rss: dict[int, int] = {}
    contained: set[int] = set()
    for line in text.splitlines():
        match = _PROC_LINE.match(line)
        if match is None:
            continue
        pid, kind, value = int(match.group(1)), match.group(2), match.group(3)
        if kind == "rss" and value.strip().isdigit():
            rss[pid] = int(value.strip())
        elif kind == "cgroup" and _CONTAINER_CGROUP.search(value):
            contained.add(pid)
    kept = [kb for pid, kb in rss.items() if pid not in contained]
    return sum(kept) / 1024 if kept else None


def parse_server_processes(text: str) -> list[ServerProcess]:
    """The `@@servers` section: each candidate's argv (`/proc/PID/cmdline:ARG`,
    one line per argument), its cgroups (`/proc/PID/cgroup:LINE`), its open
    descriptors (`ls -lR /proc/PID/fd`, or ls's error when they cannot be
    read) and the node's listening TCP sockets (`ss -ltnHe`, or the rows of
    /proc/net/tcp and tcp6). Kept: vLLM API servers outside any container
    (TP workers, `--headless`, have no API); each with the ports its sockets
    listen on, or its `--port` when its descriptors are another user's (or
    it does not listen yet). Those whose sockets were read come first.
    Every engine's servers, not only vLLM's (`observe.engines`)."""
    argv: dict[int, list[str]] = {}
    in_container: set[int] = set()
    sockets: dict[int, list[int]] = {}  # pid -> socket inodes, for the pids whose descriptors were read
    unreadable: set[int] = set()
    gone: set[int] = set()
    listening: dict[int, int] = {}  # inode -> port
    fd_pid: int | None = None
    last_arg: int | None = None  # the pid whose argv the previous line extended
    for line in text.splitlines():
        match = _PROC_LINE.match(line)
        if match:
            pid, kind, value = int(match.group(1)), match.group(2), match.group(3)
            fd_pid = None
            if kind == "cmdline":
                argv.setdefault(pid, []).append(value)
                last_arg = pid
            else:
                last_arg = None
                if kind == "cgroup" and _CONTAINER_CGROUP.search(value):
                    in_container.add(pid)
            continue
        if (header := _FD_HEADER.match(line)) is not None:
            fd_pid, last_arg = int(header.group(1)), None
            sockets.setdefault(fd_pid, [])
            continue
        if (error := _FD_ERROR.match(line)) is not None:
            pid = int(error.group(1))
            (gone if "No such file" in line else unreadable).add(pid)
            fd_pid = last_arg = None
            continue
        if (listen := _listening(line)) is not None:
            listening[listen[0]] = listen[1]
            fd_pid = last_arg = None
            continue
        if fd_pid is not None and (sock := _SOCKET.search(line)) is not None:
            sockets[fd_pid].append(int(sock.group(1)))
            continue
        if last_arg is not None and line:
            argv[last_arg][-1] += "\n" + line  # an argument with a newline in it
    out: list[ServerProcess] = []
    for pid, args in argv.items():
        found = server_command(args)
        if found is None or pid in in_container or pid in gone:
            continue
        engine_id, command = found
        engine = engines.by_id(engine_id) or engines.by_id(DEFAULT)
        assert engine is not None
        if engine.is_worker(args):
            continue  # a worker of an engine over several nodes: no API of its own
        ports = sorted({listening[i] for i in sockets.get(pid, []) if i in listening})
        if ports and pid not in unreadable:
            out.append(ServerProcess(pid, args, ports, "socket", command, engine_id))
        else:
            out.append(ServerProcess(pid, args, [engine.port(args)], "flag", command, engine_id))
    # Those whose sockets were read first: a launcher in front of a server (`uv run vllm serve ...`) holds
    # none, and the server's own entry, on the same address and port, is the one to name.
    return sorted(out, key=lambda s: s.port_source != "socket")
