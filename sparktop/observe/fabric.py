"""Pure parsers for a node's ConnectX-7 fabric, and the choice made from them.

A Spark's ConnectX-7 shows each QSFP port twice (two PCIe x4 halves,
`enp1s0f1np1` and `enP2p1s0f1np1`, with RoCE devices `rocep1s0f1` and
`roceP2p1s0f1`). What a cluster launch needs from it, per node:

- the interface NCCL, Gloo and UCX open their sockets on, and its IPv4
  address (link-local 169.254.x.y with NVIDIA's netplan, or one configured
  by hand): `ip -br addr`;
- the RoCE devices whose port is up, for `NCCL_IB_HCA` (both halves of a
  cabled port, as eugr's spark-vllm-docker sets it): `ibdev2netdev`, or
  `/sys/class/infiniband/*/device/net/*` where it is not installed;
- the MTU, from `/sys/class/net/*/mtu`.

Every function here reads text and returns values; `launch/preflight.py`
runs the commands (`DETECT_SCRIPT`) and the ping between the nodes.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

# One command per node; sections keep what each part printed apart.
DETECT_SCRIPT = (
    "echo @@ibdev2netdev; ibdev2netdev 2>/dev/null; "
    'echo @@sysib; for d in "${SPARKTOP_SYS_ROOT:-/sys}"/class/infiniband/*/device/net/*; do '
    '[ -e "$d" ] && echo "$d"; done; '
    "echo @@addr; ip -br addr 2>/dev/null; "
    'echo @@net; for n in "${SPARKTOP_SYS_ROOT:-/sys}"/class/net/*; do [ -e "$n/operstate" ] && '
    'echo "${n##*/} $(cat "$n/mtu" 2>/dev/null || echo -) $(cat "$n/operstate" 2>/dev/null)"; done; '
    "echo @@end"
)


@dataclass(frozen=True)
class RdmaLink:
    """One RDMA device and the network interface it drives."""

    ibdev: str
    port: int
    netdev: str
    up: bool | None  # None: not said (the /sys listing has no state)


@dataclass(frozen=True)
class Interface:
    """One line of `ip -br addr`."""

    name: str
    state: str  # UP, DOWN, UNKNOWN, ...
    addresses: tuple[str, ...] = ()

    @property
    def ipv4(self) -> list[ipaddress.IPv4Interface]:
        out = []
        for text in self.addresses:
            try:
                iface = ipaddress.ip_interface(text)
            except ValueError:
                continue
            if isinstance(iface, ipaddress.IPv4Interface):
                out.append(iface)
        return out


@dataclass(frozen=True)
class Fabric:
    """What a cluster launch uses on one node: the socket interface, its
    address, the RoCE devices and the MTU (any may be unknown)."""

    eth_if: str | None = None
    ip: str | None = None
    ib_if: tuple[str, ...] = ()
    mtu: int | None = None


@dataclass(frozen=True)
class Port:
    """A ConnectX-7 interface that is up and has an IPv4 address: a candidate."""

    netdev: str
    address: ipaddress.IPv4Interface
    mtu: int | None = None
    prefix_known: bool = True  # False for an inventory's fabric_ip (no prefix given)


@dataclass
class NodeFabric:
    """What one node showed: its RDMA links, interfaces and MTUs."""

    links: list[RdmaLink] = field(default_factory=list)
    interfaces: dict[str, Interface] = field(default_factory=dict)
    net: dict[str, tuple[int | None, str]] = field(default_factory=dict)  # name -> (mtu, operstate)
    source: str = ""  # "ibdev2netdev" or "/sys/class/infiniband" or ""

    def is_up(self, netdev: str) -> bool:
        link_up = next((link.up for link in self.links if link.netdev == netdev and link.up is not None), None)
        if link_up is not None:
            return link_up
        iface = self.interfaces.get(netdev)
        if iface is not None:
            return iface.state == "UP"
        return self.net.get(netdev, (None, ""))[1] == "up"

    def mtu(self, netdev: str) -> int | None:
        return self.net.get(netdev, (None, ""))[0]

    @property
    def cx7(self) -> list[str]:
        """The interfaces an RDMA device drives, primary (`enp1s0…`) halves first."""
        return sorted(dict.fromkeys(link.netdev for link in self.links), key=_primary_first)

    @property
    def up_cx7(self) -> list[str]:
        return [n for n in self.cx7 if self.is_up(n)]

    @property
    def roce(self) -> tuple[str, ...]:
        """RoCE devices whose interface is up (for NCCL_IB_HCA)."""
        names = {link.ibdev for link in self.links if self.is_up(link.netdev)}
        return tuple(sorted(names, key=_primary_first))

    def ports(self, only: str | None = None) -> list[Port]:
        """Up ConnectX-7 interfaces with an IPv4 address (or just `only`, when
        the inventory names the interface: any interface, CX-7 or not)."""
        names = [only] if only else self.up_cx7
        out = []
        for name in names:
            iface = self.interfaces.get(name)
            if iface is None or (not only and not self.is_up(name)):
                continue
            for address in iface.ipv4:
                out.append(Port(name, address, self.mtu(name)))
        return out

    def holding(self, ip: str) -> str | None:
        """The interface that has address `ip`."""
        for iface in self.interfaces.values():
            if any(str(a.ip) == ip for a in iface.ipv4):
                return iface.name
        return None

    def describe(self) -> str:
        """What was seen, for a message when nothing fits."""
        if not self.links:
            return "no ConnectX-7 (RDMA) interface found (no ibdev2netdev, nothing in /sys/class/infiniband)"
        parts = []
        for name in self.cx7:
            iface = self.interfaces.get(name)
            v4 = ", ".join(str(a) for a in iface.ipv4) if iface else ""
            if not self.is_up(name):
                parts.append(f"{name} down")
            else:
                parts.append(f"{name} up, {v4}" if v4 else f"{name} up, no IPv4 address")
        return "; ".join(parts)


def _primary_first(name: str) -> tuple[int, str]:
    # enP2p1s0f1np1 / roceP2p1s0f1 are the second PCIe half of a port: NVIDIA's
    # guides use the enp1s0… / rocep1s0… names first.
    return (1 if re.match(r"(en|roce)P\d+p", name) else 0, name)


# -- parsers ------------------------------------------------------------------


def sections(text: str) -> dict[str, str]:
    """`@@name` marker lines split a script's output into named parts."""
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@@"):
            current = line[2:].strip()
            out.setdefault(current, [])
        elif current is not None:
            out[current].append(line)
    return {name: "\n".join(lines) for name, lines in out.items()}


