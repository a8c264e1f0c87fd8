"""The fabric of a simulated Spark: its ConnectX-7 ports and what moves over them.

A Spark's QSFP port shows as two interfaces, one per PCIe Gen5 x4 half of
its ConnectX-7 (`enp1s0f1np1` and `enP2p1s0f1np1` for the cabled port), each
with a RoCE device (`rocep1s0f1`, `roceP2p1s0f1`). Each simulated host keeps,
under its home, what a monitor reads on a Spark:

    sys/class/net/<if>/statistics/{rx,tx}_{bytes,packets}   kernel traffic (TCP/IP through the interface)
    sys/class/net/<if>/speed        Mb/s: 200000 on an up CX-7 half, 10000 on the RJ45 port, -1 when down
    sys/class/infiniband/<dev>/ports/1/state                `4: ACTIVE` or `1: DOWN`
    sys/class/infiniband/<dev>/ports/1/counters/port_{xmit,rcv}_{data,packets}
                                    RDMA traffic; data in 4-byte words, as mlx5 counts it
    sys/class/infiniband/<dev>/device/net/<if>              the interface the device drives
    net/<if>.ethtool                what the `ethtool -S <if>` stand-in prints (mlx5's counter names)
    net/counters.json               the counters themselves; the files above are views of them

An engine over several hosts moves its all-reduce bytes where its NCCL
would (`LinkTraffic`), on each host it spans: over RDMA on the active HCAs
that `NCCL_IB_HCA` allows, split evenly (both halves of the cable by
default), or over TCP on `NCCL_SOCKET_IFNAME`'s interface when
`NCCL_IB_DISABLE=1`, `NCCL_NET=Socket` or no HCA is usable (the kernel
counters move, with TCP/IP framing; the RDMA ones stand still). NCCL's
bootstrap and the rendezvous store keep a few KB/s on the socket interface
either way. The RJ45 management port (`enP7s7`) ticks slowly with ssh and
HTTP whenever the counters are touched.

Counters only grow; every change happens under a lock (`net/.lock`) and
every file is replaced atomically (write, then rename).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

# A Spark's RoCE devices and the interfaces they drive (ibdev2netdev's pairs).
RDMA_DEVICES = {"rocep1s0f0": "enp1s0f0np0", "rocep1s0f1": "enp1s0f1np1",
                "roceP2p1s0f0": "enP2p1s0f0np0", "roceP2p1s0f1": "enP2p1s0f1np1"}
NETDEV_RDMA = {netdev: dev for dev, netdev in RDMA_DEVICES.items()}
MANAGEMENT = "enP7s7"  # the RJ45 10GbE port
CX7_SPEED_MBPS = 200_000  # each half of a cabled QSFP port, as `ethtool` and /sys show it
MANAGEMENT_SPEED_MBPS = 10_000
PCI = {"enp1s0f0np0": "0000:01:00.0", "enp1s0f1np1": "0000:01:00.1", "enP2p1s0f0np0": "0002:01:00.0",
       "enP2p1s0f1np1": "0002:01:00.1", MANAGEMENT: "0007:01:00.0"}
KERNEL = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")
RDMA = ("rdma_rx_bytes", "rdma_tx_bytes", "rdma_rx_packets", "rdma_tx_packets")
# Background traffic, bytes per second each way: the management port's ssh
# and HTTP; NCCL's bootstrap and the rendezvous store on an engine's socket
# interface (what moves there while NCCL runs over RDMA).
MANAGEMENT_BPS = {"rx_bytes": 1400.0, "tx_bytes": 900.0}
CONTROL_BPS = 2500.0
MANAGEMENT_PACKET = 120  # bytes per management packet, on average
CONTROL_PACKET = 180  # bytes per control-plane packet, on average
TICK_EVERY_S = 1.0  # `tick` (the nvidia-smi stand-in) rewrites the counters at most this often
# TCP/IPv4 with timestamps over Ethernet: 66 bytes of headers a segment
# (14 + 20 + 32), a payload of MTU - 52; an ACK (66 bytes) every other segment.
TCP_HEADERS = 66
TCP_MSS_OVERHEAD = 52


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


# -- the ports ------------------------------------------------------------------


def set_port(home: Path, netdev: str, state: str) -> None:
    """An interface's speed, and its RDMA device's port state, for the
    interface's operstate (`up` or `down`); the device's files are created
    on first use."""
    sys_root = home / "sys"
    if netdev == "lo":
        return
    up = state == "up"
    speed = (CX7_SPEED_MBPS if netdev in NETDEV_RDMA else MANAGEMENT_SPEED_MBPS) if up else -1
    _write(sys_root / "class/net" / netdev / "speed", f"{speed}\n")
    dev = NETDEV_RDMA.get(netdev)
    if dev is None:
        return
    ib = sys_root / "class/infiniband" / dev
    drives = ib / "device/net" / netdev
    if not drives.is_symlink() and not drives.exists():
        drives.parent.mkdir(parents=True, exist_ok=True)
        drives.symlink_to(Path("../../../../net") / netdev)
    port = ib / "ports/1"
    _write(port / "state", "4: ACTIVE\n" if up else "1: DOWN\n")
    _write(port / "phys_state", "5: LinkUp\n" if up else "3: Disabled\n")
    _write(port / "rate", "200 Gb/sec (4X HDR)\n" if up else "10 Gb/sec (4X SDR)\n")
    if not (port / "link_layer").exists():
        _write(port / "link_layer", "Ethernet\n")


def active_hcas(home: Path) -> list[str]:
    """RoCE devices whose port is ACTIVE, the primary (`rocep1…`) halves first."""
    out = []
    for dev in RDMA_DEVICES:
        if "ACTIVE" in _read(home / "sys/class/infiniband" / dev / "ports/1/state"):
            out.append(dev)
    return sorted(out, key=lambda d: (not d.startswith("rocep1"), d))


def up_interfaces(home: Path) -> list[str]:
    try:
        names = sorted(p.name for p in (home / "sys/class/net").iterdir())
    except OSError:
        return []
    return [n for n in names if _read(home / "sys/class/net" / n / "operstate") == "up"]


def mtu(home: Path, netdev: str) -> int:
    try:
        return int(_read(home / "sys/class/net" / netdev / "mtu", "1500"))
    except ValueError:
        return 1500


def roce_mtu(netdev_mtu: int) -> int:
    """The RoCE path MTU an interface's MTU allows (1024 at 1500, 4096 from 4200 up)."""
    return max([m for m in (256, 512, 1024, 2048, 4096) if m + 100 <= netdev_mtu] or [256])


