"""The link and the box, on the twin: what a user checks on a pair of Sparks
serving one model with tensor parallelism. Both nodes' cabled ports move by
the bytes the model says the all-reduces send (over RDMA on both halves of
the cable, or over TCP when NCCL is told off InfiniBand), `ethtool -S` and
/sys/class/infiniband say so in the driver's words, each box names its maker
in /sys/class/dmi/id, and `nvidia-smi --query-compute-apps` names the
engine's process, which its cgroup ties to its container."""

from __future__ import annotations

import asyncio
import io
import os
import random
import shlex
import subprocess
import time

import httpx
import pytest

from sparktop.observe import hostparse
from sparktop.twin import link
from sparktop.twin.cluster import DEFAULT_IMAGE, TwinCluster, wait_ready
from sparktop.twin.containers import Containers
from sparktop.twin.dialects.vllm_args import parse_serve_args
from sparktop.twin.host import PRODUCT_FAMILY, VARIANTS, TwinHost
from sparktop.twin.nvidia_smi import query_apps
from sparktop.twin.server import TwinServer
from tests.conftest import free_port

MODEL = "gpt-oss-120b"
HALVES = ("enp1s0f1np1", "enP2p1s0f1np1")  # the cabled port's two halves
NCCL_VARS = ("NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_NET", "NCCL_DEBUG")


@pytest.fixture(autouse=True)
def _no_nccl_env(monkeypatch):
    for name in NCCL_VARS:
        monkeypatch.delenv(name, raising=False)


def new_host(root, name: str, variant: str | None = None) -> TwinHost:
    host = TwinHost(root / name)
    host.setup(name, variant=variant)
    return host


def rdma(host: TwinHost, netdev: str) -> tuple[int, int]:
    """(sent, received) RDMA bytes of an interface, as its RoCE device's port counts them (4-byte words)."""
    port = host.home / "sys/class/infiniband" / link.NETDEV_RDMA[netdev] / "ports/1/counters"
    return int((port / "port_xmit_data").read_text()) * 4, int((port / "port_rcv_data").read_text()) * 4


def kernel(host: TwinHost, netdev: str) -> tuple[int, int]:
    stats = host.home / "sys/class/net" / netdev / "statistics"
    return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())


@pytest.fixture
async def pair(tmp_path):
    """Factory: a tp=2 engine over two simulated hosts, in this process (the head on spark-a, a
    `--headless` worker on spark-b, joined through the twin's rendezvous); both stop at teardown."""
    servers: list[TwinServer] = []

    async def make(*flags: str) -> tuple[TwinServer, TwinHost, TwinHost]:
        a, b = new_host(tmp_path, "spark-a"), new_host(tmp_path, "spark-b")
        common = [MODEL, "--speed", "40", "--startup-speed", "300", "-tp", "2", "--nnodes", "2", "--master-addr",
                  "127.0.0.1", "--master-port", str(free_port()), *flags]
        head = TwinServer(parse_serve_args([*common, "--host", "127.0.0.1", "--port", "0", "--node-rank", "0"]),
                          log=io.StringIO(), host=a)
        worker = TwinServer(parse_serve_args([*common, "--node-rank", "1", "--headless"]), log=io.StringIO(), host=b)
        servers.extend([worker, head])
        await asyncio.wait_for(asyncio.gather(head.start(), worker.start()), 10)
        return head, a, b

    yield make
    for server in servers:
        await server.stop()


