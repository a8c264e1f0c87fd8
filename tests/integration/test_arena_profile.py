"""Spark Arena's spark-arena-v2 profile run as published against a twin
(time compressed), exported as the board's three files and read back."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest

from sparktop.bench.arena import ARENA_V2
from tests.helpers.twin_process import start_twin_process

pytestmark = pytest.mark.slow


def test_the_arena_profile_runs_in_its_order_and_exports_as_the_board_takes_it(tmp_path):
    """Spark Arena's whole profile (every depth and concurrency the board asks) against a twin at 200x: the
    profile's requests, not its waits, are the time."""
    proc, url = start_twin_process("gpt-oss-120b", speed=200.0)
    try:
        done = subprocess.run([sys.executable, "-m", "sparktop", "sweep", "-e", url, "--profile", "spark-arena-v2",
                               "--results", str(tmp_path / "runs"), "--json"], capture_output=True, text=True,
                              timeout=900)
    finally:
        proc.terminate()
        proc.wait(10)
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    export = subprocess.run([sys.executable, "-m", "sparktop", "export", str(run_dir), "--arena",
                             str(tmp_path / "arena")], capture_output=True, text=True, timeout=120)
    assert export.returncode == 0, export.stderr
    assert "Nothing was uploaded" in export.stdout and "sparkrun arena benchmark" in export.stdout
    assert "Not the spark-arena-v2 profile" not in export.stdout  # every cell, as published
    rows = list(csv.DictReader(io.StringIO((tmp_path / "arena" / "benchmark.csv").read_text())))
    # The measured pp rows in the profile's heat-aware order, each cell once.
    cells = [r["test_name"] for r in rows if r["test_name"].startswith("pp")]
    expected = [f"pp2048{f' @ d{d}' if d else ''} (c{c})" for d, c in ARENA_V2.cells()]
    assert cells == expected
    assert len(rows) == 104  # pp and tg per cell, ctx_pp and ctx_tg per cell at a depth
    meta = json.loads((tmp_path / "arena" / "metadata.json").read_text())
    assert meta["benchmark"]["profile"] == "@official/spark-arena-v2"
    back = subprocess.run([sys.executable, "-m", "sparktop", "runs", "--import", str(tmp_path / "arena"), "--label",
                           "arena"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")})
    assert back.returncode == 0 and "(28 cells)" in back.stdout, back.stderr
