"""One poll of one node: a single shell round trip through its transport.

The probe script prints sections (`@@name`), each the output of one read:
meminfo, the first line of /proc/stat, two nvidia-smi queries, `docker ps`
and the vLLM API servers in the process list (`@@servers`, vLLM started
outside Docker); with the slow tier, the space left on the filesystems a
Spark fills (`@@disk`), and once the GPU's highest SM clock (`@@gpumax`). A
missing tool prints `@@missing` for its section, which the
monitor shows as a state rather than an error. The meminfo path can be
redirected with `$SPARKTOP_PROC_ROOT` (the twin's simulated hosts use it);
on a real node it is /proc.

Time is the probe's `clock` (`sparktop.clock`, the system's unless the
poller gives another): when the slow tier is due and the link's rate
window on its `now()`, the snapshot's time on its `wall()`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shlex
import shutil
import socket
import struct
import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from sparktop import engine_ids
from sparktop.clock import SYSTEM, Clock
from sparktop.engine_ids import DEFAULT, ROUTER
from sparktop.labels import prediction_labels
from sparktop.layouts import from_label
from sparktop.observe import engines, hostparse
from sparktop.observe.argv import flag_value
from sparktop.observe.fabric import parse_ip_br_addr
from sparktop.observe.linkparse import LINK_SCRIPT, LinkCounters, link_rates, parse_link_section
from sparktop.observe.machine import DMI_SCRIPT, Machine, parse_dmi_section
from sparktop.observe.prometheus import RATE_WINDOW_S
from sparktop.observe.snapshot import Container, Disk, NodeSnapshot, ServerProcess
from sparktop.remote import Transport
from sparktop.remote.local import LocalTransport

GPU_QUERY = "name,utilization.gpu,temperature.gpu,power.draw,clocks.sm,pstate"
# Why the clocks are held down (NVML's clock event reasons, a bitmask): drivers before 535 do not know
# the field and refuse the whole query, so a node answering so is asked without it from then on.
GPU_QUERY_REASONS = GPU_QUERY + ",clocks_event_reasons.active"
APPS_QUERY = "pid,process_name,used_memory"
# The GPU's highest SM clock, for the silent low-clock alert (a clock under a share of it). NVML's maximum is the
# hardware's, which a cap or a clock lock does not lower (a GB10 with bad USB-C power delivery still reports 3003 MHz
# at ~500 MHz: hoesing/spark-gpu-throttle-check's README), so it is asked once (with the slow tier until nvidia-smi
# answers it), in a query of its own: a field the driver does not know makes nvidia-smi refuse the whole query
# (`Field "..." is not a valid field to query.`, exit 2), and the every-poll figures must not hang on it.
GPU_MAX_QUERY = "clocks.max.sm"
_SCRIPT_GPU_MAX = (
    "if command -v nvidia-smi >/dev/null 2>&1; then "
    f"echo @@gpumax; nvidia-smi --query-gpu={GPU_MAX_QUERY} --format=csv,noheader,nounits 2>&1; "
    'echo "@@rc $?"; fi; '
)
# The filesystems a Spark's work fills, read with the slow tier (space goes by downloads, not by the second):
# `/`, the Hugging Face cache (`$HF_HOME`, else ~/.cache/huggingface) and Docker's root (`data-root` in
# /etc/docker/daemon.json, else /var/lib/docker). Each path's role first (`hostparse.DISK_ROLES`), then one
# `df -Pk` of them all: POSIX's format, in KiB, a row per path it could read; the parser keeps one per filesystem
# and puts a path df could not read (absent) under none. No `[ -e ]` first: on a hung mount (an NFS-backed HF
# cache) that test would hang the shell itself; df runs under `timeout 1` where it exists, well inside the probe's
# own limit (2 s at the default interval), so a hung mount costs this section, never the node's poll.
_SCRIPT_DISK = (
    'echo @@disk; h=${HF_HOME:-$HOME/.cache/huggingface}; r=/var/lib/docker; '
    "if [ -r /etc/docker/daemon.json ]; then while IFS= read -r l || [ -n \"$l\" ]; do case $l in *'\"data-root\"'*) "
    "l=${l#*'\"data-root\"'}; l=${l#*'\"'}; r=${l%%'\"'*} ;; esac; done < /etc/docker/daemon.json; fi; "
    'echo "root /"; echo "hf_cache $h"; echo "docker $r"; '
    'if command -v timeout >/dev/null 2>&1; then timeout -k 1 1 df -Pk -- / "$h" "$r" 2>&1; '
    'else df -Pk -- / "$h" "$r" 2>&1; fi; echo "@@rc $?"; '
)

# Shell builtins where a command would do (`read` for the first line of
# /proc/stat): every process started on the node costs it CPU each poll.
_SCRIPT_FILES = (
    'echo @@meminfo; cat "${SPARKTOP_PROC_ROOT:-/proc}/meminfo" 2>&1; '
    "echo @@stat; read -r l < /proc/stat && echo \"$l\"; "
)
def gpu_script(query: str = GPU_QUERY_REASONS) -> str:
    """The `@@gpu`, `@@apps` and `@@appcg` sections, `query` the GPU's fields."""
    return _SCRIPT_GPU.replace(GPU_QUERY_REASONS, query)


