"""The architecture rules DESIGN.md sets, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import sparktop

PACKAGE = Path(sparktop.__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_the_ui_package_imports_textual():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "ui" in path.relative_to(PACKAGE).parts[:1]:
            continue
        if any(m == "textual" or m.startswith("textual.") for m in imported_modules(path)):
            offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []


def test_nothing_outside_the_ui_imports_the_ui():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "ui" or rel.name == "cli.py" or rel.name == "demo.py":
            continue
        if any(m.startswith("sparktop.ui") for m in imported_modules(path)):
            offenders.append(str(rel))
    assert offenders == []


def test_every_module_says_what_it_is_for():
    missing = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if p.name != "__init__.py" and not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def test_the_layout_follows_design_md():
    for sub in ("remote", "observe", "launch", "bench", "model", "twin", "ui"):
        assert (PACKAGE / sub / "__init__.py").exists(), sub
    for module in ("cli.py", "settings.py", "model/perf.py", "model/scheduler.py", "model/simulate.py",
                   "twin/engine.py", "twin/server.py", "twin/node.py"):
        assert (PACKAGE / module).exists(), module


def test_the_performance_model_stands_alone():
    """`model` is a product feature, not a test double: it never imports the
    twin (or launch, observe, ui); launch and bench use the model, never the twin."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        banned = {"model": ("sparktop.twin", "sparktop.launch", "sparktop.observe", "sparktop.ui"),
                  "launch": ("sparktop.twin",), "bench": ("sparktop.twin",)}.get(rel.parts[0], ())
        for m in imported_modules(path):
            if m.startswith(banned) if banned else False:
                offenders.append(f"{rel} imports {m}")
    assert offenders == []
