"""A real small filesystem that fills up: a tmpfs of a given size, mounted for one test (needs root to
mount; the test is skipped without), for the history's full-disk tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """`where` (made here) with a tmpfs of `size` (mount's: "384k", "2m") mounted on it, unmounted after."""
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (not root, or no mount in this container)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