_SCRIPT_GPU = (
    "if command -v nvidia-smi >/dev/null 2>&1; then "
    f"echo @@gpu; nvidia-smi --query-gpu={GPU_QUERY_REASONS} --format=csv,noheader,nounits 2>&1; "
    'echo "@@rc $?"; '
    f"echo @@apps; a=$(nvidia-smi --query-compute-apps={APPS_QUERY} --format=csv,noheader,nounits 2>&1); "
    'r=$?; printf \'%s\\n\' "$a"; echo "@@rc $r"; '
    # Each GPU process's cgroup, with builtins: which container holds that memory.
    'echo @@appcg; printf \'%s\\n\' "$a" | while IFS=", " read -r p _; do '
    'f="${SPARKTOP_PROC_ROOT:-/proc}/$p/cgroup"; [ -r "$f" ] && while read -r l; do echo "$p:$l"; done < "$f"; '
    'done 2>/dev/null; '
    "else echo @@gpu; echo @@missing; fi; "
)
_SCRIPT_DOCKER = (
    "if command -v docker >/dev/null 2>&1; then "
    "echo @@docker; docker ps -a --no-trunc --format '{{json .}}' 2>&1; echo \"@@rc $?\"; "
    "else echo @@docker; echo @@missing; fi; "
)
# The link's rates are taken over this many seconds, as the engines' token rates are (prometheus.py).
LINK_WINDOW_S = RATE_WINDOW_S
# The fabric's addresses change rarely: read with the slow tier (which port reaches which node).
_SCRIPT_ADDR = "echo @@addr; ip -br addr 2>/dev/null; "
# Engine API servers outside Docker, in one pass over the process table: one
# grep finds the candidates (an argument naming an engine's server, each
# engine module's `process_arg`, or `sparktop`; `vll[m]` and the like so grep
# does not find itself), then one
# grep|tr prints their argv, shell builtins their cgroups, one `ls` their
# sockets and one `ss` the listening ones (the kernel answers a LISTEN-only
# query without walking its connection table, which reading /proc/net/tcp
# does). Nothing runs past the first grep when no candidate is found, nor when
# the candidates are the processes the previous read found (`unchanged`).
# Engines' processes that title themselves (vLLM's engine core and workers, `VLLM::EngineCore`,
# `VLLM::Worker_TP0`, `Engine.process_titles`) hold their memory, counted when nvidia-smi lists no processes.
SERVER_ARG = "|".join(p for p in (engines.process_pattern(), engines.title_pattern(), r"(^|/)sparkto[p]$") if p)
# Each candidate's cgroups and resident memory, with shell builtins (no process per candidate).
_SERVERS_MEMORY = (
    'for p in $c; do d=${p%/cmdline}; '
    'while read -r l; do echo "$d/cgroup:$l"; done < $d/cgroup; '
    'while read -r k v u; do [ "$k" = VmRSS: ] && echo "$d/rss:$v"; done < $d/status; done 2>/dev/null; '
)
_SERVERS_READ = (
    'echo candidates $c; grep -azH \'\' $c | tr \'\\0\' \'\\n\'; f=; '
    'for p in $c; do d=${p%/cmdline}; f="$f $d/fd"; done; ' + _SERVERS_MEMORY
    + "ls -lR $f 2>&1; "
    "if command -v ss >/dev/null 2>&1; then ss -ltnHe; "
    "else grep -H ' 0A ' /proc/net/tcp /proc/net/tcp6 2>/dev/null; fi; "
)


