"""The terminal driver: Textual's Linux driver with an input thread that sleeps while nobody types.

Textual's input thread wakes ten times a second whether or not a key came,
so that an Escape pressed alone (which could start a longer sequence) is
sent after its short timeout, and so that it notices when the app stops.
For a monitor left open all day that is a tenth of what watching costs.
Here the thread waits for input (or a wake-up) while nothing is pending,
waking every IDLE_WAIT_S only to check that its terminal is still there,
and polls at Textual's pace only in the second after a key, which is when
an unfinished sequence can be waiting for its timeout. Stopping wakes it
through a pipe, so quitting is as quick as before.

A terminal that goes away (an SSH session dropped, a tmux session killed)
ends the app through its normal shutdown, as `q` would, so the poller, its
SSH connections and a recording are closed: the input thread reads the end
of its terminal, the writer finds it cannot write there any more, and the
idle wake-up finds the terminal is no longer one (SIGHUP, where it comes,
is `run.py`'s). Two things of Textual's own kept the process alive after
such a loss. The kernel sends a hung-up terminal's session leader SIGCONT
along with SIGHUP, and Textual answers any SIGCONT by starting application
mode again: a second input thread and writer on the dead terminal, and the
first input thread, not the one Textual stops and waits for, slept on and
held the interpreter open at exit. And its writer thread dies at the first
write that fails (EIO), after which the app runs on, polling, until its
queue of writes is full, and then blocks for good.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import sys
import threading
import time
from codecs import getincrementaldecoder
from collections.abc import Callable
from typing import IO, Any

from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

TYPING_POLL_S = 0.1  # Textual's own wait: an Escape sequence's timeout is checked this often
TYPING_WINDOW_S = 1.0  # ... for this long after the last input
IDLE_WAIT_S = 2.0  # otherwise: nothing to check until a key (or the wake-up) comes but the terminal itself


class _WakingEvent(threading.Event):
    """An Event whose `set` also writes to a pipe the input thread listens on.
    `sets` counts them: a thread ends on any set since it began, even one
    cleared again before the thread looked (Textual clears it once the
    thread it knows of has ended)."""

    def __init__(self, wake_fd: int):
        super().__init__()
        self._wake_fd = wake_fd
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()
        with contextlib.suppress(OSError):
            os.write(self._wake_fd, b"x")


class _TerminalOutput:
    """The terminal as Textual's writer thread writes to it: a write that
    fails (EIO once the terminal has hung up) says the terminal is gone and
    the rest are dropped, so the thread lives on to drain its queue and the
    app, whose writes wait while the queue is full, shuts down."""

    def __init__(self, file: IO[str], gone: Callable[[], None]):
        self._file = file
        self._gone = gone
        self.failed = False

    def write(self, text: str) -> int:
        if not self.failed:
            try:
                return self._file.write(text)
            except (OSError, ValueError):
                self._fail()
        return len(text)

    def flush(self) -> None:
        if not self.failed:
            try:
                self._file.flush()
            except (OSError, ValueError):
                self._fail()

    def _fail(self) -> None:
        self.failed = True
        self._gone()

    def fileno(self) -> int:
        return self._file.fileno()


def _is_terminal(fd: int) -> bool:
    """Whether fd is a terminal still there: a hung-up one answers EIO."""
    return os.isatty(fd)


class QuietLinuxDriver(LinuxDriver):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._stop = _WakingEvent(self._wake_w)
        self.exit_event = self._stop
        self._output = _TerminalOutput(self._file or sys.__stderr__, self._terminal_gone)
        self._file = self._output  # what Textual's writer thread writes to
        self.terminal_gone = threading.Event()

    def _terminal_gone(self) -> None:
        """The terminal went away: the app exits as it would on `q` (from any
        thread, once; the app's shutdown stops this driver's threads)."""
        if self.terminal_gone.is_set():
            return
        self.terminal_gone.set()
        with contextlib.suppress(Exception):  # the loop closed: the app is gone already
            self._loop.call_soon_threadsafe(self._app.exit)

    def _sigcont_application(self, *_: Any) -> None:
        # Application mode is to be resumed only after a suspension of our own (SIGTSTP).
        # Any other SIGCONT (the kernel sends one with SIGHUP when the terminal hangs up)
        # would start it again over itself: a second input thread and writer.
        if self._must_signal_resume:
            super()._sigcont_application()

    def _terminals(self) -> list[int]:
        """The terminals to watch: the input (its end is the terminal's) and the output."""
        fds = [self.fileno]
        with contextlib.suppress(OSError, ValueError):
            fds.append(self._output.fileno())
        return [fd for fd in dict.fromkeys(fds) if _is_terminal(fd)]

    def _selector(self) -> selectors.BaseSelector:
        """What the input thread waits in (tests give it one that counts its waits and wake-ups)."""
        return selectors.PollSelector()  # epoll refuses /dev/null, a file, as stdin

    def run_input_thread(self) -> None:
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode
        last_input = time.monotonic()
        started = self._stop.sets
        terminals = self._terminals()
        with self._selector() as selector:
            selector.register(self.fileno, selectors.EVENT_READ, "input")
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            while self._stop.sets == started and not self._stop.is_set():
                typing = time.monotonic() - last_input < TYPING_WINDOW_S
                ready = selector.select(TYPING_POLL_S if typing else IDLE_WAIT_S)
                if not ready and not typing and terminals and not all(map(_is_terminal, terminals)):
                    self._terminal_gone()  # gone without a word (no EOF, no failed write, no SIGHUP)
                    terminals = []
                for key, _ in ready:
                    if key.data == "wake":
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 64)
                        continue
                    try:
                        raw = os.read(self.fileno, 4096)
                    except OSError:  # EIO: the terminal is gone (its pty closed)
                        raw = b""
                    if not raw:
                        # At its end (stdin piped, or the terminal gone): it stays readable, and
                        # Textual's own thread then spins at a full core until the process exits.
                        selector.unregister(self.fileno)
                        if self.fileno in terminals:  # a terminal ends only when it is gone: so does the app
                            self._terminal_gone()
                            terminals = []
                        continue
                    data = decode(raw)
                    last_input = time.monotonic()
                    for event in parser.feed(data):
                        self.process_message(event)
                for event in parser.tick():
                    self.process_message(event)
        with contextlib.suppress(Exception):  # the parser's end, as Textual's thread ends it
            for _ in parser.feed(""):
                pass

    def close(self) -> None:
        super().close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
