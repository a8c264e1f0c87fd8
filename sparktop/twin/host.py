"""The state of one simulated Spark host, kept in a directory.

Two simulated hosts on one machine stay apart because each has its own
directory, named by `$SPARKTOP_TWIN_HOME`. Everything the stand-ins need to
agree on lives there:

    config.json        host name, memory, speed-up factor, images
    procs/<pid>.json   processes using the GPU (vLLM engines, Ray workers):
                       name, memory, utilisation, updated periodically
    containers/<name>.json  what `docker` started
    proc/meminfo       a GB10-like /proc/meminfo, rewritten when memory changes
    sys/class/net/<if>/operstate, mtu  the network interfaces a Spark has
                       (the ConnectX-7 fabric ports, the RJ45 port and lo), for
                       preflight's check; with their speed, their RoCE devices
                       under sys/class/infiniband and both kinds of traffic
                       counters (link.py, which moves them)
    sys/class/dmi/id/  the maker's names for the box (`VARIANTS`: NVIDIA's
                       DGX Spark or one of the other GB10 machines)
    proc/<pid>/cgroup  for each GPU process: the container it runs in, as
                       Docker's cgroup (or a user session outside one)
    config.json "unreachable"  fabric addresses this host's `ping` gets no
                       reply from (a cable that is out, a switch port down)
    config.json "sm_clock_cap"  the MHz its GPU's SM clock is held under with
                       no clock event reason (`set_clock_cap`: bad USB-C power)
    disk               its disk's size and free bytes, `<total> <free>`, which
                       the `df` stand-in answers for every path (`set_disk`)
    ray/               the Ray stand-in's head address and members
    net/               the interfaces' traffic counters and `ethtool -S` texts (link.py)

Files are replaced atomically (write then rename) so readers never see half.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from sparktop.twin import link

ENV_HOME = "SPARKTOP_TWIN_HOME"
ENV_PROC_ROOT = "SPARKTOP_PROC_ROOT"
ENV_SYS_ROOT = "SPARKTOP_SYS_ROOT"
ENV_CONTAINER = "SPARKTOP_TWIN_CONTAINER"  # set in a twin container's processes: the container's name
# A Spark's QSFP ports as `ip link` names them (one cable, in the second
# port: both its halves up, as in the ibdev2netdev captures), its RJ45 port
# and loopback.
INTERFACES = {"enp1s0f0np0": "down", "enp1s0f1np1": "up", "enP2p1s0f0np0": "down", "enP2p1s0f1np1": "up",
              "enP7s7": "up", "lo": "unknown"}
# The GB10 machines, as their firmware names them in /sys/class/dmi/id.
# NVIDIA's, ASUS's, Dell's and Lenovo's as real units report them
# (tests/fixtures/dmi/, SOURCES.md: `NVIDIA_DGX_Spark` with underscores,
# ASUS's bare `GX10`, Dell's `Dell  Inc.` with two spaces, Lenovo's
# machine-type-model); HP's, MSI's, GIGABYTE's and Acer's are not published
# and follow their makers' usual style. `product_family` is the platform's
# on every one (the twin keeps it on Lenovo's too, where it was not seen).
PRODUCT_FAMILY = "DGX Spark"
VARIANTS: dict[str, dict[str, str]] = {
    "nvidia": {"sys_vendor": "NVIDIA", "product_name": "NVIDIA_DGX_Spark", "product_version": "A.7",
               "board_vendor": "NVIDIA", "board_name": "P4242", "bios_vendor": "NVIDIA",
               "bios_version": "5.36_0ACUM018"},
    "asus": {"sys_vendor": "ASUSTeK COMPUTER INC.", "product_name": "GX10", "product_version": "5.36_GX10DGX",
             "board_vendor": "ASUSTeK COMPUTER INC.", "board_name": "GX10", "bios_vendor": "American Megatrends",
             "bios_version": "5.36_GX10DGX"},
    "dell": {"sys_vendor": "Dell  Inc.", "product_name": "Dell Pro Max with GB10 FCM1253", "product_version": "",
             "board_vendor": "Dell  Inc.", "board_name": "0DA7", "bios_vendor": "Dell Inc.",
             "bios_version": "1.2.0"},
    "hp": {"sys_vendor": "HP", "product_name": "HP ZGX Nano G1n AI Station", "product_version": "",
           "board_vendor": "HP", "board_name": "8E3B", "bios_vendor": "HP", "bios_version": "Z10 Ver. 01.01.03"},
    "lenovo": {"sys_vendor": "LENOVO", "product_name": "30KL0005GF", "product_version": "ThinkStation PGX",
               "board_vendor": "LENOVO", "board_name": "30KL", "bios_vendor": "LENOVO", "bios_version": "2.0.14"},
    "msi": {"sys_vendor": "Micro-Star International Co., Ltd.", "product_name": "EdgeXpert MS-C931",
            "product_version": "1.0", "board_vendor": "Micro-Star International Co., Ltd.",
            "board_name": "MS-C9311", "bios_vendor": "American Megatrends International, LLC.",
            "bios_version": "1.10"},
    "gigabyte": {"sys_vendor": "GIGABYTE", "product_name": "AI TOP ATOM", "product_version": "1.0",
                 "board_vendor": "GIGABYTE", "board_name": "AT1-GB10", "bios_vendor": "GIGABYTE",
                 "bios_version": "F2"},
    "acer": {"sys_vendor": "Acer", "product_name": "Veriton GN100", "product_version": "V1.00",
             "board_vendor": "Acer", "board_name": "GN100", "bios_vendor": "Acer", "bios_version": "V1.04"},
}
# A twin cluster's nodes take these in turn unless told otherwise: two nodes, two makers.
VARIANT_ORDER = ("nvidia", "asus", "dell", "hp", "lenovo", "msi", "gigabyte", "acer")
GB10_MEM_TOTAL_KB = 125_441_420  # `free -b` on a Spark: 128452014080 bytes
GB10_SWAP_KB = 16_777_212
BASE_USED_KB = 4_300_000  # OS, desktop and services on an idle Spark
# One filesystem for everything, as on a Spark: its 4 TB NVMe drive's second partition, which published setups show
# as `/dev/nvme0n1p2  3.7T  123G  3.4T   4% /` in `df -h` (beside a 512M /boot/efi); no `df -P` of one was found,
# so the bytes are those sizes': 3.7T as df -h rounds up, and 3.4T left a few models in (ext4 keeps 5 % for root).
DISK_TOTAL_B = 3_965_000_000_000
DISK_FREE_B = 3_700_000_000_000


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def read_json(path: Path, default=None):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@dataclass
class GpuProcess:
    pid: int
    name: str
    used_mib: int
    util: float
    cache_mib: int = 0  # page cache the process's weights keep warm


class TwinHost:
    def __init__(self, home: str | Path):
        self.home = Path(home)

    @classmethod
    def from_env(cls) -> TwinHost | None:
        home = os.environ.get(ENV_HOME)
        return cls(home) if home else None

    # -- config ---------------------------------------------------------------

    def setup(self, name: str, speed: float = 1.0, images: list | None = None,
              address: str = "127.0.0.1", startup_speed: float | None = None, variant: str | None = None) -> None:
        for sub in ("procs", "containers", "proc", "ray", "logs", "hf-cache", "net"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        for interface, state in INTERFACES.items():
            if not (self.home / "sys/class/net" / interface / "operstate").exists():
                self.set_interface(interface, state)
            elif (found := self.interface(interface)) and not (self.home / "sys/class/net" / interface /
                                                                 "speed").exists():
                link.set_port(self.home, interface, found[0])  # a host set up before its ports had RoCE devices
        link.init(self.home, sorted(INTERFACES))
        config = self.config
        variant = variant or config.get("variant") or VARIANT_ORDER[0]
        if variant not in VARIANTS:
            raise ValueError(f"unknown GB10 variant {variant!r} (one of {', '.join(VARIANTS)})")
        self._write_dmi(variant)
        config.update({"name": name, "speed": speed, "address": address, "variant": variant})
        if startup_speed:
            config["startup_speed"] = startup_speed
        if images is not None:
            config["images"] = images
        write_json(self.home / "config.json", config)
        self.write_meminfo()
        if self.disk() is None:
            self.set_disk(DISK_FREE_B, DISK_TOTAL_B)

    @property
    def config(self) -> dict:
        return read_json(self.home / "config.json", {}) or {}

    @property
    def name(self) -> str:
        return self.config.get("name", "twin")

    @property
    def speed(self) -> float:
        return float(self.config.get("speed", 1.0))

    @property
    def address(self) -> str:
        return self.config.get("address", "127.0.0.1")

    @property
    def images(self) -> list[str]:
        return list(self.config.get("images", []))

    @property
    def variant(self) -> str:
        return self.config.get("variant", VARIANT_ORDER[0])

    def _write_dmi(self, variant: str) -> None:
        dmi = self.home / "sys/class/dmi/id"
        dmi.mkdir(parents=True, exist_ok=True)
        for field, value in {**VARIANTS[variant], "product_family": PRODUCT_FAMILY}.items():
            tmp = dmi / f".{field}.{os.getpid()}.tmp"
            tmp.write_text(value + "\n")
            os.replace(tmp, dmi / field)

    def set_interface(self, interface: str, state: str, mtu: int | None = None) -> None:
        """Bring a simulated interface up or down (`operstate`: up, down,
        unknown), and set its MTU (1500 until said otherwise, as on a Spark
        out of the box). Its speed and its RoCE device's port state follow."""
        path = self.home / "sys/class/net" / interface / "operstate"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(state + "\n")
        mtu_path = path.with_name("mtu")
        if mtu is not None or not mtu_path.exists():
            mtu_path.write_text(f"{mtu or (65536 if interface == 'lo' else 1500)}\n")
        link.set_port(self.home, interface, state)

    def interface(self, interface: str) -> tuple[str, int] | None:
        """An interface's operstate and MTU; None when the host has no such interface."""
        d = self.home / "sys/class/net" / interface
        try:
            state = (d / "operstate").read_text().strip()
        except OSError:
            return None
        try:
            mtu = int((d / "mtu").read_text())
        except (OSError, ValueError):
            mtu = 1500
        return state, mtu

    def cut_link(self, address: str, cut: bool = True) -> None:
        """Stop (or restore) replies from a peer's fabric address to this host's pings."""
        config = self.config
        unreachable = set(config.get("unreachable", []))
        unreachable = unreachable | {address} if cut else unreachable - {address}
        config["unreachable"] = sorted(unreachable)
        write_json(self.home / "config.json", config)

    @property
    def unreachable(self) -> set[str]:
        return set(self.config.get("unreachable", []))

    # -- faults a test sets -----------------------------------------------------

    def set_clock_cap(self, mhz: int | None) -> None:
        """Hold the GPU's SM clock under `mhz` with no clock event reason, its power falling with it, as a Spark
        whose USB-C power delivery went wrong does (None: lift it). What the twin's nvidia-smi answers."""
        config = self.config
        if mhz is None:
            config.pop("sm_clock_cap", None)
        else:
            config["sm_clock_cap"] = int(mhz)
        write_json(self.home / "config.json", config)

    def set_disk(self, free: int, total: int | None = None) -> None:
        """The bytes left on the host's disk (and its size, kept unless given): what its `df` says for every
        path. A plain `<total> <free>` line, which the stand-in reads with shell builtins."""
        total = total if total is not None else (self.disk() or (DISK_TOTAL_B, 0))[0]
        free = max(0, min(int(free), int(total)))
        path = self.home / "disk"
        tmp = path.with_name(f".disk.{os.getpid()}.tmp")
        tmp.write_text(f"{int(total)} {free}\n")
        os.replace(tmp, path)

    def disk(self) -> tuple[int, int] | None:
        """(total, free) bytes of the host's disk; None before it is set up."""
        try:
            total, free = (self.home / "disk").read_text().split()
            return int(total), int(free)
        except (OSError, ValueError):
            return None

    # -- GPU processes --------------------------------------------------------

    def register(self, pid: int, name: str, used_mib: int, util: float = 0.0, cache_mib: int = 0) -> None:
        try:
            pgid = os.getpgid(pid)  # the container's process group: `docker rm` waits for it to go
        except OSError:
            pgid = None
        write_json(self.home / "procs" / f"{pid}.json", {
            "pid": pid, "pgid": pgid, "name": name, "used_mib": int(used_mib), "util": util,
            "cache_mib": int(cache_mib), "updated": time.time(),
        })
        if pid == os.getpid():
            self._write_cgroup(pid, os.environ.get(ENV_CONTAINER))
        self.write_meminfo()

    def _write_cgroup(self, pid: int, container: str | None) -> None:
        """`$SPARKTOP_PROC_ROOT/<pid>/cgroup` as the kernel shows it (cgroup v2,
        systemd's driver): Docker's scope named by the container's full id,
        or the user's session for a process outside any container."""
        record = read_json(self.home / "containers" / f"{container}.json") if container else None
        cid = (record or {}).get("id")
        line = f"0::/system.slice/docker-{cid}.scope" if cid else \
            f"0::/user.slice/user-{os.getuid()}.slice/session-1.scope"
        path = self.home / "proc" / str(pid) / "cgroup"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".cgroup.{os.getpid()}.tmp")
        tmp.write_text(line + "\n")
        os.replace(tmp, path)

    def _forget_cgroup(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            (self.home / "proc" / str(pid) / "cgroup").unlink()
            (self.home / "proc" / str(pid)).rmdir()

    def update_util(self, pid: int, util: float) -> None:
        path = self.home / "procs" / f"{pid}.json"
        data = read_json(path)
        if data is not None:
            data["util"] = util
            data["updated"] = time.time()
            write_json(path, data)

    def unregister(self, pid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.home / "procs" / f"{pid}.json").unlink()
        self._forget_cgroup(pid)
        self.write_meminfo()

    def processes(self) -> list[GpuProcess]:
        out, gone = [], False
        for path in sorted((self.home / "procs").glob("*.json")):
            data = read_json(path)
            if not data:
                continue
            if not pid_alive(int(data["pid"])):
                path.unlink(missing_ok=True)  # killed without unregistering: its memory is free again
                self._forget_cgroup(int(data["pid"]))
                gone = True
                continue
            # A process that stopped reporting is idle, not busy forever.
            util = data.get("util", 0.0) if time.time() - data.get("updated", 0) < 5 else 0.0
            out.append(GpuProcess(int(data["pid"]), data["name"], int(data["used_mib"]), util,
                                  int(data.get("cache_mib", 0))))
        if gone:
            self.write_meminfo()
        return out

    def release(self, pgids: set[int], timeout: float = 5.0) -> None:
        """After a kill: wait until the GPU processes of these process groups are
        gone, then show their memory as free, as the kernel does at once."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            held = [path for path in (self.home / "procs").glob("*.json")
                    if (read_json(path) or {}).get("pgid") in pgids and pid_alive(int(path.stem))]
            if not held:
                break
            time.sleep(0.05)
        self.processes()
        self.write_meminfo()

    def used_mib(self, exclude_pid: int | None = None) -> int:
        return sum(p.used_mib for p in self.processes() if p.pid != exclude_pid)

    def gpu_util(self) -> float:
        return min(1.0, sum(p.util for p in self.processes()))

    # -- memory ---------------------------------------------------------------

    def meminfo_text(self) -> str:
        procs = self.processes()
        used_kb = BASE_USED_KB + sum(p.used_mib for p in procs) * 1024
        cached_kb = 2_100_000 + sum(p.cache_mib for p in procs) * 1024
        total = GB10_MEM_TOTAL_KB
        used_kb = min(used_kb, total - 200_000)
        cached_kb = min(cached_kb, total - used_kb - 150_000)
        buffers_kb = 95_000
        free_kb = max(0, total - used_kb - cached_kb - buffers_kb)
        available_kb = free_kb + int(cached_kb * 0.95) + buffers_kb
        fields = [
            ("MemTotal", total), ("MemFree", free_kb), ("MemAvailable", available_kb),
            ("Buffers", buffers_kb), ("Cached", cached_kb), ("SwapCached", 0),
            ("Active", used_kb // 2), ("Inactive", cached_kb), ("Shmem", 60_000),
            ("SwapTotal", GB10_SWAP_KB), ("SwapFree", GB10_SWAP_KB),
        ]
        return "".join(f"{k + ':':<16}{v:>8} kB\n" for k, v in fields)

    def write_meminfo(self) -> None:
        path = self.home / "proc" / "meminfo"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".meminfo.{os.getpid()}.tmp")
        tmp.write_text(self.meminfo_text())
        os.replace(tmp, path)

    def env(self, bin_dir: str | Path) -> dict[str, str]:
        """Environment that makes a shell on this machine act as this host."""
        return {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            ENV_HOME: str(self.home),
            ENV_PROC_ROOT: str(self.home / "proc"),
            ENV_SYS_ROOT: str(self.home / "sys"),
        }