# Twin nodes share this machine's process table: on one (`$SPARKTOP_TWIN_HOME` set), only the processes started
# on that node (its containers', which carry the same variable) are its own, as a real node's are. Not set on
# a real node: nothing runs.
_TWIN_NODE_ONLY = (
    'if [ -n "$SPARKTOP_TWIN_HOME" ]; then k=; for p in $c; do '
    'grep -qszxF "SPARKTOP_TWIN_HOME=$SPARKTOP_TWIN_HOME" "${p%/cmdline}/environ" && k="$k $p"; done; '
    'c=${k# }; fi; '
)


def servers_script(previous: str | None = None) -> str:
    """The `@@servers` section; `previous`: the candidates the last read
    printed (`candidates /proc/1/cmdline ...`), whose answer is kept when the
    same processes are there."""
    find = f"echo @@servers; c=$(grep -lszE '{SERVER_ARG}' /proc/[0-9]*/cmdline); {_TWIN_NODE_ONLY}"
    if previous:
        return find + f"set -- $c; if [ \"$*\" = {shlex.quote(previous)} ]; then echo unchanged; {_SERVERS_MEMORY}" \
            f'elif [ -n "$c" ]; then {_SERVERS_READ}fi; '
    return find + f'if [ -n "$c" ]; then {_SERVERS_READ}fi; '


def server_candidates(section: str) -> str | None:
    """What a read of the servers printed about its candidates (the section's
    body): `unchanged`, the list (`/proc/1/cmdline /proc/2/cmdline`), or None
    (none, or not read)."""
    for line in section.splitlines():
        if line == "unchanged":
            return line
        if line.startswith("candidates /proc/"):
            return line.removeprefix("candidates ")
    return None


_SCRIPT_SERVERS = servers_script()
# The link's counters are read every poll, like memory (RoCE bypasses the kernel: only the NIC counts it).
_SCRIPT_HEAD = _SCRIPT_FILES + _SCRIPT_GPU + LINK_SCRIPT
_SCRIPT_HEAD_OLD_DRIVER = _SCRIPT_FILES + gpu_script(GPU_QUERY) + LINK_SCRIPT
# Every section; a poll sends the head and whichever of the others are due.
PROBE_SCRIPT = _SCRIPT_HEAD + _SCRIPT_DOCKER + _SCRIPT_SERVERS + "echo @@end"
# The slow tier: `docker ps` is most of a poll's cost on the node (a Go binary
# and a daemon round trip, ~10 ms of CPU), and the process list, the addresses
# and which ports are engines change as rarely: read at most this often, and at
# once when something changed (the poller asks: an engine stopped answering or
# started to, the app launched or stopped something).
DOCKER_EVERY_S = 10.0
# A docker that fails twice in a row (no daemon, no permission) is asked again a
# minute later, then half as often each time it fails again, down to once in DOCKER_RETRY_MAX_S:
# its CLI costs as much to fail as to answer (~30 ms of CPU), and a daemon that
# is down stays down. An engine that stops answering still has it asked at once.
DOCKER_RETRY_S = 60.0
DOCKER_RETRY_MAX_S = 300.0


