"""Tools that cannot share sparktop's environment get their own venv under
`.lab/` (gitignored), made once on first use from PyPI and reused after."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

LAB = Path(__file__).resolve().parents[2] / ".lab"

LLAMA_BENCHY = "llama-benchy==0.4.0"


def ensure_tool(spec: str, exe: str, name: str | None = None, remove: list[str] | None = None) -> Path:
    """The executable `exe` of package `spec` installed in `.lab/<name>`
    (default: the spec with `==` as `-`); the packages in `remove` are
    uninstalled after it (dependencies that break it)."""
    venv = LAB / (name or spec.replace("==", "-").replace("[", "-").replace("]", ""))
    path, done = venv / "bin" / exe, venv / ".complete"
    if done.exists():
        return path
    shutil.rmtree(venv, ignore_errors=True)  # a half-made one from an interrupted run
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", spec], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:]
        raise RuntimeError(f"pip install {spec} failed: {' '.join(last)}")
    if remove:
        subprocess.run([str(venv / "bin" / "pip"), "uninstall", "-q", "-y", *remove], capture_output=True)
    done.touch()
    return path


def llama_benchy() -> Path:
    return ensure_tool(LLAMA_BENCHY, "llama-benchy")
