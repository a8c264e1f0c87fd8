"""Pure readers of what `sparktop setup` runs on a node, and the judgements made from them.

The fabric's own outputs (`ibdev2netdev`, `/sys/class/infiniband`, `ip -br addr`, the MTUs, `ping`) are read by
`observe.fabric` and the disks' `df -Pk` by `observe.hostparse`; what only setup runs is read here:

- `ib_write_bw --report_gbits` (perftest): the result row under `#bytes #iterations BW peak[Gb/sec] ...`
  (`REPORT_FMT` in perftest's src/perftest_parameters.h);
- `iperf3 -J`: the receiver's bits per second; the python3 TCP probe's bytes and seconds, where neither
  perftest nor iperf3 is installed;
- `docker info --format '{{json .}}'`: the server's version, its runtimes and default runtime, or why the
  daemon did not answer (`ServerErrors`);
- `date +%s.%N` round trips: a node's clock against this machine's, with the round trip's half as the bound.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

RECOMMENDED_MTU = 9000  # RoCE's 4096-byte path MTU needs an interface MTU above 4200; NVIDIA's netplan sets 9000
CLOCK_WARN_S = 0.05  # nodes further apart than this (beyond what the round trips leave unknown) disagree
HF_FREE_WARN_GIB = 200.0  # a 70B model at 16 bits is ~140 GB
HF_FREE_FAIL_GIB = 20.0
LINK_BOTH_HALVES_GBPS = 150.0  # both halves of a Spark's cable at once read ~196 Gb/s; one half ~100-112
# Per rail (one half of the cable), as NVIDIA's playbook judges `ib_write_bw -q 4` (connect-two-sparks'
# check-connectx-bandwidth @ a6a4e7a6: 80 Gb/s healthy; 8-25 Gb/s is the ConnectX-7's stale initialisation).
RAIL_HEALTHY_GBPS = 80.0
STALE_INIT_GBPS = (8.0, 25.0)


@dataclass(frozen=True)
class BwResult:
    size: int
    iterations: int
    peak_gbps: float
    average_gbps: float
    msg_rate_mpps: float


_BW_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(Gb|MB)/sec\]\s+BW average\[(Gb|MB)/sec\]")
_BW_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")


def parse_ib_write_bw(text: str) -> BwResult | None:
    """The result row of `ib_write_bw`'s report (None when it printed none: it failed before measuring).
    MB/sec (without --report_gbits) is turned into Gb/s."""
    unit = None
    for line in text.splitlines():
        header = _BW_HEADER.search(line)
        if header:
            unit = header.group(1)
            continue
        row = _BW_ROW.match(line) if unit else None
        if row:
            scale = 1.0 if unit == "Gb" else 8 * 1.048576 / 1000  # perftest's MB is 2**20 bytes
            return BwResult(int(row.group(1)), int(row.group(2)), float(row.group(3)) * scale,
                            float(row.group(4)) * scale, float(row.group(5)))
    return None


def rail_verdict(gbps: float) -> str | None:
    """What is wrong with one rail's RDMA write rate (None: healthy)."""
    if gbps >= RAIL_HEALTHY_GBPS:
        return None
    if STALE_INIT_GBPS[0] <= gbps <= STALE_INIT_GBPS[1]:
        return ("the ConnectX-7's stale initialisation state (NVIDIA's playbook): reboot both nodes with the cable "
                "in; if it stays, power both off at the wall for 60 s")
    return f"under the {RAIL_HEALTHY_GBPS:.0f} Gb/s a healthy rail carries: check the cable, the MTU and the PCIe link"


def parse_tcp_probe(text: str) -> float | None:
    """The python3 TCP source's `BYTES SECONDS`: Gb/s (None when it printed no such line)."""
    for line in reversed(text.splitlines()):
        parts = line.split()
        if len(parts) == 2:
            try:
                sent, seconds = int(parts[0]), float(parts[1])
            except ValueError:
                continue
            return sent * 8 / seconds / 1e9 if seconds > 0 else None
    return None


def parse_iperf3(text: str) -> float | None:
    """`iperf3 -c ... -J`: the receiver's Gb/s (None when the JSON has none, or says why it failed)."""
    try:
        doc = json.loads(text)
        return float(doc["end"]["sum_received"]["bits_per_second"]) / 1e9
    except (ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class DockerInfo:
    version: str | None
    runtimes: tuple[str, ...]
    default_runtime: str | None
    error: str | None = None  # the daemon's own words when it did not answer

    @property
    def nvidia(self) -> bool:
        return "nvidia" in self.runtimes


def parse_docker_info(text: str) -> DockerInfo:
    """`docker info --format '{{json .}}'` (one JSON object; the client's part only when the daemon is down)."""
    try:
        doc = json.loads(text.strip().splitlines()[-1] if text.strip() else "")
    except ValueError:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "no output")
        return DockerInfo(None, (), None, first)
    if not isinstance(doc, dict):
        return DockerInfo(None, (), None, "unexpected output")
    errors = doc.get("ServerErrors") or []
    runtimes = doc.get("Runtimes") or {}
    return DockerInfo(doc.get("ServerVersion") or None, tuple(sorted(runtimes)), doc.get("DefaultRuntime") or None,
                      str(errors[0]) if errors else None)


