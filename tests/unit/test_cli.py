"""The command line a user types."""

from __future__ import annotations

import subprocess
import sys

from sparktop import __version__
from sparktop.cli import main

SUBCOMMANDS = ["monitor", "demo", "launch", "stop", "status", "sweep", "compare", "recipes", "predict",
               "replay", "twin"]


def sparktop(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "sparktop", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_version():
    r = sparktop("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"sparktop {__version__}"


def test_help_lists_every_subcommand():
    r = sparktop("--help")
    assert r.returncode == 0
    for name in SUBCOMMANDS:
        assert f"\n    {name} " in r.stdout, name


def test_twin_cards_lists_the_models(capsys):
    assert main(["twin", "cards"]) == 0
    out = capsys.readouterr().out
    for name in ("gpt-oss-120b", "qwen3-235b-a22b", "llama-3.1-70b"):
        assert name in out


def test_twin_node_sets_up_a_host(tmp_path, capsys):
    assert main(["twin", "node", "--home", str(tmp_path / "h"), "--name", "spark-x",
                 "--images", "vllm/vllm-openai:v0.20.1"]) == 0
    out = capsys.readouterr().out
    assert "export SPARKTOP_TWIN_HOME=" in out
    for tool in ("docker", "vllm", "ray", "nvidia-smi"):
        assert (tmp_path / "h" / "bin" / tool).exists()
    assert "MemTotal:" in (tmp_path / "h" / "proc" / "meminfo").read_text()


def test_unknown_twin_model_is_one_line_and_nonzero():
    r = sparktop("twin", "serve", "--model", "gpt-7", "--port", "0")
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "unknown model 'gpt-7'" in r.stderr
