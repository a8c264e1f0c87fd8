"""Engine names live in the table (`sparktop/engine_ids.py`) and the seams, nowhere else.

Outside `engine_ids.py` and the three seams (observe/engines/, launch/runtimes/, twin/dialects/), no code
compares something with an engine's id, alias or name, or asks whether it starts or ends with one: it asks
the table (`engine_ids.lookup`, `is_router`, a row's `base_model`) or its seam (a `Runtime`'s `flags_key`, an
`Engine`'s `process_titles`). So adding an engine is its row and its modules, and renaming one (llama-cpp ->
llama.cpp) is one line. Docstrings and f-strings say engine names freely; they are text, not decisions."""

from __future__ import annotations

import ast
from pathlib import Path

import sparktop
from sparktop import engine_ids

PACKAGE = Path(sparktop.__file__).parent
SEAMS = ("observe/engines/", "launch/runtimes/", "twin/dialects/")
TABLE = "engine_ids.py"
# Files that may still decide by an engine's name, and why. Each must still need it (a stale entry fails).
ALLOWED: dict[str, str] = {}
# Every name that stands for an engine, in lower case: ids, aliases ("llama-cpp", "trt-llm") and the names
# people read ("vLLM", "TensorRT-LLM").
NAMES = frozenset(n.lower() for r in engine_ids.ROWS for n in (r.id, *r.aliases, r.name))


def _strings(node: ast.AST):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for elt in node.elts:
            yield from _strings(elt)


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.hits: list[tuple[int, str]] = []

    def _check(self, node: ast.AST, where: int) -> None:
        self.hits += [(where, s) for s in _strings(node) if s.lower() in NAMES]

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return  # an f-string is text

    def visit_Compare(self, node: ast.Compare) -> None:
        for operand in (node.left, *node.comparators):
            self._check(operand, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("startswith", "endswith"):
            for arg in node.args:
                self._check(arg, node.lineno)
        self.generic_visit(node)


def engine_names_in(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, name) of every comparison with, or startswith/endswith of, an engine name in `source`."""
    finder = _Finder()
    finder.visit(ast.parse(source, filename=filename))
    return finder.hits


def offenders(package: Path = PACKAGE) -> dict[str, list[tuple[int, str]]]:
    """Per file (relative to the package) outside the table and the seams: where it decides by an engine name."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel == TABLE or rel.startswith(SEAMS):
            continue
        hits = engine_names_in(path.read_text(), str(path))
        if hits:
            out[rel] = hits
    return out


def test_no_engine_name_decides_outside_the_table_and_the_seams():
    found = offenders()
    unexpected = [f"sparktop/{rel}:{line}: {name!r}" for rel, hits in found.items() if rel not in ALLOWED
                  for line, name in hits]
    assert unexpected == [], ("ask engine_ids (lookup, is_router, a row's fields) or the engine's seam instead:\n"
                              + "\n".join(unexpected))
    stale = [rel for rel in ALLOWED if rel not in found]
    assert stale == [], f"no longer decide by an engine name: drop them from ALLOWED: {stale}"


def test_the_guard_sees_comparisons_and_prefixes_but_not_text():
    assert engine_names_in('if kind == "sglang":\n    pass\n') == [(1, "sglang")]
    assert engine_names_in('ok = rt != "llama-cpp"') == [(1, "llama-cpp")]
    assert engine_names_in('ok = x in ("tgi", "ollama", "other")') == [(1, "tgi"), (1, "ollama")]
    assert engine_names_in('ok = name.startswith("vLLM")') == [(1, "vLLM")]
    assert engine_names_in('ok = argv[0].endswith(("trt-llm", "x"))') == [(1, "trt-llm")]
    assert engine_names_in('ok = role == "head"') == []
    text = '"""Compare with "vllm" or if kind == "sglang"."""\nmsg = f"{kind == \'sglang\'} vllm"\nx = "vllm"\n'
    assert engine_names_in(text) == []


def test_the_guard_fails_on_a_new_comparison(tmp_path):
    """What the guard says when someone writes `if kind == "sglang":` in, say, status.py."""
    copy = tmp_path / "sparktop"
    (copy / "observe" / "engines").mkdir(parents=True)
    (copy / "status.py").write_text((PACKAGE / "status.py").read_text() + '\n\ndef _x(kind):\n'
                                    '    if kind == "sglang":\n        return 1\n')
    (copy / "observe" / "engines" / "sglang.py").write_text('ok = kind == "sglang"\n')  # a seam: its own name
    found = offenders(copy)
    assert list(found) == ["status.py"] and found["status.py"][-1][1] == "sglang"


def test_the_help_texts_launched_list_is_what_launch_launches():
    """cli.py lists the runtimes sparktop launches as the rows sparkrun runs (so `--help` imports no launch code)."""
    from sparktop.cli import _LAUNCHED
    from sparktop.launch.runtimes import RUNTIMES

    assert {engine_ids.runtime_id(n) for n in _LAUNCHED} == set(RUNTIMES)
    assert _LAUNCHED == ["vllm", "sglang", "llama-cpp", "trtllm"]