@dataclass(frozen=True)
class ClockSample:
    """A node's `date +%s.%N` between this machine's clock before and after asking."""

    before: float
    remote: float
    after: float

    @property
    def offset(self) -> float:
        """The node's clock minus this machine's, at the middle of the round trip."""
        return self.remote - (self.before + self.after) / 2

    @property
    def bound(self) -> float:
        """How far off `offset` can be: half the round trip."""
        return (self.after - self.before) / 2


def parse_date(text: str) -> float | None:
    try:
        return float(text.strip().splitlines()[0])
    except (ValueError, IndexError):
        return None


def clock_spread(samples: dict[str, ClockSample]) -> tuple[float, float]:
    """The largest difference between two nodes' offsets, and what the round trips leave unknown of it."""
    offsets = [(s.offset, s.bound) for s in samples.values()]
    if len(offsets) < 2:
        return 0.0, 0.0
    hi = max(offsets, key=lambda o: o[0])
    lo = min(offsets, key=lambda o: o[0])
    return hi[0] - lo[0], hi[1] + lo[1]


def clocks_agree(samples: dict[str, ClockSample], limit: float = CLOCK_WARN_S) -> bool:
    spread, unknown = clock_spread(samples)
    return spread - unknown <= limit


def parse_ntp(text: str) -> bool | None:
    """`timedatectl show -p NTPSynchronized --value`: yes/no (None: not said)."""
    word = text.strip().lower()
    return True if word == "yes" else False if word == "no" else None


# -- the nodes' ssh to each other (`remote.peers.check_command`: `ssh -o BatchMode=yes ... true`) -----------------

PeerKind = Literal["ok", "unknown-host-key", "changed-host-key", "refused", "unreachable", "no-ssh", "config",
                   "other"]


@dataclass(frozen=True)
class PeerSSH:
    kind: PeerKind
    reason: str  # one line; "" when ok

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    @property
    def fixable(self) -> bool:
        """What setup can put in place: the source's key authorized on the target, the target's host key (the one
        this machine verified) in the source's known_hosts. A changed host key is never replaced."""
        return self.kind in ("unknown-host-key", "refused")


_UNREACHABLE = ("connection refused", "connection timed out", "no route to host", "network is unreachable",
                "could not resolve hostname", "name or service not known", "temporary failure in name resolution",
                "operation timed out", "connection closed by", "connection reset by")


def parse_peer_ssh(stderr: str, exit_status: int) -> PeerSSH:
    """OpenSSH's reason, from its stderr, in one line: the host key unknown to the source (BatchMode: "No ED25519
    host key is known for ... and you have requested strict checking"), changed ("REMOTE HOST IDENTIFICATION HAS
    CHANGED"), the key refused ("Permission denied (publickey)"), the target unreachable, no ssh, a bad config."""
    lines = [line.strip().rstrip(".") for line in stderr.replace("\r", "\n").splitlines() if line.strip()]
    low = stderr.lower()
    if exit_status == 0:
        return PeerSSH("ok", "")
    if "remote host identification has changed" in low or ("host key for" in low and "has changed" in low):
        return PeerSSH("changed-host-key", "its host key differs from the one in the source's known_hosts (a "
                                           "reinstalled node, or someone in between): not replaced here")
    if "host key verification failed" in low or "host key is known" in low:
        return PeerSSH("unknown-host-key", "host key unknown to the source (not in its known_hosts)")
    if "permission denied" in low:
        said = next((line for line in lines if "permission denied" in line.lower()), "permission denied")
        return PeerSSH("refused", f"key refused ({said})")
    if exit_status == 127 or "command not found" in low or ": not found" in low:
        return PeerSSH("no-ssh", "no ssh client on the source: `sudo apt install openssh-client`")
    if any(word in low for word in _UNREACHABLE):
        said = next((line for line in lines if any(w in line.lower() for w in _UNREACHABLE)), lines[-1])
        return PeerSSH("unreachable", f"unreachable ({said})")
    if "bad configuration option" in low or "can't open user config file" in low or "configuration file" in low:
        said = next((line for line in lines if "config" in line.lower()), lines[-1])
        return PeerSSH("config", f"the source's ssh config: {said}")
    return PeerSSH("other", lines[-1] if lines else f"ssh exited with status {exit_status}")


def parse_ssh_g(text: str) -> dict[str, list[str]]:
    """`ssh -G`: every option (lower case) with its values in order (identityfile and userknownhostsfile repeat
    or hold several)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and value:
            out.setdefault(key.lower(), []).extend(value.split() if key.lower() == "userknownhostsfile"
                                                    else [value.strip()])
    return out
