"""The monitor does not outlive its terminal: the real CLI, started in tmux
with --record against a twin engine, exits through its normal shutdown
(the poller closed, the recording whole) within seconds of the terminal
going away, or of a SIGHUP alone.

Run in a tmux server of its own (`tmux -L sparktop-test-...`, no config
read), never the user's. Killing the session hangs the terminal up: the
kernel sends the pane's process SIGHUP and SIGCONT, its reads end and its
writes fail (EIO). It used to stay alive in 2 tries of 5, so each case is
tried more than once.

The bug was "never", not "slow": it exits in well under a second once its
terminal is gone, and `GONE_WITHIN_S` is only the point past which it is
taken to be stuck, set far beyond that so a loaded machine cannot fail it."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.helpers.twin_process import start_twin_process

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]

ROOT = Path(__file__).resolve().parents[2]
TRIES = 3
GONE_WITHIN_S = 30.0  # a hang detector (see above)
XDG = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")

# The pane's process where sparktop's exit status is looked at: it runs sparktop and
# writes its status to argv[1]. It ignores SIGHUP (as a shell that does not pass it on
# would), so when the terminal hangs up sparktop, its child, learns of it only from the
# terminal itself.
STATUS_PARENT = """
import os, signal, subprocess, sys
signal.signal(signal.SIGHUP, signal.SIG_IGN)
child = subprocess.Popen(sys.argv[2:], preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
code = child.wait()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(code))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    home = tmp_path_factory.mktemp("twin-home")
    with pytest.MonkeyPatch.context() as mp:
        for var in XDG:
            mp.setenv(var, str(home / var.lower()))
        proc, url = start_twin_process("llama-3.1-8b", speed=1.0)
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


class Terminal:
    """A private tmux server with one 160x48 session, `main`."""

    def __init__(self):
        self.socket = f"sparktop-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def tmux(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True,
                              text=True, timeout=10, check=check)
        return done.stdout.strip()

    def start(self, argv: list[str]) -> int:
        """Runs argv as the pane's process (exec'd by the pane's shell); its pid."""
        env = [f"{var}={os.environ[var]}" for var in XDG if var in os.environ]
        command = "exec " + shlex.join(["env", *env, f"PYTHONPATH={ROOT}", "TERM=xterm-256color", *argv])
        self.tmux("new-session", "-d", "-s", "main", "-x", "160", "-y", "48", "-c", str(ROOT), command)
        return int(self.tmux("list-panes", "-t", "main", "-F", "#{pane_pid}"))

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "main", check=False)

    def close(self) -> None:
        self.tmux("kill-server", check=False)


@pytest.fixture
def terminals():
    made: list[Terminal] = []

    def make() -> Terminal:
        made.append(Terminal())
        return made[-1]

    yield make
    for terminal in made:
        terminal.close()


def _sparktop(url: str, record: Path) -> list[str]:
    return [sys.executable, "-m", "sparktop", "--engine", url, "-i", "1", "--record", str(record)]


def _running(terminal: Terminal, record: Path) -> None:
    """Waits until the monitor is up: its screen drawn, some snapshots recorded."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = record.read_text().splitlines() if record.exists() else []
        if len(lines) >= 3 and "Quit" in terminal.screen():
            return
        time.sleep(0.2)
    raise AssertionError(f"the monitor did not come up:\n{terminal.screen()}")


def _gone_within(proc: psutil.Process, seconds: float) -> float | None:
    """Seconds until the process ended (a zombie has: the tmux server that
    would reap it may be gone), or None if it still runs."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return time.monotonic() - started
        except psutil.NoSuchProcess:
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def _check_recording(record: Path) -> None:
    text = record.read_text()
    assert text.endswith("\n"), "the recording's last line is cut"
    rows = [json.loads(line) for line in text.splitlines()]
    assert rows[0]["recording"] == 1 and len(rows) >= 3
    assert all("t" in row for row in rows[1:])


def _start_with_status(terminal: Terminal, url: str, record: Path, status: Path) -> psutil.Process:
    """sparktop under STATUS_PARENT; sparktop's process."""
    parent = psutil.Process(terminal.start([sys.executable, "-c", STATUS_PARENT, str(status),
                                            *_sparktop(url, record)]))
    deadline = time.monotonic() + 30
    while not parent.children() and time.monotonic() < deadline:
        time.sleep(0.05)
    (proc,) = parent.children()
    return proc


def _status(status: Path) -> str:
    """sparktop's exit status as its parent wrote it: 0, or -N for a signal."""
    deadline = time.monotonic() + GONE_WITHIN_S  # the parent writes it once sparktop has ended
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return status.read_text()


@contextlib.contextmanager
def _killed_if_left(proc: psutil.Process):
    try:
        yield
    finally:
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                proc.kill()


@pytest.mark.parametrize("how", ["kill-session", "kill-server"])
def test_it_exits_when_its_tmux_session_is_killed(engine, terminals, tmp_path, how):
    for attempt in range(TRIES):
        terminal = terminals()
        record = tmp_path / f"{how}-{attempt}.jsonl"
        proc = psutil.Process(terminal.start(_sparktop(engine, record)))
        with _killed_if_left(proc):
            _running(terminal, record)
            if how == "kill-session":
                terminal.tmux("kill-session", "-t", "main")
            else:
                terminal.tmux("kill-server")
            took = _gone_within(proc, GONE_WITHIN_S)
            assert took is not None, f"try {attempt + 1}: still running {GONE_WITHIN_S} s after its terminal went"
        _check_recording(record)


def test_it_exits_cleanly_when_its_terminal_goes_without_a_signal(engine, terminals, tmp_path):
    """Its terminal hung up, no SIGHUP: the end of its input and the writes that
    fail say so, and it exits with status 0 (its own shutdown, not a signal)."""
    for attempt in range(TRIES):
        terminal = terminals()
        record, status = tmp_path / f"quiet-{attempt}.jsonl", tmp_path / f"quiet-{attempt}.status"
        proc = _start_with_status(terminal, engine, record, status)
        with _killed_if_left(proc):
            _running(terminal, record)
            terminal.tmux("kill-server")
            took = _gone_within(proc, GONE_WITHIN_S)
            assert took is not None, f"try {attempt + 1}: still running {GONE_WITHIN_S} s after its terminal went"
        assert _status(status) == "0"
        _check_recording(record)


def test_sighup_alone_ends_it_cleanly(engine, terminals, tmp_path):
    """SIGHUP with the terminal still there: it exits with status 0, its own
    shutdown (SIGHUP's default would end it with -1)."""
    for attempt in range(TRIES):
        terminal = terminals()
        record, status = tmp_path / f"hup-{attempt}.jsonl", tmp_path / f"hup-{attempt}.status"
        proc = _start_with_status(terminal, engine, record, status)
        with _killed_if_left(proc):
            _running(terminal, record)
            proc.send_signal(signal.SIGHUP)
            took = _gone_within(proc, GONE_WITHIN_S)
            assert took is not None, f"try {attempt + 1}: still running {GONE_WITHIN_S} s after SIGHUP"
        assert _status(status) == "0"
        _check_recording(record)
        terminal.close()
