"""A test host's stand-ins find an engine's program through the dialects' registry: every program a dialect
answers (its `engine_ids` row's and its helpers) is installed and runs that dialect's `tool_main`, and a
machine tool (`docker ps`, every second) loads no dialect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sparktop.twin import node
from sparktop.twin.dialects import DIALECTS, PROGRAMS, programs_of
from sparktop.twin.dialects.vllm import VLLM_VERSION

ROOT = Path(__file__).parents[2]


def test_every_dialect_program_is_installed_and_owned_by_one_dialect(tmp_path):
    assert list(PROGRAMS) == [p for engine in DIALECTS for p in programs_of(engine)]
    assert PROGRAMS["vllm"] == "vllm" and PROGRAMS["ggml-rpc-server"] == "llama.cpp"
    assert {PROGRAMS[p] for p in ("trtllm-serve", "trtllm-llmapi-launch", "mpirun", "sshd")} == {"trtllm"}
    installed = {p.name for p in node.install(tmp_path).iterdir()}
    assert installed == {*node.MACHINE_TOOLS, *node.FABRIC_TOOLS, *PROGRAMS, "ethtool", "df", "ip"}


def test_a_program_runs_its_dialect(capsys):
    assert node.main("vllm", ["--version"]) == 0
    assert capsys.readouterr().out == f"{VLLM_VERSION}\n"
    assert node.main("sglang", ["launch"]) == 2
    assert "usage: sglang serve" in capsys.readouterr().err
    assert node.main("trtllm-llmapi-launch", []) == 2
    assert node.main("mpirun", []) == 1
    assert capsys.readouterr().err == "mpirun: no executable given\n"
    assert node.main("no-such-tool", []) == 2
    assert capsys.readouterr().err == "unknown twin tool 'no-such-tool'\n"


def test_a_machine_tool_loads_no_dialect():
    code = ("import sys; from sparktop.twin import node, docker; "
            "print(sorted(m for m in sys.modules if m.startswith(('aiohttp', 'sparktop.twin.dialects.'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout == "[]\n"