# -- the counters ---------------------------------------------------------------


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    path = home / "net" / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _state_path(home: Path) -> Path:
    return home / "net" / "counters.json"


def _load(home: Path) -> dict:
    try:
        state = json.loads(_state_path(home).read_text())
    except (OSError, ValueError):
        state = {}
    state.setdefault("t", time.time())
    state.setdefault("if", {})
    return state


def counters(home: Path, netdev: str) -> dict[str, int]:
    """One interface's counters: the kernel's (`rx_bytes`, ...) and RDMA's (`rdma_rx_bytes`, ...)."""
    values = _load(home)["if"].get(netdev, {})
    return {k: int(values.get(k, 0)) for k in KERNEL + RDMA}


def ethtool_text(netdev: str, c: Mapping[str, int]) -> str:
    """`ethtool -S` of an interface, in its driver's names (mlx5 for the
    ConnectX-7 halves: the kernel's counters, then the vport's, RDMA among
    them, then the port's, which count everything on the wire)."""
    k = {name: int(c.get(name, 0)) for name in KERNEL}
    r = {name: int(c.get("rdma_" + name, 0)) for name in KERNEL}
    if netdev not in NETDEV_RDMA:
        rows = [("rx_packets", k["rx_packets"]), ("tx_packets", k["tx_packets"]), ("rx_bytes", k["rx_bytes"]),
                ("tx_bytes", k["tx_bytes"]), ("rx_errors", 0), ("tx_errors", 0), ("rx_missed", 0),
                ("align_errors", 0), ("tx_single_collisions", 0), ("tx_multi_collisions", 0),
                ("rx_unicast", k["rx_packets"]), ("rx_broadcast", 0), ("rx_multicast", 0)]
    else:
        wire_rx = k["rx_packets"] + r["rx_packets"]
        wire_tx = k["tx_packets"] + r["tx_packets"]
        rows = [
            ("rx_packets", k["rx_packets"]), ("rx_bytes", k["rx_bytes"]),
            ("tx_packets", k["tx_packets"]), ("tx_bytes", k["tx_bytes"]),
            ("tx_tso_packets", 0), ("tx_tso_bytes", 0), ("rx_csum_complete", k["rx_packets"]),
            ("rx_csum_unnecessary", 0), ("tx_csum_partial", k["tx_packets"]), ("rx_xdp_drop", 0),
            ("tx_queue_stopped", 0), ("tx_queue_dropped", 0), ("rx_wqe_err", 0), ("rx_out_of_buffer", 0),
            ("rx_vport_unicast_packets", k["rx_packets"]), ("rx_vport_unicast_bytes", k["rx_bytes"]),
            ("tx_vport_unicast_packets", k["tx_packets"]), ("tx_vport_unicast_bytes", k["tx_bytes"]),
            ("rx_vport_multicast_packets", 0), ("rx_vport_multicast_bytes", 0),
            ("tx_vport_multicast_packets", 0), ("tx_vport_multicast_bytes", 0),
            ("rx_vport_broadcast_packets", 0), ("rx_vport_broadcast_bytes", 0),
            ("tx_vport_broadcast_packets", 0), ("tx_vport_broadcast_bytes", 0),
            ("rx_vport_rdma_unicast_packets", r["rx_packets"]), ("rx_vport_rdma_unicast_bytes", r["rx_bytes"]),
            ("tx_vport_rdma_unicast_packets", r["tx_packets"]), ("tx_vport_rdma_unicast_bytes", r["tx_bytes"]),
            ("rx_vport_rdma_multicast_packets", 0), ("rx_vport_rdma_multicast_bytes", 0),
            ("tx_vport_rdma_multicast_packets", 0), ("tx_vport_rdma_multicast_bytes", 0),
            ("tx_packets_phy", wire_tx), ("rx_packets_phy", wire_rx), ("rx_crc_errors_phy", 0),
            # The port counts the frame check sequence too.
            ("tx_bytes_phy", k["tx_bytes"] + r["tx_bytes"] + 4 * wire_tx),
            ("rx_bytes_phy", k["rx_bytes"] + r["rx_bytes"] + 4 * wire_rx),
            ("rx_discards_phy", 0), ("tx_discards_phy", 0), ("tx_errors_phy", 0), ("link_down_events_phy", 0),
        ]
    return "NIC statistics:\n" + "".join(f"     {name}: {value}\n" for name, value in rows)


