"""YAML loading that remembers where each key was written.

Inventory and recipe errors must name the file, the line and the key. PyYAML
forgets positions once it builds Python objects, so this loader builds
`Located` dicts and lists that keep the 1-based line of every key / item.

Both loaders here parse with libyaml (PyYAML's C parser) where PyYAML was
built with it, about ten times faster than the pure-Python one: the model's
reference files are hundreds of kilobytes. `safe_load` is `yaml.safe_load`
on it; `load_published` also keeps a file's parse for the process, until the
file changes.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from sparktop.errors import ConfigError

# libyaml's parser with PyYAML's safe constructors: the same objects, the same errors (yaml.YAMLError, marks
# with 0-based lines), where PyYAML has it; the pure-Python SafeLoader otherwise.
FAST_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """`yaml.safe_load`, parsed by libyaml where PyYAML has it."""
    return yaml.load(text, Loader=FAST_LOADER)  # noqa: S506 - a safe loader


_PUBLISHED: dict[str, tuple[tuple[int, int], Any]] = {}


def load_published(path: str | Path) -> Any:
    """A data file shipped with sparktop (`safe_load` of its text), parsed once per process and again only
    when it changes (its modification time or size). The object is shared: read it, never change it."""
    path = Path(path)
    st = os.stat(path)
    stamp = (st.st_mtime_ns, st.st_size)
    key = str(path.resolve())
    hit = _PUBLISHED.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    data = safe_load(path.read_text(encoding="utf-8"))
    _PUBLISHED[key] = (stamp, data)
    return data


class LocatedDict(dict):
    """A dict that knows the line of each of its keys and of itself."""

    line: int = 0
    key_lines: dict

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class LocatedList(list):
    """A list that knows the line of each item and of itself."""

    line: int = 0
    item_lines: list

    def line_of(self, index: int) -> int:
        if 0 <= index < len(self.item_lines):
            return self.item_lines[index]
        return self.line


class _Loader(FAST_LOADER):  # libyaml's nodes keep their start marks too
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LocatedDict:
    loader.flatten_mapping(node)
    result = LocatedDict()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in result.key_lines:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LocatedList:
    result = LocatedList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_text(text: str, path: str | Path) -> Any:
    """Parse YAML text; a syntax error becomes a ConfigError naming the line."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or str(exc)
        raise ConfigError(str(path), line, None, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), None, None, f"invalid YAML: {exc}") from None


def load_file(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), None, None, f"cannot read: {exc.strerror}") from None
    return load_text(text, path)


def line_of(container: Any, key: Any) -> int | None:
    """Line of `key` inside `container` when it was loaded by this module."""
    if isinstance(container, LocatedDict):
        return container.line_of(key)
    if isinstance(container, LocatedList) and isinstance(key, int):
        return container.line_of(key)
    return getattr(container, "line", None)


def check_keys(mapping: dict, allowed: Iterable[str], path: str | Path, where: str = "") -> None:
    """Reject unknown keys with a did-you-mean, naming file, line and key."""
    allowed = list(allowed)
    for key in mapping:
        if key in allowed:
            continue
        name = f"{where}.{key}" if where else str(key)
        close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(sorted(allowed))}"
        raise ConfigError(str(path), line_of(mapping, key), name, f"unknown key{hint}")
