"""`ip` and `ib_write_bw` on a twin host: the ConnectX-7 ports' addresses and the RDMA test over them.

Twin hosts share this machine's network, which has no ConnectX-7, so these answer from the host's own files
(`TwinHost`: `sys/class/net/<if>/operstate` and `mtu`, the RoCE devices under `sys/class/infiniband`) and the
addresses a test gives its ports (`set_addresses`: `net/addresses.json`, e.g. `enp1s0f1np1: 127.0.0.2/24`;
loopback addresses, so what listens on them is reachable between the lab's hosts):

- `ip [-j] [-br] addr [show [dev IF]]` in iproute2's brief and JSON formats, `ip link set [dev] IF mtu N`
  (the MTU file, as `ip` sets the kernel's). A host given no addresses is left to this machine's real `ip`, so
  the demo and the tests that do not set addresses see what they always saw; the installed `ip` is a shell
  script (`ip_script`) that decides that without starting Python.
- `ib_write_bw` (perftest): a server (no address) binds the port (`-p`, 18515) on its device's address, says it
  waits as perftest does and answers one client; a client connects to the server's address. Both print
  perftest's report (`RESULT_FMT_G`/`REPORT_FMT` of src/perftest_parameters.h, the header as a Spark prints it)
  with the twin link's figure for the device: each half of a Spark's cable sits behind a PCIe Gen5 x4, about
  98 Gb/s of RDMA writes with a 4096-byte path MTU (both halves at once read ~196 Gb/s), a little less at the
  smaller path MTU a 1500-byte interface MTU allows (`link.roce_mtu`).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import zlib
from pathlib import Path

from sparktop.twin import link
from sparktop.twin.host import TwinHost, read_json, write_json

ADDRESSES = "net/addresses.json"
# iproute2 lists a Spark's interfaces in this order (fixtures/fabric/ip-br-addr_*); others after, by name.
ORDER = ("lo", link.MANAGEMENT, "enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1")
HALF_GBPS = 98.1  # one half's RDMA write rate at a 4096-byte path MTU (~196 Gb/s over both)
HEADERS_B = 70  # RoCEv2's headers and trailer per packet (Ethernet, IP, UDP, BTH, RETH, ICRC, FCS)
ITERS_PER_QP = 5000  # perftest's DEF_ITERS_WB: a -q 4 run reports 20000 iterations
RULE = "-" * 87


def set_addresses(home: Path, addresses: dict[str, list[str]]) -> None:
    """Give a twin host's interfaces their IPv4 addresses (`{"enp1s0f1np1": ["127.0.0.2/24"]}`)."""
    write_json(Path(home) / ADDRESSES, addresses)


def addresses(home: Path) -> dict[str, list[str]] | None:
    return read_json(Path(home) / ADDRESSES)


SYSTEM_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")  # where this machine's own `ip` is


def _real_ip(argv: list[str]) -> int:
    """This machine's own `ip` (never PATH's first, which is this stand-in's script)."""
    for folder in SYSTEM_DIRS:
        candidate = Path(folder) / "ip"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            os.execv(str(candidate), ["ip", *argv])
    print("ip: command not found", file=sys.stderr)
    return 127


def ip_script(python: str, src: str) -> str:
    """The `ip` a twin host's PATH finds: a shell script, so a host given no addresses (the demo, most tests)
    runs this machine's `ip` without starting Python, as the monitor does every few seconds per node."""
    prog = (f"import sys; sys.path.insert(0, {src!r}); from sparktop.twin.fabric_tools import ip_main; "
            "sys.exit(ip_main(sys.argv[1:]))")
    real = " ".join(SYSTEM_DIRS)
    return ("#!/bin/sh\n"
            "# sparktop twin: ip, the host's ConnectX-7 ports when it was given addresses, else this machine's ip\n"
            f'if [ -n "$SPARKTOP_TWIN_HOME" ] && [ -r "$SPARKTOP_TWIN_HOME/{ADDRESSES}" ]; then\n'
            f'  exec {shlex.quote(python)} -c {shlex.quote(prog)} "$@"\n'
            "fi\n"
            f'for d in {real}; do [ -x "$d/ip" ] && exec "$d/ip" "$@"; done\n'
            'echo "ip: command not found" >&2; exit 127\n')