def split_sections(text: str) -> dict[str, tuple[str, int | None, bool]]:
    """section -> (body, exit status if printed, missing)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@@") and not line.startswith("@@rc") and line != "@@missing":
            current = line[2:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    out = {}
    for name, lines in sections.items():
        rc = None
        missing = "@@missing" in lines
        body = []
        for line in lines:
            if line.startswith("@@rc "):
                try:
                    rc = int(line[5:])
                except ValueError:
                    rc = None
            elif line != "@@missing":
                body.append(line)
        out[name] = ("\n".join(body), rc, missing)
    return out


@dataclass
class HostProbe:
    name: str
    transport: Transport
    timeout: float = 5.0
    docker_every: float = DOCKER_EVERY_S
    link_window: float = LINK_WINDOW_S  # link rates over this many seconds (the engines' token-rate window)
    clock: Clock = SYSTEM  # the tiers' timing and the link's window on its now(), the snapshot on its wall()
    _prev_cpu: tuple[int, int] | None = field(default=None, repr=False)
    _docker_at: float | None = field(default=None, repr=False)
    _docker_failures: int = field(default=0, repr=False)  # reads in a row that docker failed
    _docker: tuple[str, list[Container]] | None = field(default=None, repr=False)
    _tools: tuple[bool, bool] | None = field(default=None, repr=False)  # nvidia-smi, docker (local node)
    # The vLLM servers outside Docker: read as often as the container list is when docker answers,
    # whatever docker does (a node without docker runs its vLLM as a plain process).
    _servers_at: float | None = field(default=None, repr=False)
    _servers: list[ServerProcess] | None = field(default=None, repr=False)
    _servers_rss: float | None = field(default=None, repr=False)
    _server_candidates: str | None = field(default=None, repr=False)
    # The link's counters as read (when, what), over the last `link_window` s: rates over the window.
    _links: deque[tuple[float, list[LinkCounters]]] = field(default_factory=deque, repr=False)
    _machine: Machine | None = field(default=None, repr=False)
    _dmi_read: bool = field(default=False, repr=False)  # DMI does not change: read once
    _has_rdma: bool | None = field(default=None, repr=False)  # the local node: any RDMA device at all
    _gpu_query: str = field(default=GPU_QUERY_REASONS, repr=False)
    _addresses: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    _disks: list[Disk] | None = field(default=None, repr=False)  # as the slow tier last read them
    _gpu_max: float | None = field(default=None, repr=False)  # the SM clock's ceiling (MHz), once nvidia-smi said
    _gpu_max_read: bool = field(default=False, repr=False)
    # Whether the last poll read the containers or the process list afresh (or copied the last ones).
    read_slow_tier: bool = field(default=False, repr=False)

    def refresh_docker(self) -> None:
        """Read the container list and the process list on the next poll (something changed)."""
        self._docker_at = None
        self._servers_at = None

    async def poll(self) -> NodeSnapshot:
        started = self.clock.now()
        # One failure may be a hiccup (a container removed mid-list): asked again at the usual pace.
        # Failing again, the daemon is down: asked less and less often.
        every = self.docker_every if self._docker is None or self._docker[0] == "ok" or self._docker_failures <= 1 \
            else min(DOCKER_RETRY_MAX_S, DOCKER_RETRY_S * 2 ** max(0, self._docker_failures - 2))
        docker_due = self._docker is None or self._docker_at is None or started - self._docker_at >= every - 0.05
        servers_due = self._servers_at is None or started - self._servers_at >= self.docker_every - 0.05
        if isinstance(self.transport, LocalTransport):
            text, ok, why = await self._read_here(docker_due, servers_due)
        else:
            head = _SCRIPT_HEAD if self._gpu_query == GPU_QUERY_REASONS else _SCRIPT_HEAD_OLD_DRIVER
            script = head + ("" if self._dmi_read else DMI_SCRIPT) + (
                _SCRIPT_GPU_MAX if servers_due and not self._gpu_max_read else "") + (
                _SCRIPT_DOCKER + _SCRIPT_ADDR if docker_due else "") + (
                servers_script(self._server_candidates) + _SCRIPT_DISK if servers_due else "") + "echo @@end"
            result = await self.transport.run(script, timeout=self.timeout)
            text, ok, why = result.stdout, "@@end" in result.stdout, \
                f"exit {result.exit_status}: {result.first_error_line()}"
        sections = split_sections(text)  # once: the snapshot, the servers and the link all read it
        snap = parse_probe(self.name, text, self._prev_cpu, self._gpu_query, sections, t=self.clock.wall())
        if self._gpu_query == GPU_QUERY_REASONS and "clocks_event_reasons.active" in snap.gpu_status:
            self._gpu_query = GPU_QUERY  # a driver before 535: asked without the reasons from now on
            snap.gpu_status = "ok" if snap.gpu is not None else "unknown"
        self._prev_cpu = snap._cpu_raw  # type: ignore[attr-defined]
        if docker_due:
            self._docker_at = started
            self._docker = (snap.docker_status, snap.containers)
            self._docker_failures = 0 if snap.docker_status in ("ok", "missing") else self._docker_failures + 1
        elif self._docker is not None:
            snap.docker_status, snap.containers = self._docker[0], list(self._docker[1])
        if servers_due and ok:  # a cut-off answer is no news that the servers have gone
            self._servers_at = started
            candidates = server_candidates(sections.get("servers", ("", None, False))[0])
            if candidates == "unchanged" and self._servers is not None:
                snap.servers = list(self._servers)  # the same processes; their memory was read afresh
            else:
                self._servers = list(snap.servers)
                # Kept for the next read unless a server has not shown its socket yet (or hides it).
                self._server_candidates = candidates if all(
                    s.port_source == "socket" for s in snap.servers) else None
            self._servers_rss = snap.servers_rss_mib
        elif self._servers is not None:
            snap.servers = list(self._servers)
            snap.servers_rss_mib = self._servers_rss
        self._read_link_and_machine(sections, ok, snap)
        self._read_disks_and_clock(sections, ok, snap)
        self.read_slow_tier = docker_due or (servers_due and ok)
        snap.poll_ms = (self.clock.now() - started) * 1000
        if not ok:
            raise RuntimeError(f"probe did not finish ({why})")
        return snap

    def _read_link_and_machine(self, sections: dict, ok: bool, snap: NodeSnapshot) -> None:
        """The link's rates since the last read (measured interval, not the poll period asked for) and
        the machine, read once."""
        if "dmi" in sections and ok:
            self._dmi_read = True
            self._machine = parse_dmi_section(sections["dmi"][0])
        snap.machine = self._machine
        if "addr" in sections and ok:
            self._addresses = {name: iface.addresses for name, iface in
                               parse_ip_br_addr(sections["addr"][0]).items()}
        if "link" not in sections or not ok:
            return
        now = self.clock.now()
        counters = parse_link_section(sections["link"][0])
        snap.addresses = {c.netdev: self._addresses[c.netdev] for c in counters
                          if c.netdev and c.netdev in self._addresses}
        if self._links:
            # From the newest read at least a window old (or the oldest there is): NCCL moves its bytes in
            # bursts, and a second's rate beside a token rate over 10 s would jump around it.
            start = self._links[0]
            for t, old in self._links:
                if now - t >= self.link_window:
                    start = (t, old)
            snap.links = link_rates(start[1], start[0], counters, now)
        self._links.append((now, counters))
        while len(self._links) > 2 and now - self._links[1][0] >= self.link_window:
            self._links.popleft()

    def _read_disks_and_clock(self, sections: dict, ok: bool, snap: NodeSnapshot) -> None:
        """The filesystems as the slow tier last read them, and the GPU's highest SM clock once it is known."""
        if "disk" in sections and ok:
            self._disks = hostparse.parse_disks(sections["disk"][0])
        snap.disks = list(self._disks or [])
        if "gpumax" in sections and ok:
            body, rc, _ = sections["gpumax"]
            if rc == 0:
                self._gpu_max, self._gpu_max_read = hostparse.parse_max_clock(body), True
            elif "not a valid field" in body:  # a driver that does not know it: never asked again
                self._gpu_max_read = True
        if snap.gpu is not None:
            snap.gpu.max_sm_clock = self._gpu_max

    async def _read_here(self, docker_due: bool, servers_due: bool = False) -> tuple[str, bool, str]:
        """The probe's sections for the node sparktop runs on: the /proc files
        (and the process list) read in-process (a monitor left open all day
        should not start a shell and `cat` every second), the tools run only
        when they exist here."""
        assert isinstance(self.transport, LocalTransport)
        env = self.transport.environ
        if self._tools is None:
            path = env.get("PATH")
            self._tools = (shutil.which("nvidia-smi", path=path) is not None,
                           shutil.which("docker", path=path) is not None)
        gpu, docker = self._tools
        root = env.get("SPARKTOP_PROC_ROOT") or "/proc"
        twin_home = env.get("SPARKTOP_TWIN_HOME") or None  # a twin node: its own processes only
        try:
            with open(f"{root}/meminfo") as f:
                meminfo = f.read()
        except OSError as exc:
            meminfo = f"cat: {root}/meminfo: {exc.strerror}"
        try:
            with open("/proc/stat") as f:
                stat = f.readline()
        except OSError:
            stat = ""
        text = f"@@meminfo\n{meminfo.rstrip()}\n@@stat\n{stat.rstrip()}\n"
        sys_root = env.get("SPARKTOP_SYS_ROOT") or "/sys"
        if self._has_rdma is None or docker_due:  # a driver loaded since: looked for again now and then
            self._has_rdma = bool(_listdir(f"{sys_root}/class/infiniband"))
        if not self._dmi_read:
            text += "@@dmi\n" + "".join(f"{name}={_first_line_of(f'{sys_root}/class/dmi/id/{name}')}\n"
                                       for name in ("sys_vendor", "product_name", "product_family"))
        script = (gpu_script(self._gpu_query) if gpu else "") + (
            _SCRIPT_GPU_MAX if gpu and servers_due and not self._gpu_max_read else "") + (
            _SCRIPT_DOCKER if docker and docker_due else "") + (
            LINK_SCRIPT if self._has_rdma else "") + (_SCRIPT_ADDR if self._has_rdma and docker_due else "") + (
            _SCRIPT_DISK if servers_due else "")
        if not gpu:
            text += "@@gpu\n@@missing\n"
        if docker_due and not docker:
            text += "@@docker\n@@missing\n"
        if not script:
            return text + (read_servers_here(twin_home=twin_home) if servers_due else "") + "@@end\n", True, ""
        result = await self.transport.run(script + "echo @@end", timeout=self.timeout)
        # After `docker ps`: a container's process seen here was in the list docker printed.
        return text + result.stdout + (read_servers_here(twin_home=twin_home) if servers_due else ""), \
            "@@end" in result.stdout, \
            f"exit {result.exit_status}: {result.first_error_line()}"


