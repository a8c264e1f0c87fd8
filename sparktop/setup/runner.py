"""`Setup`: each host checked, what can be fixed fixed once the user says so, and the inventory written.

Per host, in order: ssh (an unknown host key is shown by its fingerprint and trusted only when `decide` says so, a
changed one never; failed key authentication offers to install the user's public key over a session the user
authenticates), the ConnectX-7 fabric (`observe.fabric.DETECT_SCRIPT`: ports up with an IPv4 address, their MTU,
the RoCE devices; an MTU under 9000 is offered `ip link set ... mtu 9000`), Docker and the NVIDIA runtime, the
Hugging Face cache's free space, the clock (sampled with `date +%s.%N` round trips on the injected clock, and NTP's
word from `timedatectl`). Then, between the nodes: the pair of ports every worker reaches the head over
(`observe.fabric.pairs`, pinged; with three nodes or more every pair of workers too, NCCL's ring), the link
measured with the real tools where both ends have them (`ib_write_bw` over both halves of the cable at once, each
rail judged as NVIDIA's playbook does; else TCP with `iperf3`, else one stream of python3's sockets), the clocks
compared. Then every ordered pair of nodes over ssh, as `sparktop sync` runs it (`remote.peers`: A's `$RSYNC_RSH`
or `ssh`, BatchMode, to B's fabric address): a host key unknown to A or A's key refused by B is fixed once the user
says so (A's key made where it has none, never over one; appended to B's ~/.ssh/authorized_keys through this
machine's own session to B; B's host key, the one this machine's session verified against its known_hosts, added
to the known_hosts A's `ssh -G` names; never ssh-keyscan, never StrictHostKeyChecking=no); a changed host key is
never replaced. Last, the inventory.

Every command is emitted (`CommandShown`) before it runs; `--dry-run` emits them and runs none (no connection
is even opened). Every value put in a command line is `shlex.quote`d. Nothing that changes a host or this
machine runs unless `decide` returned True for its `FixProposed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparktop.events import emitting
from sparktop.observe.fabric import DETECT_SCRIPT, NodeFabric, Port, pairs, parse_detect, parse_ping
from sparktop.observe.hostparse import parse_disks
from sparktop.remote import HostKeyError, Transport, TransportError, peers
from sparktop.remote.hostkeys import (
    AUTHORIZE,
    copy_id_command,
    host_key,
    known_fingerprints,
    public_key_for,
    resolve,
    shown,
    trust,
)
from sparktop.settings import Defaults
from sparktop.setup import inventory as inv
from sparktop.setup.events import (
    CheckDone,
    CheckStarted,
    CommandShown,
    FixApplied,
    FixDeclined,
    FixProposed,
    InventoryDone,
    SetupEvent,
    SetupFinished,
    Status,
)
from sparktop.setup.parse import (
    HF_FREE_FAIL_GIB,
    HF_FREE_WARN_GIB,
    LINK_BOTH_HALVES_GBPS,
    RECOMMENDED_MTU,
    ClockSample,
    PeerSSH,
    clock_spread,
    clocks_agree,
    parse_date,
    parse_docker_info,
    parse_ib_write_bw,
    parse_iperf3,
    parse_ntp,
    parse_peer_ssh,
    parse_ssh_g,
    parse_tcp_probe,
    rail_verdict,
)

GIB = 1024**3
Decide = Callable[[FixProposed], Awaitable[bool]]
Emit = Callable[[SetupEvent], None]
IB_PORT = 18515  # perftest's default port; the second half's server listens on the next one
DOCKER_INFO = "docker info --format '{{json .}}'"
TCP_PORT = IB_PORT + 5
# The last resort of the link test, one TCP stream with python3's sockets (DGX OS has python3): a sink on the worker
# that says when it listens and counts what arrives, and a source on the head that sends for N seconds and prints
# the bytes and the seconds it took until the sink had them all (the sink closes once it has counted them).
TCP_SINK = ("import socket, sys\n"
            "s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
            "s.settimeout(60)\n"
            'print("listening", flush=True)\n'
            "c, _ = s.accept()\n"
            "n = 0\n"
            "while b := c.recv(1 << 20):\n"
            "    n += len(b)\n"
            "print(n, flush=True)\n"
            "c.close()\n")
TCP_SOURCE = ("import socket, sys, time\n"
              "c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)\n"
              "buf, n = bytes(1 << 20), 0\n"
              "t = time.monotonic()\n"
              "while time.monotonic() - t < float(sys.argv[3]):\n"
              "    c.sendall(buf)\n"
              "    n += len(buf)\n"
              "c.shutdown(socket.SHUT_WR)\n"
              "c.recv(1)\n"
              "print(n, time.monotonic() - t)\n")
TOOLS = "for t in ib_write_bw iperf3 python3 timeout; do command -v \"$t\" >/dev/null 2>&1 && echo \"$t\"; done; true"


_PUBLIC_KEY = re.compile(r"(ssh|ecdsa|sk)-[A-Za-z0-9@.-]+ [A-Za-z0-9+/=]+( [^\n]*)?")


def _on_home(path: str) -> str:
    """A path for the node's shell, `~/` as its $HOME (quoted either way)."""
    return '"$HOME"' + shlex.quote(path[1:]) if path.startswith("~/") else shlex.quote(path)


