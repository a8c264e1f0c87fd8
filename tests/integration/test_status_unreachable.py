"""`sparktop status` on what it cannot reach says so: a node whose name resolves to no address is down
and says why, and an address nothing answers at is unreachable, not called a vLLM (nothing said what it is).

The inventory's node is named in `.invalid` (RFC 6761: it never resolves), without `host:`, so its name is its
ssh host; nothing on this machine is polled."""

from __future__ import annotations

import json

from sparktop.cli import main
from tests.conftest import free_port

NODE = "spark-x.invalid"


def _inventory(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(f"nodes:\n  - name: {NODE}\n")  # no host: the name is the host
    return path


def test_a_node_whose_name_resolves_nowhere_is_down_cannot_resolve(tmp_path, capsys, monkeypatch):
    inventory = _inventory(tmp_path)
    assert main(["status", "--json", "--inventory", str(inventory)]) == 0
    (node,) = json.loads(capsys.readouterr().out)["nodes"]
    assert node["name"] == NODE and node["state"] == "down"
    assert node["reason"].startswith(f"cannot resolve {NODE}")  # in a network without DNS: "(temporary failure...)"
    monkeypatch.setenv("COLUMNS", "200")  # the table's cells unwrapped
    assert main(["status", "--inventory", str(inventory)]) == 0
    assert f"down: cannot resolve {NODE}" in capsys.readouterr().out


def test_an_engine_nothing_answers_at_is_unreachable_and_not_called_a_vllm(tmp_path, capsys, monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"  # a port nothing listens on: refused
    inventory = _inventory(tmp_path)
    assert main(["status", "--json", "--inventory", str(inventory), "--engine", url]) == 0
    (engine,) = json.loads(capsys.readouterr().out)["engines"]
    assert engine["url"] == url and engine["state"] == "unreachable" and engine["reason"] == "connection refused"
    assert engine["kind"] is None and engine["engine"] is None and engine["recognised"] is None
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["status", "--inventory", str(inventory), "--engine", url]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if url.removeprefix("http://") in line and "│" in line]
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[1] == "—" and cells[3].startswith("unreachable")  # engine: unknown; state: unreachable
    assert "vllm" not in row.lower()
    assert f"{url}: connection refused" in out
