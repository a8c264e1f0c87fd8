"""One poll of one node: a single shell round trip through its transport.

The probe script prints sections (`@@name`), each the output of one read:
meminfo, the first line of /proc/stat, two nvidia-smi queries and
`docker ps`. A missing tool prints `@@missing` for its section, which the
monitor shows as a state rather than an error. The meminfo path can be
redirected with `$SPARKTOP_PROC_ROOT` (the twin's simulated hosts use it);
on a real node it is /proc.
"""

from __future__ import annotations

import shlex
import shutil
import time
from dataclasses import dataclass, field

from sparktop.observe import hostparse
from sparktop.observe.snapshot import Container, NodeSnapshot
from sparktop.remote import Transport
from sparktop.remote.local import LocalTransport

GPU_QUERY = "name,utilization.gpu,temperature.gpu,power.draw,clocks.sm,pstate"
APPS_QUERY = "pid,process_name,used_memory"

# Shell builtins where a command would do (`read` for the first line of
# /proc/stat): every process started on the node costs it CPU each poll.
_SCRIPT_FILES = (
    'echo @@meminfo; cat "${SPARKTOP_PROC_ROOT:-/proc}/meminfo" 2>&1; '
    "echo @@stat; read -r l < /proc/stat && echo \"$l\"; "
)
_SCRIPT_GPU = (
    "if command -v nvidia-smi >/dev/null 2>&1; then "
    f"echo @@gpu; nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits 2>&1; echo \"@@rc $?\"; "
    f"echo @@apps; nvidia-smi --query-compute-apps={APPS_QUERY} --format=csv,noheader,nounits 2>&1; "
    'echo "@@rc $?"; '
    "else echo @@gpu; echo @@missing; fi; "
)
_SCRIPT_DOCKER = (
    "if command -v docker >/dev/null 2>&1; then "
    "echo @@docker; docker ps -a --no-trunc --format '{{json .}}' 2>&1; echo \"@@rc $?\"; "
    "else echo @@docker; echo @@missing; fi; "
)
_SCRIPT_HEAD = _SCRIPT_FILES + _SCRIPT_GPU
PROBE_SCRIPT = _SCRIPT_HEAD + _SCRIPT_DOCKER + "echo @@end"
PROBE_SCRIPT_NO_DOCKER = _SCRIPT_HEAD + "echo @@end"
# `docker ps` is most of a poll's cost on the node (a Go binary and a daemon
# round trip, ~10 ms of CPU): the container list is read at most this often,
# and at once when the poller asks (an engine stopped answering).
DOCKER_EVERY_S = 3.0
# A docker that fails (no daemon, no permission, not installed) is asked again
# this rarely: its CLI costs as much to fail as to answer.
DOCKER_RETRY_S = 30.0


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
    _prev_cpu: tuple[int, int] | None = field(default=None, repr=False)
    _docker_at: float | None = field(default=None, repr=False)
    _docker: tuple[str, list[Container]] | None = field(default=None, repr=False)
    _tools: tuple[bool, bool] | None = field(default=None, repr=False)  # nvidia-smi, docker (local node)

    def refresh_docker(self) -> None:
        """Read the container list on the next poll (something changed)."""
        self._docker_at = None

    async def poll(self) -> NodeSnapshot:
        started = time.monotonic()
        every = self.docker_every if self._docker is None or self._docker[0] == "ok" else DOCKER_RETRY_S
        docker_due = self._docker is None or self._docker_at is None or started - self._docker_at >= every - 0.05
        if isinstance(self.transport, LocalTransport):
            text, ok, why = await self._read_here(docker_due)
        else:
            result = await self.transport.run(PROBE_SCRIPT if docker_due else PROBE_SCRIPT_NO_DOCKER,
                                              timeout=self.timeout)
            text, ok, why = result.stdout, "@@end" in result.stdout, \
                f"exit {result.exit_status}: {result.first_error_line()}"
        snap = parse_probe(self.name, text, self._prev_cpu)
        self._prev_cpu = snap._cpu_raw  # type: ignore[attr-defined]
        if docker_due:
            self._docker_at = started
            self._docker = (snap.docker_status, snap.containers)
        elif self._docker is not None:
            snap.docker_status, snap.containers = self._docker[0], list(self._docker[1])
        snap.poll_ms = (time.monotonic() - started) * 1000
        if not ok:
            raise RuntimeError(f"probe did not finish ({why})")
        return snap

    async def _read_here(self, docker_due: bool) -> tuple[str, bool, str]:
        """The probe's sections for the node sparktop runs on: the /proc files
        read in-process (a monitor left open all day should not start a shell
        and `cat` every second), the tools run only when they exist here."""
        assert isinstance(self.transport, LocalTransport)
        env = self.transport.environ
        if self._tools is None:
            path = env.get("PATH")
            self._tools = (shutil.which("nvidia-smi", path=path) is not None,
                           shutil.which("docker", path=path) is not None)
        gpu, docker = self._tools
        root = env.get("SPARKTOP_PROC_ROOT") or "/proc"
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
        script = (_SCRIPT_GPU if gpu else "") + (_SCRIPT_DOCKER if docker and docker_due else "")
        if not gpu:
            text += "@@gpu\n@@missing\n"
        if docker_due and not docker:
            text += "@@docker\n@@missing\n"
        if not script:
            return text + "@@end\n", True, ""
        result = await self.transport.run(script + "echo @@end", timeout=self.timeout)
        return text + result.stdout, "@@end" in result.stdout, \
            f"exit {result.exit_status}: {result.first_error_line()}"