def _disk_script(hf_cache: str) -> str:
    """`df -Pk` of the HF cache, or of its nearest existing parent when it is not made yet (a bare node)."""
    path = _on_home(hf_cache)
    return (f'h={path}; while [ -n "$h" ] && [ ! -e "$h" ]; do h=${{h%/*}}; done; [ -n "$h" ] || h=/; '
            'echo "hf_cache $h"; df -Pk -- "$h"')


@dataclass
class Host:
    """One host as setup finds it."""

    given: str  # as typed on the command line, less a `user@` in front
    user: str | None = None  # from `user@host`, else --user (None: the ssh config's, else this machine's)
    transport: Transport | None = None
    reachable: bool = False
    fabric: NodeFabric | None = None
    ports: list[Port] = field(default_factory=list)
    tools: set[str] = field(default_factory=set)
    clock: ClockSample | None = None
    root: bool = True
    chosen: Port | None = None  # the port the inventory names

    @property
    def name(self) -> str:
        return self.given.removesuffix(".local")


@dataclass
class Options:
    hosts: list[str]
    inventory: Path
    user: str | None = None
    dry_run: bool = False
    hf_cache: str = Defaults.hf_cache


def ssh_transport(host: str, user: str | None) -> Transport:
    from sparktop.remote.ssh import SSHTransport

    return SSHTransport(host, user=user, name=host)


