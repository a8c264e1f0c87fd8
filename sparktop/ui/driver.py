"""The terminal driver: Textual's Linux driver with an input thread that sleeps while nobody types.

Textual's input thread wakes ten times a second whether or not a key came,
so that an Escape pressed alone (which could start a longer sequence) is
sent after its short timeout, and so that it notices when the app stops.
For a monitor left open all day that is a tenth of what watching costs.
Here the thread waits for input (or a wake-up) for as long as nothing is
pending, and polls at Textual's pace only in the second after a key, which
is when an unfinished sequence can be waiting for its timeout. Stopping
wakes it through a pipe, so quitting is as quick as before.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import threading
import time
from codecs import getincrementaldecoder

from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

TYPING_POLL_S = 0.1  # Textual's own wait: an Escape sequence's timeout is checked this often
TYPING_WINDOW_S = 1.0  # ... for this long after the last input
IDLE_WAIT_S = 5.0  # otherwise: nothing to check until a key (or the wake-up) comes


class _WakingEvent(threading.Event):
    """An Event whose `set` also writes to a pipe the input thread listens on."""

    def __init__(self, wake_fd: int):
        super().__init__()
        self._wake_fd = wake_fd

    def set(self) -> None:
        super().set()
        with contextlib.suppress(OSError):
            os.write(self._wake_fd, b"x")


class QuietLinuxDriver(LinuxDriver):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self.exit_event = _WakingEvent(self._wake_w)

    def run_input_thread(self) -> None:
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode
        last_input = time.monotonic()
        with selectors.DefaultSelector() as selector:
            selector.register(self.fileno, selectors.EVENT_READ, "input")
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            while not self.exit_event.is_set():
                typing = time.monotonic() - last_input < TYPING_WINDOW_S
                ready = selector.select(TYPING_POLL_S if typing else IDLE_WAIT_S)
                for key, _ in ready:
                    if key.data == "wake":
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 64)
                        continue
                    try:
                        raw = os.read(self.fileno, 4096)
                    except OSError:  # the terminal is gone (its pty closed): SIGHUP ends the app
                        raw = b""
                    if not raw:
                        # At its end (stdin piped, or the terminal gone): it stays readable, and
                        # Textual's own thread then spins at a full core until the process exits.
                        selector.unregister(self.fileno)
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
