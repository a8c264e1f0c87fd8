"""`sparktop setup`'s readers, inventory writer, questions and checks, on real captured outputs.

The nodes here answer from captures of real Sparks (`ibdev2netdev`: NVIDIA's playbook and eugr's README; `ip -br
addr`: starsky and hutch, cabled to each other; `ib_write_bw`: eugr's docs; iputils' `ping`) through a transport
that records every command; the clocks are the test's own (a counter), so the offsets are exact. The lab runs
the same over real OpenSSH (tests/e2e/test_lab_setup.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparktop.observe.fabric import DETECT_SCRIPT, parse_ip_br_addr
from sparktop.remote import CommandResult
from sparktop.remote.hostkeys import HostKey, Target, copy_id_command, public_key_for, resolve, shown, trust
from sparktop.settings import load_inventory
from sparktop.setup import inventory as inv
from sparktop.setup.events import CheckDone, CommandShown, FixDeclined, FixProposed, InventoryDone, SetupFinished
from sparktop.setup.parse import (
    ClockSample,
    clock_spread,
    clocks_agree,
    parse_docker_info,
    parse_ib_write_bw,
    parse_iperf3,
    parse_ntp,
    rail_verdict,
)
from sparktop.setup.runner import Options, Setup
from sparktop.twin import fabric_tools
from sparktop.twin.host import TwinHost

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IB_WRITE_BW = FIXTURES / "setup" / "ib_write_bw_dgx-spark_rocep1s0f1-q4-client_eugr-spark-vllm-docker.txt"
IBDEV = FIXTURES / "captures" / "ibdev2netdev_dgx-spark_rocep1-first_eugr-spark-vllm-docker.txt"
ADDR = {"starsky": FIXTURES / "fabric" / "ip-br-addr_dgx-spark-starsky_code-monkeys.txt",
        "hutch": FIXTURES / "fabric" / "ip-br-addr_dgx-spark-hutch_code-monkeys.txt"}
PING = FIXTURES / "fabric" / "ping_iputils-20221126_reply.txt"
NO_REPLY = FIXTURES / "fabric" / "ping_iputils-20221126_no-reply.txt"


# -- readers ------------------------------------------------------------------------


def test_ib_write_bw_report_of_a_spark():
    bw = parse_ib_write_bw(IB_WRITE_BW.read_text())
    assert bw is not None
    assert (bw.size, bw.iterations, bw.peak_gbps, bw.average_gbps, bw.msg_rate_mpps) == \
        (65536, 20000, 111.72, 111.71, 0.21307)


def test_ib_write_bw_in_megabytes_and_a_failed_run():
    text = (" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
            " 65536      5000             11000.00            10000.00\t\t   0.160000\n")
    bw = parse_ib_write_bw(text)
    assert bw is not None and round(bw.average_gbps, 2) == round(10000 * 8 * 1.048576 / 1000, 2)
    assert parse_ib_write_bw(" Unable to perform rdma_client function\n Unable to init the socket connection\n") is None


def test_the_twins_ib_write_bw_prints_perftests_layout():
    """The stand-in's report has the capture's lines in the capture's order, and reads back as its figure."""
    text = fabric_tools._report("rocep1s0f1", 4, 65536, 9000, 98.1, "client")
    real = IB_WRITE_BW.read_text().splitlines()
    ours = text.splitlines()
    # The capture ran with --force-link IB; over RoCE (the stand-in's) perftest adds the GID index it used.
    keys = [line.split(":")[0].strip() for line in ours[:16] if not line.startswith(" GID index")]
    assert keys == [line.split(":")[0].strip() for line in real[:15]]
    assert ours[-3] == real[-3]  # the column header
    bw = parse_ib_write_bw(text)
    assert bw is not None and (bw.iterations, bw.average_gbps, bw.peak_gbps) == (20000, 98.1, 98.11)


def test_rails_judged_as_nvidias_playbook_does():
    assert rail_verdict(parse_ib_write_bw(IB_WRITE_BW.read_text()).average_gbps) is None
    assert "stale initialisation" in rail_verdict(13.0)  # the 13 Gb/s per channel issue 40 quotes for a Spark pair
    assert "under the 80 Gb/s" in rail_verdict(50.0)


def test_docker_info():
    info = parse_docker_info(json.dumps({"ServerVersion": "28.3.3", "DefaultRuntime": "runc",
                                         "Runtimes": {"io.containerd.runc.v2": {}, "nvidia": {}, "runc": {}}}))
    assert (info.version, info.nvidia, info.default_runtime) == ("28.3.3", True, "runc")
    refused = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
    down = parse_docker_info(json.dumps({"ServerErrors": [refused]}))
    assert down.version is None and down.error.startswith("Cannot connect to the Docker daemon")
    assert parse_docker_info("permission denied while trying to connect\n").error == \
        "permission denied while trying to connect"
    assert not parse_docker_info(json.dumps({"ServerVersion": "28.3.3", "Runtimes": {"runc": {}}})).nvidia


def test_iperf3_and_ntp():
    assert parse_iperf3(json.dumps({"end": {"sum_received": {"bits_per_second": 9.41e9}}})) == pytest.approx(9.41)
    assert parse_iperf3(json.dumps({"error": "unable to connect to server"})) is None
    assert (parse_ntp("yes\n"), parse_ntp("no\n"), parse_ntp("")) == (True, False, None)


def test_clock_offsets_from_round_trips():
    a = ClockSample(before=100.0, remote=100.6, after=101.0)  # the node read 100.6 halfway through a 1 s trip
    assert (a.offset, a.bound) == (pytest.approx(0.1), 0.5)
    b = ClockSample(100.0, 100.5, 100.0)
    assert clock_spread({"a": a, "b": b}) == (pytest.approx(0.4), pytest.approx(0.5))
    assert clocks_agree({"a": a, "b": b})  # 0.4 s apart, but the round trips leave 0.5 s unknown
    c = ClockSample(100.0, 102.0, 100.002)
    assert not clocks_agree({"b": b, "c": c})


