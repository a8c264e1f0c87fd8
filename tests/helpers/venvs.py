"""Tools that cannot share sparktop's environment get their own venv under
`.lab/` (gitignored), made once on first use from PyPI and reused after.

Making one is locked (two test processes never make the same venv at once).
A test worker in a network namespace of its own (tests/helpers/netns.py) has
no route to PyPI: there the tools are made by the run's controller in the
background (tests/helpers/prepare.py) and a worker that needs one waits for
it, or fails with the reason the install gave."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

LAB = Path(__file__).resolve().parents[2] / ".lab"

LLAMA_BENCHY = "llama-benchy==0.4.0"

# Set in a worker that cannot reach PyPI: the tools are the controller's to make (prepare.py).
OFFLINE = "SPARKTOP_TEST_OFFLINE"
# Held (flock) by the controller's background `prepare` for its whole life: a lock, not a pid, because a
# worker in a process namespace of its own cannot see the controller's processes.
PREPARE_LOCK = LAB / ".prepare.lock"
WAIT_S = 1800.0  # a llama.cpp build on two busy cores, at worst


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def failure_file(marker: Path) -> Path:
    """Where `prepare` writes why a tool could not be made (beside its `.complete` marker's folder)."""
    return marker.parent.parent / f".{marker.parent.name}.failed"


def made(marker: Path, make: Callable[[], None], what: str) -> None:
    """`make()` once (under a lock), unless `marker` exists; in an offline
    worker, wait for the controller's `prepare` to make it instead."""
    if marker.exists():
        return
    if os.environ.get(OFFLINE):
        wait_for(marker, what)
        return
    with locked(marker.parent.parent / f".{marker.parent.name}.lock"):
        if marker.exists():
            return
        failure_file(marker).unlink(missing_ok=True)
        try:
            make()
        except Exception as exc:
            failure_file(marker).write_text(f"{exc}\n")  # what a waiting worker reports
            raise
        marker.touch()


def preparing() -> bool:
    """Whether a `prepare` is at work (holds PREPARE_LOCK)."""
    if not PREPARE_LOCK.exists():
        return False
    with open(PREPARE_LOCK) as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def wait_for(marker: Path, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not marker.exists():
        failed = failure_file(marker)
        if failed.exists():
            raise RuntimeError(f"{what}: {failed.read_text().strip()}")
        if not preparing():
            if marker.exists():
                break
            log = LAB / "prepare.log"
            last = log.read_text().strip().splitlines()[-1:] if log.exists() else []
            raise RuntimeError(f"{what} is not installed, and this test worker has no network (it runs in a "
                               "namespace of its own): run `.venv/bin/python -m tests.helpers.prepare` first, "
                               "or run the test without -n" + (f" (.lab/prepare.log ends: {last[0]})" if last else ""))
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} still not ready after {WAIT_S:.0f} s (see .lab/prepare.log)")
        time.sleep(1.0)


def venv_dir(spec: str, name: str | None = None) -> Path:
    """`.lab/<name>`, by default the spec with `==` as `-`."""
    return LAB / (name or spec.replace("==", "-").replace("[", "-").replace("]", ""))


def ensure_tool(spec: str, exe: str, name: str | None = None, remove: list[str] | None = None) -> Path:
    """The executable `exe` of package `spec` installed in its venv
    (`venv_dir`); the packages in `remove` are uninstalled after it
    (dependencies that break it)."""
    venv = venv_dir(spec, name)
    path = venv / "bin" / exe

    def make() -> None:
        shutil.rmtree(venv, ignore_errors=True)  # a half-made one from an interrupted run
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # --no-compile: pip would byte-compile every module of the venv (53,000 files over the four tools,
        # minutes of CPU on two cores) where a tool's run imports a small share of them, compiled as imported.
        r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-compile", spec],
                           capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stderr or r.stdout).strip().splitlines()[-1:]
            raise RuntimeError(f"pip install {spec} failed: {' '.join(last)}")
        if remove:
            subprocess.run([str(venv / "bin" / "pip"), "uninstall", "-q", "-y", *remove], capture_output=True)

    made(venv / ".complete", make, spec)
    return path


def llama_benchy() -> Path:
    return ensure_tool(LLAMA_BENCHY, "llama-benchy")
