"""The shapes of what a vLLM server answers, to hold the twin to a real one.

Values differ from server to server (ids, times, text, counts); what must
match is the shape: which metric families exist with which type and label
names, which keys each kind of SSE chunk carries and of which JSON types,
which keys a JSON body has. These functions reduce a body to its shape, and
`compare` says, one line each, where two shapes differ. They serve the
fixture test (`tests/unit/test_twin_conformance_fixtures.py`, against
`tests/fixtures/vllm-0.32.0/`) and the live comparison with a running vLLM.

The differences the twin keeps on purpose are in
`sparktop.twin.dialects.vllm_differences.DIFFERENCES`; `ignored(scope)` gives the patterns
`compare` skips for one scope ("metrics", "sse", "json").

Prometheus' text format declares each counter's `_created` series with a
TYPE line of its own (gauge), so prometheus-client's parser returns them as
families of their own: `vllm:prompt_tokens_created` is a gauge family here,
as it is on the wire.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

from sparktop.twin.dialects.vllm_differences import DIFFERENCES

# Label names a histogram or summary adds to its own samples.
_SAMPLE_LABELS = {"le", "quantile"}
CHUNK_KINDS = ("role", "content", "finish", "usage", "error", "done")


# -- /metrics --------------------------------------------------------------------


def metric_families(text: str, prefix: str = "vllm:") -> dict[str, tuple[str, tuple[str, ...]]]:
    """{family: (type, sorted label names)} for the families whose name starts with `prefix`."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefix):
            continue
        labels = {name for sample in family.samples for name in sample.labels} - _SAMPLE_LABELS
        out[family.name] = (family.type, tuple(sorted(labels)))
    return out


def histogram_buckets(text: str, prefix: str = "vllm:") -> dict[str, tuple[float, ...]]:
    """{histogram family: its bucket boundaries, +Inf last}."""
    out: dict[str, tuple[float, ...]] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram" or not family.name.startswith(prefix):
            continue
        les = {float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")}
        out[family.name] = tuple(sorted(les))
    return out


def label_values(text: str, family: str, label: str) -> set[str]:
    """The values one label takes in a family's samples (a reason, a state)."""
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            return {s.labels[label] for s in fam.samples if label in s.labels}
    return set()


# -- JSON and SSE ------------------------------------------------------------------


def shape(value: object) -> object:
    """A JSON value's shape: objects keep their keys (with their values'
    shapes), lists the distinct shapes of their elements, scalars their type."""
    if isinstance(value, dict):
        return {key: shape(v) for key, v in value.items()}
    if isinstance(value, list):
        seen: dict[str, object] = {}
        for item in value:
            s = shape(item)
            seen.setdefault(json.dumps(s, sort_keys=True), s)
        return [seen[k] for k in sorted(seen)]
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "str"


def json_shape(body: str | bytes) -> object:
    return shape(json.loads(body))


def sse_events(body: str | bytes) -> list[object]:
    """The `data:` payloads of an SSE body: JSON objects, and "[DONE]"."""
    text = body.decode() if isinstance(body, bytes) else body
    events: list[object] = []
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def chunk_kind(event: object) -> str:
    """role, content, finish, usage, error or done."""
    if event == "[DONE]":
        return "done"
    assert isinstance(event, dict), event
    if "error" in event:
        return "error"
    choices = event.get("choices") or []
    if not choices:
        return "usage"
    choice = choices[0]
    if "role" in (choice.get("delta") or {}):
        return "role"
    if choice.get("finish_reason") is not None:
        return "finish"
    return "content"


def sse_shapes(body: str | bytes) -> dict[str, object]:
    """{kind of chunk: its shape}, one entry per kind present; a kind whose
    chunks differ in shape gets the list of their distinct shapes."""
    by_kind: dict[str, dict[str, object]] = {}
    for event in sse_events(body):
        kind = chunk_kind(event)
        s = "[DONE]" if kind == "done" else shape(event)
        by_kind.setdefault(kind, {}).setdefault(json.dumps(s, sort_keys=True), s)
    out: dict[str, object] = {}
    for kind in CHUNK_KINDS:
        if kind in by_kind:
            shapes = [by_kind[kind][k] for k in sorted(by_kind[kind])]
            out[kind] = shapes[0] if len(shapes) == 1 else shapes
    return out


def sse_kinds(body: str | bytes) -> list[str]:
    """The kinds of the chunks in order, runs of one kind collapsed:
    ["role", "content", "finish", "usage", "done"]."""
    kinds: list[str] = []
    for event in sse_events(body):
        kind = chunk_kind(event)
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    return kinds


# -- comparing ---------------------------------------------------------------------


def ignored(scope: str) -> list[str]:
    """The difference patterns the twin keeps for one scope, without the scope."""
    return [key.split(":", 1)[1] for key in DIFFERENCES if key.split(":", 1)[0] == scope]


def compare(expected: object, actual: object, ignore: Iterable[str] = (), where: str = "") -> list[str]:
    """Where `actual` differs from `expected`, one readable line each.

    Paths name object keys with dots and list elements with `[]`
    (`choices[].delta.content`); at the top of a metric-family map the key is
    the family's name. A path matching one of `ignore` (fnmatch patterns) is
    skipped with everything under it.
    """
    patterns = list(ignore)
    if where and any(fnmatch.fnmatchcase(where, p) for p in patterns):
        return []
    label = where or "(top)"
    if isinstance(expected, dict) and isinstance(actual, dict):
        out: list[str] = []
        for key in expected:
            path = f"{where}.{key}" if where else str(key)
            if key not in actual:
                if not any(fnmatch.fnmatchcase(path, p) for p in patterns):
                    out.append(f"{path}: missing (expected {_brief(expected[key])})")
                continue
            out += compare(expected[key], actual[key], patterns, path)
        for key in actual:
            path = f"{where}.{key}" if where else str(key)
            if key not in expected and not any(fnmatch.fnmatchcase(path, p) for p in patterns):
                out.append(f"{path}: unexpected (got {_brief(actual[key])})")
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) == 1 and len(actual) == 1:
            return compare(expected[0], actual[0], patterns, f"{where}[]")
        if expected != actual:
            return [f"{label}: {_brief(expected)} expected, got {_brief(actual)}"]
        return []
    if expected != actual:
        return [f"{label}: {_brief(expected)} expected, got {_brief(actual)}"]
    return []


def _brief(value: object) -> str:
    if isinstance(value, dict):
        return "object {" + ", ".join(map(str, value)) + "}"
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple):
        kind, labels = value
        return f"{kind} with labels {', '.join(labels) or '(none)'}"
    text = json.dumps(value) if not isinstance(value, tuple) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
