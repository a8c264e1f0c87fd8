"""SGLang's release wheel, for the tests that hold the twin's SGLang dialect
to SGLang's own source (tests/unit/test_twin_sglang.py reads its metric
declarations with `zipfile` and `ast`; nothing in it is imported or run).

The wheel is fetched once per machine with pip (`pip download --no-deps`)
into a cache outside the clone, keyed by version (`$SPARKTOP_TEST_CACHE`,
default `~/.cache/sparktop-tests`, then `sglang-0.5.23/`), and checked
against the sha256 PyPI published for it (tests/fixtures/sglang/SOURCES.md).
A half-made download (an interrupted run) has no `.complete` marker and is
made again. SGLang 0.5.23 ships only CPython 3.11-3.13 x86_64 manylinux
wheels (no sdist, no aarch64), so the cp311 x86_64 wheel is asked for by
name, whatever machine runs the tests: its Python files are the same in
every wheel of the release.

When it cannot be downloaded the tests fail with why; they are never skipped.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.venvs import made

VERSION = "0.5.23"
WHEEL = f"sglang-{VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"
SHA256 = "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"
TIMEOUT_S = 900


class WheelUnavailable(RuntimeError):
    """The wheel could not be fetched (no network, no PyPI, a changed file)."""


def cache_dir(version: str = VERSION) -> Path:
    root = os.environ.get("SPARKTOP_TEST_CACHE") or str(Path.home() / ".cache" / "sparktop-tests")
    return Path(root) / f"sglang-{version}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(into: Path) -> Path:
    """pip download of the one wheel, for CPython 3.11 on x86_64 Linux whatever this machine is."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
           "--platform", "manylinux_2_34_x86_64", "-d", str(into), f"sglang=={VERSION}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise WheelUnavailable(f"pip download of sglang=={VERSION} took more than {TIMEOUT_S} s") from None
    wheel = into / WHEEL
    if r.returncode != 0 or not wheel.is_file():
        last = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise WheelUnavailable(f"cannot download {WHEEL} from PyPI with pip ({' '.join(cmd[3:])}): {last}")
    if _sha256(wheel) != SHA256:
        raise WheelUnavailable(f"{wheel} is not the wheel PyPI published for sglang {VERSION} (sha256 differs)")
    return wheel


def sglang_wheel() -> Path:
    """The path of SGLang 0.5.23's wheel, downloaded on first use (WheelUnavailable when it cannot be)."""
    folder = cache_dir()

    def download() -> None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        _download(folder)

    # Once per machine, under a lock; a test worker without network waits for the controller's download
    # (tests/helpers/prepare.py) instead.
    try:
        made(folder / ".complete", download, f"SGLang {VERSION}'s wheel")
    except RuntimeError as exc:
        raise WheelUnavailable(str(exc)) from None
    return folder / WHEEL