# -- vLLM servers on this machine -------------------------------------------------

_SPARKTOP_ARG = re.compile(r"(^|/)sparktop$")
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _NLMSG_ERROR, _NLMSG_DONE = 4, 20, 2, 3
_TCP_LISTEN = 10


def _on_twin_node(base: str, twin_home: str) -> bool:
    """Whether the process at `base` was started on the twin node whose home is `twin_home` (`_TWIN_NODE_ONLY`)."""
    try:
        with open(f"{base}/environ", "rb") as f:
            return f"SPARKTOP_TWIN_HOME={twin_home}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def read_servers_here(proc: str = "/proc", twin_home: str | None = None) -> str:
    """The `@@servers` section for the machine sparktop runs on, read
    in-process: what the probe script prints on a remote node. `twin_home`: on a twin node, only the
    processes started on it (`_TWIN_NODE_ONLY`)."""
    out = ["@@servers"]
    fds = []
    try:
        pids = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return "@@servers\n"
    for pid in pids:
        try:  # os.open/os.read: a file object per process, every few seconds, was most of this read's cost
            fd = os.open(f"{proc}/{pid}/cmdline", os.O_RDONLY)
        except OSError:
            continue
        try:
            raw = _read_all(fd)
        except OSError:
            continue
        finally:
            os.close(fd)
        if b"sparktop" not in raw and not raw.startswith(engines.PROCESS_TITLE_BYTES) \
                and not any(needle in raw for needle in engines.PROCESS_BYTES):
            continue
        args = raw.decode(errors="replace").removesuffix("\0").split("\0")
        if not args[0].startswith(engines.PROCESS_TITLES) and \
                not any(engines.engine_argument(a) or _SPARKTOP_ARG.search(a) for a in args):
            continue
        base = f"{proc}/{pid}"
        if twin_home and not _on_twin_node(base, twin_home):
            continue
        out += [f"{base}/cmdline:{a}" for a in args]
        with contextlib.suppress(OSError), open(f"{base}/cgroup") as f:
            out += [f"{base}/cgroup:{line.rstrip()}" for line in f]
        with contextlib.suppress(OSError), open(f"{base}/status") as f:
            out += [f"{base}/rss:{line.split()[1]}" for line in f if line.startswith("VmRSS:")]
        fds.append(base)
    for base in fds:
        try:
            names = os.listdir(f"{base}/fd")
        except PermissionError:
            out.append(f"ls: cannot open directory '{base}/fd': Permission denied")
            continue
        except OSError:
            out.append(f"ls: cannot access '{base}/fd': No such file or directory")
            continue
        out.append(f"{base}/fd:")
        for name in names:
            with contextlib.suppress(OSError):
                target = os.readlink(f"{base}/fd/{name}")
                if target.startswith("socket:"):
                    out.append(f"{name} -> {target}")
    if fds:
        out += _listening_here(proc)
    return "\n".join(out) + "\n"


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _listening_here(proc: str) -> list[str]:
    """This machine's listening TCP sockets as `ss -ltnHe` prints them (from
    the kernel's sock_diag, which answers for listening sockets alone), or
    the LISTEN rows of /proc/net/tcp{,6} where netlink is refused."""
    try:
        return [f"LISTEN 0 0 {addr}:{port} *:* ino:{inode}" for addr, port, inode in _sock_diag_listening()]
    except OSError:
        pass
    rows = []
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"{proc}/net/{name}") as f:
            rows += [f"/proc/net/{name}:{line.rstrip()}" for line in f if " 0A " in line]
    return rows


