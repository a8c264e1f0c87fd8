"""The README's promises stay true: CI runs exactly its test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```sh\n(.+?)\n```", text)


def test_readme_has_the_two_setup_commands():
    demo, tests = readme_commands()[:2]
    assert demo.endswith("sparktop demo") and "pip install ." in demo
    assert tests == "scripts/test"
    script = (ROOT / "scripts" / "test").read_text()
    # A fresh machine: what the lab and the browser test need, then the venv, then pytest.
    for needed in ("openssh-server", "chromium", "python3 -m venv .venv", "pip install -q -e '.[test]'",
                   ".venv/bin/python -m pytest"):
        assert needed in script


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r'TEST_COMMAND="(.+)"', ci).group(1)
    assert command == readme_commands()[1]