_IBDEV = re.compile(r"^\s*(\S+)\s+port\s+(\d+)\s+==>\s+(\S+)\s+\((\w+)\)")


def parse_ibdev2netdev(text: str) -> list[RdmaLink]:
    """`ibdev2netdev`: `rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)` per line."""
    out = []
    for line in text.splitlines():
        m = _IBDEV.match(line)
        if m:
            out.append(RdmaLink(m.group(1), int(m.group(2)), m.group(3), m.group(4).lower() == "up"))
    return out


def parse_sys_infiniband(text: str) -> list[RdmaLink]:
    """Paths `/sys/class/infiniband/<ibdev>/device/net/<netdev>`, one a line."""
    out = []
    for line in text.splitlines():
        m = re.search(r"/class/infiniband/([^/\s]+)/device/net/([^/\s]+)\s*$", line)
        if m:
            out.append(RdmaLink(m.group(1), 1, m.group(2), None))
    return out


def parse_ip_br_addr(text: str) -> dict[str, Interface]:
    """`ip -br addr`: name, state, then the addresses with their prefix."""
    out: dict[str, Interface] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name = parts[0].split("@", 1)[0]  # vlan0@eth0, veth1@if4
        out[name] = Interface(name, parts[1], tuple(parts[2:]))
    return out


def parse_sys_net(text: str) -> dict[str, tuple[int | None, str]]:
    """Lines `NAME MTU OPERSTATE` (MTU `-` when unreadable)."""
    out: dict[str, tuple[int | None, str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        mtu = int(parts[1]) if parts[1].isdigit() else None
        out[parts[0]] = (mtu, parts[2] if len(parts) > 2 else "")
    return out


def parse_detect(text: str) -> NodeFabric:
    """The output of `DETECT_SCRIPT`."""
    parts = sections(text)
    links = parse_ibdev2netdev(parts.get("ibdev2netdev", ""))
    source = "ibdev2netdev" if links else ""
    if not links:
        links = parse_sys_infiniband(parts.get("sysib", ""))
        source = "/sys/class/infiniband" if links else ""
    return NodeFabric(links, parse_ip_br_addr(parts.get("addr", "")), parse_sys_net(parts.get("net", "")), source)


@dataclass(frozen=True)
class Ping:
    ok: bool
    rtt_ms: float | None = None
    error: str | None = None  # what ping said when it could not send (no such device, ...)
    summary: str | None = None  # "1 packets transmitted, 0 received, 100% packet loss, time 0ms"


def parse_ping(text: str, exit_status: int) -> Ping:
    """iputils `ping -c1 -W2 -I IFACE ADDR`: exit 0 when a reply came."""
    m = re.search(r"(\d+) packets transmitted, (\d+) received.*", text)
    received = int(m.group(2)) if m else 0
    rtt = re.search(r"rtt min/avg/max/mdev = [\d.]+/([\d.]+)/", text) or re.search(r"time=([\d.]+) ms", text)
    error = next((line.strip() for line in text.splitlines()
                  if line.startswith("ping:") and "Warning" not in line), None)
    return Ping(exit_status == 0 and received > 0, float(rtt.group(1)) if rtt else None, error,
                m.group(0).strip() if m else None)


# -- the choice ------------------------------------------------------------------


def same_subnet(a: Port, b: Port) -> bool:
    """Each address is in the other's network (a side whose prefix is not
    known, an inventory's fabric_ip, takes the other's word for it)."""
    return ((not a.prefix_known or b.address.ip in a.address.network)
            and (not b.prefix_known or a.address.ip in b.address.network)
            and (a.prefix_known or b.prefix_known or a.address.ip != b.address.ip))


def pairs(head: list[Port], worker: list[Port]) -> list[tuple[Port, Port]]:
    """Head and worker ports that share a subnet, the likeliest first: the
    same interface name on both (the same port cabled on each Spark), then
    the primary halves, then the order found."""
    found = [(h, w) for h in head for w in worker if same_subnet(h, w)]
    return sorted(found, key=lambda hw: (hw[0].netdev != hw[1].netdev, _primary_first(hw[0].netdev)[0],
                                         _primary_first(hw[1].netdev)[0]))