async def serve(url: str, requests: int = 6, words: int = 300, max_tokens: int = 24) -> int:
    """Distinct prompts (no prefix-cache hits), all answered; the tokens the usage reports."""
    rng = random.Random(7)

    async def one(client: httpx.AsyncClient, i: int) -> int:
        prompt = f"request {i}: " + " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(words))
        r = await client.post(url + "/v1/completions", json={
            "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        return usage["prompt_tokens"] + usage["completion_tokens"]

    async with httpx.AsyncClient(timeout=30) as client:
        return sum(await asyncio.gather(*(one(client, i) for i in range(requests))))


async def settled(read, want: float, timeout: float = 30.0) -> None:
    """Until `read()` reaches `want` (the head moves the counters every half second); after `timeout` the
    assertions that follow say what was read instead."""
    deadline = asyncio.get_running_loop().time() + timeout
    while read() < want and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)


# -- traffic ----------------------------------------------------------------------


async def test_a_tp2_engine_moves_both_hosts_rdma_counters_by_the_models_bytes_on_both_halves(pair):
    began = time.monotonic()  # before either node's link starts counting
    head, a, b = await pair()
    per_token = head.plan.perf.link_bytes_per_token()
    assert per_token > 100_000  # gpt-oss-120b over two nodes: ~400 KB a token each way
    before = {(h.name, n): rdma(h, n) for h in (a, b) for n in HALVES}
    used = await serve(head.url)
    computed = head.engine.tokens_computed
    # Every token went through the model once but each request's last one (its sample is the answer).
    assert computed == used - 6
    want = computed * per_token
    await settled(lambda: sum(rdma(b, n)[0] - before[("spark-b", n)][0] for n in HALVES), int(want))
    for host in (a, b):
        sent = [rdma(host, n)[0] - before[(host.name, n)][0] for n in HALVES]
        got = [rdma(host, n)[1] - before[(host.name, n)][1] for n in HALVES]
        # What the model says each node sends (and receives), within the tokens counted since the last move.
        assert sum(sent) == pytest.approx(want, rel=0.03), host.name
        assert sum(got) == pytest.approx(want, rel=0.03), host.name
        assert sum(sent) == pytest.approx(used * per_token, rel=0.03)
        # NCCL on both HCAs: the cable's two halves share it evenly; the other port stands still.
        assert abs(sent[0] - sent[1]) <= 4 and min(sent) > 0
        assert rdma(host, "enp1s0f0np0") == rdma(host, "enP2p1s0f0np0") == (0, 0)
        # The socket interface carries only NCCL's bootstrap: its few KB/s, over no more than the seconds since
        # the engine began (however many this machine took).
        trickle = kernel(host, "enp1s0f1np1")[0]
        assert 0 < trickle <= link.CONTROL_BPS * (time.monotonic() - began)


async def test_nccl_ib_disable_moves_the_kernel_bytes_instead_and_the_rdma_counters_stand_still(pair, monkeypatch):
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "enp1s0f1np1")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    head, a, b = await pair()
    per_token = head.plan.perf.link_bytes_per_token()
    await serve(head.url, requests=4)
    want = head.engine.tokens_computed * per_token
    await settled(lambda: kernel(b, "enp1s0f1np1")[1], int(want))
    for host in (a, b):
        assert all(rdma(host, n) == (0, 0) for n in link.NETDEV_RDMA)
        tx, rx = kernel(host, "enp1s0f1np1")
        # The payload and TCP/IP's headers (some 7 % at MTU 1500), through the one interface NCCL was given.
        assert want * 1.02 < tx < want * 1.10 and want * 1.02 < rx < want * 1.10, (host.name, tx / want)
        assert kernel(host, "enP2p1s0f1np1") == (0, 0)
    said = head.log.stream.getvalue()
    assert "NCCL INFO Using network Socket" in said and "NCCL_IB_DISABLE=1" in said


async def test_nccl_ib_hca_naming_one_device_moves_only_that_half(pair, monkeypatch):
    monkeypatch.setenv("NCCL_IB_HCA", "=roceP2p1s0f1")
    head, a, b = await pair()
    await serve(head.url, requests=2, words=100)
    want = head.engine.tokens_computed * head.plan.perf.link_bytes_per_token()
    await settled(lambda: rdma(b, "enP2p1s0f1np1")[0], int(want))
    for host in (a, b):
        assert rdma(host, "enP2p1s0f1np1")[0] == pytest.approx(want, rel=0.03)
        assert rdma(host, "enp1s0f1np1") == (0, 0)


