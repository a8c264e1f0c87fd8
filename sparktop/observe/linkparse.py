"""Pure parsers for how much a node's RoCE links carry, and the rates from them.

RoCE traffic bypasses the kernel's network stack, so a netdev's
`statistics/rx_bytes` and `tx_bytes` barely move while NCCL pushes tens of
Gb/s through the same port. The bytes are only visible to the NIC:

- mlx5's vport counters in `ethtool -S <netdev>`: `rx_vport_rdma_unicast_bytes`,
  `tx_vport_rdma_unicast_bytes` and their multicast twins, in bytes;
- the RDMA device's port counters `/sys/class/infiniband/<dev>/ports/1/counters/
  port_xmit_data` and `port_rcv_data`, which count 4-byte words (the
  InfiniBand PortXmitData/PortRcvData definition), so bytes are ×4.

`LINK_SCRIPT` reads both (ethtool only where it is installed) together with
the kernel's own byte counters, so the screen can show RDMA and kernel traffic
side by side. Everything here reads text and returns values; running the
script is the poller's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Source = Literal["ethtool", "port counters"]

# One `sh -c` per poll, on the node or over SSH. Every process spawned here is
# paid for on every poll, so files are read with the `read` builtin (a `cat`
# per counter is ~10 forks per device) and ethtool, the one external command,
# only runs for ports that are up: a Spark has four RDMA devices and normally
# two of them are down, whose counters cannot move. `printf` rather than `echo`:
# dash's echo interprets backslashes in values. `read` fails on a file with no
# final newline yet still sets the variable, and on a down port's `speed`
# (EINVAL): `_lk_read` ignores its status so a `set -e` caller survives. Names
# are prefixed so the fragment can be pasted into a bigger probe script.
LINK_SCRIPT = r"""_lk_sys="${SPARKTOP_SYS_ROOT:-/sys}"
_lk_eth=
command -v ethtool >/dev/null 2>&1 && _lk_eth=1
_lk_read() { _lk_v=; { read -r _lk_v < "$1" || :; } 2>/dev/null; }
printf '%s\n' '@@link'
for _lk_d in "$_lk_sys"/class/infiniband/*; do
  [ -d "$_lk_d" ] || continue
  printf 'dev %s\n' "${_lk_d##*/}"
  _lk_read "$_lk_d/ports/1/state"; _lk_state="$_lk_v"; printf 'state %s\n' "$_lk_v"
  _lk_read "$_lk_d/ports/1/counters/port_xmit_data"; printf 'xmit %s\n' "$_lk_v"
  _lk_read "$_lk_d/ports/1/counters/port_rcv_data"; printf 'rcv %s\n' "$_lk_v"
  for _lk_n in "$_lk_d"/device/net/*; do
    [ -e "$_lk_n" ] || continue
    _lk_n="${_lk_n##*/}"
    printf 'netdev %s\n' "$_lk_n"
    _lk_read "$_lk_sys/class/net/$_lk_n/statistics/rx_bytes"; printf 'rx_bytes %s\n' "$_lk_v"
    _lk_read "$_lk_sys/class/net/$_lk_n/statistics/tx_bytes"; printf 'tx_bytes %s\n' "$_lk_v"
    _lk_read "$_lk_sys/class/net/$_lk_n/speed"; printf 'speed %s\n' "$_lk_v"
    if [ -n "$_lk_eth" ]; then
      case "$_lk_state" in
        *ACTIVE*)
          ethtool -S "$_lk_n" 2>/dev/null | while read -r _lk_k _lk_x; do
            case "$_lk_k" in [rt]x_vport_rdma_*) printf 'eth %s %s\n' "$_lk_k" "$_lk_x" ;; esac
          done ;;
      esac
    fi
  done