def _render(home: Path, netdev: str, new: Mapping[str, float], old: Mapping[str, float]) -> None:
    """Rewrite the files of an interface whose counters changed (only those that did)."""
    stats = home / "sys/class/net" / netdev / "statistics"
    for name in KERNEL:
        if int(new.get(name, 0)) != int(old.get(name, -1)):
            _write(stats / name, f"{int(new.get(name, 0))}\n")
    dev = NETDEV_RDMA.get(netdev)
    if dev is not None:
        port = home / "sys/class/infiniband" / dev / "ports/1/counters"
        files = {"port_xmit_data": ("rdma_tx_bytes", 4), "port_rcv_data": ("rdma_rx_bytes", 4),
                 "port_xmit_packets": ("rdma_tx_packets", 1), "port_rcv_packets": ("rdma_rx_packets", 1)}
        for name, (counter, unit) in files.items():
            if int(new.get(counter, 0)) != int(old.get(counter, -1)):
                _write(port / name, f"{int(new.get(counter, 0)) // unit}\n")
    if netdev != "lo":
        _write(home / "net" / f"{netdev}.ethtool", ethtool_text(netdev, {k: int(v) for k, v in new.items()}))


def init(home: Path, interfaces: list[str]) -> None:
    """Every interface's counter files, at their current values (zero on a new host)."""
    with _locked(home):
        state = _load(home)
        for netdev in interfaces:
            values = {k: float(state["if"].get(netdev, {}).get(k, 0)) for k in KERNEL + RDMA}
            state["if"][netdev] = values
            _render(home, netdev, values, {})
        _write(_state_path(home), json.dumps(state, sort_keys=True))


