"""The import rules docs/ARCHITECTURE.md writes down, checked on the source.

Every import counts, at module level or inside a function: a function-level
import is still a dependency, only a later one. No cycle between modules:
test_module_cycles.py (and `lint-imports` in CI)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import sparktop

PACKAGE = Path(sparktop.__file__).parent

# What each part of sparktop may import (besides itself and the foundation).
FOUNDATION = {"errors", "yamlfile", "units", "events", "settings", "layouts", "clock", "engine_ids", "masking",
              "measuring", "tables", "labels", "__init__"}
ALLOWED = {
    "remote": set(),
    "observe": {"remote"},
    "bench": {"observe"},
    "model": {"bench"},
    "launch": {"remote", "observe", "bench", "model"},
    "twin": {"remote", "model"},
    "status": {"remote", "observe", "launch"},
    "setup": {"remote", "observe"},
    "study": {"remote", "observe", "bench", "model", "launch"},
    # web: the token rules its metrics endpoint shares; launch: the router keys of what sparktop launched
    "history": {"remote", "observe", "web", "launch"},
    "ui": {"remote", "observe", "bench", "model", "launch", "study", "history", "sync"},
    "demo": {"remote", "observe", "launch", "twin", "ui"},
    "sync": {"remote"},  # copies between nodes and lists their caches: the inventory and the transports only
    "web": set(),  # serves `sparktop monitor` by its command line, never imports the app
    "cli": {"remote", "observe", "bench", "model", "launch", "study", "twin", "ui", "status", "demo", "web",
            "history", "setup", "sync"},
    "__main__": {"cli"},
}


def part(module: str) -> str:
    """sparktop.observe.poller -> observe; sparktop.cli -> cli."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def imports(path: Path) -> list[tuple[str, int]]:
    """(absolute sparktop module, line) for every import in the file."""
    here = module_name(path)
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("sparktop")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + (1 if path.name == "__init__.py" else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("sparktop"):
                out.append((target, node.lineno))
    return out


def edges() -> list[tuple[str, str, str, int]]:
    """(importing module, imported module, file, line) across the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for target, line in imports(path):
            found.append((module_name(path), target, str(path.relative_to(PACKAGE.parent)), line))
    return found


def test_each_part_imports_only_what_the_architecture_allows():
    offenders = []
    for source, target, where, line in edges():
        a, b = part(source), part(target)
        if a == b or b in FOUNDATION:
            continue
        if a in FOUNDATION:
            offenders.append(f"{where}:{line}: the foundation imports {target}")
        elif b not in ALLOWED.get(a, set()):
            offenders.append(f"{where}:{line}: {a} may not import {target}")
    assert offenders == []


def test_no_cycles_between_packages():
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target, _, _ in edges():
        if part(source) != part(target):
            graph[part(source)].add(part(target))
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail else f"{node}->{nxt}")
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(list(graph)):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_only_the_cli_imports_a_commands_module():
    offenders = [f"{where}:{line}: {target}" for source, target, where, line in edges()
                 if target.rsplit(".", 1)[-1] == "commands" and source != "sparktop.cli"]
    assert offenders == []


SEAMS = ("sparktop.observe.engines", "sparktop.launch.runtimes", "sparktop.twin.dialects")


def engine_of(module: str, seam: str) -> str:
    """The engine a seam's module belongs to: `vllm` for `twin.dialects.vllm` and for the modules it grew
    into (`twin.dialects.vllm_metrics`, `vllm_log`, `vllm_args`)."""
    return module[len(seam) + 1:].split(".")[0].split("_")[0]


def test_an_engine_lives_in_its_own_modules():
    """Each engine is one module per seam (how it is watched, launched and
    imitated), or a few named after it where one grew large (`vllm_metrics`).
    They meet only through the seam's `base` and its registry, so adding or
    changing one engine never touches another, and nothing outside the seams
    reaches into one engine's module."""
    offenders = []
    for source, target, where, line in edges():
        seam = next((s for s in SEAMS if target.startswith(s + ".")), None)
        if seam is None or target.endswith(".base"):
            continue
        inside = next((s for s in SEAMS if source == s or source.startswith(s + ".")), None)
        if inside == seam and source == seam:
            continue  # the registry lists its engines
        same_engine = inside is not None and engine_of(source, inside) == engine_of(target, seam)
        if not same_engine:
            offenders.append(f"{where}:{line}: {source} imports {target}")
    assert offenders == []
