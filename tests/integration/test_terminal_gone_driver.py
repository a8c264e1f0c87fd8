"""The driver's side of a terminal going away (sparktop/ui/driver.py), on a
real pty: its end asks the app to exit, a write that fails does too without
ever blocking the app, a SIGCONT that follows no suspension starts nothing
(a hung-up terminal's session gets one with SIGHUP), and an input thread
ends on a stop even if the stop was cleared before it looked."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import threading
import time

import pytest
from textual.drivers._writer_thread import WriterThread

from sparktop.ui.driver import IDLE_WAIT_S, QuietLinuxDriver, _TerminalOutput


class _App:
    def __init__(self):
        self.exits = 0
        self.exited = threading.Event()

    def exit(self) -> None:
        self.exits += 1
        self.exited.set()


@pytest.fixture
def loop():
    """A loop running in a thread, as the app's runs while the driver's threads work."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(2)
    loop.close()


@pytest.fixture
def make_driver(loop):
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTSTP, signal.SIGCONT)}
    made: list[QuietLinuxDriver] = []

    def make(app) -> QuietLinuxDriver:
        async def build() -> QuietLinuxDriver:  # made inside a loop, and on the main thread (signals)
            return QuietLinuxDriver(app)

        here = asyncio.new_event_loop()
        driver = here.run_until_complete(build())
        here.close()
        driver._loop = loop  # the app's, running
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.exit_event.set()
        driver.close()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _input_thread(driver) -> threading.Thread:
    thread = threading.Thread(target=driver.run_input_thread, daemon=True)
    thread.start()
    return thread


def test_the_end_of_its_terminal_ends_the_app(make_driver):
    app = _App()
    driver = make_driver(app)
    master, slave = os.openpty()
    try:
        driver.fileno = slave
        thread = _input_thread(driver)
        time.sleep(1.2)  # past the typing window: asleep until something comes
        assert not app.exited.is_set()
        os.close(master)  # the terminal hangs up, as when tmux or sshd lets it go
        master = -1
        assert app.exited.wait(2), "the app was not asked to exit"
        assert thread.is_alive()  # stopped by the app's shutdown, which follows
        driver.exit_event.set()
        thread.join(1)
        assert not thread.is_alive() and app.exits == 1
    finally:
        for fd in (master, slave):
            with contextlib.suppress(OSError):
                os.close(fd)


def test_a_write_that_fails_ends_the_app_and_never_blocks_it():
    class _HungUp:
        def write(self, text: str) -> int:
            raise OSError(errno.EIO, "Input/output error")

        def flush(self) -> None:
            raise OSError(errno.EIO, "Input/output error")

        def fileno(self) -> int:
            return 2

    app = _App()
    writer = WriterThread(_TerminalOutput(_HungUp(), app.exit))  # type: ignore[arg-type]
    writer.start()
    done = threading.Event()

    def app_writes() -> None:
        for _ in range(200):  # many more than the writer's queue holds (30)
            writer.write("x" * 100)
        writer.stop()
        done.set()

    threading.Thread(target=app_writes, daemon=True).start()
    assert done.wait(5), "the app blocked writing to a terminal that is gone"
    assert app.exits == 1


def test_a_sigcont_that_follows_no_suspension_starts_nothing(make_driver, monkeypatch):
    driver = make_driver(_App())
    started = []
    monkeypatch.setattr(driver, "start_application_mode", lambda: started.append(1))
    driver._sigcont_application(signal.SIGCONT, None)  # the kernel's, with SIGHUP, or a stray `kill -CONT`
    assert started == []
    driver._must_signal_resume = True  # suspended by its own SIGTSTP (ctrl+z), then continued
    driver._sigcont_application(signal.SIGCONT, None)
    assert started == [1]


def test_an_input_thread_ends_on_a_stop_cleared_before_it_looked(make_driver):
    driver = make_driver(_App())
    read, write = os.pipe()
    try:
        driver.fileno = read
        threads = [_input_thread(driver), _input_thread(driver)]  # as a second start of application mode made
        time.sleep(1.2)
        # Textual's disable_input sets the stop, joins the thread it knows of and clears it; the
        # other thread, woken by the same byte on the wake-up pipe, finds it read already and sleeps on.
        driver.exit_event.set()
        with contextlib.suppress(BlockingIOError):
            os.read(driver._wake_r, 64)
        driver.exit_event.clear()
        for thread in threads:
            thread.join(IDLE_WAIT_S + 1)
            assert not thread.is_alive()
    finally:
        for fd in (read, write):
            with contextlib.suppress(OSError):
                os.close(fd)