def add(home: Path, deltas: Mapping[str, Mapping[str, float]]) -> None:
    """Add to interfaces' counters (`{netdev: {counter: amount}}`), with the
    management port's background traffic since the counters last moved.
    Counters are kept with their fractions (a packet every so many ticks),
    and shown whole."""
    now = time.time()
    with _locked(home):
        state = _load(home)
        dt = max(0.0, now - float(state["t"]))
        moves: dict[str, dict[str, float]] = {n: dict(d) for n, d in deltas.items()}
        if dt > 0 and (home / "sys/class/net" / MANAGEMENT).exists():
            mgmt = moves.setdefault(MANAGEMENT, {})
            for name, rate in MANAGEMENT_BPS.items():
                packets = name.replace("bytes", "packets")
                mgmt[name] = mgmt.get(name, 0.0) + rate * dt
                mgmt[packets] = mgmt.get(packets, 0.0) + rate * dt / MANAGEMENT_PACKET
        for netdev, delta in moves.items():
            known = netdev in state["if"]
            old = {k: float(state["if"].get(netdev, {}).get(k, 0)) for k in KERNEL + RDMA}
            new = {k: old[k] + max(0.0, float(delta.get(k, 0))) for k in old}
            state["if"][netdev] = new
            _render(home, netdev, new, old if known else {})
        state["t"] = now
        _write(_state_path(home), json.dumps(state, sort_keys=True))


def tick(home: Path) -> None:
    """The background traffic up to now, at most once in TICK_EVERY_S (the
    nvidia-smi stand-in calls this: the monitor runs it every poll)."""
    try:
        if time.time() - _state_path(home).stat().st_mtime < TICK_EVERY_S:
            return
    except OSError:
        return  # a host set up before the fabric had counters
    with contextlib.suppress(OSError):
        add(home, {})


# -- where NCCL puts an engine's bytes ------------------------------------------


def _matches(spec: str | None, names: list[str], port: bool = False) -> list[str] | None:
    """NCCL's interface and HCA lists (`NCCL_SOCKET_IFNAME`, `NCCL_IB_HCA`):
    comma-separated prefixes, `=` for exact names, `^` to exclude, `:1` for a
    port (HCAs). None when the variable is not set."""
    if spec is None or not spec.strip():
        return None
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    spec = spec.lstrip("=")
    wanted = []
    for item in spec.split(","):
        name, _, which = item.strip().partition(":")
        if name and (not port or not which or which == "1"):
            wanted.append(name)

    def hit(n: str) -> bool:
        return any(n == w if exact else n.startswith(w) for w in wanted)

    return [n for n in names if hit(n) != exclude]


@dataclass(frozen=True)
class Route:
    """Where NCCL's bytes go on one host: RDMA over `hcas` (their interfaces
    in `netdevs`), or TCP over `netdevs`; `control` carries the bootstrap."""

    kind: str  # "rdma" or "socket"
    netdevs: tuple[str, ...]
    hcas: tuple[str, ...]
    control: str | None
    said: tuple[str, ...]  # what NCCL_DEBUG=INFO says about the choice, line by line

    @property
    def on_sockets(self) -> bool:
        return self.kind == "socket"


