"""`sparktop setup` from two bare lab hosts (real OpenSSH, no inventory) to an inventory `status` and a launch's
preflight accept; a second run that finds everything in place; an unknown host key refused.

The hosts' ConnectX-7 ports get addresses (`twin.fabric_tools.set_addresses`: each half of the cable in its own
/24 on the loopback, as NVIDIA's playbook addresses a pair) and keep the twin's out-of-the-box MTU of 1500,
which setup raises to 9000 with `ip link set` once told to (`--yes`). Its link test runs the twin's `ib_write_bw`
over both halves at once, a server per half on spark-b and the clients on spark-a. The hosts' ssh to each other
(each reads its own ~/.ssh through RSYNC_RSH, `Lab._peer_config`) starts bare and setup puts it in place, which a
real `sparktop sync` then uses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparktop.settings import load_inventory
from sparktop.twin.fabric_tools import set_addresses

pytestmark = [pytest.mark.lab, pytest.mark.slow]

MODEL = "nvidia/Llama-3.1-8B-Instruct-FP8"


def sparktop(lab, *args, timeout=180):
    return subprocess.run([sys.executable, "-m", "sparktop", *args], capture_output=True, text=True,
                          env=lab.env(), timeout=timeout)


def results(r, check: str) -> list[str]:
    """The result lines of one check (`ok   lab-spark-b link     ...`)."""
    return [line for line in r.stdout.splitlines() if line.split()[:1] in (["ok"], ["warn"], ["FAIL"])
            and line.split()[2:3] == [check]]


@pytest.fixture(scope="module")
def cabled(lab):
    for host in lab.hosts:
        n = host.address.rsplit(".", 1)[1]
        set_addresses(host.twin.home, {"enp1s0f1np1": [f"{host.address}/24"], "enP2p1s0f1np1": [f"127.0.1.{n}/24"]})
    return lab


def test_setup_from_bare_hosts_then_a_second_run_changes_nothing(cabled):
    lab = cabled
    inventory = lab.root / "setup" / "cluster.yaml"
    assert not inventory.exists()
    hosts = [f"lab-{h.name}" for h in lab.hosts]
    first = sparktop(lab, "setup", *hosts, "--yes", "--inventory", str(inventory))
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stdout
    # Every command shown before it ran; the MTU raised on both halves, after a yes.
    assert "$ lab-spark-a: id -u" in out
    assert "$ lab-spark-a: change ip link set dev enP2p1s0f1np1 mtu 9000" in out
    assert "$ lab-spark-b: change ip link set dev enp1s0f1np1 mtu 9000" in out
    for host in lab.hosts:
        assert host.twin.interface("enp1s0f1np1") == ("up", 9000)
        assert host.twin.interface("enP2p1s0f1np1") == ("up", 9000)
    # The link measured over both halves at once: two servers on spark-b, two clients on spark-a.
    assert "$ lab-spark-b: timeout 60 ib_write_bw -d rocep1s0f1 -p 18515 --report_gbits -q 4 -R" in out
    assert "$ lab-spark-b: timeout 60 ib_write_bw -d roceP2p1s0f1 -p 18516 --report_gbits -q 4 -R" in out
    assert "ib_write_bw -d roceP2p1s0f1 -p 18516 --report_gbits -q 4 -R 127.0.1.3" in out
    assert "rocep1s0f1 98.1 + roceP2p1s0f1 98.1, ib_write_bw, all halves at once" in out
    assert "FAIL" not in out and "Traceback" not in first.stderr
    assert f"inventory {inventory}: written" in out

    text = inventory.read_text()
    assert "# " in text.splitlines()[0]  # commented
    loaded = load_inventory(inventory)
    assert [(n.name, n.host, n.fabric_ip, n.eth_if, n.ib_if) for n in loaded.nodes] == [
        ("lab-spark-a", "lab-spark-a", "127.0.0.2", "enp1s0f1np1", ["rocep1s0f1", "roceP2p1s0f1"]),
        ("lab-spark-b", "lab-spark-b", "127.0.0.3", "enp1s0f1np1", ["rocep1s0f1", "roceP2p1s0f1"])]

    status = sparktop(lab, "status", "--inventory", str(inventory), "--json")
    assert status.returncode == 0, status.stderr
    nodes = json.loads(status.stdout)["nodes"]
    assert sorted(n["name"] for n in nodes) == ["lab-spark-a", "lab-spark-b"]
    assert [n["state"] for n in nodes] == ["ok", "ok"], nodes

    # A launch's preflight over both nodes passes (the launch then stops: no --yes and no terminal).
    lab.put_weights(MODEL)
    launch = sparktop(lab, "launch", "llama-3.1-8b", "-t", "cluster-mp", "--inventory", str(inventory))
    assert "not launching without confirmation" in launch.stderr, launch.stdout + launch.stderr
    assert "FAIL" not in launch.stdout
    assert "[ok  ] lab-spark-b fabric" in launch.stdout

    before = inventory.read_bytes(), inventory.stat().st_mtime_ns
    second = sparktop(lab, "setup", *hosts, "--yes", "--inventory", str(inventory))
    assert second.returncode == 0, second.stdout + second.stderr
    assert ": change " not in second.stdout  # no command that changes a host was even shown
    assert f"inventory {inventory}: unchanged" in second.stdout
    assert second.stdout.rstrip().endswith("all is well: nothing changed")
    assert (inventory.read_bytes(), inventory.stat().st_mtime_ns) == before
    assert sorted(p.name for p in inventory.parent.iterdir()) == ["cluster.yaml"]  # no backup: nothing replaced


def test_an_unknown_host_key_is_refused_even_with_yes(cabled):
    lab = cabled
    known = lab.ssh_dir / "known_hosts"
    saved = known.read_text()
    host = lab.hosts[0]
    known.write_text("".join(line + "\n" for line in saved.splitlines() if f"[{host.address}]" not in line))
    try:
        inventory = lab.root / "refused" / "cluster.yaml"
        r = sparktop(lab, "setup", f"lab-{host.name}", "--yes", "--inventory", str(inventory))
        assert r.returncode == 1
        assert "Traceback" not in r.stderr
        refused = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
        assert len(refused) == 1 and "unknown host key SHA256:" in refused[0] and "not trusted" in refused[0], r.stdout
        assert "refused: an unknown host key is never accepted by --yes" in r.stdout
        assert f"[{host.address}]" not in known.read_text()  # nothing trusted
        assert not inventory.exists()

        # Accepted only when asked for by name: then it is in known_hosts and the host is set up.
        r = sparktop(lab, "setup", f"lab-{host.name}", "--yes", "--accept-new-host-keys", "--inventory",
                     str(inventory))
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"[{host.address}]:{host.port} ssh-ed25519" in known.read_text()
        assert f"$ lab-spark-a: change echo '[{host.address}]:{host.port} ssh-ed25519 " in r.stdout
        assert inventory.exists()
    finally:
        known.write_text(saved)


def test_a_host_that_does_not_resolve_is_one_line(cabled):
    r = sparktop(cabled, "setup", "no-such-spark.invalid", "--yes", "--inventory",
                 str(cabled.root / "nohost" / "cluster.yaml"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    [failed] = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    # (what the resolver adds, "(temporary failure in name resolution)", depends on the machine)
    assert failed.split()[:6] == ["FAIL", "no-such-spark.invalid", "ssh", "cannot", "resolve", "no-such-spark.invalid"]


def test_dry_run_shows_every_command_and_runs_none(cabled):
    lab = cabled
    inventory = lab.root / "dry" / "cluster.yaml"
    mtus = [h.twin.interface("enp1s0f1np1") for h in lab.hosts]
    r = sparktop(lab, "setup", *[f"lab-{h.name}" for h in lab.hosts], "--dry-run", "--inventory", str(inventory))
    assert r.returncode == 0, r.stdout + r.stderr
    shown = [line for line in r.stdout.splitlines() if line.startswith("  $ ")]
    assert shown and all(line.endswith("(not run: dry run)") for line in shown)
    assert {line.split()[1] for line in shown} == {"lab-spark-a:", "lab-spark-b:"}
    assert f"inventory {inventory}: not written (dry run)" in r.stdout
    assert r.stdout.rstrip().splitlines()[-1].startswith("dry run: nothing was run and no connection opened")
    assert not any(line.startswith(("ok ", "warn", "FAIL")) for line in r.stdout.splitlines())
    assert not inventory.parent.exists()
    assert [h.twin.interface("enp1s0f1np1") for h in lab.hosts] == mtus


def test_a_host_without_the_key_is_offered_the_key_and_says_why_it_failed(cabled):
    """spark-b stops accepting the lab's key: setup says which key it would install and runs the ssh that
    would append it (the lab's sshd takes no passwords, so that login is refused, and setup says so)."""
    lab = cabled
    host = lab.hosts[1]
    authorized = host.root / "authorized_keys"
    saved = authorized.read_text()
    authorized.write_text("")
    try:
        r = sparktop(lab, "setup", f"lab-{host.name}", "--yes", "--inventory", str(lab.root / "nokey" / "c.yaml"))
    finally:
        authorized.write_text(saved)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"key authentication failed: install {lab.key}.pub in the host's ~/.ssh/authorized_keys" in r.stdout
    assert "$ lab-spark-b: change ssh -F " in r.stdout  # shown before it ran
    assert "-o PubkeyAuthentication=no lab-spark-b" in r.stdout
    assert "Permission denied (publickey)" in r.stderr  # what the real ssh said
    assert "not done lab-spark-b ssh      `ssh` exited with status 255" in r.stdout
    [failed] = [line for line in r.stdout.splitlines() if line.startswith("FAIL lab-spark-b")]
    assert "ssh authentication failed" in failed


def test_one_half_of_the_cable_unaddressed_is_said(cabled):
    """NVIDIA's link-local netplan gives the second half no IPv4 address (the starsky/hutch captures): the link
    is measured over the one half both ends address, and setup says NCCL gets about half the link."""
    lab = cabled
    b = lab.hosts[1]
    set_addresses(b.twin.home, {"enp1s0f1np1": [f"{b.address}/24"]})
    try:
        inventory = lab.root / "half" / "cluster.yaml"
        r = sparktop(lab, "setup", *[f"lab-{h.name}" for h in lab.hosts], "--yes", "--inventory", str(inventory))
    finally:
        set_addresses(b.twin.home, {"enp1s0f1np1": [f"{b.address}/24"], "enP2p1s0f1np1": ["127.0.1.3/24"]})
    assert r.returncode == 0, r.stdout + r.stderr
    [link] = results(r, "link")
    assert link.startswith("warn lab-spark-b link") and "RDMA write 98.1 Gb/s (rocep1s0f1 98.1" in link
    assert "only one half of the cable is addressed on both ends" in link
    assert "18516" not in r.stdout  # no second server or client was started
    assert load_inventory(inventory).nodes[1].fabric_ip == b.address


def test_without_perftest_the_link_is_measured_over_tcp(cabled):
    """No ib_write_bw on the nodes (nor iperf3 here): one TCP stream of python3's sockets over the fabric
    address, said to be a floor; the figure is this machine's, so only what it says is checked."""
    lab = cabled
    tool = lab.bin / "ib_write_bw"
    hidden = tool.rename(lab.bin / ".ib_write_bw")
    try:
        inventory = lab.root / "tcp" / "cluster.yaml"
        r = sparktop(lab, "setup", *[f"lab-{h.name}" for h in lab.hosts], "--yes", "--inventory", str(inventory))
    finally:
        hidden.rename(tool)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "$ lab-spark-b: python3 -c 'import socket, sys" in r.stdout
    assert "127.0.0.3 18520" in r.stdout  # the worker's fabric address
    [link] = results(r, "link")
    assert link.startswith("ok   lab-spark-b link     reaches lab-spark-a 127.0.0.2 over enp1s0f1np1; TCP ")
    assert "Gb/s (python3, one stream: a floor); RDMA not measured" in link


def test_a_changed_host_key_is_never_replaced(cabled, tmp_path):
    """known_hosts holds another key for spark-a (a reinstalled node, or someone in between): setup stops there,
    with `--yes` and `--accept-new-host-keys` both, and says how to clear the old key once it is checked."""
    lab = cabled
    host = lab.hosts[0]
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = lab.ssh_dir / "known_hosts"
    saved = known.read_text()
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    lines = [f"[{host.address}]:{host.port} {kind} {key}" if f"[{host.address}]" in line else line
             for line in saved.splitlines()]
    known.write_text("\n".join(lines) + "\n")
    try:
        r = sparktop(lab, "setup", f"lab-{host.name}", "--yes", "--accept-new-host-keys", "--inventory",
                     str(lab.root / "changed" / "cluster.yaml"))
        assert known.read_text() == "\n".join(lines) + "\n"  # nothing added, nothing removed
    finally:
        known.write_text(saved)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    [failed] = results(r, "ssh")
    assert failed.startswith("FAIL lab-spark-a ssh      host key does not match known_hosts")
    assert "ssh-keygen -R" in failed
    assert not any(line.startswith("fix ") for line in r.stdout.splitlines())  # nothing was offered


def test_the_nodes_reach_each_other_over_ssh_once_setup_put_the_keys_in_place(cabled):
    """Bare hosts cannot ssh to each other (no key, known_hosts or authorized key in their own ~/.ssh, which each
    host's ssh reads through RSYNC_RSH, `Lab._peer_config`): the check fails with ssh's reason; `--yes` makes
    spark-a's and spark-b's keys, authorizes each on the other through this machine's sessions, and gives each
    the other's host key as this machine verified it; then a real `sparktop sync` copies a snapshot from spark-a
    to spark-b over that ssh, and a second setup changes nothing."""
    import shutil

    from tests.helpers.hfsnapshot import write_snapshot

    lab = cabled
    a, b = lab.hosts[:2]
    for host in lab.hosts:  # bare, whatever an earlier test put in place
        for name in ("id_ed25519", "id_ed25519.pub", "known_hosts", "authorized_keys"):
            (host.home / ".ssh" / name).unlink(missing_ok=True)
    inventory = lab.root / "mesh" / "cluster.yaml"
    hosts = [f"lab-{h.name}" for h in lab.hosts]

    refused = sparktop(lab, "setup", *hosts, "--inventory", str(inventory))  # no terminal, no --yes: nothing done
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert results(refused, "mesh") == [
        "FAIL lab-spark-a mesh     ssh to lab-spark-b 127.0.0.3: host key unknown to the source (not in its "
        "known_hosts) (not fixed)",
        "FAIL lab-spark-b mesh     ssh to lab-spark-a 127.0.0.2: host key unknown to the source (not in its "
        "known_hosts) (not fixed)"], refused.stdout
    assert "$ lab-spark-a: ${RSYNC_RSH:-ssh} -o BatchMode=yes -o ConnectTimeout=5 127.0.0.3 true" in refused.stdout
    assert not (a.home / ".ssh/id_ed25519").exists() and not (b.home / ".ssh/authorized_keys").exists()
    assert not inventory.exists()

    fixed = sparktop(lab, "setup", *hosts, "--yes", "--inventory", str(inventory))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert results(fixed, "mesh") == [
        "ok   lab-spark-a mesh     ssh to lab-spark-b 127.0.0.3: key authentication, host key known now",
        "ok   lab-spark-b mesh     ssh to lab-spark-a 127.0.0.2: key authentication, host key known now"]
    ssh_a = a.home / ".ssh"
    assert f"$ lab-spark-a: change k={ssh_a / 'id_ed25519'}; mkdir -p -m 700" in fixed.stdout  # shown, then run
    for one, other in ((a, b), (b, a)):
        pub = (one.home / ".ssh/id_ed25519.pub").read_text()
        authorized = other.home / ".ssh/authorized_keys"
        assert authorized.read_text() == pub and authorized.stat().st_mode & 0o777 == 0o600
        host_key = " ".join((other.root / "ssh_host_ed25519_key.pub").read_text().split()[:2])
        assert (one.home / ".ssh/known_hosts").read_text() == f"[{other.address}]:{other.port} {host_key}\n"
        private = (one.home / ".ssh/id_ed25519").read_text().splitlines()[1]
        assert private not in fixed.stdout + fixed.stderr  # no private key content, ever
    assert "Traceback" not in fixed.stderr

    # What sync needs is in place: the real rsync on spark-a, over its ssh to spark-b's fabric address.
    if shutil.which("rsync"):
        repo = "lab-org/mesh-model"
        write_snapshot(a.home / ".cache/huggingface/hub", repo, {"model.safetensors": 200_000})
        sync = subprocess.run([sys.executable, "-m", "sparktop", "sync", repo, "--inventory", str(inventory)],
                              capture_output=True, text=True, env=lab.env(), timeout=300)
        assert sync.returncode == 0, sync.stdout + sync.stderr
        copied = b.home / ".cache/huggingface/hub/models--lab-org--mesh-model/snapshots"
        assert (next(copied.iterdir()) / "model.safetensors").resolve().stat().st_size == 200_000

    files = {p: p.read_bytes() for h in lab.hosts for p in (h.home / ".ssh").iterdir()}
    again = sparktop(lab, "setup", *hosts, "--yes", "--inventory", str(inventory))
    assert again.returncode == 0, again.stdout + again.stderr
    assert ": change " not in again.stdout and not any(line.startswith("fix ") for line in again.stdout.splitlines())
    assert [line.split()[:3] for line in results(again, "mesh")] == [["ok", "lab-spark-a", "mesh"],
                                                                     ["ok", "lab-spark-b", "mesh"]]
    assert {p: p.read_bytes() for p in files} == files

    # spark-b stops accepting spark-a's key: said as ssh says it, and only the key would be installed again.
    (b.home / ".ssh/authorized_keys").write_text("")
    denied = sparktop(lab, "setup", *hosts, "--inventory", str(inventory))
    [line] = [line for line in results(denied, "mesh") if line.startswith("FAIL")]
    assert line.startswith("FAIL lab-spark-a mesh     ssh to lab-spark-b 127.0.0.3: key refused (")
    assert "Permission denied (publickey" in line
