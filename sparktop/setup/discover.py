"""Sparks found over mDNS, for `sparktop setup --discover` when no host is named.

A DGX Spark announces its ssh server over Avahi; NVIDIA's own `discover-sparks` (dgx-spark-playbooks,
connect-two-sparks/assets @ 5873195c) lists them with `avahi-browse -p -r -f -t _ssh._tcp`, whose resolved
lines read `=;interface;IPv4;name;description;local;fqdn;address;port;txt`. Each host is kept once (by its
`.local` name, the name ssh reaches it by on the LAN), with the addresses it was seen at. The CX-7 subnet
scan is not done: on a pair cabled back to back the peers are the ones mDNS already lists over that link.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparktop.errors import SparktopError
from sparktop.remote import Transport

AVAHI = "avahi-browse -p -r -f -t _ssh._tcp"


@dataclass
class Found:
    host: str  # spark-1a2b.local
    addresses: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)


def parse_avahi(text: str) -> list[Found]:
    """Resolved (`=`) IPv4 lines of `avahi-browse -p -r`, one `Found` per host, in the order first seen."""
    out: dict[str, Found] = {}
    for line in text.splitlines():
        parts = line.split(";")
        if len(parts) < 9 or parts[0] != "=" or parts[2] != "IPv4":
            continue
        iface, fqdn, address = parts[1], parts[6], parts[7]
        if not fqdn:
            continue
        found = out.setdefault(fqdn, Found(fqdn))
        if address and address not in found.addresses:
            found.addresses.append(address)
        if iface and iface not in found.interfaces:
            found.interfaces.append(iface)
    return list(out.values())


async def discover(transport: Transport) -> list[Found]:
    """The Sparks mDNS lists from where `transport` runs (this machine, for the CLI)."""
    r = await transport.run(AVAHI, timeout=30)
    if r.exit_status == 127:
        raise SparktopError(f"{transport.name}: `{AVAHI}`: avahi-browse is not installed (sudo apt install "
                            "avahi-utils), or name the hosts: sparktop setup HOST...")
    found = parse_avahi(r.stdout)
    if not found:
        why = "" if r.ok else f" ({r.first_error_line()})"
        raise SparktopError(f"{transport.name}: `{AVAHI}` found no ssh server over mDNS{why}: name the hosts: "
                            "sparktop setup HOST...")
    return found