def _sock_diag_listening() -> list[tuple[str, int, int]]:
    """(address, port, socket inode) of every listening TCP socket, IPv4 and IPv6."""
    found = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(1.0)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
            # nlmsghdr, then inet_diag_req_v2: family, protocol, ext, pad, states, a zeroed inet_diag_sockid
            req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN) + bytes(48)
            sock.send(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, 0x301, seq, 0) + req)
            done = False
            while not done:
                data = sock.recv(65536)
                offset = 0
                while offset + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, offset)
                    if kind == _NLMSG_DONE or length < 16:
                        done = True
                        break
                    if kind == _NLMSG_ERROR:
                        raise OSError("sock_diag refused the request")
                    msg = offset + 16  # inet_diag_msg: family, state, timer, retrans, sockid, ..., inode
                    port = struct.unpack_from(">H", data, msg + 4)[0]
                    raw = data[msg + 8:msg + 8 + (4 if family == socket.AF_INET else 16)]
                    inode = struct.unpack_from("=I", data, msg + 68)[0]
                    address = str(ipaddress.ip_address(raw))
                    found.append((f"[{address}]" if family == socket.AF_INET6 else address, port, inode))
                    offset += (length + 3) & ~3
    return found


@dataclass
class ProcessEngine:
    """The API endpoint of an engine's server running as a plain process."""

    url: str
    port: int
    host: str | None  # the address it was told to bind, when it named one
    found: str  # "process 4242 (vllm serve, port 8000)"
    kind: str = DEFAULT  # the engine it is (`observe.engines`), to be confirmed by what it answers
    topology: str | None = None
    model: str | None = None
    argv: list[str] | None = None


