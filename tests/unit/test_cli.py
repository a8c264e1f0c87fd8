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


def test_a_rate_window_outside_its_range_is_one_line_and_nonzero(tmp_path):
    for value, why in (("0.5", "from 1 to 3600"), ("ten", "a number of seconds")):
        r = sparktop("monitor", "--rate-window", value)
        assert r.returncode == 2 and r.stdout == "", r.stdout
        (line,) = [x for x in r.stderr.splitlines() if "--rate-window" in x and "error" in x]
        assert why in line and "Traceback" not in r.stderr


def test_web_sessions_keep_the_rate_window():
    import shlex

    from sparktop.web import session_command

    assert "--rate-window=30" in shlex.split(session_command(None, [], 1.0, read_only=True, rate_window=30.0))
    assert not any(a.startswith("--rate-window") for a in shlex.split(session_command(None, [], 1.0, True)))
