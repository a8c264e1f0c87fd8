"""XDG locations and the cluster inventory, including the errors a user sees."""

from __future__ import annotations

import pytest

from sparktop import settings
from sparktop.errors import ConfigError


def write(tmp_path, text: str):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_xdg_locations_follow_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "c"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "d"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "s"))
    assert settings.inventory_path() == tmp_path / "c" / "sparktop" / "cluster.yaml"
    assert settings.results_dir() == tmp_path / "d" / "sparktop" / "results"
    assert settings.logs_dir() == tmp_path / "s" / "sparktop" / "logs"


def test_no_inventory_means_this_node_only():
    inv = settings.load_inventory()
    assert len(inv.nodes) == 1 and inv.head.is_local
    assert inv.defaults.port == 8000


def test_a_full_inventory(tmp_path):
    path = write(tmp_path, """
defaults:
  image: nvcr.io/nvidia/vllm:25.09-py3
  hf_cache: /data/hf
  port: 8888
nodes:
  - name: spark-a
    host: spark-a.lan
    user: nvidia
    port: 2222
    fabric_ip: 192.168.100.10
    eth_if: enp1s0f1np1
    ib_if: rocep1s0f1,roceP2p1s0f1
  - name: spark-b
    host: spark-b.lan
    fabric_ip: 192.168.100.11
    ib_if: [rocep1s0f1]
""")
    inv = settings.load_inventory(path)
    assert [n.name for n in inv.nodes] == ["spark-a", "spark-b"]
    a = inv.node("spark-a")
    assert (a.host, a.user, a.port, a.fabric_ip, a.eth_if) == ("spark-a.lan", "nvidia", 2222, "192.168.100.10",
                                                               "enp1s0f1np1")
    assert a.ib_if == ["rocep1s0f1", "roceP2p1s0f1"] and inv.node("spark-b").ib_if == ["rocep1s0f1"]
    assert inv.defaults.image == "nvcr.io/nvidia/vllm:25.09-py3" and inv.defaults.port == 8888
    assert inv.head is a and not a.is_local and a.address == "192.168.100.10"


def test_hosts_can_be_plain_names(tmp_path):
    inv = settings.load_inventory(write(tmp_path, "nodes: [spark-a, spark-b]\n"))
    assert [(n.name, n.host) for n in inv.nodes] == [("spark-a", "spark-a"), ("spark-b", "spark-b")]


@pytest.mark.parametrize("text, line, needle", [
    ("nodes:\n  - name: a\n    hots: x\n", 3, "nodes[0].hots: unknown key; did you mean 'host'?"),
    ("nodes:\n  - name: a\n    port: twenty\n", 3, "nodes[0].port: must be an integer"),
    ("nodes:\n  - name: a\n  - name: a\n", 3, "duplicate node name 'a'"),
    ("defaults:\n  prot: 1\nnodes: [a]\n", 2, "defaults.prot: unknown key; did you mean 'port'?"),
    ("nodes: []\n", 1, "nodes: must be a non-empty list"),
    ("nodes:\n  - name: a\n   host: b\n", 3, "invalid YAML"),
])
def test_inventory_errors_name_file_line_and_key(tmp_path, text, line, needle):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        settings.load_inventory(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert needle in message
    assert "\n" not in message


def test_unknown_node_name(tmp_path):
    inv = settings.load_inventory(write(tmp_path, "nodes: [spark-a]\n"))
    with pytest.raises(ConfigError, match="no node named 'spark-z'"):
        inv.node("spark-z")
