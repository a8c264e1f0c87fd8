"""Small things that cost trust (issue 37): a bare word taken for an engine, a YAML error hidden behind
"neither a recipe nor a model card", a traceback when the reader of a pipe goes away, options without help."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from sparktop.cli import SIGPIPE_EXIT, build_parser, main
from sparktop.observe.targets import check_engine_url


@pytest.mark.parametrize("command", [["status"], ["monitor"], ["collect"], ["web"]])
def test_every_command_that_watches_refuses_an_engine_that_is_no_address(command, capsys):
    for value, why in (("not-a-url", "it has no port"), ("ftp://spark-a:8000", "http or https"),
                       ("spark-a:eighty", "its port must be a number")):
        assert main([*command, "--engine", value]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.count("\n") == 1, err  # one line, no traceback
        assert err.startswith(f"sparktop: --engine {value!r}: expected a URL like http://HOST:PORT (or HOST:PORT)")
        assert why in err


def test_the_addresses_an_engine_is_given_as_are_taken():
    for url in ("http://spark-a:8000", "http://spark-a:8000/v1", "https://llm.example.com", "spark-a:8000",
                "127.0.0.1:30000/v1", "http://[::1]:8080"):
        assert check_engine_url(url) == url


def test_predict_shows_a_yaml_error_at_its_line(tmp_path, capsys):
    path = tmp_path / "syntax.yaml"
    path.write_text("name: mine\nmodel: [openai/gpt-oss-120b\nruntime: vllm\n")
    assert main(["predict", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sparktop: {path}:3: invalid YAML: ") and err.count("\n") == 1, err
    assert "neither a recipe nor a model card" not in err


def test_predict_shows_what_is_wrong_in_a_recipe_file(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nmodel: openai/gpt-oss-120b\nmax_seqs: 8\n")
    assert main(["predict", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"sparktop: {path}:3: max_seqs: unknown key")
    assert main(["predict", str(tmp_path / "missing.yaml")]) == 2
    assert capsys.readouterr().err == f"sparktop: {tmp_path / 'missing.yaml'}: no such recipe file\n"


def test_predict_of_a_name_that_is_nothing_still_says_so(capsys):
    assert main(["predict", "gpt-7"]) == 2
    assert "'gpt-7' is neither a recipe nor a model card" in capsys.readouterr().err


def _with_reader_gone(*args: str) -> subprocess.CompletedProcess:
    """`sparktop ARGS | head -c0`: the pipe's reader has gone before sparktop writes a byte (a reader that
    goes after a few bytes is the same to the writer, once the pipe's buffer no longer takes its output)."""
    proc = subprocess.Popen([sys.executable, "-m", "sparktop", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    return subprocess.CompletedProcess(proc.args, proc.wait(timeout=60), "", err)


@pytest.mark.parametrize("args", [("twin", "cards"), ("recipes", "--json"), ("twin", "serve", "--help")])
def test_a_reader_that_goes_away_ends_the_command_quietly(args):
    r = _with_reader_gone(*args)
    assert r.stderr == "", r.stderr  # no BrokenPipeError traceback, no "Exception ignored"
    assert r.returncode == SIGPIPE_EXIT == 141  # as a shell reports a command SIGPIPE ended


def test_a_table_whose_reader_goes_away_ends_quietly():
    r = _with_reader_gone("predict", "qwen3-8b")  # a Rich table: Rich ends the command itself, with status 1
    assert r.stderr == "", r.stderr
    assert r.returncode != 0


def _options(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*path, name))
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield path, action


def test_every_option_of_every_command_says_what_it_does():
    missing = [f"{' '.join(path)} {'/'.join(a.option_strings) or a.dest}"
               for path, a in _options(build_parser(), ("sparktop",))
               if a.help != argparse.SUPPRESS and not (a.help or "").strip()]
    assert missing == [], f"options without a help text: {missing}"


def test_twin_serve_help_names_engine(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["twin", "serve", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "--max-num-seqs" in out  # vLLM's flags, as its parser lists them
    own = out.split("sparktop's own option", 1)[1]
    assert "--engine ENGINE" in own and "sglang" in own and "llama-cpp" in own and "trtllm" in own
