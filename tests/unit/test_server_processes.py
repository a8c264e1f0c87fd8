"""vLLM started outside Docker: the probe's `@@servers` section, parsed from
real captures (tests/fixtures/SOURCES.md, `processes/`), and how a server
process becomes an engine to watch."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparktop.observe.host_probe import (
    parse_probe,
    process_engine,
    server_candidates,
    servers_script,
    split_sections,
)
from sparktop.observe.hostparse import parse_server_processes, server_command
from sparktop.observe.poller import EngineTarget, NodeTarget, Poller
from sparktop.observe.snapshot import Container, NodeSnapshot, ServerProcess, node_from_dict, to_dict
from tests.helpers import gb10

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "processes"
STAND_IN, TWIN, FAKE, UNBOUND, HEADLESS, BOXED, API_SERVER = range(11734, 11741)
OTHERS = {32045: 18123, 32047: 18123, 9967: 8000, 9971: 8000}  # other sessions' twins, then


def servers(name: str) -> dict[int, ServerProcess]:
    body = split_sections((FIX / f"servers-section_{name}.txt").read_text())["servers"][0]
    return {s.pid: s for s in parse_server_processes(body)}


@pytest.mark.parametrize("name", ["root", "root_no-ss"])
def test_servers_outside_docker_with_the_ports_their_sockets_listen_on(name):
    found = servers(name)
    assert {pid: (s.command, s.ports, s.port_source) for pid, s in found.items()} == {
        STAND_IN: ("vllm serve", [48911], "socket"),
        TWIN: ("sparktop twin serve", [53975], "socket"),
        FAKE: ("vllm serve", [45839], "socket"),
        UNBOUND: ("vllm serve", [8000], "flag"),  # not listening yet: its flags say where it will
        API_SERVER: ("vllm api_server", [46575], "socket"),
        **{pid: ("vllm serve", [port], "socket") for pid, port in OTHERS.items()},
    }
    # The TP worker has no API; the process in a Docker cgroup is the container discovery's.
    assert HEADLESS not in found and BOXED not in found
    assert found[STAND_IN].argv[2:] == ["serve", "llama-3.1-8b", "--host", "127.0.0.1", "--port", "48911",
                                        "--startup-speed", "1000"]
    assert found[STAND_IN].argv[1].endswith("/twin-bin/vllm")
    assert found[TWIN].argv[1:5] == ["-m", "sparktop", "twin", "serve"]
    assert found[API_SERVER].argv[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]


def test_unreadable_descriptors_fall_back_to_the_port_flag_and_say_so():
    found = servers("nobody")
    assert set(found) == {STAND_IN, TWIN, FAKE, UNBOUND, API_SERVER, *OTHERS}
    assert all(s.port_source == "flag" for s in found.values())
    assert found[FAKE].ports == [45839] and found[UNBOUND].ports == [8000]
    assert process_engine(found[FAKE], "127.0.0.1").found == f"process {FAKE} (vllm serve, port 45839 from --port)"
    assert process_engine(found[UNBOUND], "127.0.0.1").found == \
        f"process {UNBOUND} (vllm serve, port 8000, vLLM's default)"
    # Its cgroup is still readable: the process in a container stays skipped.
    assert BOXED not in found and HEADLESS not in found


def test_a_server_whose_sockets_were_read_comes_before_a_launcher_in_front_of_it():
    text = "\n".join([
        "/proc/10/cmdline:uv", "/proc/10/cmdline:run", "/proc/10/cmdline:vllm", "/proc/10/cmdline:serve",
        "/proc/10/cmdline:m", "/proc/11/cmdline:/venv/bin/python", "/proc/11/cmdline:/venv/bin/vllm",
        "/proc/11/cmdline:serve", "/proc/11/cmdline:m", "/proc/10/fd:", "/proc/11/fd:",
        "lrwx------ 1 u u 64 Nov 23 16:18 7 -> socket:[99]",
        "LISTEN 0      128      0.0.0.0:8000  0.0.0.0:* ino:99 sk:1 cgroup:/ <->"])
    assert [(s.pid, s.port_source) for s in parse_server_processes(text)] == [(11, "socket"), (10, "flag")]


def test_what_counts_as_an_engine_api_server():
    assert server_command(["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m"]) == ("vllm", "vllm serve")
    assert server_command(["python", "-m", "vllm.entrypoints.cli.main", "serve", "m"]) == ("vllm", "vllm serve")
    assert server_command(["python", "-m", "vllm.entrypoints.openai.api_server"]) == ("vllm", "vllm api_server")
    assert server_command(["/v/bin/sparktop", "twin", "serve", "m"]) == ("vllm", "sparktop twin serve")
    assert server_command(["python3", "-m", "sglang.launch_server", "--model-path", "m"]) == \
        ("sglang", "sglang launch_server")
    assert server_command(["/usr/local/bin/sglang", "serve", "--model-path", "m"]) == ("sglang", "sglang serve")
    assert server_command(["/app/llama-server", "-m", "/models/m.gguf"]) == ("llama.cpp", "llama-server")
    assert server_command(["/app/ggml-rpc-server", "-H", "0.0.0.0"]) == ("llama.cpp", "ggml-rpc-server")
    assert server_command(["/usr/bin/python3", "/usr/local/bin/trtllm-serve", "m"]) == ("trtllm", "trtllm-serve")
    assert server_command(["/usr/local/bin/ollama", "serve"]) == ("ollama", "ollama serve")
    assert server_command(["/usr/local/bin/ollama", "runner", "--port", "41234"]) is None  # its model runner
    assert server_command(["python", "-m", "sparktop", "monitor"]) is None
    assert server_command(["vllm", "bench", "serve"]) is None
    assert server_command(["tail", "-f", "vllm serve.log"]) is None
    assert server_command(["less", "llama-server.log"]) is None


def server(*args: str, ports=(8000,), pid=42) -> ServerProcess:
    return ServerProcess(pid, ["python", "/usr/bin/vllm", "serve", "org/model", *args], list(ports))


def test_the_engine_a_process_serves_on_its_node():
    engine = process_engine(server("--port", "8000"), "10.0.0.5")
    assert (engine.url, engine.found, engine.model, engine.topology) == (
        "http://10.0.0.5:8000", "process 42 (vllm serve, port 8000)", "org/model", "solo")
    # A named address is where it is reached; a wildcard is the node's own.
    assert process_engine(server("--host", "10.0.1.5", "--port", "9000", ports=[9000]), "10.0.0.5").url == \
        "http://10.0.1.5:9000"
    assert process_engine(server("--host", "0.0.0.0"), "10.0.0.5").url == "http://10.0.0.5:8000"
    assert process_engine(server("--host", "fd00::5"), "10.0.0.5").url == "http://[fd00::5]:8000"
    # The --port it listens on wins over another socket it holds.
    assert process_engine(server("--port", "9000", ports=[5555, 9000]), "n").port == 9000
    tp = process_engine(server("-tp", "2", "--distributed-executor-backend", "ray"), "n")
    assert tp.topology == "cluster-ray"


def test_a_process_bound_to_another_nodes_address_is_that_nodes():
    """The lab's hosts are one machine: each sees every host's processes."""
    lab = servers("root")[32045]  # --host 127.0.0.2 --port 18123
    assert process_engine(lab, "127.0.0.2", {"127.0.0.3"}).url == "http://127.0.0.2:18123"
    assert process_engine(lab, "127.0.0.3", {"127.0.0.2"}) is None
    # Loopback is reached only from the node itself: not from a monitor watching another address.
    local = servers("root")[FAKE]  # --host 127.0.0.1
    assert process_engine(local, "127.0.0.1").url == f"http://127.0.0.1:{45839}"
    assert process_engine(server("--host", "localhost"), "127.0.0.1").url == "http://127.0.0.1:8000"
    assert process_engine(local, "127.0.0.2") is None
    assert process_engine(local, "192.168.1.10") is None


def test_how_each_engine_was_found():
    assert EngineTarget("http://a:8000").found == "given (--engine)"
    assert EngineTarget("http://a:8000", origin="discovered", container="vllm-solo").found == "container vllm-solo"
    assert EngineTarget("http://a:8000", origin="discovered",
                        process="process 7 (vllm serve, port 8000)").found == "process 7 (vllm serve, port 8000)"
    assert EngineTarget("http://a:8000", origin="candidate").found == "default port 8000"


def test_the_probe_reads_the_section_and_old_recordings_load():
    text = gb10.probe_answer().replace("@@end", (FIX / "servers-section_root.txt").read_text() + "@@end")
    snap = parse_probe("spark-a", text, None)
    assert snap.containers and STAND_IN in {s.pid for s in snap.servers}
    assert parse_probe("spark-a", gb10.probe_answer(), None).servers == []  # a probe without the section
    again = node_from_dict(to_dict(snap))
    assert again.servers == snap.servers
    old = to_dict(NodeSnapshot("spark-a", 0.0))
    del old["servers"]
    assert node_from_dict(old).servers == []


def test_the_same_candidates_are_not_read_again():
    script = servers_script("/proc/1/cmdline /proc/2/cmdline")
    assert "then echo unchanged" in script and "'/proc/1/cmdline /proc/2/cmdline'" in script
    assert server_candidates("@@servers\nunchanged\n") == "unchanged"
    assert server_candidates((FIX / "servers-section_root.txt").read_text()).startswith(
        f"/proc/{STAND_IN}/cmdline /proc/{TWIN}/cmdline")
    assert server_candidates("@@servers\n") is None


class Silent:
    """A node transport never asked anything: the poller is paused."""

    name = "silent"

    async def close(self) -> None:
        pass


async def discovery(*nodes: tuple[str, str]):
    poller = Poller([NodeTarget(name, Silent(), address) for name, address in nodes], default_port=None)  # type: ignore[arg-type]
    poller.pause()
    await poller.start()
    return poller


def node(name: str, servers_=(), containers=(), docker="ok") -> NodeSnapshot:
    return NodeSnapshot(name, 0.0, state="ok", servers=list(servers_), containers=list(containers),
                        docker_status=docker)


async def test_process_engines_come_and_go_with_the_list_even_without_docker():
    poller = await discovery(("spark-a", "10.0.0.5"), ("spark-b", "10.0.0.6"))
    try:
        a, b = poller._nodes["spark-a"], poller._nodes["spark-b"]
        boxed = Container("vllm-solo", "vllm/vllm-openai", "running", "Up", command="vllm serve m --port 8001")
        poller._discover(a, node("spark-a", [server("--port", "8000")], [boxed]))
        assert {k: (w.target.node, w.target.found) for k, w in poller._engines.items()} == {
            "http://10.0.0.5:8000": ("spark-a", "process 42 (vllm serve, port 8000)"),
            "http://10.0.0.5:8001": ("spark-a", "container vllm-solo")}
        # Bound to spark-a's address: not spark-b's, though spark-b lists it too.
        poller._discover(b, node("spark-b", [server("--host", "10.0.0.5", "--port", "8000")]))
        assert len(poller._engines) == 2
        # docker stops answering: the container's engine stays, the process engine goes with its process.
        poller._discover(a, node("spark-a", [], docker="permission denied"))
        assert list(poller._engines) == ["http://10.0.0.5:8001"]
    finally:
        await poller.close()


async def test_a_containers_own_process_is_the_containers_engine():
    """The twin's containers are processes on this machine: one engine, found as the container."""
    poller = await discovery(("spark-a", "127.0.0.2"))
    try:
        a = poller._nodes["spark-a"]
        proc = server("--host", "127.0.0.2", "--port", "8000")
        boxed = Container("sparktop-vllm", "vllm/vllm-openai", "running", "Up",
                          command="vllm serve org/model --host 127.0.0.2 --port 8000")
        poller._discover(a, node("spark-a", [proc]))  # docker printed its list just before the process started
        poller._discover(a, node("spark-a", [proc], [boxed]))
        assert {k: w.target.found for k, w in poller._engines.items()} == {
            "http://127.0.0.2:8000": "container sparktop-vllm"}
    finally:
        await poller.close()


