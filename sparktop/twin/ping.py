"""`ping` on a twin host: the fabric between simulated Sparks.

Preflight pings every other node over the fabric interface (`ping -c1 -W2
-I IFACE ADDR`). Twin hosts share this machine's loopback, so a real ping
would always answer (or, bound to a Spark's interface name this machine
lacks, always fail). This one answers as iputils does on a Spark
(tests/fixtures/fabric/ping_iputils-*.txt): "No such device" for an
interface the host does not have, no reply when the interface is down or
the address is one the host was told it cannot reach
(`TwinHost.cut_link`), else one reply.
"""

from __future__ import annotations

import sys

from sparktop.twin.host import TwinHost


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    host = TwinHost.from_env()
    iface = argv[argv.index("-I") + 1] if "-I" in argv[:-1] else None
    address = argv[-1] if argv and not argv[-1].startswith("-") else None
    if host is None or address is None:
        print("ping: usage error: Destination address required", file=sys.stderr)
        return 2
    found = host.interface(iface) if iface is not None else ("up", 65536)
    if found is None:
        print(f"ping: SO_BINDTODEVICE {iface}: No such device", file=sys.stderr)
        return 2
    state = found[0]
    source = host.address
    print(f"PING {address} ({address}) from {source} {iface or 'lo'}: 56(84) bytes of data.")
    reached = state in ("up", "unknown") and address not in host.unreachable
    if reached:
        print(f"64 bytes from {address}: icmp_seq=1 ttl=64 time=0.214 ms")
    print(f"\n--- {address} ping statistics ---")
    print(f"1 packets transmitted, {int(reached)} received, {0 if reached else 100}% packet loss, time 0ms")
    if reached:
        print("rtt min/avg/max/mdev = 0.214/0.214/0.214/0.000 ms")
        return 0
    return 1