done
"""


# -- ethtool -S -----------------------------------------------------------------


def parse_ethtool_stats(text: str) -> dict[str, int]:
    """`ethtool -S` output: `     name: value` lines under `NIC statistics:`.

    Lines that are not `name: integer` (the header, blank lines, `N/A`, a
    driver's odd text) are skipped rather than failing the whole read. The
    value is taken after the last colon, so per-queue forms such as bnx2x's
    `[0]: rx_bytes: 123` keep their whole prefix as the name.
    """
    stats: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.rpartition(":")
        name = name.strip()
        if not sep or not name:
            continue
        try:
            stats[name] = int(value.strip())
        except ValueError:
            continue
    return stats


def _sum_present(stats: dict[str, int], names: tuple[str, ...]) -> int | None:
    values = [stats[n] for n in names if n in stats]
    return sum(values) if values else None


def rdma_bytes(stats: dict[str, int]) -> tuple[int | None, int | None]:
    """(rx, tx) RDMA bytes from mlx5's vport counters; None where absent.

    Unicast and multicast are added: NCCL is unicast, but a RoCE multicast
    group is still traffic on the wire. The plain `rx_vport_unicast_bytes`
    counters are the kernel path's traffic and are not counted here.
    """
    rx = _sum_present(stats, ("rx_vport_rdma_unicast_bytes", "rx_vport_rdma_multicast_bytes"))
    tx = _sum_present(stats, ("tx_vport_rdma_unicast_bytes", "tx_vport_rdma_multicast_bytes"))
    return rx, tx


# -- the @@link section ------------------------------------------------------------


@dataclass(frozen=True)
class LinkCounters:
    """One RDMA device's counters at one instant (cumulative, not rates)."""

    rdma_device: str
    netdev: str | None
    up: bool
    speed_mbps: int | None
    rdma_rx_bytes: int | None
    rdma_tx_bytes: int | None
    source: Source  # where the RDMA bytes came from; rates never mix the two
    kernel_rx_bytes: int | None
    kernel_tx_bytes: int | None


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _port_up(state: str) -> bool:
    # The kernel prints `4: ACTIVE` (also `1: DOWN`, `2: INIT`, `3: ARMED`,
    # `5: ACTIVE_DEFER`); the number is the IB port state, 4 is active.
    number, _, word = state.partition(":")
    word = word.strip().upper() if word else number.strip().upper()
    return word.startswith("ACTIVE")


@dataclass
class _Block:
    device: str
    state: str = ""
    xmit: str | None = None
    rcv: str | None = None
    netdev: str | None = None
    rx_bytes: str | None = None
    tx_bytes: str | None = None
    speed: str | None = None
    ethtool: list[str] | None = None


def _finish(block: _Block) -> LinkCounters:
    stats = parse_ethtool_stats("\n".join(block.ethtool or []))
    rx, tx = rdma_bytes(stats)
    source: Source = "ethtool"
    if rx is None or tx is None:
        # No ethtool (not installed, port down, not mlx5): the port counters
        # count the same RoCE traffic in 4-byte words.
        source = "port counters"
        xmit, rcv = _int(block.xmit), _int(block.rcv)
        rx = rcv * 4 if rcv is not None else None
        tx = xmit * 4 if xmit is not None else None
    speed = _int(block.speed)
    return LinkCounters(
        rdma_device=block.device,
        netdev=block.netdev,
        up=_port_up(block.state),
        # A down port reads -1 (SPEED_UNKNOWN) or fails to read at all.
        speed_mbps=speed if speed is not None and speed > 0 else None,
        rdma_rx_bytes=rx,
        rdma_tx_bytes=tx,
        source=source,
        kernel_rx_bytes=_int(block.rx_bytes),
        kernel_tx_bytes=_int(block.tx_bytes),
    )


def parse_link_section(text: str) -> list[LinkCounters]:
    """The body `LINK_SCRIPT` prints (with or without its `@@link` line).

    One block per RDMA device: `dev NAME`, then `state`, `xmit`, `rcv`,
    `netdev NAME`, `rx_bytes`, `tx_bytes`, `speed` (each `key value`, the value
    possibly empty) and any number of `eth NAME: VALUE` lines from ethtool.
    """
    blocks: list[_Block] = []
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "dev":
            blocks.append(_Block(device=value.strip()))
            continue
        if not blocks:
            continue
        block = blocks[-1]
        if key == "state":
            block.state = value.strip()
        elif key == "xmit":
            block.xmit = value
        elif key == "rcv":
            block.rcv = value
        elif key == "netdev":
            block.netdev = value.strip() or None
        elif key == "rx_bytes":
            block.rx_bytes = value
        elif key == "tx_bytes":
            block.tx_bytes = value
        elif key == "speed":
            block.speed = value
        elif key == "eth":
            block.ethtool = (block.ethtool or []) + [value]
    return [_finish(b) for b in blocks if b.device]


# -- rates ------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkRate:
    """Per device, Gb/s (10^9 bit/s) over one measured interval; None = unknown."""

    rdma_device: str
    netdev: str | None
    up: bool
    speed_mbps: int | None
    source: Source
    rdma_rx_gbps: float | None
    rdma_tx_gbps: float | None
    kernel_rx_gbps: float | None
    kernel_tx_gbps: float | None
    seconds: float
    # The counters themselves, bytes since the driver loaded (for Prometheus, whose rate() wants counters).
    rdma_rx_bytes: int | None = None
    rdma_tx_bytes: int | None = None
    kernel_rx_bytes: int | None = None
    kernel_tx_bytes: int | None = None


def _gbps(prev: int | None, cur: int | None, seconds: float) -> float | None:
    if prev is None or cur is None or seconds <= 0:
        return None
    if cur < prev:
        # The counter went back: a driver reload or a port reset. The interval
        # cannot be measured; a negative (or wrapped, huge) rate would be a lie.
        return None
    return (cur - prev) * 8 / seconds / 1e9


def link_rates(
    prev: list[LinkCounters], prev_t: float, cur: list[LinkCounters], cur_t: float
) -> list[LinkRate]:
    """Rates for every device in `cur`, from the deltas since `prev`.

    `prev_t` and `cur_t` are when each read was taken (wall time, seconds):
    the interval actually measured, not the poll period asked for.
    """
    seconds = cur_t - prev_t
    before = {c.rdma_device: c for c in prev}
    out = []
    for c in cur:
        p = before.get(c.rdma_device)
        same_source = p is not None and p.source == c.source
        out.append(
            LinkRate(
                rdma_device=c.rdma_device,
                netdev=c.netdev,
                up=c.up,
                speed_mbps=c.speed_mbps,
                source=c.source,
                # ethtool's vport bytes and the port counters ×4 are different
                # counters: a delta across a source change is meaningless.
                rdma_rx_gbps=_gbps(p.rdma_rx_bytes, c.rdma_rx_bytes, seconds) if p and same_source else None,
                rdma_tx_gbps=_gbps(p.rdma_tx_bytes, c.rdma_tx_bytes, seconds) if p and same_source else None,
                kernel_rx_gbps=_gbps(p.kernel_rx_bytes, c.kernel_rx_bytes, seconds) if p else None,
                kernel_tx_gbps=_gbps(p.kernel_tx_bytes, c.kernel_tx_bytes, seconds) if p else None,
                seconds=seconds,
                rdma_rx_bytes=c.rdma_rx_bytes,
                rdma_tx_bytes=c.rdma_tx_bytes,
                kernel_rx_bytes=c.kernel_rx_bytes,
                kernel_tx_bytes=c.kernel_tx_bytes,
            )
        )
    return out
