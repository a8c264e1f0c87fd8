"""The twin's node stand-ins (docker, nvidia-smi, vllm, ray) on two simulated
hosts on this machine, driven the way sparktop drives a real node: shell
commands through a LocalTransport with the host's environment.

A container is read after it has reached the state the test is about (it
exited, or it waits on a file the test creates), never after a sleep."""

from __future__ import annotations

import asyncio
import json
import shlex
from pathlib import Path

import httpx
import psutil
import pytest

from sparktop.twin.cluster import DEFAULT_IMAGE, TwinCluster, wait_ready
from tests.conftest import free_port
from tests.helpers.wait import eventually

pytestmark = pytest.mark.slow


@pytest.fixture
async def cluster(tmp_path):
    c = TwinCluster(tmp_path / "lab", speed=1.0).setup()
    yield c
    for node in c.nodes:
        t = node.transport()
        await t.run("docker ps -aq | xargs -r docker rm -f; ray stop --force", timeout=30)


async def sh(node, *argv, timeout=30):
    return await node.transport().run(shlex.join(argv), timeout=timeout)


async def exited(node, name: str, timeout: float = 30) -> list[str]:
    """Waits until the container has exited; its status and exit code."""
    state: list[str] = []

    async def check() -> bool:
        nonlocal state
        state = (await sh(node, "docker", "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                          name)).stdout.split()
        return bool(state) and state[0] == "exited"

    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"{name} still {state} after {timeout:g} s"
        await asyncio.sleep(0.1)
    return state


def serve_argv(node, name, port, *extra, model="llama-3.1-8b"):
    return ["docker", "run", "-d", "--name", name, "--gpus", "all", "--network", "host", DEFAULT_IMAGE, model,
            "--host", node.address, "--port", str(port), "--startup-speed", "500", *extra]


async def test_docker_runs_lists_logs_and_removes_a_vllm_container(cluster):
    a = cluster.nodes[0]
    port = free_port(a.address)
    r = await sh(a, *serve_argv(a, "engine-1", port))
    assert r.ok, r.stderr
    assert len(r.stdout.strip()) == 64
    url = f"http://{a.address}:{port}"
    await wait_ready([url], timeout=30)

    ps = await sh(a, "docker", "ps", "--format", "{{json .}}")
    rows = [json.loads(line) for line in ps.stdout.splitlines()]
    assert [(row["Names"], row["State"], row["Image"]) for row in rows] == [("engine-1", "running", DEFAULT_IMAGE)]
    assert rows[0]["Status"].startswith("Up ")

    smi = await sh(a, "nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                   "--format=csv,noheader,nounits")
    pid, name, used = [part.strip() for part in smi.stdout.strip().split(",")]
    assert name == "VLLM::EngineCore" and int(used) > 90_000  # 0.9 x 119.6 GiB
    meminfo = (a.host.home / "proc" / "meminfo").read_text()
    available_kb = int(next(line for line in meminfo.splitlines() if line.startswith("MemAvailable")).split()[1])
    assert available_kb < 30 * 1024 * 1024

    logs = await sh(a, "docker", "logs", "--tail", "50", "engine-1")
    assert "Application startup complete." in logs.stdout

    # The other host sees none of it.
    b = cluster.nodes[1]
    assert (await sh(b, "docker", "ps", "-q")).stdout == ""
    assert (await sh(b, "nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader")).stdout == ""

    assert (await sh(a, "docker", "rm", "-f", "engine-1")).ok
    # The memory is free the moment `docker rm` returns, as on a real node.
    meminfo = (a.host.home / "proc" / "meminfo").read_text()
    available_kb = int(next(line for line in meminfo.splitlines() if line.startswith("MemAvailable")).split()[1])
    assert available_kb > 110 * 1024 * 1024
    assert (await sh(a, "docker", "ps", "-aq")).stdout == ""
    assert (await sh(a, "nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader")).stdout == ""
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/health", timeout=1)


async def test_docker_errors_look_like_dockers(cluster):
    a = cluster.nodes[0]
    missing = await sh(a, "docker", "run", "-d", "--name", "x", "no/such:image", "true")
    assert missing.exit_status == 125 and "Unable to find image 'no/such:image' locally" in missing.stderr
    assert (await sh(a, "docker", "image", "inspect", "no/such:image")).exit_status == 1
    assert (await sh(a, "docker", "image", "inspect", "--format", "{{.Id}}", DEFAULT_IMAGE)).stdout.startswith(
        "sha256:")
    assert (await sh(a, "docker", "run", "-d", "--name", "dup", "--entrypoint", "sleep", DEFAULT_IMAGE, "30")).ok
    dup = await sh(a, "docker", "run", "-d", "--name", "dup", "--entrypoint", "sleep", DEFAULT_IMAGE, "30")
    assert dup.exit_status == 125 and "is already in use" in dup.stderr
    gone = await sh(a, "docker", "logs", "nothing-here")
    assert gone.exit_status == 1 and "No such container: nothing-here" in gone.stderr
    assert (await sh(a, "docker", "stop", "-t", "2", "dup")).ok
    ps = await sh(a, "docker", "ps", "-a", "--format", "{{.Names}} {{.State}}")
    assert ps.stdout.strip() == "dup exited"
    # Several names, one of them gone: docker prints those it has and an error line for the other.
    both = await sh(a, "docker", "inspect", "--format", "{{.Name}} {{.State.Status}}", "dup", "nothing-here")
    assert both.exit_status == 1 and both.stdout.strip() == "/dup exited"
    assert both.stderr.strip() == "Error: No such object: nothing-here"


async def test_a_failed_start_leaves_an_exited_container_with_the_reason_in_its_log(cluster):
    a = cluster.nodes[0]
    port = free_port(a.address)
    r = await sh(a, *serve_argv(a, "too-big", port, model="qwen3-235b-a22b"))
    assert r.ok  # docker run -d succeeds; the container then dies
    assert await exited(a, "too-big") == ["exited", "1"]
    logs = (await sh(a, "docker", "logs", "too-big")).stdout
    assert "CUDA out of memory" in logs


async def test_hostile_values_reach_the_container_as_literal_arguments(cluster, tmp_path):
    a = cluster.nodes[0]
    marker = tmp_path / "pwned"
    value = f"; touch {marker}; $(touch {marker}) `touch {marker}`"
    r = await sh(a, "docker", "run", "-d", "--name", "echoer", "-e", f"NOTE={value}", "--entrypoint", "printf",
                 DEFAULT_IMAGE, "%s|", value)
    assert r.ok
    assert await exited(a, "echoer") == ["exited", "0"]
    assert (await sh(a, "docker", "logs", "echoer")).stdout == value + "|"
    assert not marker.exists()


async def test_tp2_without_ray_across_two_hosts_and_worker_death_takes_the_head_down(cluster):
    a, b = cluster.nodes
    port, master = free_port(a.address), free_port(a.address)
    common = ["-tp", "2", "--nnodes", "2", "--master-addr", a.address, "--master-port", str(master)]
    worker = await sh(b, "docker", "run", "-d", "--name", "worker", "--network", "host", DEFAULT_IMAGE,
                      "gemma4-26b-a4b", *common, "--node-rank", "1", "--headless", "--startup-speed", "500")
    assert worker.ok
    head = await sh(a, "docker", "run", "-d", "--name", "head", "--network", "host", DEFAULT_IMAGE,
                    "gemma4-26b-a4b", *common, "--node-rank", "0", "--host", a.address, "--port", str(port),
                    "--startup-speed", "500")
    assert head.ok
    url = f"http://{a.address}:{port}"
    await wait_ready([url], timeout=30)
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200
    smi_b = await sh(b, "nvidia-smi", "--query-compute-apps=process_name", "--format=csv,noheader")
    assert smi_b.stdout.strip() == "VLLM::Worker_TP1"
    assert "world_size=2" in (await sh(a, "docker", "logs", "head")).stdout

    await sh(b, "docker", "rm", "-f", "worker")
    await exited(a, "head")
    assert "NCCL" in (await sh(a, "docker", "logs", "head")).stdout


async def test_tp2_head_without_its_worker_times_out(cluster):
    a = cluster.nodes[0]
    port, master = free_port(a.address), free_port(a.address)
    r = await sh(a, "docker", "run", "-d", "--name", "lonely", "--network", "host", DEFAULT_IMAGE, "gemma4-26b-a4b",
                 "-tp", "2", "--nnodes", "2", "--node-rank", "0", "--master-addr", a.address, "--master-port",
                 str(master), "--host", a.address, "--port", str(port), "--startup-speed", "300",
                 "--store-wait", "2")  # no worker is coming: the head need not wait for one to start
    assert r.ok
    await exited(a, "lonely")
    logs = (await sh(a, "docker", "logs", "lonely")).stdout
    assert "Timed out after 600 seconds waiting for clients. 1/2 clients joined." in logs


async def test_ray_cluster_forms_and_serves_tp2_and_losing_a_node_fails_the_engine(cluster):
    a, b = cluster.nodes
    ray_port, port = free_port(a.address), free_port(a.address)
    head = await sh(a, "ray", "start", "--head", "--port", str(ray_port), "--node-ip-address", a.address)
    assert head.ok, head.stderr
    member = await sh(b, "ray", "start", "--address", f"{a.address}:{ray_port}", "--node-ip-address", b.address)
    assert member.ok, member.stderr
    status = await sh(a, "ray", "status")
    assert status.stdout.count("node_spark-") == 2 and "2.0 GPU" in status.stdout

    r = await sh(a, "docker", "run", "-d", "--name", "vllm-ray", "--network", "host", DEFAULT_IMAGE,
                 "gpt-oss-120b", "-tp", "2", "--distributed-executor-backend", "ray", "--host", a.address,
                 "--port", str(port), "--startup-speed", "500")
    assert r.ok
    url = f"http://{a.address}:{port}"
    await wait_ready([url], timeout=30)
    smi_b = await sh(b, "nvidia-smi", "--query-compute-apps=process_name", "--format=csv,noheader")
    assert smi_b.stdout.strip() == "ray::RayWorkerWrapper"

    assert (await sh(b, "ray", "stop")).ok
    await exited(a, "vllm-ray")
    assert "ActorDiedError" in (await sh(a, "docker", "logs", "vllm-ray")).stdout


async def test_ray_tp2_without_a_cluster_fails_at_startup(cluster):
    a = cluster.nodes[0]
    port = free_port(a.address)
    await sh(a, "docker", "run", "-d", "--name", "no-ray", "--network", "host", DEFAULT_IMAGE, "gpt-oss-120b",
             "-tp", "2", "--distributed-executor-backend", "ray", "--port", str(port), "--startup-speed", "500")
    await exited(a, "no-ray")
    assert "required GPUs exceeds" in (await sh(a, "docker", "logs", "no-ray")).stdout


async def test_nvidia_smi_speaks_gb10(cluster):
    a = cluster.nodes[0]
    q = await sh(a, "nvidia-smi", "--query-gpu=name,memory.used,memory.total,utilization.gpu",
                 "--format=csv,noheader,nounits")
    assert q.stdout.strip() == "NVIDIA GB10, [N/A], [N/A], 0"
    q = await sh(a, "nvidia-smi", "--query-gpu=utilization.gpu,temperature.gpu,power.draw,clocks.sm,pstate",
                 "--format=csv,noheader,nounits")
    util, temp, power, clock, pstate = [p.strip() for p in q.stdout.split(",")]
    assert (util, pstate) == ("0", "P8") and float(power) > 0 and int(temp) > 20
    bad = await sh(a, "nvidia-smi", "--query-gpu=bogus", "--format=csv")
    assert bad.exit_status == 2 and 'Field "bogus" is not a valid field to query.' in bad.stderr
    table = await sh(a, "nvidia-smi")
    assert "NVIDIA GB10" in table.stdout and "Not Supported" in table.stdout
    assert all(len(line) == 91 for line in table.stdout.splitlines()[1:] if line.startswith(("|", "+")))


def _following(name: str) -> bool:
    """A `docker logs -f NAME` of this test's is running."""
    for proc in psutil.Process().children(recursive=True):
        try:
            argv = proc.cmdline()
        except psutil.Error:
            continue
        if argv[-3:] == ["logs", "-f", name]:
            return True
    return False


async def test_exec_sees_the_container_env_and_logs_follow_until_exit(cluster, tmp_path: Path):
    a = cluster.nodes[0]
    go = tmp_path / "go"  # the container runs until the test creates it: exec and follow it while it runs
    r = await sh(a, "docker", "run", "-d", "--name", "box", "-e", "GREETING=hello there", "--entrypoint", "sh",
                 DEFAULT_IMAGE, "-c", f'echo start; while [ ! -e "{go}" ]; do sleep 0.05; done; echo done')
    assert r.ok
    out = await sh(a, "docker", "exec", "box", "sh", "-c", 'printf %s "$GREETING"')
    assert out.stdout == "hello there"
    follow = asyncio.create_task(sh(a, "docker", "logs", "-f", "box", timeout=60))
    await eventually(lambda: _following("box"), timeout=30, what="docker logs -f following the container")
    assert not follow.done()  # nor can it end while the container runs
    go.touch()
    followed = await asyncio.wait_for(follow, 60)
    assert followed.stdout == "start\ndone\n"
    state = await sh(a, "docker", "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", "box")
    assert state.stdout.strip() == "false 0"
    not_running = await sh(a, "docker", "exec", "box", "true")
    assert not_running.exit_status == 1 and "is not running" in not_running.stderr


async def test_docker_restart_and_start_run_the_container_again_with_its_log_kept(cluster, tmp_path: Path):
    """`docker restart` stops a container and starts its command again: a new process and StartedAt, the
    same name, labels and environment, its log appended to (as Docker keeps a container's log across its
    starts); `docker start` does the same for a stopped one and nothing for a running one."""
    a = cluster.nodes[0]
    go = tmp_path / "go"
    script = f'echo "run $GREETING"; while [ ! -e "{go}" ]; do sleep 0.05; done'
    assert (await sh(a, "docker", "run", "-d", "--name", "box", "--label", "sparktop.launch=x", "-e",
                     "GREETING=again", "--entrypoint", "sh", DEFAULT_IMAGE, "-c", script)).ok
    fmt = "{{.State.Status}} {{.State.Pid}} {{.State.StartedAt}} {{.Config.Labels}}"

    async def inspect() -> list[str]:
        return (await sh(a, "docker", "inspect", "--format", fmt, "box")).stdout.split(maxsplit=3)

    async def logged(n: int, timeout: float = 30) -> None:
        """Until the log holds the lines of `n` runs (the predicate asks the node, so it is awaited)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while (out := (await sh(a, "docker", "logs", "box")).stdout) != "run again\n" * n:
            assert asyncio.get_running_loop().time() < deadline, f"after {timeout:g} s the log is {out!r}"
            await asyncio.sleep(0.1)

    await logged(1)
    first = await inspect()
    restarted = await sh(a, "docker", "restart", "-t", "2", "box")
    assert restarted.ok and restarted.stdout.strip() == "box"
    await logged(2)
    second = await inspect()
    assert second[0] == "running" and second[1] != first[1] and second[2] > first[2] and second[3] == first[3]
    assert (await sh(a, "docker", "stop", "-t", "2", "box")).ok
    assert (await inspect())[0] == "exited"
    assert (await sh(a, "docker", "start", "box")).ok
    await logged(3)
    third = await inspect()
    assert third[0] == "running" and third[2] > second[2]
    assert (await sh(a, "docker", "start", "box")).ok  # running already: nothing happens
    assert (await inspect())[1:3] == third[1:3]
    missing = await sh(a, "docker", "restart", "nothing-here")
    assert missing.exit_status == 1 and "No such container: nothing-here" in missing.stderr
