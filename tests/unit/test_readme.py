"""The README's promises stay true: CI runs exactly its test command, its table lists every command, its
example inventory is one the loader reads."""

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


def test_readme_lists_every_command():
    """Each of `sparktop --help`'s commands has its row in the README's table (`sparktop NAME ...`)."""
    from sparktop.cli import build_parser

    table = "\n".join(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `"))
    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    missing = [name for name in sub.choices if f"`sparktop {name}" not in table]
    assert missing == [], f"commands the README's table does not list: {missing}"


def test_readme_inventory_is_one_the_loader_reads_and_names_every_key(tmp_path):
    """The README's example inventory loads as written (an unknown key would be an error) and shows every key
    the loader reads, so a key added to the loader is documented there too."""
    from sparktop.settings import DEFAULT_KEYS, NODE_KEYS, load_inventory

    section = (ROOT / "README.md").read_text().split("### The inventory\n", 1)[1]
    example = re.search(r"```yaml\n(.+?)\n```", section, re.S).group(1)
    path = tmp_path / "cluster.yaml"
    path.write_text(example)
    inv = load_inventory(path)
    assert [n.name for n in inv.nodes] == ["spark-a", "spark-b"] and inv.head.name == "spark-a"
    assert inv.nodes[0].host == "spark-a.lan" and inv.nodes[1].host == "spark-b"  # a name alone is its host
    assert inv.nodes[0].ib_if == ["rocep1s0f1", "roceP2p1s0f1"]
    assert inv.defaults.images == {"sglang": "lmsysorg/sglang:spark"}
    written = set(re.findall(r"^\s*-?\s*(\w+):", example, re.M))
    assert set(NODE_KEYS) - written == set() and set(DEFAULT_KEYS) - written == set()