_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


def _loopback(address: str) -> bool:
    if address in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def _same_address(a: str, b: str) -> bool:
    return a == b or (a in _LOCAL_NAMES and b in _LOCAL_NAMES)


def _engine_of(kind: str) -> type[engines.Engine]:
    engine = engines.by_id(kind) or engines.by_id(DEFAULT)
    assert engine is not None
    return engine


def process_engine(server: ServerProcess, node_address: str, other_nodes: Collection[str] = ()) -> \
        ProcessEngine | None:
    """The endpoint a server process on this node serves, or None when it is
    not this node's to show: bound to another node's address (the lab's
    hosts share one process table), or to a loopback address the monitor
    reaches only from that node itself."""
    args = server.argv
    engine = _engine_of(server.engine)
    host = engine.host(args)
    if host is not None and not _same_address(host, node_address) and (host in other_nodes or _loopback(host)):
        return None
    address = node_address if host is None or _same_address(host, node_address) else host
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"  # an IPv6 address in a URL
    flag = engine.port(args)
    port = flag if flag in server.ports or not server.ports else server.ports[0]
    how = f"port {port}" if server.port_source == "socket" else (
        f"port {port} from --port" if flag_value(args, "--port") else f"port {port}, {engine.name}'s default")
    return ProcessEngine(url=f"http://{address}:{port}", port=port, host=host,
                         found=f"process {server.pid} ({server.command}, {how})", kind=engine.id,
                         topology=engine.layout(args).name, model=engine.served_model(args), argv=list(args))