def nccl_route(home: Path, env: Mapping[str, str]) -> Route:
    """The transport NCCL picks on this host, from its environment and the
    host's ports, as it picks it at communicator set-up."""
    up = [n for n in up_interfaces(home) if n != "lo" and not n.startswith("docker")]
    cx7 = sorted((n for n in up if n in NETDEV_RDMA), key=lambda n: (not n.startswith("enp1"), n))
    named = _matches(env.get("NCCL_SOCKET_IFNAME"), up)
    sockets = named if named else (cx7[:1] or [n for n in up if n == MANAGEMENT])
    control = sockets[0] if sockets else None
    disabled = env.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0") or \
        env.get("NCCL_NET", "").strip().lower() == "socket"
    hcas = active_hcas(home)
    allowed = _matches(env.get("NCCL_IB_HCA"), hcas, port=True)
    if allowed is not None:
        hcas = allowed
    if disabled:
        why = "NET/IB : disabled (NCCL_IB_DISABLE=1)" if env.get("NCCL_NET", "").lower() != "socket" \
            else "NET/IB : not used (NCCL_NET=Socket)"
    elif not hcas:
        why = "NET/IB : No device found."
    else:
        return Route("rdma", tuple(RDMA_DEVICES[h] for h in hcas), tuple(hcas), control, (
            "NET/IB : Using " + " ".join(f"[{i}]{h}:1/RoCE" for i, h in enumerate(hcas)), "Using network IB"))
    return Route("socket", tuple(sockets), (), control, (
        why, "NET/Socket : Using " + " ".join(f"[{i}]{n}" for i, n in enumerate(sockets)), "Using network Socket"))


class LinkTraffic:
    """One engine's NCCL traffic on one host. `advance(total)` takes the
    bytes this node has sent over the link since the engine started (it
    receives as much), and moves the counters of the ports its NCCL uses by
    what is new, with the bootstrap's trickle for the time since."""

    def __init__(self, home: Path, env: Mapping[str, str] | None = None):
        self.home = Path(home)
        self.route = nccl_route(self.home, os.environ if env is None else env)
        self.sent = 0.0
        self._done: dict[str, int] = {}  # payload bytes already counted, per interface
        self._last = time.monotonic()

    def moves(self, total: float, seconds: float = 0.0) -> dict[str, dict[str, float]]:
        """The counter changes `advance` makes (without making them)."""
        route = self.route
        out: dict[str, dict[str, float]] = {}
        ports = list(route.netdevs)
        whole = int(max(total, self.sent))
        for i, netdev in enumerate(ports):
            # Even shares of the total that always sum to it: the halves of one cable move together.
            target = whole * (i + 1) // len(ports) - whole * i // len(ports)
            before = self._done.get(netdev, 0)
            if target <= before:
                continue
            if route.on_sockets:
                mss = max(536, mtu(self.home, netdev) - TCP_MSS_OVERHEAD)
                segs = math.ceil(target / mss) - math.ceil(before / mss)
                acks = math.ceil(target / mss) // 2 - math.ceil(before / mss) // 2
                wire = target - before + (segs + acks) * TCP_HEADERS
                out[netdev] = {"tx_bytes": wire, "rx_bytes": wire, "tx_packets": segs + acks,
                               "rx_packets": segs + acks}
            else:
                path = roce_mtu(mtu(self.home, netdev))
                packets = math.ceil(target / path) - math.ceil(before / path)
                out[netdev] = {"rdma_tx_bytes": target - before, "rdma_rx_bytes": target - before,
                               "rdma_tx_packets": packets, "rdma_rx_packets": packets}
        if route.control and seconds > 0:
            control = out.setdefault(route.control, {})
            for way in ("tx", "rx"):
                control[f"{way}_bytes"] = control.get(f"{way}_bytes", 0) + CONTROL_BPS * seconds
                control[f"{way}_packets"] = control.get(f"{way}_packets", 0) + CONTROL_BPS * seconds / CONTROL_PACKET
        return out

    def advance(self, total: float) -> None:
        now = time.monotonic()
        seconds, self._last = now - self._last, now
        moves = self.moves(total, seconds)
        whole = int(max(total, self.sent))
        for i, netdev in enumerate(self.route.netdevs):
            self._done[netdev] = whole * (i + 1) // len(self.route.netdevs) - whole * i // len(self.route.netdevs)
        self.sent = max(total, self.sent)
        if moves:
            add(self.home, moves)
