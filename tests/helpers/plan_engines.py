"""The engines a launch plan starts, as a twin in their container sees them: the engine's own command line
(after the image's entrypoint, through a `sh -c ... exec` where the plan wraps it), the container's labels and
its image."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from sparktop.engine_ids import is_router
from sparktop.launch.plan import Plan

PROGRAMS = ("vllm", "trtllm-serve", "llama-server", "python3", "python")


@dataclass
class PlanEngine:
    kind: str  # the engine's id (its `sparktop.kind` label)
    argv: list[str]  # the engine's arguments, after its program (and vLLM's `serve`, SGLang's `-m ...`)
    labels: dict[str, str]
    image: str


def _after_program(words: list[str]) -> list[str]:
    program, rest = words[0], words[1:]
    if program.endswith("vllm") and rest[:1] == ["serve"]:
        return rest[1:]
    if program.startswith("python") and rest[:1] == ["-m"]:
        return rest[2:]
    return rest


def plan_engines(plan: Plan) -> list[PlanEngine]:
    out = []
    for step in plan.steps:
        argv = [str(a) for a in step.argv]
        if argv[:3] != ["docker", "run", "-d"] or "--entrypoint" not in argv:
            continue
        labels = dict(argv[i + 1].partition("=")[::2] for i, a in enumerate(argv) if a == "--label")
        kind = labels.get("sparktop.kind")
        if not kind or is_router(kind):
            continue
        at = argv.index("--entrypoint")
        entry, image, rest = argv[at + 1], argv[at + 2], argv[at + 3:]
        if entry == "sh" and rest[:1] == ["-c"]:
            words = rest[3:] if 'exec "$@"' in rest[1] else shlex.split(rest[1])
        else:
            words = [entry, *rest]
        # Wrapped (ray start && exec vllm serve ..., mpirun ... trtllm-serve ...): from the engine's program on.
        words = words[next(i for i, w in enumerate(words) if w.rsplit("/", 1)[-1] in PROGRAMS):]
        out.append(PlanEngine(kind, _after_program(words), labels, image))
    return out


def without_address(argv: list[str]) -> list[str]:
    """The engine's arguments without its --host/--port (a test's twin binds its own)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--host", "--port"):
            skip = True
            continue
        out.append(a)
    return out
