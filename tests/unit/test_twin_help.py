"""`sparktop twin serve --engine E --help` (issue 37): every flag of the SGLang, llama.cpp and TensorRT-LLM
twins says what the real engine's flag does, and the description says unknown flags are accepted and ignored."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from sparktop.cli import main
from sparktop.twin.dialects import llamacpp, sglang, trtllm
from sparktop.twin.dialects.llamacpp import LlamaCppDialect
from sparktop.twin.dialects.sglang import SglangDialect

# --engine's name -> the dialect's parser, as its `parse` builds it.
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "sglang": lambda: sglang._parser("sglang serve"),
    "llama-cpp": lambda: llamacpp._parser(LlamaCppDialect.prog),
    "trtllm": lambda: trtllm.build_parser(),
}


def _flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("engine", sorted(PARSERS))
def test_every_flag_of_an_engine_twin_has_help(engine, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["twin", "serve", "--engine", engine, "--help"])
    assert exc.value.code in (0, None)
    out = capsys.readouterr().out
    parser = PARSERS[engine]()
    assert parser.description and "accepted and ignored" in parser.description
    assert "accepted and ignored" in " ".join(out.split())
    for action in _flags(parser):
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help.strip() and action.help != argparse.SUPPRESS, f"{engine}: {name}"
        text = action.help % {**vars(action), "prog": parser.prog}  # what --help prints, %(default)s filled in
        assert len(text) <= 100, f"{engine}: {name}: {text!r}"
        if not isinstance(action, argparse._StoreFalseAction):  # a --no-X flag: its --X states the default
            assert action.default in (None, False) or "default" in action.help, (
                f"{engine}: {name} has a default its help does not state")
        for option in action.option_strings:
            assert option in out, f"{engine}: {option} missing from --help"
    # The printed options section: each option's entry carries text after its flags (inline or on the next line).
    section = out.split("\noptions:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    for i, line in enumerate(section):
        if not line.startswith("  -") or line.lstrip().startswith("-h, --help"):
            continue
        inline = "  " in line.strip()  # argparse puts a short entry's help two spaces after its flags
        following = i + 1 < len(section) and section[i + 1].startswith(" " * 20)  # else on the next line
        assert inline or following, f"{engine}: no help for {line.strip()!r}"


@pytest.mark.parametrize("engine, argv", [
    ("sglang", ["--model-path", "Qwen/Qwen3-8B", "--enable-torch-compile", "--some-new-flag", "3"]),
    ("llama-cpp", ["-hf", "ggml-org/gpt-oss-20b-GGUF", "--jinja", "-fa", "on", "-ngl", "99"]),
    ("trtllm", ["serve", "nvidia/Llama-3.1-8B-Instruct-FP8", "--some_new_flag", "7"]),
])
def test_flags_an_engine_twin_does_not_model_are_accepted_and_ignored(engine, argv):
    if engine == "sglang":
        args = SglangDialect().parse(argv)
    elif engine == "llama-cpp":
        args = LlamaCppDialect().parse(argv)
    else:
        args = trtllm.parse_trtllm_args(argv)
    model_at = argv.index(next(a for a in argv if "/" in a))
    assert args.extra == argv[model_at + 1:]