def parse_probe(name: str, text: str, prev_cpu: tuple[int, int] | None,
                gpu_query: str = GPU_QUERY_REASONS, sections: dict | None = None,
                t: float | None = None) -> NodeSnapshot:
    """`sections`: `split_sections(text)` when the caller has it already; `t`: the snapshot's (epoch)
    time, now by default."""
    sections = split_sections(text) if sections is None else sections
    snap = NodeSnapshot(name=name, t=time.time() if t is None else t, state="ok")
    body, _, _ = sections.get("meminfo", ("", None, False))
    try:
        snap.memory = hostparse.parse_meminfo(body)
    except ValueError:
        snap.memory = None
    cpu = hostparse.parse_proc_stat_cpu(sections.get("stat", ("", None, False))[0])
    snap.cpu_pct = hostparse.cpu_percent(prev_cpu, cpu)
    snap._cpu_raw = cpu  # type: ignore[attr-defined]

    gpu_body, gpu_rc, gpu_missing = sections.get("gpu", ("", None, True))
    if gpu_missing:
        snap.gpu_status = "missing"
    elif gpu_rc not in (0, None):
        snap.gpu_status = _first_line(gpu_body) or f"nvidia-smi exited {gpu_rc}"
    else:
        try:
            snap.gpu = hostparse.parse_gpu_query(gpu_body, tuple(gpu_query.split(",")))
            snap.gpu_status = "ok"
        except ValueError as exc:
            snap.gpu_status = f"unreadable nvidia-smi output: {exc}"
        apps_body, apps_rc, _ = sections.get("apps", ("", None, False))
        if apps_rc in (0, None):
            snap.processes = hostparse.parse_compute_apps(apps_body)
            cgroups = hostparse.parse_pid_cgroups(sections.get("appcg", ("", None, False))[0])
            for proc in snap.processes:
                proc.container_id = cgroups.get(proc.pid)
    if "servers" in sections:
        snap.servers = hostparse.parse_server_processes(sections["servers"][0])
        snap.servers_rss_mib = hostparse.servers_memory_mib(sections["servers"][0])

    docker_body, docker_rc, docker_missing = sections.get("docker", ("", None, True))
    if docker_missing:
        snap.docker_status = "missing"
    elif docker_rc not in (0, None):
        snap.docker_status = hostparse.docker_problem(_first_line(docker_body), docker_rc)
    else:
        snap.docker_status = "ok"
        snap.containers = hostparse.parse_docker_ps(docker_body)
    return snap


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _first_line_of(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.readline().rstrip("\n")
    except OSError:
        return ""


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


# -- engines inside containers ------------------------------------------------------


@dataclass
class DiscoveredEngine:
    url: str
    port: int
    host: str | None  # the address the engine bound, when it named one
    container: str
    kind: str = DEFAULT  # the engine its command or image suggests; what it answers decides
    topology: str | None = None
    model: str | None = None
    argv: list[str] | None = None
    image: str | None = None  # the container's image: names the engine's build (the stack a prediction uses)
    serves: dict[str, str] = field(default_factory=dict)  # what its launch labelled it with (`labels.PREDICTION`)


def _split(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


_ROUTER_PROGRAMS = engine_ids.get(ROUTER).programs


def container_argv(container: Container) -> list[str]:
    """The command a container runs; inside `sh -c "... && exec CMD"` or
    `bash -c '...'`, the part that starts a server."""
    args = _split(container.command)
    if len(args) > 2 and args[0].rsplit("/", 1)[-1] in ("sh", "bash") and args[1] in ("-c", "-lc", "-ec"):
        for part in reversed(re.split(r"&&|;|\|\|", args[2])):
            inner = _split(part.strip())
            if inner and inner[0] == "exec":
                inner = inner[1:]
            if inner and (engines.for_command(inner) is not None or any(p in part for p in _ROUTER_PROGRAMS)):
                return inner
    return args


def engines_in(container: Container, node_address: str) -> DiscoveredEngine | None:
    """The API endpoint a container serves (or served, if it has exited)."""
    labels = container.labels
    if labels.get("sparktop.endpoint"):
        url = labels["sparktop.endpoint"]
        port = int(url.rsplit(":", 1)[-1].split("/")[0]) if url.count(":") >= 2 else 80
        return DiscoveredEngine(url=url, port=port, host=None, container=container.name,
                                kind=labels.get("sparktop.kind", DEFAULT),
                                topology=from_label(labels.get("sparktop.topology")),
                                model=labels.get("sparktop.model"), argv=container_argv(container),
                                image=container.image or None, serves=prediction_labels(labels))
    args = container_argv(container)
    if not args:
        return None
    found = engines.for_command(args)
    if found is None:
        # An image whose entrypoint is the server (`ollama/ollama`: "/bin/ollama serve" may be cut off).
        by_image = engines.for_image(container.image) if container.image else None
        if by_image is None or by_image.image_needs is not None and by_image.image_needs not in args:
            return None
        engine: type[engines.Engine] = by_image
    else:
        engine = found[0]
    if engine.is_worker(args):
        return None  # a worker of an engine over several nodes: no API of its own
    port = engine.port(args)
    host = engine.host(args)
    address = host or node_address
    return DiscoveredEngine(url=f"http://{address}:{port}", port=port, host=host, container=container.name,
                            kind=engine.id,
                            topology=None if engine.router else engine.layout(args).name,
                            model=None if engine.router else engine.served_model(args), argv=args,
                            image=container.image or None)
