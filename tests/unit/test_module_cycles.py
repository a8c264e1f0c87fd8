"""No import cycle between any two modules of sparktop, however long, whether its imports are at module level
or inside a function (a function-level import is a dependency too, only a later one), and the two placements
that broke the cycles there were (issue 36). `lint-imports` checks the same in CI with import-linter's
contracts (pyproject.toml); this test needs nothing installed and names the file and line of every import
in a cycle.

`from pkg import mod` counts as an import of pkg.mod; imports under `if TYPE_CHECKING:` run for the type
checker only and are left out."""

from __future__ import annotations

import ast
import graphlib
from collections import defaultdict
from pathlib import Path

import sparktop

PACKAGE = Path(sparktop.__file__).parent
MODULES = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
           for p in PACKAGE.rglob("*.py")}


def _module(name: str) -> str | None:
    """The sparktop module a dotted name is or lies in (sparktop.bench.stats.parse_slo -> sparktop.bench.stats)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name | ast.Attribute) and getattr(test, "id", getattr(test, "attr", "")) == \
        "TYPE_CHECKING"


def runtime_imports(path: Path) -> list[tuple[str, int]]:
    """(sparktop module, line) for every import that runs: at module level or in a function."""
    here = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                for stmt in child.orelse:  # the else branch runs
                    visit(stmt)
                continue
            if isinstance(child, ast.Import):
                out.extend((m, child.lineno) for a in child.names if (m := _module(a.name)))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(up + ([child.module] if child.module else []))
                for a in child.names:  # `from pkg import mod` imports pkg.mod
                    if m := _module(f"{base}.{a.name}"):
                        out.append((m, child.lineno))
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return [(m, line) for m, line in out if m != here]


def module_graph() -> dict[str, dict[str, list[str]]]:
    """{importer: {imported: ["file:line", ...]}} over the whole package."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, path in sorted(MODULES.items()):
        graph[name]  # every module is a node
        for target, line in runtime_imports(path):
            where = f"{path.relative_to(PACKAGE.parent)}:{line}"
            if where not in graph[name][target]:
                graph[name][target].append(where)
    return graph


def cycles(graph: dict[str, dict[str, list[str]]], most: int = 20) -> list[str]:
    """Each cycle found, as its imports with where they are. After each, one of its imports is set aside so
    that the next cycle shows too (at most `most`)."""
    edges = {a: set(bs) for a, bs in graph.items()}
    found = []
    for _ in range(most):
        try:
            graphlib.TopologicalSorter(edges).prepare()
            break
        except graphlib.CycleError as e:
            loop = e.args[1][::-1]  # the sorter lists each module before the one that imports it
            steps = list(zip(loop, loop[1:], strict=False))
            found.append("; ".join(f"{a.removeprefix('sparktop.')} -> {b.removeprefix('sparktop.')} "
                                   f"({', '.join(graph[a][b])})" for a, b in steps))
            a, b = steps[0]
            edges[a].discard(b)
    return found


def test_no_cycles_between_modules():
    found = cycles(module_graph())
    assert found == [], "import cycles:\n" + "\n".join(found)


def test_the_model_constants_import_nothing_else_of_the_model():
    """Every module of the model may import `model.constants`, so it may import none of them."""
    inside = [f"{m} (line {line})" for m, line in runtime_imports(MODULES["sparktop.model.constants"])
              if m.startswith("sparktop.model")]
    assert inside == []


def test_slo_parsing_lives_with_the_statistics():
    """A run read back from its files (`bench.run.Run.rate_levels`) recomputes its rate levels with the SLO
    parsing and the statistics the sweep used: both live in `bench.stats`, which imports nothing of the sweep
    but the records it counts and the sweep's error."""
    defined = {n.name for n in ast.parse(MODULES["sparktop.bench.stats"].read_text()).body
               if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    assert {"parse_slo", "rate_level_stats", "RateLevelStats"} <= defined
    bench = {m for m, _ in runtime_imports(MODULES["sparktop.bench.stats"]) if m.startswith("sparktop.bench")}
    assert bench <= {"sparktop.bench.request", "sparktop.bench.levels"}