def test_nccl_picks_its_transport_as_nccl_does(tmp_path):
    host = new_host(tmp_path, "spark-a")
    home = host.home

    def route(**env: str) -> tuple[str, tuple[str, ...]]:
        r = link.nccl_route(home, env)
        return r.kind, r.hcas or r.netdevs

    assert route() == ("rdma", ("rocep1s0f1", "roceP2p1s0f1"))  # every active HCA: both halves of the cable
    assert route(NCCL_IB_HCA="rocep1s0f1,roceP2p1s0f1", NCCL_IB_DISABLE="0") == route()  # what a launch sets
    assert route(NCCL_IB_HCA="roce") == route()  # prefixes, as NCCL matches them
    assert route(NCCL_IB_HCA="^rocep1") == ("rdma", ("roceP2p1s0f1",))
    assert route(NCCL_IB_HCA="rocep1s0f1:1") == ("rdma", ("rocep1s0f1",))
    assert route(NCCL_IB_DISABLE="1") == ("socket", ("enp1s0f1np1",))
    assert route(NCCL_NET="Socket", NCCL_SOCKET_IFNAME="enP2p1s0f1np1") == ("socket", ("enP2p1s0f1np1",))
    # A device whose port is down is no device: NCCL falls back to sockets.
    assert route(NCCL_IB_HCA="=rocep1s0f0") == ("socket", ("enp1s0f1np1",))
    host.set_interface("enP2p1s0f1np1", "down")
    assert route() == ("rdma", ("rocep1s0f1",))
    assert (home / "sys/class/infiniband/roceP2p1s0f1/ports/1/state").read_text() == "1: DOWN\n"
    assert (home / "sys/class/net/enP2p1s0f1np1/speed").read_text() == "-1\n"


def test_counters_only_grow_and_every_view_agrees(tmp_path):
    host = new_host(tmp_path, "spark-a")
    traffic = link.LinkTraffic(host.home, {})
    seen = []
    for total in (1_000_003, 1_000_003, 500, 5_000_000):  # a total that goes back (a late message) moves nothing
        traffic.advance(total)
        seen.append(sum(rdma(host, n)[0] for n in HALVES))
    # In 4-byte words, as the RoCE device counts them: 500,001 and 500,002 bytes show as 500,000 each.
    assert seen == [1_000_000, 1_000_000, 1_000_000, 5_000_000]
    values = link.counters(host.home, "enp1s0f1np1")
    assert values["rdma_tx_bytes"] == 2_500_000 and values["rdma_tx_packets"] == 2_500_000 // 1024 + 1
    speed = {n: (host.home / "sys/class/net" / n / "speed").read_text().strip() for n in (*HALVES, "enp1s0f0np0")}
    assert speed == {"enp1s0f1np1": "200000", "enP2p1s0f1np1": "200000", "enp1s0f0np0": "-1"}
    device = host.home / "sys/class/infiniband/rocep1s0f1/device/net/enp1s0f1np1"
    assert device.exists() and (device / "operstate").read_text() == "up\n"


def test_ethtool_prints_mlx5_counters_that_parse(tmp_path):
    cluster = TwinCluster(tmp_path / "lab", names=("spark-a",)).setup()
    node = cluster.nodes[0]
    link.LinkTraffic(node.host.home, {}).advance(8_000_000)
    env = {**os.environ, **node.env}

    def ethtool(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", shlex.join(["ethtool", *argv])], env=env, capture_output=True,
                              text=True, timeout=10)

    out = ethtool("-S", "enp1s0f1np1")
    assert out.returncode == 0 and out.stdout.startswith("NIC statistics:\n")
    rows = dict(line.strip().split(": ", 1) for line in out.stdout.splitlines()[1:])
    assert all(value.isdigit() for value in rows.values())
    assert int(rows["tx_vport_rdma_unicast_bytes"]) == int(rows["rx_vport_rdma_unicast_bytes"]) == 4_000_000
    assert int(rows["tx_vport_rdma_unicast_packets"]) > 0
    assert int(rows["tx_bytes"]) == kernel(node.host, "enp1s0f1np1")[0]  # the kernel's own, as in /sys
    assert ethtool("-S", "enp9s9").returncode != 0
    settings = ethtool("enP2p1s0f1np1").stdout
    assert "Speed: 200000Mb/s" in settings and "Link detected: yes" in settings
    assert "driver: mlx5_core" in ethtool("-i", "enp1s0f1np1").stdout


# -- the box ----------------------------------------------------------------------