def _layout_name(argv: list[str]) -> str:
    from sparktop.observe.engines import for_command

    found = for_command(argv)
    assert found is not None
    return found[0].layout(argv).name


def test_a_command_line_names_its_layout():
    assert _layout_name(["vllm", "serve", "m"]) == "solo"
    assert _layout_name(["vllm", "serve", "m", "-tp", "2"]) == "cluster-mp"
    assert _layout_name(["vllm", "serve", "m", "--tensor-parallel-size", "2", "--distributed-executor-backend",
                         "ray"]) == "cluster-ray"
    assert _layout_name(["vllm", "serve", "m", "--tensor-parallel-size", "4", "--distributed-executor-backend",
                         "ray"]) == "tp=4,ray"
    assert _layout_name(["vllm", "serve", "m", "-tp", "2", "--pipeline-parallel-size", "2", "--nnodes", "4"]) == \
        "tp=2,pp=2"
    assert _layout_name(["vllm", "serve", "m", "-tp", "x"]) == "solo"  # nonsense is not a layout
    assert _layout_name(["python3", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "2", "--nnodes", "2",
                         "--node-rank", "0", "--dist-init-addr", "10.0.0.1:25000"]) == "cluster-mp"
    assert _layout_name(["/app/llama-server", "-m", "m.gguf", "--rpc", "10.0.0.2:50052"]) == "pp=2"
    assert _layout_name(["trtllm-serve", "m", "--tp_size", "2"]) == "cluster-mp"
