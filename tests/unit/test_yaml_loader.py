"""YAML through libyaml (`yamlfile.safe_load`, the line-keeping loader on its
parser): the same objects as PyYAML's pure-Python SafeLoader for every file
sparktop ships, the same lines in errors and in what it keeps, and the
published figure files parsed once per process until they change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sparktop import yamlfile
from sparktop.errors import ConfigError
from sparktop.model import fit
from sparktop.model.runtimes import FIGURES
from sparktop.settings import shipped_recipes_dir

DATA = Path(fit.__file__).parent / "data"
COMMUNITY = Path(__file__).parents[1] / "fixtures" / "community"  # eugr's and sparkrun's recipes
BIG = {fit.MORE.name, FIGURES.name}  # hundreds of KB: seconds with the pure-Python loader


def shipped_yaml() -> list[Path]:
    return sorted(DATA.rglob("*.yaml")) + sorted(shipped_recipes_dir().glob("*.yaml")) + sorted(
        COMMUNITY.rglob("*.yaml"))


def where(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def test_the_fast_loader_is_libyaml_where_pyyaml_has_it():
    if getattr(yaml, "__with_libyaml__", False):
        assert yamlfile.FAST_LOADER is yaml.CSafeLoader
        assert issubclass(yamlfile._Loader, yaml.CSafeLoader)
    else:
        assert yamlfile.FAST_LOADER is yaml.SafeLoader


@pytest.mark.parametrize("path", [p for p in shipped_yaml() if p.name not in BIG], ids=where)
def test_every_shipped_file_loads_the_same_as_with_the_pure_python_loader(path):
    text = path.read_text()
    assert yamlfile.safe_load(text) == yaml.safe_load(text)
    assert yamlfile.load_text(text, path) == yaml.safe_load(text)


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in shipped_yaml() if p.name in BIG], ids=where)
def test_the_big_reference_files_load_the_same_as_with_the_pure_python_loader(path):
    text = path.read_text()
    assert yamlfile.safe_load(text) == yaml.safe_load(text)


DOC = """\
# a comment
nodes:
  - name: a
    host: a.lan

  - name: b
    extra:
      - 1
      - two
defaults: &d
  port: 8000
more:
  <<: *d
  image: x
"""


def test_the_line_keeping_loader_keeps_every_line():
    doc = yamlfile.load_text(DOC, "inv.yaml")
    assert doc.line == 2 and doc.key_lines == {"nodes": 2, "defaults": 10, "more": 12}
    nodes = doc["nodes"]
    assert nodes.line == 3 and nodes.item_lines == [3, 6]
    assert nodes[0].key_lines == {"name": 3, "host": 4} and nodes[1].line_of("extra") == 7
    assert nodes[1]["extra"].item_lines == [8, 9]
    assert doc["more"] == {"port": 8000, "image": "x"} and doc["more"].line_of("image") == 14
    assert yamlfile.line_of(doc["defaults"], "port") == 11


@pytest.mark.parametrize("text, line", [
    ("nodes:\n  - name: a\n   host: b\n", 3),  # bad indentation
    ("a: 1\nb: 2\na: 3\n", 3),  # a duplicate key, at the second one
    ("a: [1,\n", 2),  # a flow sequence never closed
    ("a: 1\nb: 'open\n", 3),  # a quoted scalar never closed
    ("a: 1\n\tb: 2\n", 2),  # a tab
])
def test_errors_name_the_same_line_as_before(text, line):
    with pytest.raises(ConfigError) as info:
        yamlfile.load_text(text, "x.yaml")
    assert str(info.value).startswith(f"x.yaml:{line}: invalid YAML: ")
    assert info.value.line == line


def test_published_files_are_parsed_once_until_they_change(tmp_path, monkeypatch):
    path = tmp_path / "figures.yaml"
    path.write_text("figures:\n  - value: 1\n")
    first = yamlfile.load_published(path)
    assert first == {"figures": [{"value": 1}]}
    monkeypatch.setattr(yamlfile, "safe_load", lambda text: pytest.fail("parsed again"))
    assert yamlfile.load_published(path) is first
    monkeypatch.undo()
    path.write_text("figures:\n  - value: 22\n")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a later modification, however fast
    assert yamlfile.load_published(path) == {"figures": [{"value": 22}]}