def test_each_node_names_its_maker_and_the_demos_two_differ(tmp_path):
    cluster = TwinCluster(tmp_path / "lab").setup()
    dmi = [{f: (n.host.home / "sys/class/dmi/id" / f).read_text().strip()
            for f in ("sys_vendor", "product_name", "product_family")} for n in cluster.nodes]
    assert dmi[0] == {"sys_vendor": "NVIDIA", "product_name": "NVIDIA_DGX_Spark", "product_family": "DGX Spark"}
    assert dmi[1] == {"sys_vendor": "ASUSTeK COMPUTER INC.", "product_name": "GX10", "product_family": PRODUCT_FAMILY}
    chosen = TwinCluster(tmp_path / "other", variants=("dell", "hp", "msi")).setup()
    assert [n.host.variant for n in chosen.nodes] == ["dell", "hp"]
    assert len({VARIANTS[v]["product_name"] for v in VARIANTS}) == 8
    # The monitor's reading of the strings names every variant the twin offers, each a GB10 box.
    from sparktop.observe.machine import identify

    named = {v: identify(f["sys_vendor"], f["product_name"], PRODUCT_FAMILY) for v, f in VARIANTS.items()}
    assert all(m is not None and m.gb10 for m in named.values())
    assert len({m.variant for m in named.values() if m is not None}) == 8, named
    with pytest.raises(ValueError, match="unknown GB10 variant"):
        new_host(tmp_path, "spark-z", variant="raspberry")


def test_compute_apps_name_the_engine_and_its_cgroup_names_its_container(tmp_path, monkeypatch):
    host = new_host(tmp_path, "spark-a")
    record = {"id": "ab" * 32, "name": "sparktop-vllm", "state": "running", "pid": os.getpid()}
    Containers(host).save(record)
    monkeypatch.setenv("SPARKTOP_TWIN_CONTAINER", "sparktop-vllm")
    host.register(os.getpid(), "VLLM::EngineCore", 95_000)
    code, out = query_apps(host, ["pid", "process_name", "used_memory"], {"csv", "noheader", "nounits"})
    assert (code, out) == (0, f"{os.getpid()}, VLLM::EngineCore, 95000\n")
    cgroup = (host.home / "proc" / str(os.getpid()) / "cgroup").read_text()
    assert cgroup == f"0::/system.slice/docker-{'ab' * 32}.scope\n"
    assert hostparse._CONTAINER_CGROUP.search(cgroup)  # the monitor's own test for "in a container"
    host.unregister(os.getpid())
    assert not (host.home / "proc" / str(os.getpid())).exists()
    monkeypatch.delenv("SPARKTOP_TWIN_CONTAINER")
    host.register(os.getpid(), "python3", 1000)
    assert "user.slice" in (host.home / "proc" / str(os.getpid()) / "cgroup").read_text()
    host.unregister(os.getpid())


# -- on a twin cluster, through its docker ---------------------------------------------


async def sh(node, *argv: str, timeout: float = 30):
    return await node.transport().run(shlex.join(argv), timeout=timeout)


async def run_tp2_pair(cluster: TwinCluster, ib_disable: str, head: str = "head", worker: str = "worker",
                       labels: tuple[str, ...] = ()) -> str:
    """A tp=2 engine over the cluster's two nodes through the twin's docker, NCCL told to use both halves
    (or put on sockets with `ib_disable` "1"); `labels` (`--label` pairs) on both containers, each also
    labelled with its role (its name). Its URL, once ready."""
    a, b = cluster.nodes
    port, master = free_port(a.address), free_port(a.address)
    env = ["-e", "NCCL_SOCKET_IFNAME=enp1s0f1np1", "-e", "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1",
           "-e", f"NCCL_IB_DISABLE={ib_disable}"]
    common = [MODEL, "-tp", "2", "--nnodes", "2", "--master-addr", a.address, "--master-port", str(master),
              "--startup-speed", "500"]
    for node, name, rank in ((b, worker, ["--node-rank", "1", "--headless"]),
                             (a, head, ["--node-rank", "0", "--host", a.address, "--port", str(port)])):
        role = ["--label", f"sparktop.role={name}"] if labels else []
        assert (await sh(node, "docker", "run", "-d", "--name", name, "--network", "host", *env, *labels, *role,
                         DEFAULT_IMAGE, *common, *rank)).ok
    url = f"http://{a.address}:{port}"
    await wait_ready([url])  # two engines starting on a busy machine: its two minutes, not 30 s
    return url