# -- the inventory --------------------------------------------------------------------


def nodes() -> list[inv.NodeEntry]:
    return [inv.NodeEntry("spark-a", "spark-a.local", "nvidia", "169.254.44.136", "enp1s0f1np1",
                          ("rocep1s0f1", "roceP2p1s0f1"), {"fabric_ip": "enp1s0f1np1's IPv4 address (ip -br addr)"}),
            inv.NodeEntry("yes", "10.0.0.2", None, None, None, ())]


def test_the_inventory_reads_back_with_a_comment_on_every_value(tmp_path):
    text = inv.render(nodes(), "/data/hf cache")
    path = tmp_path / "cluster.yaml"
    assert inv.write(path, text) is None  # nothing was there: no backup
    loaded = load_inventory(path)
    assert loaded.defaults.hf_cache == "/data/hf cache"
    a, b = loaded.nodes
    assert (a.name, a.host, a.user, a.fabric_ip, a.eth_if, a.ib_if) == \
        ("spark-a", "spark-a.local", "nvidia", "169.254.44.136", "enp1s0f1np1", ["rocep1s0f1", "roceP2p1s0f1"])
    assert (b.name, b.host, b.fabric_ip) == ("yes", "10.0.0.2", None)  # a name YAML would read as true stays a name
    values = [line for line in text.splitlines() if ": " in line and not line.startswith("#")]
    assert values and all(" # " in line for line in values)
    assert "# enp1s0f1np1's IPv4 address (ip -br addr)" in text