def parse_probe(name: str, text: str, prev_cpu: tuple[int, int] | None) -> NodeSnapshot:
    sections = split_sections(text)
    snap = NodeSnapshot(name=name, t=time.time(), state="ok")
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
            snap.gpu = hostparse.parse_gpu_query(gpu_body, tuple(GPU_QUERY.split(",")))
            snap.gpu_status = "ok"
        except ValueError as exc:
            snap.gpu_status = f"unreadable nvidia-smi output: {exc}"
        apps_body, apps_rc, _ = sections.get("apps", ("", None, False))
        if apps_rc in (0, None):
            snap.processes = hostparse.parse_compute_apps(apps_body)

    docker_body, docker_rc, docker_missing = sections.get("docker", ("", None, True))
    if docker_missing:
        snap.docker_status = "missing"
    elif docker_rc not in (0, None):
        line = _first_line(docker_body) or f"docker exited {docker_rc}"
        snap.docker_status = "permission denied" if "permission denied" in line.lower() else line
    else:
        snap.docker_status = "ok"
        snap.containers = hostparse.parse_docker_ps(docker_body)
    return snap


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
    kind: str = "vllm"
    topology: str | None = None
    model: str | None = None


def _flag(args: list[str], *names: str) -> str | None:
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def engines_in(container: Container, node_address: str) -> DiscoveredEngine | None:
    """The API endpoint a container serves (or served, if it has exited)."""
    labels = container.labels
    if labels.get("sparktop.endpoint"):
        url = labels["sparktop.endpoint"]
        port = int(url.rsplit(":", 1)[-1].split("/")[0]) if url.count(":") >= 2 else 80
        return DiscoveredEngine(url=url, port=port, host=None, container=container.name,
                                kind=labels.get("sparktop.kind", "vllm"), topology=labels.get("sparktop.topology"),
                                model=labels.get("sparktop.model"))
    try:
        args = shlex.split(container.command)
    except ValueError:
        args = container.command.split()
    if not args:
        return None
    text = " ".join(args)
    if "--headless" in args:
        return None  # a TP worker: no API of its own
    is_vllm = "serve" in args and ("vllm" in text or "vllm" in container.image)
    is_router = "litellm" in text
    if not (is_vllm or is_router):
        return None
    port = int(_flag(args, "--port") or (4000 if is_router and not is_vllm else 8000))
    host = _flag(args, "--host")
    if host in (None, "0.0.0.0", "::", ""):
        host = None
    address = host or node_address
    topology = None
    model = None
    if is_vllm:
        model = _flag(args, "--served-model-name") or _flag(args, "--model")
        if model is None:
            after = args[args.index("serve") + 1:]
            model = next((a for a in after if not a.startswith("-")), None)
        tp = _flag(args, "-tp", "--tensor-parallel-size")
        if tp and tp != "1":
            backend = _flag(args, "--distributed-executor-backend")
            topology = "cluster-ray" if backend == "ray" else "cluster-mp"
        else:
            topology = "solo"
    return DiscoveredEngine(url=f"http://{address}:{port}", port=port, host=host, container=container.name,
                            kind="router" if is_router and not is_vllm else "vllm", topology=topology,
                            model=model)