def _interfaces(host: TwinHost) -> list[str]:
    try:
        names = [p.name for p in (host.home / "sys/class/net").iterdir()]
    except OSError:
        names = []
    names = sorted(set(names) | {"lo"}, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    return names


def _mac(name: str) -> str:
    h = zlib.crc32(name.encode())
    return "4c:bb:47:" + ":".join(f"{(h >> s) & 0xFF:02x}" for s in (16, 8, 0))


def _row(host: TwinHost, index: int, name: str, given: dict[str, list[str]]) -> dict:
    state, mtu = host.interface(name) or ("unknown", 65536)
    lo = name == "lo"
    up = state in ("up", "unknown")
    flags = ["LOOPBACK", "UP", "LOWER_UP"] if lo else (["BROADCAST", "MULTICAST", "UP", "LOWER_UP"] if up else
                                                       ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"])
    cidrs = ["127.0.0.1/8"] if lo else list(given.get(name, []))
    info = []
    for cidr in cidrs:
        ip, _, prefix = cidr.partition("/")
        info.append({"family": "inet", "local": ip, "prefixlen": int(prefix or 32),
                     "scope": "host" if lo else "global", "label": name,
                     "valid_life_time": 4294967295, "preferred_life_time": 4294967295})
    return {"ifindex": index, "ifname": name, "flags": flags, "mtu": mtu, "qdisc": "noqueue" if lo else "mq",
            "operstate": state.upper(), "group": "default", "txqlen": 1000,
            "link_type": "loopback" if lo else "ether", "address": "00:00:00:00:00:00" if lo else _mac(name),
            "broadcast": "00:00:00:00:00:00" if lo else "ff:ff:ff:ff:ff:ff", "addr_info": info}


def ip_main(argv: list[str]) -> int:
    host = TwinHost.from_env()
    given = addresses(host.home) if host is not None else None
    if host is None or given is None:
        return _real_ip(argv)
    opts = [a for a in argv if a.startswith("-")]
    words = [a for a in argv if not a.startswith("-")]
    as_json = any(o in ("-j", "-json", "--json") for o in opts)
    brief = any(o in ("-br", "-brief", "--brief") for o in opts)
    if words[:1] in (["a"], ["addr"], ["address"]) and (len(words) == 1 or words[1] in ("show", "list", "dev")):
        rest = words[1:]
        only = rest[rest.index("dev") + 1] if "dev" in rest[:-1] else (rest[1] if rest[:1] == ["show"] and
                                                                       len(rest) > 1 else None)
        names = _interfaces(host)
        if only is not None and only not in names:
            print(f'Device "{only}" does not exist.', file=sys.stderr)
            return 1
        rows = [_row(host, i, n, given) for i, n in enumerate(names, 1) if only in (None, n)]
        if as_json:
            print(json.dumps(rows, separators=(",", ":")))
        elif brief:
            for r in rows:
                cidrs = "".join(f"{a['local']}/{a['prefixlen']} " for a in r["addr_info"])
                print(f"{r['ifname']:<16} {r['operstate']:<14} {cidrs}")
        else:
            for r in rows:
                print(f"{r['ifindex']}: {r['ifname']}: <{','.join(r['flags'])}> mtu {r['mtu']} qdisc {r['qdisc']} "
                      f"state {r['operstate']} group default qlen 1000")
                for a in r["addr_info"]:
                    print(f"    inet {a['local']}/{a['prefixlen']} scope {a['scope']} {r['ifname']}")
        return 0
    if words[:2] in (["link", "set"], ["l", "set"]) and "mtu" in words[:-1]:
        rest = words[2:]
        name = rest[rest.index("dev") + 1] if "dev" in rest[:-1] else rest[0]
        found = host.interface(name)
        if found is None:
            print(f'Cannot find device "{name}"', file=sys.stderr)
            return 1
        mtu = words[words.index("mtu") + 1]
        if not mtu.isdigit() or not 68 <= int(mtu) <= 9978:  # mlx5's largest
            print(f'Error: argument "{mtu}" is wrong: Invalid MTU', file=sys.stderr)
            return 1
        host.set_interface(name, found[0], int(mtu))
        return 0
    return _real_ip(argv)


# -- ib_write_bw ----------------------------------------------------------------------


def _opts(argv: list[str]) -> tuple[dict[str, str], str | None]:
    takes = {"-d": "dev", "--ib-dev": "dev", "-p": "port", "--port": "port", "-q": "qps", "--qp": "qps",
             "-s": "size", "--size": "size", "-n": "iters", "--iters": "iters", "-x": "gid", "--gid-index": "gid",
             "--force-link": "link", "-D": "duration", "--duration": "duration"}
    out: dict[str, str] = {}
    server = None
    i = 0
    while i < len(argv):
        a = argv[i]
        key, eq, value = a.partition("=")
        if key in takes:
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            out[takes[key]] = value
        elif not a.startswith("-"):
            server = a
        i += 1
    return out, server


def _device(host: TwinHost, dev: str) -> tuple[str, str | None, int] | None:
    """The device's netdev, its first IPv4 address and its MTU; None when there is no such device up."""
    netdev = link.RDMA_DEVICES.get(dev)
    state = (host.home / "sys/class/infiniband" / dev / "ports/1/state")
    if netdev is None or not state.exists() or "ACTIVE" not in state.read_text():
        return None
    given = addresses(host.home) or {}
    cidrs = given.get(netdev) or []
    return netdev, (cidrs[0].split("/")[0] if cidrs else None), link.mtu(host.home, netdev)


def _gbps(netdev_mtu: int) -> float:
    path = link.roce_mtu(netdev_mtu)
    full = 4096 / (4096 + HEADERS_B)
    return round(HALF_GBPS * (path / (path + HEADERS_B)) / full, 2)


def _report(dev: str, qps: int, size: int, mtu: int, gbps: float, side: str) -> str:
    """perftest's header (as a Spark's client printed it, eugr/spark-vllm-docker's docs/NETWORKING.md; the
    server's has no TX depth line), its QPs' addresses and the result row."""
    tx = [" TX depth        : 128"] if side == "client" else []
    lines = [RULE, "                    RDMA_Write BW Test",
             f" Dual-port       : OFF          Device         : {dev}",
             f" Number of qps   : {qps:<12} Transport type : IB",
             " Connection type : RC           Using SRQ      : OFF", " PCIe relax order: ON", " ibv_wr* API     : ON",
             *tx, " CQ Moderation   : 1", f" Mtu             : {link.roce_mtu(mtu)}[B]", " Link type       : Ethernet",
             " GID index       : 3", " Max inline data : 0[B]", " rdma_cm QPs     : ON", " Data ex. method : rdma_cm",
             RULE]
    seed = zlib.crc32(dev.encode())
    for who in ("local", "remote"):
        for q in range(qps):
            qpn, psn = (seed + q) % 0xFFFF, (seed * (q + 3)) % 0xFFFFFF
            lines.append(f" {who} address: LID 0000 QPN 0x{qpn:04x} PSN 0x{psn:06x}")
    iters = ITERS_PER_QP * qps
    rate = gbps * 1e9 / 8 / size / 1e6
    lines += [RULE, " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]",
              f" {size:<7}    {iters:<10}       {gbps + 0.01:<7.2f}            {gbps:<7.2f}\t\t   {rate:<7.6f}", RULE]
    return "\n".join(lines)


def ib_write_bw_main(argv: list[str]) -> int:
    host = TwinHost.from_env()
    opts, server = _opts(argv)
    dev = opts.get("dev", "rocep1s0f1")
    found = _device(host, dev) if host is not None else None
    if found is None:
        print(f" IB device {dev} not found\n Unable to find the Infiniband/RoCE device", file=sys.stderr)
        return 1
    _netdev, address, mtu = found
    port = int(opts.get("port", 18515))
    qps, size = int(opts.get("qps", 1)), int(opts.get("size", 65536))
    gbps = _gbps(mtu)
    if server is None:
        if address is None:
            print(f" Couldn't bind rdma_cm to {dev}: its interface has no IPv4 address", file=sys.stderr)
            return 1
        with socket.create_server((address, port)) as listener:
            print("\n************************************\n* Waiting for client to connect... *\n"
                  "************************************", flush=True)
            conn, _ = listener.accept()
            with conn:
                asked = json.loads(conn.makefile().readline() or "{}")
                peer = min(gbps, float(asked.get("gbps", gbps)))  # the slower end sets the pace
                conn.sendall((json.dumps({"gbps": peer}) + "\n").encode())
        print(_report(dev, qps, size, mtu, peer, "server"))
        return 0
    try:
        conn = socket.create_connection((server, port), timeout=5)
    except OSError:
        print(" Unable to perform rdma_client function\n Unable to init the socket connection", file=sys.stderr)
        return 1
    with conn:
        conn.sendall((json.dumps({"gbps": gbps, "qps": qps, "size": size}) + "\n").encode())
        answer = json.loads(conn.makefile().readline() or "{}")
    print(_report(dev, qps, size, mtu, float(answer.get("gbps", gbps)), "client"))
    return 0


def main(tool: str, argv: list[str]) -> int:
    if tool == "ip":
        return ip_main(argv)
    if tool == "ib_write_bw":
        return ib_write_bw_main(argv)
    print(f"unknown twin tool {tool!r}", file=sys.stderr)
    return 2