def test_an_inventory_is_replaced_only_with_a_backup(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes: [old]\n")
    backup = inv.write(path, inv.render(nodes()))
    assert backup is not None and backup.read_text() == "nodes: [old]\n"
    assert backup.name.startswith("cluster.yaml.bak-")
    assert inv.render(nodes()) == path.read_text()  # the same findings render the same bytes


@pytest.mark.parametrize("value, quoted", [("spark-a", "spark-a"), ("yes", '"yes"'), ("1.5", '"1.5"'),
                                           ("a b", '"a b"'), ("~/.cache/huggingface", "~/.cache/huggingface")])
def test_scalars(value, quoted):
    assert inv.scalar(value) == quoted


# -- ssh helpers ------------------------------------------------------------------------


def test_resolve_copy_id_and_trust(tmp_path, monkeypatch):
    key = tmp_path / "id_test"
    key.write_text("private")
    key.with_name("id_test.pub").write_text("ssh-ed25519 AAAAC3 me@here\n")
    config = tmp_path / "config"
    config.write_text(f"Host spark-a\n  HostName 10.0.0.5\n  Port 2222\n  User nvidia\n  IdentityFile {key}\n")
    target = resolve("spark-a", config=[str(config)])
    assert (target.host, target.port, target.user, target.known_hosts_name) == \
        ("10.0.0.5", 2222, "nvidia", "[10.0.0.5]:2222")
    public = public_key_for(target)
    assert public == key.with_name("id_test.pub")
    argv = copy_id_command(target, public, [str(config)])
    assert argv[:9] == ["ssh", "-F", str(config), "-o", f"UserKnownHostsFile={Path.home() / '.ssh/known_hosts'}",
                        "-l", "nvidia", "-o", "PubkeyAuthentication=no"] and argv[9] == "spark-a"
    assert shown(argv, public).endswith(f"< {public}")
    known = tmp_path / "ssh" / "known_hosts"
    host = HostKey(target, "ssh-ed25519", "SHA256:abc", "[10.0.0.5]:2222 ssh-ed25519 AAAAkey")
    trust(host, known)
    trust(host, known)  # once only
    assert known.read_text() == "[10.0.0.5]:2222 ssh-ed25519 AAAAkey\n"
    assert known.stat().st_mode & 0o777 == 0o600


# -- the run, on captured nodes -----------------------------------------------------------


class Clock:
    def __init__(self):
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        self.t += 0.002
        return self.t


class Node:
    """A transport answering as a captured Spark does; every command is recorded."""

    def __init__(self, name: str, clock: Clock, offset: float, mtu: int, addr: str | None = None,
                 unreachable: frozenset[str] = frozenset()):
        self.name, self.clock, self.offset, self.mtu = name, clock, offset, mtu
        self.addr = addr if addr is not None else ADDR[name].read_text()
        self.unreachable = unreachable  # addresses its pings get no reply from
        self.commands: list[str] = []

    async def run(self, cmd, timeout=30.0, input=None):
        self.commands.append(cmd)
        if cmd == "id -u":
            return CommandResult(0, "1000\n", "")
        if cmd == DETECT_SCRIPT:
            net = "".join(f"{n} {self.mtu if 'f1' in n else 1500} {'up' if 'f1' in n else 'down'}\n"
                          for n in ("enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1"))
            return CommandResult(0, f"@@ibdev2netdev\n{IBDEV.read_text()}@@sysib\n@@addr\n{self.addr}"
                                    f"@@net\n{net}@@end\n", "")
        if cmd.startswith("docker info"):
            return CommandResult(0, json.dumps({"ServerVersion": "28.3.3", "DefaultRuntime": "runc",
                                                "Runtimes": {"nvidia": {}, "runc": {}}}) + "\n", "")
        if cmd.startswith("h="):
            return CommandResult(0, "hf_cache /home/nvidia/.cache/huggingface\n"
                                    "Filesystem     1024-blocks       Used  Available Capacity Mounted on\n"
                                    "/dev/nvme0n1p2  3872070312  258789063 3613281249       7% /\n", "")
        if cmd == "date +%s.%N":
            return CommandResult(0, f"{self.clock.t + 0.001 + self.offset:.9f}\n", "")
        if cmd.startswith("timedatectl"):
            return CommandResult(0, "yes\n", "")
        if "ping" in cmd:
            if cmd.split()[-1] in self.unreachable:
                return CommandResult(1, NO_REPLY.read_text(), "")
            return CommandResult(0, PING.read_text(), "")
        if cmd.startswith("for t in"):
            return CommandResult(0, "timeout\n", "")  # neither ib_write_bw nor iperf3
        if cmd.startswith("${RSYNC_RSH:-ssh} -o BatchMode=yes -o ConnectTimeout=5 "):
            return CommandResult(0, "", "")  # the nodes reach each other over ssh
        return CommandResult(127, "", f"sh: 1: {cmd.split()[0]}: not found")

    async def close(self):
        pass


async def collect(setup: Setup) -> list:
    return [e async for e in setup.events()]


async def test_a_run_on_captured_sparks_says_what_it_found_and_changes_nothing_unasked(tmp_path):
    clock = Clock()
    made = {"starsky": Node("starsky", clock, 0.0, 9000), "hutch": Node("hutch", clock, 2.0, 1500)}
    asked: list[FixProposed] = []

    async def decide(fix):
        asked.append(fix)
        return False

    path = tmp_path / "cluster.yaml"
    setup = Setup(Options(["starsky", "hutch"], path), decide, transport_for=lambda h, u: made[h], clock=clock)
    events = await collect(setup)
    done = {(e.host, e.check): (e.status, e.reason) for e in events if isinstance(e, CheckDone)}
    assert done[("starsky", "fabric")] == ("ok", "enp1s0f1np1 169.254.44.136/16; RoCE rocep1s0f1,roceP2p1s0f1 "
                                                 "(ibdev2netdev)")
    assert done[("starsky", "mtu")][0] == "ok"
    # hutch's MTU is 1500: a fix was proposed (with sudo: the user is not root), declined, and nothing ran.
    [fix] = asked
    assert fix.commands == ("sudo -n ip link set dev enp1s0f1np1 mtu 9000",)
    assert done[("hutch", "mtu")] == ("warn", "MTU enp1s0f1np1 1500, 9000 recommended for RoCE")
    assert not any("ip link set" in c for node in made.values() for c in node.commands)
    assert any(isinstance(e, FixDeclined) for e in events)
    # hutch's clock runs 2 s ahead of starsky's: said, as a state.
    assert done[("all", "clocks")][0] == "warn" and "differ by 2000 ms" in done[("all", "clocks")][1]
    # One half addressed, no ib_write_bw or iperf3: reached, bandwidth not measured.
    assert done[("hutch", "link")][0] == "warn"
    assert done[("hutch", "link")][1].startswith("reaches starsky 169.254.44.136 over enp1s0f1np1; bandwidth not "
                                                 "measured")
    assert done[("hutch", "docker")] == ("ok", "Docker 28.3.3, NVIDIA runtime, default runc")
    assert done[("hutch", "disk")][0] == "ok"
    # Every command was shown before it ran, in order.
    shown_cmds = [e.command for e in events if isinstance(e, CommandShown) and e.host == "starsky"]
    assert shown_cmds == made["starsky"].commands
    # Nothing failed, so the inventory is written (a new file needs no question).
    [written] = [e for e in events if isinstance(e, InventoryDone)]
    assert written.outcome == "written" and written.backup is None
    inventory = load_inventory(path)
    assert [(n.name, n.fabric_ip, n.eth_if) for n in inventory.nodes] == [
        ("starsky", "169.254.44.136", "enp1s0f1np1"), ("hutch", "169.254.127.30", "enp1s0f1np1")]
    assert events[-1] == SetupFinished(ok=True, changed=True, warnings=3, failures=0)

    # Again, with the file there: the same findings, the same bytes, no question about the file.
    asked.clear()
    again = await collect(Setup(Options(["starsky", "hutch"], path), decide,
                                transport_for=lambda h, u: made[h], clock=clock))
    assert [e.outcome for e in again if isinstance(e, InventoryDone)] == ["unchanged"]
    assert [f.check for f in asked] == ["mtu"]


async def test_dry_run_runs_nothing(tmp_path):
    def no_transport(host, user):
        raise AssertionError("a dry run opened a connection")

    async def decide(fix):
        raise AssertionError("a dry run asked")

    path = tmp_path / "cluster.yaml"
    events = await collect(Setup(Options(["spark-a", "spark-b"], path, dry_run=True), decide,
                                 transport_for=no_transport))
    commands = [e for e in events if isinstance(e, CommandShown)]
    assert commands and not any(e.ran for e in commands)
    assert {e.host for e in commands} == {"spark-a", "spark-b"}
    assert DETECT_SCRIPT in [e.command for e in commands]
    assert [e.outcome for e in events if isinstance(e, InventoryDone)] == ["not written"]
    assert not path.exists()
    assert not any(isinstance(e, CheckDone) for e in events)  # nothing ran, so nothing is judged
    assert events[-1] == SetupFinished(ok=True, changed=False, warnings=0, failures=0, dry_run=True)


def test_the_twins_ip_in_both_formats(tmp_path, monkeypatch, capsys):
    host = TwinHost(tmp_path / "twin")
    host.setup("spark-a")
    fabric_tools.set_addresses(host.home, {"enp1s0f1np1": ["127.0.0.2/24"], "enP2p1s0f1np1": ["127.0.1.2/24"]})
    monkeypatch.setenv("SPARKTOP_TWIN_HOME", str(host.home))
    assert fabric_tools.main("ip", ["-br", "addr"]) == 0
    brief = parse_ip_br_addr(capsys.readouterr().out)
    assert [str(a) for a in brief["enp1s0f1np1"].ipv4] == ["127.0.0.2/24"]
    assert brief["enp1s0f0np0"].state == "DOWN" and brief["lo"].state == "UNKNOWN"
    assert fabric_tools.main("ip", ["link", "set", "dev", "enP2p1s0f1np1", "mtu", "9000"]) == 0
    assert fabric_tools.main("ip", ["-j", "addr", "show", "dev", "enP2p1s0f1np1"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["ifname"], row["mtu"], row["operstate"], row["addr_info"][0]["local"]) == \
        ("enP2p1s0f1np1", 9000, "UP", "127.0.1.2")
    assert fabric_tools.main("ip", ["link", "set", "dev", "nope0", "mtu", "9000"]) == 1
    assert capsys.readouterr().err == 'Cannot find device "nope0"\n'


def test_target_names_known_hosts_as_openssh_does():
    assert Target("a", "10.0.0.5", 22, None).known_hosts_name == "10.0.0.5"


async def test_yes_never_trusts_a_host_key_on_its_own(monkeypatch):
    from rich.console import Console

    from sparktop.setup.commands import asker

    console = Console(record=True, width=200)
    key = FixProposed("spark-a", "ssh", "the host key ...", kind="trust-host-key")
    mtu = FixProposed("spark-a", "mtu", "MTU 1500", ("ip link set dev enp1s0f1np1 mtu 9000",))
    assert await asker(console, yes=True, accept_new_host_keys=False)(key) is False
    assert await asker(console, yes=True, accept_new_host_keys=False)(mtu) is True
    assert await asker(console, yes=False, accept_new_host_keys=True)(key) is True
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert await asker(console, yes=False, accept_new_host_keys=False)(mtu) is False  # no terminal: no
    said = console.export_text()
    assert said.count("refused: an unknown host key is never accepted by --yes") == 1
    # At a terminal, the person answers, host keys too.
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    answers = iter(["y", "", "yes"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(answers))
    decide = asker(console, yes=False, accept_new_host_keys=False)
    assert [await decide(mtu), await decide(mtu), await decide(key)] == [True, False, True]


def test_setup_without_hosts_is_one_line_and_exit_2(capsys):
    from sparktop.cli import main

    assert main(["setup"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sparktop setup: name the hosts")


def test_the_installed_ip_is_the_twins_only_where_addresses_were_given(tmp_path):
    import os
    import subprocess

    from sparktop.twin.node import install

    bin_dir = install(tmp_path / "bin")
    host = TwinHost(tmp_path / "twin")
    host.setup("spark-a")
    env = {**os.environ, "SPARKTOP_TWIN_HOME": str(host.home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def ip_br() -> dict:
        r = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True, env=env, timeout=30)
        assert r.returncode == 0, r.stderr
        return parse_ip_br_addr(r.stdout)

    assert "enp1s0f1np1" not in ip_br()  # this machine's own ip: no ConnectX-7 here
    fabric_tools.set_addresses(host.home, {"enp1s0f1np1": ["127.0.0.2/24"]})
    assert [str(a) for a in ip_br()["enp1s0f1np1"].ipv4] == ["127.0.0.2/24"]


async def test_an_inventory_that_differs_is_kept_when_the_user_says_no(tmp_path):
    clock = Clock()
    made = {"starsky": Node("starsky", clock, 0.0, 9000)}
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes: [mine]\n")
    asked: list[FixProposed] = []

    async def decide(fix):
        asked.append(fix)
        return False

    events = await collect(Setup(Options(["starsky"], path), decide, transport_for=lambda h, u: made[h], clock=clock))
    assert [f.check for f in asked] == ["inventory"]
    assert [e.outcome for e in events if isinstance(e, InventoryDone)] == ["kept"]
    assert path.read_text() == "nodes: [mine]\n" and sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml"]


def test_mdns_discovery_lines():
    """`avahi-browse -p -r` lines in the layout NVIDIA's discover-sparks reads (`=;interface;IPv4;name;description;
    local;fqdn;address;port;txt`, its comment), `+` lines (not resolved) and IPv6 ones skipped."""
    from sparktop.setup.discover import parse_avahi

    text = ("+;enP7s7;IPv4;spark-1a2b;SSH Remote Terminal;local\n"
            "=;enP7s7;IPv4;spark-1a2b;SSH Remote Terminal;local;spark-1a2b.local;192.168.1.163;22;\n"
            "=;enp1s0f1np1;IPv4;spark-1a2b;SSH Remote Terminal;local;spark-1a2b.local;169.254.127.30;22;\n"
            "=;enP7s7;IPv6;spark-3c4d;SSH Remote Terminal;local;spark-3c4d.local;fe80::1;22;\n"
            "=;enP7s7;IPv4;spark-3c4d;SSH Remote Terminal;local;spark-3c4d.local;192.168.1.120;22;\n")
    found = parse_avahi(text)
    assert [(f.host, f.addresses, f.interfaces) for f in found] == [
        ("spark-1a2b.local", ["192.168.1.163", "169.254.127.30"], ["enP7s7", "enp1s0f1np1"]),
        ("spark-3c4d.local", ["192.168.1.120"], ["enP7s7"])]


def test_discover_without_avahi_is_one_line(capsys, monkeypatch, tmp_path):
    from sparktop.cli import main

    monkeypatch.setenv("PATH", str(tmp_path))  # no avahi-browse
    assert main(["setup", "--discover", "--inventory", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "avahi-browse is not installed" in err


class Bare(Node):
    """A machine with no ConnectX-7 (no RDMA device, one Ethernet port)."""

    async def run(self, cmd, timeout=30.0, input=None):
        if cmd == DETECT_SCRIPT:
            self.commands.append(cmd)
            return CommandResult(0, "@@ibdev2netdev\n@@sysib\n@@addr\nlo               UNKNOWN        127.0.0.1/8 \n"
                                    "eth0             UP             10.0.0.5/24 \n@@net\neth0 1500 up\n@@end\n", "")
        return await super().run(cmd, timeout, input)


async def test_nodes_without_a_fabric_get_an_inventory_and_a_warning(tmp_path):
    clock = Clock()
    made = {"a": Bare("starsky", clock, 0.0, 9000), "b": Bare("hutch", clock, 0.0, 9000)}

    async def decide(fix):
        raise AssertionError(f"nothing to fix, asked {fix}")

    path = tmp_path / "cluster.yaml"
    events = await collect(Setup(Options(["a", "b"], path), decide, transport_for=lambda h, u: made[h], clock=clock))
    done = {(e.host, e.check): (e.status, e.reason) for e in events if isinstance(e, CheckDone)}
    assert done[("a", "fabric")][0] == "warn" and "no ConnectX-7 (RDMA) interface found" in done[("a", "fabric")][1]
    assert done[("all", "link")] == ("warn", "not tested: a, b has no ConnectX-7 port up with an address")
    assert [(n.name, n.fabric_ip, n.eth_if, n.ib_if) for n in load_inventory(path).nodes] == [
        ("a", None, None, []), ("b", None, None, [])]


def test_a_host_known_under_a_hashed_name_is_known(tmp_path):
    """known_hosts as `HashKnownHosts yes` writes it (Debian's and Ubuntu's default): the host is still found, so a
    different key it presents is a changed key, never a new one."""
    import subprocess

    from sparktop.remote.hostkeys import known_fingerprints

    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    kind, blob = key.with_name("k.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[10.0.0.5]:2222 {kind} {blob}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    assert known.read_text().startswith("|1|")
    fingerprint = subprocess.run(["ssh-keygen", "-lf", str(key)], capture_output=True, text=True).stdout.split()[1]
    target = Target("spark-a", "10.0.0.5", 2222, None)
    assert known_fingerprints(target, known) == [fingerprint]
    assert known_fingerprints(Target("spark-b", "10.0.0.6", 2222, None), known) == []


async def test_three_nodes_ring_every_pair(tmp_path):
    """A third Spark on the same link-local subnet (its `ip -br addr` written like the captures): the workers
    must reach each other too; hutch gets no reply from the third, which fails the ring in one line."""
    clock = Clock()
    third = ADDR["hutch"].read_text().replace("169.254.127.30/16", "169.254.9.9/16")
    made = {"starsky": Node("starsky", clock, 0.0, 9000), "hutch": Node("hutch", clock, 0.0, 9000,
                                                                        unreachable=frozenset({"169.254.9.9"})),
            "third": Node("third", clock, 0.0, 9000, addr=third)}

    async def decide(fix):
        return False

    events = await collect(Setup(Options(list(made), tmp_path / "c.yaml"), decide, transport_for=lambda h, u: made[h],
                                 clock=clock))
    done = {(e.host, e.check): (e.status, e.reason) for e in events if isinstance(e, CheckDone)}
    assert done[("hutch", "link")][0] == done[("third", "link")][0] == "warn"  # reached the head; not measured
    assert done[("all", "ring")] == ("fail", "not every pair of nodes reaches each other over the fabric: hutch → "
                                             "third 169.254.9.9 (1 packets transmitted, 0 received, 100% packet loss, "
                                             "time 0ms) (NCCL's ring needs every pair)")
    assert "LC_ALL=C ping -c1 -W2 -I enp1s0f1np1 169.254.9.9" in made["hutch"].commands
    made["hutch"].unreachable = frozenset()
    events = await collect(Setup(Options(list(made), tmp_path / "c.yaml"), decide, transport_for=lambda h, u: made[h],
                                 clock=clock))
    assert [e.reason for e in events if isinstance(e, CheckDone) and e.check == "ring"] == [
        "every pair of the 3 nodes reaches each other over the fabric"]


async def test_user_at_host_as_ssh_takes_it(tmp_path):
    clock = Clock()
    asked: list[tuple[str, str | None]] = []

    def transport_for(host, user):
        asked.append((host, user))
        return Node("starsky" if host == "starsky" else "hutch", clock, 0.0, 9000)

    async def decide(fix):
        return False

    path = tmp_path / "c.yaml"
    await collect(Setup(Options(["nvidia@starsky", "hutch"], path, user="ops"), decide, transport_for=transport_for,
                        clock=clock))
    assert asked == [("starsky", "nvidia"), ("hutch", "ops")]
    assert [(n.name, n.host, n.user) for n in load_inventory(path).nodes] == [("starsky", "starsky", "nvidia"),
                                                                             ("hutch", "hutch", "ops")]


def test_the_printer_shows_every_command_unless_quiet():
    from rich.console import Console

    from sparktop.setup.commands import Printer
    from sparktop.setup.events import FixApplied

    events = [CommandShown("spark-a", "fabric", "ip -br addr"),
              CommandShown("spark-a", "mtu", "ip link set dev enp1s0f1np1 mtu 9000", changes=True),
              CheckDone("spark-a", "mtu", "ok", "MTU 9000 now"),
              FixApplied("spark-b", "ssh", False, "`ssh` exited with status 255"),
              InventoryDone("/c.yaml", "written", "2 node(s)", "/c.yaml.bak-1"),
              SetupFinished(ok=True, changed=True, warnings=1, failures=0)]
    for quiet, expected in ((False, ["  $ spark-a: ip -br addr"]), (True, [])):
        console = Console(record=True, width=60, soft_wrap=True)
        printer = Printer(console, verbose=not quiet)
        for e in events:
            printer(e)
        lines = console.export_text().splitlines()
        assert lines == [*expected, "  $ spark-a: change ip link set dev enp1s0f1np1 mtu 9000",
                         "ok   spark-a    mtu      MTU 9000 now",
                         "not done spark-b    ssh      `ssh` exited with status 255",
                         "inventory /c.yaml: written (2 node(s); the old one is /c.yaml.bak-1)",
                         "setup done with 1 warning(s)"]


async def test_a_node_that_stops_answering_mid_link_test_is_one_line(tmp_path):
    from sparktop.remote import CommandTimeout

    class Stalls(Node):
        async def run(self, cmd, timeout=30.0, input=None):
            if "ping" in cmd:
                raise CommandTimeout(self.name, cmd, timeout)
            return await super().run(cmd, timeout, input)

    clock = Clock()
    made = {"starsky": Node("starsky", clock, 0.0, 9000), "hutch": Stalls("hutch", clock, 0.0, 9000)}

    async def decide(fix):
        return False

    events = await collect(Setup(Options(list(made), tmp_path / "c.yaml"), decide, transport_for=lambda h, u: made[h],
                                 clock=clock))
    [link] = [e for e in events if isinstance(e, CheckDone) and e.check == "link"]
    assert (link.host, link.status) == ("hutch", "fail")
    assert link.reason.startswith("command timed out after 15s: LC_ALL=C ping -c1 -W2 -I enp1s0f1np1")
    assert events[-1].failures == 1


async def test_an_inventory_that_cannot_be_written_is_one_line(tmp_path):
    clock = Clock()
    made = {"starsky": Node("starsky", clock, 0.0, 9000)}
    path = tmp_path / "taken"
    path.mkdir()  # a directory where the file should be

    async def decide(fix):
        return True

    events = await collect(Setup(Options(["starsky"], path), decide, transport_for=lambda h, u: made[h], clock=clock))
    [done] = [e for e in events if isinstance(e, InventoryDone)]
    assert (done.outcome, done.reason) == ("not written", "Is a directory")
    assert events[-1].ok is False


# -- the nodes' ssh to each other -----------------------------------------------------

# OpenSSH 9.2's stderr (`ssh -o BatchMode=yes -o ConnectTimeout=5 <peer> true`), as the lab's hosts print it.
UNKNOWN = ("No ED25519 host key is known for [127.0.0.3]:40123 and you have requested strict checking.\r\n"
           "Host key verification failed.\r\n")
CHANGED = ("@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
           "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
           "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
           "IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\n"
           "Host key for 10.0.0.2 has changed and you have requested strict checking.\nHost key verification failed.\n")
DENIED = "root@127.0.0.3: Permission denied (publickey,password).\r\n"


@pytest.mark.parametrize(("stderr", "status", "kind", "reason"), [
    ("", 0, "ok", ""),
    (UNKNOWN, 255, "unknown-host-key", "host key unknown to the source (not in its known_hosts)"),
    (CHANGED, 255, "changed-host-key", "its host key differs from the one in the source's known_hosts (a "
                                       "reinstalled node, or someone in between): not replaced here"),
    (DENIED, 255, "refused", "key refused (root@127.0.0.3: Permission denied (publickey,password))"),
    ("ssh: connect to host 10.0.0.2 port 22: Connection refused\r\n", 255, "unreachable",
     "unreachable (ssh: connect to host 10.0.0.2 port 22: Connection refused)"),
    ("ssh: connect to host 10.0.0.9 port 22: Connection timed out\r\n", 255, "unreachable",
     "unreachable (ssh: connect to host 10.0.0.9 port 22: Connection timed out)"),
    ("ssh: Could not resolve hostname spark-z: Name or service not known\r\n", 255, "unreachable",
     "unreachable (ssh: Could not resolve hostname spark-z: Name or service not known)"),
    ("sh: 1: ssh: not found\n", 127, "no-ssh", "no ssh client on the source: `sudo apt install openssh-client`"),
    ("Can't open user config file /x/config: No such file or directory\n", 255, "config",
     "the source's ssh config: Can't open user config file /x/config: No such file or directory"),
    ("kex_exchange_identification: read: Connection reset by peer\r\n", 255, "unreachable",
     "unreachable (kex_exchange_identification: read: Connection reset by peer)"),
    ("something new\n", 1, "other", "something new"),
])
def test_peer_ssh_reasons_from_stderr(stderr, status, kind, reason):
    from sparktop.setup.parse import parse_peer_ssh

    said = parse_peer_ssh(stderr, status)
    assert (said.kind, said.reason) == (kind, reason)
    assert said.fixable == (kind in ("unknown-host-key", "refused"))


def test_peer_ssh_commands_are_syncs_and_quoted():
    from sparktop.remote import peers
    from sparktop.setup.parse import parse_ssh_g
    from sparktop.sync.transfer import ssh_command

    assert peers.check_command("nvidia@10.0.0.2") == ("${RSYNC_RSH:-ssh} -o BatchMode=yes -o ConnectTimeout=5 "
                                                      "nvidia@10.0.0.2 true")
    assert peers.check_command("a b;rm -rf ~", 2222) == ("${RSYNC_RSH:-ssh} -o BatchMode=yes -p 2222 -o "
                                                         "ConnectTimeout=5 'a b;rm -rf ~' true")
    assert peers.config_command("10.0.0.2") == "${RSYNC_RSH:-ssh} -o BatchMode=yes -G 10.0.0.2"
    from sparktop.settings import Node as InventoryNode

    assert ssh_command(InventoryNode(name="b", host="b", port=2222)) == peers.ssh_command(2222)
    conf = parse_ssh_g("user nvidia\nhostname 10.0.0.2\nport 22\nidentityfile ~/.ssh/id_rsa\n"
                       "identityfile ~/.ssh/id_ed25519\nuserknownhostsfile ~/.ssh/known_hosts ~/.ssh/known_hosts2\n")
    assert conf["identityfile"] == ["~/.ssh/id_rsa", "~/.ssh/id_ed25519"]
    assert conf["userknownhostsfile"] == ["~/.ssh/known_hosts", "~/.ssh/known_hosts2"]
    assert conf["hostname"] == ["10.0.0.2"]


class Meshless(Node):
    """A Spark whose ssh to the other does not know its host key (until the fix), and whose key is made by it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.files: dict[str, str] = {}
        self.inputs: list[str | None] = []

    async def server_host_key(self):
        return f"ssh-ed25519 AAAAhostkeyof{self.name}"

    async def run(self, cmd, timeout=30.0, input=None):
        if cmd.startswith("${RSYNC_RSH:-ssh} -o BatchMode=yes -o ConnectTimeout=5 "):
            self.commands.append(cmd)
            peer = cmd.split()[-2]
            if not any(peer in line for line in self.files.get("known_hosts", "").splitlines()):
                return CommandResult(255, "", UNKNOWN.replace("[127.0.0.3]:40123", peer))
            return CommandResult(0, "", "")
        if cmd.startswith("${RSYNC_RSH:-ssh} -o BatchMode=yes -G "):
            self.commands.append(cmd)
            return CommandResult(0, f"hostname {cmd.split()[-1]}\nport 22\nidentityfile ~/.ssh/id_rsa\n"
                                    "identityfile ~/.ssh/id_ed25519\nuserknownhostsfile ~/.ssh/known_hosts "
                                    "~/.ssh/known_hosts2\n", "")
        if cmd.startswith("for f in "):
            self.commands.append(cmd)
            return CommandResult(0, "/home/nvidia/.ssh/id_ed25519\n" if "key" in self.files else "", "")
        if "ssh-keygen -q -t ed25519 -N ''" in cmd:
            self.commands.append(cmd)
            self.files["key"] = "-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n"
            return CommandResult(0, "", "")
        if cmd.startswith("cat -- "):
            self.commands.append(cmd)
            return CommandResult(0, f"ssh-ed25519 AAAAkeyof{self.name} nvidia@{self.name}\n", "")
        if cmd.startswith("umask 077; mkdir -p ~/.ssh"):
            self.commands.append(cmd)
            self.inputs.append(input)
            return CommandResult(0, "", "")
        if cmd.startswith("f="):
            self.commands.append(cmd)
            line = cmd.split("grep -qxF ")[1].split(" \"$f\"")[0].strip("'")
            self.files["known_hosts"] = self.files.get("known_hosts", "") + line + "\n"
            return CommandResult(0, "", "")
        return await super().run(cmd, timeout, input)


async def test_the_nodes_ssh_to_each_other_is_fixed_once_asked_and_then_left_alone(tmp_path):
    clock = Clock()
    made = {"starsky": Meshless("starsky", clock, 0.0, 9000), "hutch": Meshless("hutch", clock, 0.0, 9000)}
    asked: list[FixProposed] = []

    async def decide(fix):
        asked.append(fix)
        return fix.check == "mesh"

    path = tmp_path / "cluster.yaml"
    events = await collect(Setup(Options(list(made), path), decide, transport_for=lambda h, u: made[h], clock=clock))
    done = {(e.host, e.check): (e.status, e.reason) for e in events if isinstance(e, CheckDone)}
    assert done[("starsky", "mesh")] == ("ok", "ssh to hutch 169.254.127.30: key authentication, host key known now")
    assert done[("hutch", "mesh")] == ("ok", "ssh to starsky 169.254.44.136: key authentication, host key known now")
    [fix] = [f for f in asked if f.host == "starsky"]
    assert fix.what.startswith("ssh to hutch 169.254.127.30: host key unknown to the source (not in its known_hosts):"
                               " make a key on starsky (~/.ssh/id_ed25519), authorize starsky's ~/.ssh/id_ed25519.pub "
                               "in hutch's ~/.ssh/authorized_keys")
    assert fix.commands[0] == ("starsky: k=\"$HOME\"/.ssh/id_ed25519; mkdir -p -m 700 -- \"$(dirname -- \"$k\")\" && "
                               "{ [ -e \"$k\" ] || ssh-keygen -q -t ed25519 -N '' -f \"$k\"; }")
    assert fix.commands[1].startswith("hutch: umask 077; mkdir -p ~/.ssh") and fix.commands[1].endswith(
        " < starsky:~/.ssh/id_ed25519.pub")
    # hutch's host key as this machine's session to hutch verified it, under the name starsky's ssh uses.
    assert fix.commands[2] == ("starsky: f=\"$HOME\"/.ssh/known_hosts; umask 077; mkdir -p -- \"$(dirname -- \"$f\")\""
                               " && touch -- \"$f\" && { grep -qxF '169.254.127.30 ssh-ed25519 AAAAhostkeyofhutch' "
                               "\"$f\" || printf '%s\\n' '169.254.127.30 ssh-ed25519 AAAAhostkeyofhutch' >> \"$f\"; }")
    # The public key went to hutch on standard input, never on a command line; the private key nowhere.
    assert made["hutch"].inputs == ["ssh-ed25519 AAAAkeyofstarsky nvidia@starsky\n"]
    assert not any("secret" in str(e) for e in events)
    # Every command shown before it ran (the one fed a key says which: `< node:file`).
    for name, node in made.items():
        shown_cmds = [e.command.partition(" < ")[0] for e in events if isinstance(e, CommandShown) and e.host == name]
        assert shown_cmds == node.commands

    # Again: the check passes, nothing is proposed, nothing runs but the checks.
    asked.clear()
    for node in made.values():
        node.commands.clear()
    events = await collect(Setup(Options(list(made), path), decide, transport_for=lambda h, u: made[h], clock=clock))
    assert not [f for f in asked if f.check == "mesh"]
    assert [c for c in made["starsky"].commands if "RSYNC_RSH" in c] == [
        "${RSYNC_RSH:-ssh} -o BatchMode=yes -o ConnectTimeout=5 169.254.127.30 true"]


class Changed(Meshless):
    """hutch's known_hosts holds another key for starsky: ssh says so, and that is never fixed here."""

    async def run(self, cmd, timeout=30.0, input=None):
        if cmd.startswith("${RSYNC_RSH:-ssh} -o BatchMode=yes -o ConnectTimeout=5 "):
            self.commands.append(cmd)
            return CommandResult(255, "", CHANGED)
        return await super().run(cmd, timeout, input)


async def test_a_declined_or_unfixable_peer_is_one_line(tmp_path):
    clock = Clock()
    made = {"starsky": Meshless("starsky", clock, 0.0, 9000), "hutch": Changed("hutch", clock, 0.0, 9000)}
    asked: list[FixProposed] = []

    async def decide(fix):
        asked.append(fix)
        return False

    events = await collect(Setup(Options(list(made), tmp_path / "c.yaml"), decide,
                                 transport_for=lambda h, u: made[h], clock=clock))
    done = {(e.host, e.check): (e.status, e.reason) for e in events if isinstance(e, CheckDone)}
    assert done[("starsky", "mesh")] == ("fail", "ssh to hutch 169.254.127.30: host key unknown to the source (not in "
                                                 "its known_hosts) (not fixed)")
    assert not any("ssh-keygen" in c and "-f" in c for c in made["starsky"].commands)
    assert done[("hutch", "mesh")] == ("fail", "ssh to starsky 169.254.44.136: its host key differs from the one in "
                                               "the source's known_hosts (a reinstalled node, or someone in between): "
                                               "not replaced here")
    assert [f.host for f in asked if f.check == "mesh"] == ["starsky"]  # nothing offered for the changed key
    assert not any(c.startswith(("f=", "umask")) for node in made.values() for c in node.commands)
    assert [e.outcome for e in events if isinstance(e, InventoryDone)] == ["not written"]


async def test_a_bare_host_gets_its_host_key_trusted_then_our_key_installed_in_one_run(tmp_path):
    """A fresh node: its host key unknown, and password login only. Both fixes in one run, each offered once, the
    connection tried after each (was: the key install never offered after the host key was trusted)."""
    from sparktop.remote import HostKeyError, TransportError
    from sparktop.setup.runner import Host

    tried: list[str] = []

    class Bare(Setup):
        async def sh(self, host, check, cmd, **kw):
            tried.append("ssh")
            if tried.count("ssh") == 1:
                raise HostKeyError(host.given, "host key is not trusted")
            if tried.count("ssh") == 2:
                raise TransportError(host.given, "ssh authentication failed (publickey)")
            return CommandResult(0, "1000\n", "")

        async def _trust(self, host):
            tried.append("trust")
            return True

        async def _copy_id(self, host):
            tried.append("copy-id")
            return True

    async def yes(fix):
        return True

    setup = Bare(Options(["spark-new"], tmp_path / "cluster.yaml"), yes)
    events: list = []
    setup._emit = events.append
    assert await setup._ssh(Host("spark-new")) is True
    assert tried == ["ssh", "trust", "ssh", "copy-id", "ssh"]
    assert [(e.check, e.status) for e in events if isinstance(e, CheckDone)] == [("ssh", "ok")]

    # A host key still refused after it was trusted is not offered again: one line, no loop.
    tried.clear()

    class Stubborn(Bare):
        async def sh(self, host, check, cmd, **kw):
            tried.append("ssh")
            raise HostKeyError(host.given, "host key is not trusted")

    events.clear()
    stubborn = Stubborn(Options(["spark-new"], tmp_path / "cluster.yaml"), yes)
    stubborn._emit = events.append
    assert await stubborn._ssh(Host("spark-new")) is False
    assert tried == ["ssh", "trust", "ssh"]
    assert [(e.check, e.status) for e in events if isinstance(e, CheckDone)] == [("ssh", "fail")]


async def test_ctrl_d_at_a_question_is_a_no(monkeypatch):
    from rich.console import Console

    from sparktop.setup.commands import asker

    def closed(prompt):
        raise EOFError

    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", closed)
    mtu = FixProposed("spark-a", "mtu", "MTU 1500", ("ip link set dev enp1s0f1np1 mtu 9000",))
    assert await asker(Console(record=True), yes=False, accept_new_host_keys=False)(mtu) is False


def test_the_hf_cache_an_existing_inventory_names_is_kept(tmp_path):
    """Setup checks the space of, and writes again, the cache the user's inventory already names."""
    from sparktop.settings import Defaults
    from sparktop.setup.commands import _hf_cache_of

    path = tmp_path / "cluster.yaml"
    assert _hf_cache_of(path) == Defaults.hf_cache  # none yet
    path.write_text("defaults:\n  hf_cache: /data/hf\nnodes:\n  - name: a\n    host: a\n")
    assert _hf_cache_of(path) == "/data/hf"
    path.write_text("nodes: [\n")  # broken: setup offers to replace it, and says why then
    assert _hf_cache_of(path) == Defaults.hf_cache
