"""The HAProxy router sparktop puts in front of replicas: the config the launcher writes (launch/haproxy.py),
what the plan does with it, and how the monitor reads HAProxy's own exporter (observe/engines/haproxy.py).
Checked with the real HAProxy where the machine has one (`haproxy -c`, Debian's; scripts/test installs it)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from sparktop.engine_ids import HAPROXY
from sparktop.launch import haproxy as writer
from sparktop.launch.haproxy import ConfigError, haproxy_config
from sparktop.observe.engines import haproxy as reader
from sparktop.observe.engines.base import Answer

KEY_ENV = "LITELLM_MASTER_KEY"
BACKENDS = [("spark-a", "http://192.168.100.10:8000"), ("spark-b", "http://192.168.100.11:8000")]
BINARY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def test_the_config_balances_by_requests_in_flight_and_checks_each_replica():
    text = haproxy_config("0.0.0.0", 4000, BACKENDS, KEY_ENV)
    lines = [line.strip() for line in text.splitlines()]
    assert "balance leastconn" in lines
    assert "option httpchk GET /health" in lines and "http-check expect status 200" in lines
    assert "default-server check inter 2s fall 3 rise 2" in lines
    assert [line for line in lines if line.startswith("server ")] == [
        'server "spark-a" "192.168.100.10:8000"', 'server "spark-b" "192.168.100.11:8000"']
    assert 'bind "0.0.0.0:4000"' in lines
    # The key by name only: read from the environment, its absence an alert that stops HAProxy.
    assert f'unless {{ req.fhdr(authorization) -m str "Bearer ${{{KEY_ENV}}}" }}' in text
    assert f'.if !defined({KEY_ENV}) || streq("${KEY_ENV}","")' in lines and lines[lines.index(
        f'.if !defined({KEY_ENV}) || streq("${KEY_ENV}","")') + 1].startswith(".alert")
    # Streams unbuffered: nothing that would hold a body back.
    assert "http-buffer-request" not in text and "compression" not in text
    # The monitor's names are the writer's.
    assert (writer.BACKEND, writer.HEALTH) == (reader.BACKEND, reader.HEALTH)
    assert haproxy_config("spark-a.local", 4000, BACKENDS, KEY_ENV, health="/v1/models").count(
        "option httpchk GET /v1/models") == 1


def test_the_key_is_never_in_the_file_and_the_value_never_in_the_plan(monkeypatch):
    from sparktop.launch.catalog import find_recipe
    from sparktop.launch.topology import make_plan
    from sparktop.settings import Defaults, Inventory, Node

    monkeypatch.setenv(KEY_ENV, "sk-a-key-from-the-environment")
    inv = Inventory(nodes=[Node("spark-a", "a", fabric_ip="192.168.100.10"), Node("spark-b", "b")],
                    defaults=Defaults())
    plan = make_plan(find_recipe("llama-3.1-8b"), "2x solo", inv, lid="t")
    text = plan.render()
    assert "sk-a-key-from-the-environment" not in text
    [config] = [s for s in plan.steps if "HAProxy config" in s.title]
    assert config.stdin_text is not None and "sk-a" not in config.stdin_text and config.stdin_secrets == []
    assert config.command.startswith("sh -c 'umask 022 && ")  # HAProxy's own user in the image reads it
    [router] = [s for s in plan.steps if s.role == "router"]
    argv = [str(a) for a in router.argv]
    # The key reaches the container by its env file (written 0600 from standard input), never -e or a label.
    assert argv[argv.index("--env-file") + 1].endswith("/router.env")
    assert not any(KEY_ENV in a for a in argv)
    assert argv[argv.index("--entrypoint") + 1:argv.index("--entrypoint") + 3] == ["haproxy", "haproxy:3.2.24"]
    assert argv[-4:-1] == ["-W", "-db", "-f"] and argv[-1].endswith("/haproxy.cfg")
    assert "sparktop.kind=haproxy" in argv
    [secrets] = [s for s in plan.steps if s.stdin_secrets]
    assert secrets.stdin_secrets == [KEY_ENV] and "umask 077" in secrets.command
    # Every argument of the command a node runs is quoted: it splits back to the argv (the home as $HOME).
    assert shlex.split(router.command) == [a.replace("~/", "$HOME/") for a in argv]
    endpoint = next(e for e in plan.endpoints if e.kind == HAPROXY)
    assert (endpoint.url, endpoint.api_key_env) == ("http://192.168.100.10:4000", KEY_ENV)
    said = "router: HAProxy 3.2.24 leastconn on spark-a, the default for replicas"
    assert any(n.startswith(said) for n in plan.notes)


@pytest.mark.parametrize(("bind", "backends", "says"), [
    ("0.0.0.0", [("spark a", "http://10.0.0.1:8000")], "replica name 'spark a'"),
    ("0.0.0.0", [('a"b', "http://10.0.0.1:8000")], "replica name 'a\"b'"),
    ("0.0.0.0", [("a", "http://10.0.0.1:8000\n    server evil 6.6.6.6:80")], "is not http://HOST:PORT"),
    ("0.0.0.0", [("a", "http://$(touch x):8000")], "is not http://HOST:PORT"),
    ("0.0.0.0", [("a", "http://10.0.0.1")], "is not http://HOST:PORT"),
    ("0.0.0.0", [("a", "http://10.0.0.1:8000"), ("a", "http://10.0.0.2:8000")], "two replicas named alike"),
    ("0.0.0.0", [], "no replicas"),
    ('0.0.0.0" ssl', [("a", "http://10.0.0.1:8000")], "bind address"),
])
def test_a_value_the_config_cannot_hold_is_one_line_naming_it(bind, backends, says):
    with pytest.raises(ConfigError) as err:
        haproxy_config(bind, 4000, backends, KEY_ENV)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.skipif(not Path(BINARY).exists(), reason="no HAProxy here (scripts/test installs Debian's)")
def test_real_haproxy_takes_the_config_and_refuses_to_start_without_the_key(tmp_path):
    path = tmp_path / "haproxy.cfg"
    path.write_text(haproxy_config("127.0.0.1", 4000, BACKENDS + [("v6", "http://[::1]:8000")], KEY_ENV))
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    ok = subprocess.run([BINARY, "-c", "-f", str(path)], env={**env, KEY_ENV: "k3y-_"}, capture_output=True,
                        text=True, timeout=30)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for without in (env, {**env, KEY_ENV: ""}):
        refused = subprocess.run([BINARY, "-c", "-f", str(path)], env=without, capture_output=True, text=True,
                                 timeout=30)
        assert refused.returncode != 0 and f"{KEY_ENV} is not set" in refused.stdout + refused.stderr


EXPORTED = """\
# HELP haproxy_process_build_info Build info
# TYPE haproxy_process_build_info gauge
haproxy_process_build_info{version="2.6.12-1+deb12u4"} 1
# HELP haproxy_backend_current_queue Number of queued requests.
# TYPE haproxy_backend_current_queue gauge
haproxy_backend_current_queue{proxy="replicas"} 3
# HELP haproxy_server_current_sessions Number of current sessions on the frontend, backend or server
# TYPE haproxy_server_current_sessions gauge
haproxy_server_current_sessions{proxy="replicas",server="spark-a"} 4
haproxy_server_current_sessions{proxy="replicas",server="spark-b"} 0
haproxy_server_current_sessions{proxy="other",server="x"} 9
# HELP haproxy_server_sessions_total Total number of sessions.
# TYPE haproxy_server_sessions_total counter
haproxy_server_sessions_total{proxy="replicas",server="spark-a"} 12
haproxy_server_sessions_total{proxy="replicas",server="spark-b"} 8
# HELP haproxy_server_status Current status of the service, per state label value.
# TYPE haproxy_server_status gauge
haproxy_server_status{proxy="replicas",server="spark-a",state="DOWN"} 0
haproxy_server_status{proxy="replicas",server="spark-a",state="UP"} 1
haproxy_server_status{proxy="replicas",server="spark-b",state="DOWN"} 1
haproxy_server_status{proxy="replicas",server="spark-b",state="UP"} 0
"""


def test_the_monitor_reads_each_replica_as_haproxy_sees_it():
    reading = reader.parse(EXPORTED)
    assert reading.version == "2.6.12-1+deb12u4" and reading.queued == 3
    assert reading.backends == (reader.Backend("spark-a", "UP", 4, 12), reader.Backend("spark-b", "DOWN", 0, 8))


async def test_the_router_is_recognised_by_its_header_and_read_from_its_exporter():
    from sparktop.observe import engines

    models = b'{"data": [{"id": "m", "owned_by": "vllm"}]}'  # a replica's list, passed through

    async def get(path: str) -> Answer:
        headers = {"via": "1.1 haproxy", "content-type": "application/json"}
        if path == "/v1/models":
            return Answer(path, 200, headers, models)
        if path == "/metrics":
            return Answer(path, 200, headers, EXPORTED.encode())
        return Answer(path, 404, headers, b"")

    found = await engines.recognise(get)  # no hint: the Via header, before vLLM's owned_by
    assert found.id == HAPROXY and found.router and found.model == "m"
    d = await found.read(get, 1.0, False)
    assert (d.running, d.waiting, d.requests) == (4.0, 3.0, 20.0)
    assert found.version == "2.6.12-1+deb12u4"
    from sparktop.observe.snapshot import EngineSnapshot

    snap = EngineSnapshot(key="r", url="r", t=1.0)
    found.fill(snap, d)
    assert (snap.kind, snap.engine, snap.backends) == (HAPROXY, "HAProxy", {"spark-a": "UP", "spark-b": "DOWN"})

    async def plain(path: str) -> Answer:  # the replica itself: still vLLM
        return Answer(path, 200, {}, models)

    assert (await engines.recognise(plain)).id == "vllm"


async def test_without_the_key_the_router_is_read_by_liveness_alone():
    async def get(path: str) -> Answer:
        if path == "/metrics":
            return Answer(path, 401, {"via": "1.1 haproxy"}, b'{"error": {}}')
        return Answer(path, 200, {"via": "1.1 haproxy"}, b"<html>200 OK</html>")

    d = await reader.Haproxy("given").read(get, 1.0, False)
    assert d.running is None and "running" in d.missing


def test_litellm_in_front_of_haproxy_is_one_layout_word_and_its_key_goes_by_name(monkeypatch):
    """`2x solo,litellm`: HAProxy on the next port splits the replicas, LiteLLM in front (the endpoint listed
    first) has HAProxy as its one deployment and sends it the router's key by name."""
    import yaml

    from sparktop.launch.catalog import find_recipe
    from sparktop.launch.topology import make_plan
    from sparktop.layouts import describe, parse_layout
    from sparktop.model.routers import router_for
    from sparktop.settings import Defaults, Inventory, Node

    monkeypatch.setenv(KEY_ENV, "sk-never-in-a-plan")
    layout = parse_layout("2x solo,litellm")
    assert (layout.router, layout.text, describe(layout)) == (
        "litellm", "2x solo,litellm", "solo x2 + LiteLLM in front of HAProxy leastconn")
    row = router_for("litellm")
    assert row.behaviour == "even" and row.splits(8, 2) == [((4, 4), 1.0)] and row.overhead_s is None
    inv = Inventory(nodes=[Node("spark-a", "a", fabric_ip="192.168.100.10"), Node("spark-b", "b")],
                    defaults=Defaults())
    plan = make_plan(find_recipe("llama-3.1-8b"), "2x solo,litellm", inv, lid="t")
    assert "sk-never" not in plan.render()
    assert [(e.url, e.kind) for e in plan.endpoints][-2:] == [("http://192.168.100.10:4000", "router"),
                                                            ("http://192.168.100.10:4001", "haproxy")]
    config = yaml.safe_load(next(s for s in plan.steps if "LiteLLM config" in s.title).stdin_text)
    assert config["model_list"] == [{"model_name": "llama-3.1-8b", "litellm_params": {
        "model": "hosted_vllm/llama-3.1-8b", "api_base": "http://192.168.100.10:4001/v1",
        "api_key": f"os.environ/{KEY_ENV}"}}]
    haproxy = next(s for s in plan.steps if "HAProxy config" in s.title).stdin_text
    assert 'bind "0.0.0.0:4001"' in haproxy and haproxy.count("    server ") == 2
    assert [n for n in plan.notes if n.startswith("router:")] == [
        "router: LiteLLM 1.106.2 + HAProxy 3.2.24 leastconn on spark-a, as the layout says: LiteLLM's keys, spend "
        "tracking and features in front, HAProxy leastconn behind it on port 4001, so a burst of c still splits "
        "c/2 each"]