class Setup:
    def __init__(self, options: Options, decide: Decide, *,
                 transport_for: Callable[[str, str | None], Transport] = ssh_transport,
                 clock: Callable[[], float] = time.time):
        self.options = options
        self.decide = decide
        self.transport_for = transport_for
        self.clock = clock  # this machine's wall clock, for the nodes' clock offsets (a test gives its own)
        self.hosts = []
        for typed in dict.fromkeys(options.hosts):
            user, at, name = typed.rpartition("@")  # `nvidia@spark-a`, as ssh takes it
            self.hosts.append(Host(name, user if at and user else options.user))
        self._emit: Emit = lambda e: None
        self.warnings = 0
        self.failures = 0
        self.changed = False

    # -- plumbing ---------------------------------------------------------------

    def events(self) -> AsyncIterator[SetupEvent]:
        """The events as an async iterator (the CLI passes `emit` to `run` instead, so a prompt never
        overtakes what was printed before it)."""
        return emitting(self.run)

    def done(self, host: str, check: str, status: Status, reason: str) -> None:
        self.warnings += status == "warn"
        self.failures += status == "fail"
        self._emit(CheckDone(host, check, status, reason))

    async def sh(self, host: Host, check: str, cmd: str, *, timeout: float = 30.0, changes: bool = False):
        """Show the command, then run it (None in a dry run)."""
        self._emit(CommandShown(host.name, check, cmd, changes=changes, ran=not self.options.dry_run))
        if self.options.dry_run or host.transport is None:
            return None
        return await host.transport.run(cmd, timeout=timeout)

    async def propose(self, fix: FixProposed) -> bool:
        self._emit(fix)
        if self.options.dry_run:
            self._emit(FixDeclined(fix.host, fix.check, "dry run: nothing changed"))
            return False
        yes = await self.decide(fix)
        if not yes:
            self._emit(FixDeclined(fix.host, fix.check, "declined: nothing changed"))
        return yes

    # -- the run ------------------------------------------------------------------

    async def run(self, emit: Emit) -> bool:
        self._emit = emit
        try:
            for host in self.hosts:
                await self._host(host)
            reached = [h for h in self.hosts if h.reachable]
            if not self.options.dry_run and len(reached) == len(self.hosts):
                await self._between(reached)
            await self._inventory()
        finally:
            for host in self.hosts:
                if host.transport is not None:
                    with contextlib.suppress(Exception):
                        await host.transport.close()
        ok = self.failures == 0
        emit(SetupFinished(ok, self.changed, self.warnings, self.failures, self.options.dry_run))
        return ok

    async def _host(self, host: Host) -> None:
        self._emit(CheckStarted(host.name, "ssh"))
        if self.options.dry_run:
            for check, cmd in (("ssh", "id -u"), ("fabric", DETECT_SCRIPT), ("docker", DOCKER_INFO),
                               ("disk", _disk_script(self.options.hf_cache)), ("clock", "date +%s.%N"),
                               ("clock", "timedatectl show -p NTPSynchronized --value"), ("link", TOOLS)):
                await self.sh(host, check, cmd)
            return
        host.transport = self.transport_for(host.given, host.user)
        if not await self._ssh(host):
            return
        host.reachable = True
        steps: list[tuple[str, Callable[[Host], Awaitable[None]]]] = [
            ("fabric", self._fabric), ("docker", self._docker), ("disk", self._disk), ("clock", self._clock)]
        for name, step in steps:
            try:
                await step(host)
            except TransportError as exc:
                self.done(host.name, name, "fail", exc.message)

    # -- ssh ----------------------------------------------------------------------

    async def _ssh(self, host: Host) -> bool:
        # A bare host can need both fixes, one after the other: its host key trusted, then our key installed;
        # each is offered once, and the connection tried again after each.
        trusted = copied = False
        for _ in range(3):
            try:
                r = await self.sh(host, "ssh", "id -u")
            except HostKeyError as exc:
                if "does not match" in exc.message or trusted:  # a changed key is never replaced here
                    self.done(host.name, "ssh", "fail", exc.message)
                    return False
                if not await self._trust(host):
                    return False
                trusted = True
                continue
            except TransportError as exc:
                if "authentication failed" in exc.message and not copied and await self._copy_id(host):
                    copied = True
                    continue
                self.done(host.name, "ssh", "fail", exc.message)
                return False
            assert r is not None
            host.root = r.stdout.strip() == "0"
            self.done(host.name, "ssh", "ok", "reached with key authentication, host key known")
            return True
        self.done(host.name, "ssh", "fail", "still not reachable after the fix")
        return False

    async def _trust(self, host: Host) -> bool:
        try:
            target = resolve(host.given, host.user)
            key = await host_key(target)
        except TransportError as exc:
            self.done(host.name, "ssh", "fail", exc.message)
            return False
        known = known_fingerprints(target)
        if known:  # asyncssh says "not trusted" for a changed key too: never offer to add a second one
            self.done(host.name, "ssh", "fail", f"host key does not match known_hosts: {target.known_hosts_name} "
                                                f"presents {key.fingerprint}, known_hosts has {', '.join(known)}; if "
                                                "the node was reinstalled, check its new key there and remove the old "
                                                f"with `ssh-keygen -R {shlex.quote(target.known_hosts_name)}`")
            return False
        kind = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa"}.get(key.algorithm, "ecdsa")
        fix = FixProposed(host.name, "ssh", f"the host key of {target.known_hosts_name} is not in known_hosts: "
                                            f"{key.algorithm} {key.fingerprint}; compare it with the node's own "
                                            f"(`ssh-keygen -lf /etc/ssh/ssh_host_{kind}_key.pub` there) and trust it",
                          (f"echo {shlex.quote(key.line)} >> "
                           f"{shlex.quote(target.known_hosts) if target.known_hosts else '~/.ssh/known_hosts'}",),
                          kind="trust-host-key")
        if not await self.propose(fix):
            self.done(host.name, "ssh", "fail", f"unknown host key {key.fingerprint} not trusted "
                                                f"({target.known_hosts_name})")
            return False
        self._emit(CommandShown(host.name, "ssh", fix.commands[0], changes=True))  # done here, not on the host
        try:
            path = trust(key)
        except OSError as exc:
            self._emit(FixApplied(host.name, "ssh", False, f"cannot write known_hosts: {exc.strerror or exc}"))
            self.done(host.name, "ssh", "fail", f"unknown host key {key.fingerprint} not trusted: known_hosts "
                                                "could not be written")
            return False
        self.changed = True
        self._emit(FixApplied(host.name, "ssh", True, f"{key.fingerprint} added to {path}"))
        return True

    async def _copy_id(self, host: Host) -> bool:
        try:
            target = resolve(host.given, host.user)
        except TransportError:
            return False
        public = public_key_for(target)
        if public is None:
            self.done(host.name, "ssh", "fail", "key authentication failed and there is no key to install: make "
                                                "one with `ssh-keygen -t ed25519`, then run setup again")
            return False
        argv = copy_id_command(target, public)
        fix = FixProposed(host.name, "ssh", f"key authentication failed: install {public} in the host's "
                                            "~/.ssh/authorized_keys (you log in once, with your password)",
                          (shown(argv, public),))
        if not await self.propose(fix):
            return False
        self._emit(CommandShown(host.name, "ssh", fix.commands[0], changes=True))
        try:
            with public.open("rb") as key:
                proc = await asyncio.create_subprocess_exec(*argv, stdin=key)
                status = await proc.wait()
        except OSError as exc:  # no `ssh` client here, the key unreadable
            self._emit(FixApplied(host.name, "ssh", False, f"`{argv[0]}`: {exc.strerror or exc}"))
            return False
        self.changed = self.changed or status == 0
        self._emit(FixApplied(host.name, "ssh", status == 0, "key installed" if status == 0 else
                              f"`ssh` exited with status {status}"))
        if host.transport is not None:
            await host.transport.close()
        return status == 0

    # -- per node -------------------------------------------------------------------

    async def _fabric(self, host: Host) -> None:
        self._emit(CheckStarted(host.name, "fabric"))
        r = await self.sh(host, "fabric", DETECT_SCRIPT)
        found = host.fabric = parse_detect(r.stdout if r else "")
        host.ports = found.ports()
        # A warning, as in a launch's preflight: NCCL and Gloo then pick an interface themselves (slowly).
        if not found.links:
            self.done(host.name, "fabric", "warn", found.describe())
            return
        if not host.ports:
            self.done(host.name, "fabric", "warn", f"no ConnectX-7 port is up with an IPv4 address ({found.describe()})"
                                                   ": cable a QSFP port and address it (NVIDIA's connect-two-sparks "
                                                   "playbook: netplan, MTU 9000)")
            return
        ports = ", ".join(f"{p.netdev} {p.address}" for p in host.ports)
        roce = ",".join(found.roce) or "none up"
        self.done(host.name, "fabric", "ok" if found.roce else "warn",
                  f"{ports}; RoCE {roce} ({found.source or 'no RoCE device found'})")
        await self._mtu(host)

    async def _mtu(self, host: Host) -> None:
        assert host.fabric is not None
        low = sorted({p.netdev for p in host.ports if (p.mtu or 0) < RECOMMENDED_MTU})
        if not low:
            self.done(host.name, "mtu", "ok", f"MTU {RECOMMENDED_MTU} on {', '.join(p.netdev for p in host.ports)}")
            return
        said = ", ".join(f"{n} {host.fabric.mtu(n) or '?'}" for n in low)
        sudo = "" if host.root else "sudo -n "
        cmds = [f"{sudo}ip link set dev {shlex.quote(n)} mtu {RECOMMENDED_MTU}" for n in low]
        fix = FixProposed(host.name, "mtu", f"MTU {said}: RoCE wants {RECOMMENDED_MTU} (a 4096-byte path MTU); set it "
                                            "now (until reboot: keep it in netplan, `mtu: 9000` under each port)",
                          tuple(cmds))
        if not await self.propose(fix):
            self.done(host.name, "mtu", "warn", f"MTU {said}, {RECOMMENDED_MTU} recommended for RoCE")
            return
        failed = []
        for cmd in cmds:
            r = await self.sh(host, "mtu", cmd, changes=True)
            if r is not None and not r.ok:
                failed.append(f"`{cmd}`: {r.first_error_line()}")
        self.changed = self.changed or len(failed) < len(cmds)
        self._emit(FixApplied(host.name, "mtu", not failed, "; ".join(failed) or f"MTU {RECOMMENDED_MTU} set"))
        # Read back, so what the inventory and the link test see is the node's word, not ours.
        r = await self.sh(host, "mtu", DETECT_SCRIPT)
        host.fabric = parse_detect(r.stdout if r else "")
        host.ports = host.fabric.ports()
        still = [f"{p.netdev} {p.mtu}" for p in host.ports if (p.mtu or 0) < RECOMMENDED_MTU]
        self.done(host.name, "mtu", "warn" if still else "ok",
                  f"still {', '.join(still)}" if still else f"MTU {RECOMMENDED_MTU} now")

    async def _docker(self, host: Host) -> None:
        self._emit(CheckStarted(host.name, "docker"))
        r = await self.sh(host, "docker", DOCKER_INFO)
        assert r is not None
        if r.exit_status == 127:
            self.done(host.name, "docker", "fail", "docker is not installed")
            return
        info = parse_docker_info(r.stdout or r.stderr)
        if info.version is None:
            why = info.error or r.first_error_line()
            self.done(host.name, "docker", "fail", f"the Docker daemon did not answer: {why}")
        elif not info.nvidia:
            self.done(host.name, "docker", "warn", f"Docker {info.version} has no NVIDIA runtime (runtimes: "
                                                   f"{', '.join(info.runtimes) or 'none'}): `sudo nvidia-ctk runtime "
                                                   "configure --runtime=docker && sudo systemctl restart docker`")
        else:
            default = f", default {info.default_runtime}" if info.default_runtime else ""
            self.done(host.name, "docker", "ok", f"Docker {info.version}, NVIDIA runtime{default}")

    async def _disk(self, host: Host) -> None:
        self._emit(CheckStarted(host.name, "disk"))
        r = await self.sh(host, "disk", _disk_script(self.options.hf_cache))
        assert r is not None
        disks = [d for d in parse_disks(r.stdout) if "hf_cache" in d.holds]
        if not disks:
            self.done(host.name, "disk", "warn", f"cannot read the free space of {self.options.hf_cache}: "
                                                 f"{r.first_error_line()}")
            return
        free = disks[0].free / GIB
        status: Status = "fail" if free < HF_FREE_FAIL_GIB else "warn" if free < HF_FREE_WARN_GIB else "ok"
        self.done(host.name, "disk", status, f"{free:,.0f} GiB free of {disks[0].total / GIB:,.0f} GiB on "
                                             f"{disks[0].mount} (the HF cache's filesystem)")

    async def _clock(self, host: Host) -> None:
        self._emit(CheckStarted(host.name, "clock"))
        best: ClockSample | None = None
        for _ in range(3):  # the shortest round trip bounds the offset best
            before = self.clock()
            r = await self.sh(host, "clock", "date +%s.%N")
            after = self.clock()
            remote = parse_date(r.stdout) if r else None
            if remote is None:
                break
            sample = ClockSample(before, remote, after)
            if best is None or sample.bound < best.bound:
                best = sample
        host.clock = best
        r = await self.sh(host, "clock", "timedatectl show -p NTPSynchronized --value")
        ntp = parse_ntp(r.stdout) if r and r.ok else None
        if best is None:
            self.done(host.name, "clock", "warn", "cannot read the clock (`date +%s.%N`)")
        elif ntp is False:
            self.done(host.name, "clock", "warn", "NTP is not synchronised (timedatectl): `sudo timedatectl set-ntp "
                                                  "true`, or check chrony")
        else:
            self.done(host.name, "clock", "ok", "NTP synchronised" if ntp else "read; NTP's state not known "
                                                "(no timedatectl): compared with the other nodes below")

    # -- between the nodes ----------------------------------------------------------

    async def _between(self, hosts: list[Host]) -> None:
        await self._fabric_between(hosts)
        if len(hosts) > 1:
            await self._mesh(hosts)

    async def _fabric_between(self, hosts: list[Host]) -> None:
        if len(hosts) > 1:
            await self._clocks(hosts)
        head, workers = hosts[0], hosts[1:]
        if not all(h.ports for h in hosts):
            if workers:
                bare = ", ".join(h.name for h in hosts if not h.ports)
                self.done("all", "link", "warn", f"not tested: {bare} has no ConnectX-7 port up with an address")
            return
        if not workers:
            head.chosen = head.ports[0]
            return
        for worker in workers:
            try:
                await self._link(head, worker)
            except TransportError as exc:  # a node that stopped answering, a command past its time: one line
                self.done(worker.name, "link", "fail", exc.message)
        if len(workers) > 1 and all(w.chosen is not None for w in workers):
            try:
                await self._ring(workers)
            except TransportError as exc:
                self.done("all", "ring", "fail", exc.message)

    async def _ring(self, workers: list[Host]) -> None:
        """Tensor parallel over three nodes or more rings every node to its neighbours (NCCL), not only to the
        head: every pair of workers pings over the ports chosen, as a launch's preflight does."""
        self._emit(CheckStarted("all", "ring"))
        missed = []
        for i, a in enumerate(workers):
            for b in workers[i + 1:]:
                assert a.chosen is not None and b.chosen is not None
                r = await self.sh(a, "ring", f"LC_ALL=C ping -c1 -W2 -I {shlex.quote(a.chosen.netdev)} "
                                             f"{shlex.quote(str(b.chosen.address.ip))}", timeout=15)
                assert r is not None
                ping = parse_ping(r.stdout + "\n" + r.stderr, r.exit_status)
                if not ping.ok:
                    missed.append(f"{a.name} → {b.name} {b.chosen.address.ip} "
                                  f"({ping.error or ping.summary or r.first_error_line()})")
        if missed:
            self.done("all", "ring", "fail", f"not every pair of nodes reaches each other over the fabric: "
                                             f"{'; '.join(missed)} (NCCL's ring needs every pair)")
        else:
            self.done("all", "ring", "ok", f"every pair of the {len(workers) + 1} nodes reaches each other over the "
                                           "fabric")

    async def _clocks(self, hosts: list[Host]) -> None:
        samples = {h.name: h.clock for h in hosts if h.clock is not None}
        if len(samples) < 2:
            return
        self._emit(CheckStarted("all", "clocks"))
        spread, unknown = clock_spread(samples)
        if clocks_agree(samples):
            self.done("all", "clocks", "ok", f"the nodes' clocks agree within {max(spread, unknown) * 1000:.0f} ms")
        else:
            self.done("all", "clocks", "warn", f"the nodes' clocks differ by {spread * 1000:.0f} ms (±"
                                               f"{unknown * 1000:.0f}): sync them (chrony/NTP); logs and traces "
                                               "across nodes will not line up")

    async def _link(self, head: Host, worker: Host) -> None:
        check = "link"
        self._emit(CheckStarted(worker.name, check))
        options = pairs(head.ports if head.chosen is None else [head.chosen], worker.ports)
        if not options:
            self.done(worker.name, check, "fail", f"no address here shares a subnet with {head.name}'s: address both "
                                                  "ends of the cable in one subnet")
            return
        h, w = options[0]
        r = await self.sh(worker, check, f"LC_ALL=C ping -c1 -W2 -I {shlex.quote(w.netdev)} "
                                         f"{shlex.quote(str(h.address.ip))}", timeout=15)
        assert r is not None
        ping = parse_ping(r.stdout + "\n" + r.stderr, r.exit_status)
        if not ping.ok:
            self.done(worker.name, check, "fail", f"does not reach {head.name} {h.address.ip} over {w.netdev}: "
                                                  f"{ping.error or ping.summary or r.first_error_line()}")
            return
        head.chosen, worker.chosen = head.chosen or h, w
        for host in (head, worker):
            if not host.tools:
                r = await self.sh(host, check, TOOLS)
                host.tools = set(r.stdout.split()) if r else set()
        reached = f"reaches {head.name} {h.address.ip} over {w.netdev}"
        if "ib_write_bw" in head.tools and "ib_write_bw" in worker.tools:
            await self._rdma(head, worker, reached)
        elif all({"iperf3", "python3"} & h.tools for h in (head, worker)):
            await self._tcp(head, worker, reached)
        else:
            self.done(worker.name, check, "warn", f"{reached}; bandwidth not measured: neither ib_write_bw "
                                                  "(perftest), iperf3 nor python3 is on both nodes (`sudo apt "
                                                  "install perftest`)")

    def _halves(self, head: Host, worker: Host) -> list[tuple[str, Port, Port]]:
        """(RoCE device on the head, head port, worker port) for each half of the cable addressed on both ends."""
        assert head.fabric is not None
        devices = {link.netdev: link.ibdev for link in head.fabric.links}
        out: list[tuple[str, Port, Port]] = []
        seen: set[str] = set()
        for h, w in pairs(head.ports, worker.ports):
            if h.netdev in seen or w.netdev in {x[2].netdev for x in out} or h.netdev not in devices:
                continue
            seen.add(h.netdev)
            out.append((devices[h.netdev], h, w))
        return out

    async def _pair(self, head: Host, worker: Host, servers: list[str], ready: str,
                    clients: list[str]) -> tuple[list, str | None]:
        """Servers started on the worker (their output streamed), and once each has printed `ready`, the clients
        run on the head all at once: the clients' results, or why a server did not start (bounded throughout)."""
        assert head.transport is not None and worker.transport is not None
        waiting = [asyncio.Event() for _ in servers]
        said: list[list[str]] = [[] for _ in servers]

        async def serve(i: int, cmd: str) -> None:
            self._emit(CommandShown(worker.name, "link", cmd))
            assert worker.transport is not None
            async for line in worker.transport.stream(cmd):
                said[i].append(line)
                if ready in line:
                    waiting[i].set()
            waiting[i].set()  # it ended: below, whether it ever waited says why

        tasks = [asyncio.create_task(serve(i, cmd)) for i, cmd in enumerate(servers)]
        try:
            async with asyncio.timeout(30):
                await asyncio.gather(*(e.wait() for e in waiting))
            for cmd, out in zip(servers, said, strict=True):
                if not any(ready in line for line in out):
                    why = next((line.strip() for line in out if line.strip()), "no output")
                    return [], f"`{cmd}` on {worker.name}: {why}"
            for cmd in clients:
                self._emit(CommandShown(head.name, "link", cmd))
            results = await asyncio.gather(*(head.transport.run(cmd, timeout=90) for cmd in clients))
            async with asyncio.timeout(30):  # the servers end once their client is done
                await asyncio.gather(*tasks)
            return list(results), None
        except TimeoutError:
            last = " ".join(out[-1] for out in said if out) or "no output"
            return [], f"a server on {worker.name} did not get ready or did not end ({last})"
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _rdma(self, head: Host, worker: Host, reached: str) -> None:
        """`ib_write_bw` over every half at once: a server per half on the worker, then a client per half
        here, all clients together (one half at a time reads about half of what the cable carries)."""
        assert worker.fabric is not None
        wdev = {link.netdev: link.ibdev for link in worker.fabric.links}
        halves = self._halves(head, worker)
        # Bounded on the nodes too: a server whose client never came (or a client stuck) ends by itself.
        limit = {h.name: "timeout 60 " if "timeout" in h.tools else "" for h in (head, worker)}
        servers, clients = [], []
        for i, (hdev, _h, w) in enumerate(halves):
            common = f"-p {IB_PORT + i} --report_gbits -q 4 -R"
            servers.append(f"{limit[worker.name]}ib_write_bw -d {shlex.quote(wdev.get(w.netdev, w.netdev))} {common}")
            clients.append(f"{limit[head.name]}ib_write_bw -d {shlex.quote(hdev)} {common} "
                           f"{shlex.quote(str(w.address.ip))}")
        results, failed = await self._pair(head, worker, servers, "Waiting for client", clients)
        if failed:
            self.done(worker.name, "link", "fail", f"{reached}; {failed}")
            return
        figures = []
        for (hdev, _h, _w), r in zip(halves, results, strict=True):
            bw = parse_ib_write_bw(r.stdout)
            if bw is None:
                self.done(worker.name, "link", "fail", f"{reached}; ib_write_bw -d {hdev} measured nothing: "
                                                       f"{r.first_error_line()}")
                return
            figures.append((hdev, bw.average_gbps))
        total = sum(g for _, g in figures)
        each = " + ".join(f"{d} {g:.1f}" for d, g in figures)
        text = f"{reached}; RDMA write {total:.1f} Gb/s ({each}, ib_write_bw, all halves at once)"
        wrong = [f"{d}: {why}" for d, g in figures if (why := rail_verdict(g))]
        if wrong:
            self.done(worker.name, "link", "warn", f"{text}; {'; '.join(wrong)}")
        elif len(figures) < 2:
            self.done(worker.name, "link", "warn", f"{text}: only one half of the cable is addressed on both ends, "
                                                   "so NCCL gets about half the link; address the other half too")
        elif total < LINK_BOTH_HALVES_GBPS:
            self.done(worker.name, "link", "warn", f"{text}: below the ~196 Gb/s a Spark pair reads; check the cable "
                                                   "and the MTU")
        else:
            self.done(worker.name, "link", "ok", text)

    async def _tcp(self, head: Host, worker: Host, reached: str) -> None:
        """No ib_write_bw on both ends: TCP over the fabric with iperf3 (4 streams), else one stream of python3's
        sockets (a floor: one Python stream does not fill the link)."""
        w = worker.chosen
        assert w is not None
        address = shlex.quote(str(w.address.ip))
        if "iperf3" in head.tools and "iperf3" in worker.tools:
            tool, servers, ready = "iperf3, 4 streams", [f"iperf3 -s -1 --forceflush -B {address}"], "listening"
            clients = [f"iperf3 -c {address} -t 3 -P 4 -J"]
        else:
            tool, servers, ready = "python3, one stream: a floor", [f"python3 -c {shlex.quote(TCP_SINK)} {address} "
                                                                   f"{TCP_PORT}"], "listening"
            clients = [f"python3 -c {shlex.quote(TCP_SOURCE)} {address} {TCP_PORT} 2"]
        results, failed = await self._pair(head, worker, servers, ready, clients)
        r = results[0] if results else None
        gbps = (parse_iperf3(r.stdout) if tool.startswith("iperf3") else parse_tcp_probe(r.stdout)) if r else None
        if failed or gbps is None:
            why = failed or (r.first_error_line() if r else "no result")
            self.done(worker.name, "link", "warn", f"{reached}; the TCP test measured nothing: {why}")
        else:
            self.done(worker.name, "link", "ok", f"{reached}; TCP {gbps:.1f} Gb/s ({tool}); RDMA not measured: no "
                                                 "ib_write_bw on both nodes (`sudo apt install perftest`)")

    # -- the nodes' ssh to each other ------------------------------------------------

    async def _mesh(self, hosts: list[Host]) -> None:
        """Every ordered pair: A reaches B over ssh as `sparktop sync` will (`remote.peers`: A's `$RSYNC_RSH` or
        ssh, BatchMode), at the address the inventory gives B (its fabric address, else its host). A host key
        unknown to A, or A's key refused by B, is fixed once the user says so."""
        entries = {e.name: e for e in self.entries()}
        for a in hosts:
            for b in hosts:
                if a is b:
                    continue
                try:
                    await self._peer(a, b, entries[b.name])
                except TransportError as exc:
                    self.done(a.name, "mesh", "fail", f"ssh to {b.name}: {exc.message}")

    async def _peer_check(self, a: Host, address: str) -> PeerSSH:
        r = await self.sh(a, "mesh", peers.check_command(address), timeout=30)
        assert r is not None
        return parse_peer_ssh(r.stderr, r.exit_status)

    async def _peer(self, a: Host, b: Host, entry: inv.NodeEntry) -> None:
        self._emit(CheckStarted(a.name, "mesh"))
        where = entry.fabric_ip or entry.host
        address = f"{entry.user}@{where}" if entry.user else where
        said = f"ssh to {b.name} {where}"
        first = await self._peer_check(a, address)
        if first.ok:
            self.done(a.name, "mesh", "ok", f"{said}: key authentication, host key known (as sync reaches it)")
            return
        why = await self._peer_fix(a, b, address, first, said) if first.fixable else first.reason
        if why is not None:
            self.done(a.name, "mesh", "fail", f"{said}: {why}")
            return
        again = await self._peer_check(a, address)
        self.done(a.name, "mesh", "ok" if again.ok else "fail",
                  f"{said}: key authentication, host key known now" if again.ok else
                  f"{said}: still {again.reason} after the fix")

    async def _peer_fix(self, a: Host, b: Host, address: str, first: PeerSSH, said: str) -> str | None:
        """A's key (made when A has none, never over one) appended to B's ~/.ssh/authorized_keys through this
        machine's session to B; B's host key, as this machine verified it, added to the known_hosts A's ssh reads
        (`ssh -G` says which files: the config's, as on a Spark). None once done, else why not."""
        assert a.transport is not None and b.transport is not None
        r = await self.sh(a, "mesh", peers.config_command(address))
        conf = parse_ssh_g(r.stdout) if r is not None and r.ok else {}
        if not conf:
            return f"{first.reason}; cannot read the source's ssh settings (`ssh -G`): " \
                   f"{r.first_error_line() if r else 'no output'}"
        identities = [f for f in conf.get("identityfile", []) if "%" not in f] or ["~/.ssh/id_ed25519"]
        known = next(iter(conf.get("userknownhostsfile", [])), "~/.ssh/known_hosts")
        name = next(iter(conf.get("hostkeyalias", []) or conf.get("hostname", [])), address.rpartition("@")[2])
        port = next(iter(conf.get("port", [])), "22")
        known_name = name if port == "22" else f"[{name}]:{port}"
        files = " ".join(_on_home(f) for f in identities)
        r = await self.sh(a, "mesh", f'for f in {files}; do [ -f "$f" ] && [ -f "$f.pub" ] && '
                                     '{ printf \'%s\\n\' "$f"; break; }; done; true')
        have = (r.stdout.strip().splitlines() or [None])[0] if r is not None else None
        key = have or next((f for f in identities if f.endswith("/id_ed25519")), identities[0])
        host_line = None
        if first.kind == "unknown-host-key":
            verified = getattr(b.transport, "server_host_key", None)
            trusted = await verified() if verified is not None else None
            if not trusted:
                return f"{first.reason}; this machine has no verified host key of {b.name} to give it"
            host_line = f"{known_name} {trusted}"
        commands = []
        if have is None:
            commands.append((a, f"k={_on_home(key)}; mkdir -p -m 700 -- \"$(dirname -- \"$k\")\" && "
                                "{ [ -e \"$k\" ] || ssh-keygen -q -t ed25519 -N '' -f \"$k\"; }"))
        commands.append((b, AUTHORIZE))
        if host_line is not None:
            commands.append((a, f"f={_on_home(known)}; umask 077; mkdir -p -- \"$(dirname -- \"$f\")\" && "
                                f"touch -- \"$f\" && {{ grep -qxF {shlex.quote(host_line)} \"$f\" || "
                                f"printf '%s\\n' {shlex.quote(host_line)} >> \"$f\"; }}"))
        pub = f"{key}.pub"
        shown_cmds = tuple(f"{h.name}: {cmd}" + (f" < {a.name}:{pub}" if cmd is AUTHORIZE else "")
                           for h, cmd in commands)
        make = f"make a key on {a.name} ({key}), " if have is None else ""
        what = (f"{said}: {first.reason}: {make}authorize {a.name}'s {pub} in {b.name}'s ~/.ssh/authorized_keys "
                f"(through your session to {b.name})"
                + (f", and add {b.name}'s host key as this machine verified it to {a.name}'s {known}"
                   if host_line else ""))
        if not await self.propose(FixProposed(a.name, "mesh", what, shown_cmds)):
            return f"{first.reason} (not fixed)"
        for host, cmd in commands:
            if cmd is AUTHORIZE:
                r = await self.sh(a, "mesh", f"cat -- {_on_home(pub)}")
                public = r.stdout.strip() if r is not None and r.ok else ""
                if not _PUBLIC_KEY.fullmatch(public):  # one public key line, never anything else of the file
                    self._emit(FixApplied(a.name, "mesh", False, f"{pub} on {a.name} is not one public key line"))
                    return f"{first.reason} (not fixed)"
                self._emit(CommandShown(host.name, "mesh", f"{cmd} < {a.name}:{pub}", changes=True))
                r = await host.transport.run(cmd, timeout=30, input=public + "\n")  # type: ignore[union-attr]
            else:
                r = await self.sh(host, "mesh", cmd, changes=True)
            if r is not None and not r.ok:
                self._emit(FixApplied(a.name, "mesh", False, f"on {host.name}: {r.first_error_line()}"))
                return f"{first.reason} (the fix failed on {host.name}: {r.first_error_line()})"
        self.changed = True
        self._emit(FixApplied(a.name, "mesh", True, f"{a.name}'s key authorized on {b.name}"
                              + (f", {b.name}'s host key in {known}" if host_line else "")))
        return None

    # -- the inventory ------------------------------------------------------------

    def entries(self) -> list[inv.NodeEntry]:
        out = []
        for host in self.hosts:
            entry = inv.NodeEntry(host.name, host.given, host.user,
                                  sources={"host": "how ssh reaches it (as given; ~/.ssh/config applies)"})
            port = host.chosen
            if port is not None and host.fabric is not None:
                entry.fabric_ip, entry.eth_if = str(port.address.ip), port.netdev
                entry.ib_if = host.fabric.roce
                entry.sources["fabric_ip"] = f"{port.netdev}'s IPv4 address (ip -br addr)"
                entry.sources["eth_if"] = ("the ConnectX-7 port up and reaching the other nodes (ping)"
                                           if len(self.hosts) > 1 else "the ConnectX-7 port up with an address")
                entry.sources["ib_if"] = f"RoCE devices up ({host.fabric.source or '?'}), for NCCL_IB_HCA"
            out.append(entry)
        return out

    def _not_written(self, path: Path, exc: OSError) -> None:
        self.failures += 1
        self._emit(InventoryDone(str(path), "not written", exc.strerror or str(exc)))

    async def _inventory(self) -> None:
        path = self.options.inventory
        if self.options.dry_run:
            self._emit(InventoryDone(str(path), "not written", "dry run"))
            return
        if self.failures:
            self._emit(InventoryDone(str(path), "not written", "a check failed; fix it and run setup again"))
            return
        text = inv.render(self.entries(), self.options.hf_cache)
        try:
            old = path.read_text() if path.exists() else None
        except OSError as exc:  # a directory, no permission: said, never a traceback
            self._not_written(path, exc)
            return
        if old == text:
            self._emit(InventoryDone(str(path), "unchanged", "it already says what was found"))
            return
        if old is not None:
            fix = FixProposed("local", "inventory", f"{path} differs from what was found: replace it (the old one is "
                                                    "kept as a backup)", (f"write {path}",))
            if not await self.propose(fix):
                self._emit(InventoryDone(str(path), "kept", "left as it was"))
                return
        try:
            backup = inv.write(path, text)
        except OSError as exc:
            self._not_written(path, exc)
            return
        self.changed = True
        self._emit(InventoryDone(str(path), "written", f"{len(self.hosts)} node(s)",
                                 str(backup) if backup else None))