@pytest.mark.slow
@pytest.mark.parametrize("ib_disable", ["0", "1"])
async def test_a_tp2_launch_through_docker_moves_both_nodes_ports_as_the_model_says(tmp_path, ib_disable):
    cluster = TwinCluster(tmp_path / "lab", speed=20.0).setup()
    a, b = cluster.nodes
    try:
        url = await run_tp2_pair(cluster, ib_disable)
        used = await serve(url, requests=4)
        from sparktop.model.cards import find_card
        from sparktop.model.perf import PerfModel

        want = (used - 4) * PerfModel(find_card(MODEL), tp=2).link_bytes_per_token()
        read = (lambda n: kernel(b.host, n)[0]) if ib_disable == "1" else (lambda n: rdma(b.host, n)[0])
        await settled(lambda: sum(read(n) for n in HALVES), int(want))
        for node in (a, b):
            stats = (await sh(node, "ethtool", "-S", "enp1s0f1np1")).stdout
            rows = dict(line.strip().split(": ", 1) for line in stats.splitlines()[1:])
            rdma_sent = sum(rdma(node.host, n)[0] for n in HALVES)
            if ib_disable == "1":
                assert rdma_sent == 0 and int(rows["tx_vport_rdma_unicast_bytes"]) == 0
                assert want < kernel(node.host, "enp1s0f1np1")[0] < want * 1.1
            else:
                assert rdma_sent == pytest.approx(want, rel=0.03)
                assert int(rows["tx_vport_rdma_unicast_bytes"]) == rdma(node.host, "enp1s0f1np1")[0]
        # The GPU process on the head, and the container its cgroup names: the one `docker ps` lists.
        apps = (await sh(a, "nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                         "--format=csv,noheader,nounits")).stdout
        pid, name, used_mib = (part.strip() for part in apps.strip().split(","))
        assert name == "VLLM::EngineCore" and int(used_mib) > 0
        cgroup = (await sh(a, "sh", "-c", f'cat "$SPARKTOP_PROC_ROOT/{pid}/cgroup"')).stdout
        ids = (await sh(a, "docker", "ps", "--no-trunc", "--format", "{{.ID}} {{.Names}}")).stdout.split()
        assert cgroup.strip() == f"0::/system.slice/docker-{ids[ids.index('head') - 1]}.scope"
    finally:
        for node in cluster.nodes:
            await sh(node, "sh", "-c", "docker ps -aq | xargs -r docker rm -f")


@pytest.mark.slow
async def test_a_tp2_layout_launched_by_the_demo_shows_the_models_traffic_on_both_nodes():
    """`sparktop demo --layout tp=2`'s path: the recipe's plan (its NCCL_IB_HCA naming both halves), preflight and
    launch through the twin's docker; both nodes' halves carry what the model says, each half its share."""
    from sparktop.demo import launch_layout, start_demo_cluster, stop_everything
    from sparktop.model.cards import find_card
    from sparktop.model.perf import PerfModel

    cluster, _ = await start_demo_cluster(MODEL, speed=20, nodes=2, engines=False, startup_speed=500)
    launcher, plan = await launch_layout(cluster, MODEL, "tp=2", say=lambda _: None)
    try:
        requests = 4
        used = await serve(plan.endpoints[0].url, requests=requests)
        want = (used - requests) * PerfModel(find_card(MODEL), tp=2).link_bytes_per_token()
        b = cluster.nodes[1].host
        await settled(lambda: sum(rdma(b, n)[0] for n in HALVES), int(want))
        for node in cluster.nodes:
            halves = [rdma(node.host, n) for n in HALVES]
            assert sum(sent for sent, _ in halves) == pytest.approx(want, rel=0.03), node.name
            assert all(sent == got and sent == pytest.approx(want / 2, rel=0.03) for sent, got in halves)
    finally:
        await launcher.close()
        await stop_everything(cluster)
