"""The driver's side of a terminal going away (sparktop/ui/driver.py), on a
real pty: its end asks the app to exit, a write that fails does too without
ever blocking the app, a SIGCONT that follows no suspension starts nothing
(a hung-up terminal's session gets one with SIGHUP), and an input thread
ends on a stop even if the stop was cleared before it looked.

Waited on by state, as in tests/ui/test_driver.py: the input threads' waits
are counted (`CountedWaits`) and the driver's clock stands still until a
test moves it past the typing window, so "asleep" is something to wait for,
not a sleep of a second and a bit; the limits are hang detectors
(`LIMIT_S`), far past what each step takes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import threading

import pytest
from textual.drivers._writer_thread import WriterThread

from sparktop.ui import driver as driver_module
from sparktop.ui.driver import _TerminalOutput
from tests.ui.test_driver import LIMIT_S, CountedWaits, DriverClock, still_clock, wait_for


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
    thread.join(LIMIT_S)
    loop.close()


@pytest.fixture
def make_driver(loop):
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTSTP, signal.SIGCONT)}
    made: list[CountedWaits] = []

    def make(app) -> CountedWaits:
        async def build() -> CountedWaits:  # made inside a loop, and on the main thread (signals)
            return CountedWaits(app)

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


@pytest.fixture
def clock(monkeypatch) -> DriverClock:
    """The drivers' clock, still until the test moves it, and a ten-minute idle wait."""
    return still_clock(monkeypatch)


def _input_thread(driver) -> threading.Thread:
    thread = threading.Thread(target=driver.run_input_thread, daemon=True)
    thread.start()
    return thread


def test_the_end_of_its_terminal_ends_the_app(make_driver, clock):
    app = _App()
    driver = make_driver(app)
    master, slave = os.openpty()
    try:
        driver.fileno = slave
        thread = _input_thread(driver)
        clock.past_the_typing_window()
        assert wait_for(lambda: driver.asleep(thread))  # asleep until something comes (ten minutes, here)
        assert not app.exited.is_set()
        os.close(master)  # the terminal hangs up, as when tmux or sshd lets it go
        master = -1
        assert app.exited.wait(LIMIT_S), "the app was not asked to exit"
        assert ("woke", {"input"}) in driver.log(thread)  # told by reading its end, not at the idle check
        assert thread.is_alive()  # stopped by the app's shutdown, which follows
        driver.exit_event.set()
        thread.join(LIMIT_S)
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
    assert done.wait(LIMIT_S), "the app blocked writing to a terminal that is gone"
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


def test_an_input_thread_ends_on_a_stop_cleared_before_it_looked(make_driver, clock, monkeypatch):
    # A thread whose wake-up byte another read first sleeps on until its idle wait ends: a short one here,
    # so "it ends at its next wake-up" is quick; the bug was that it never ended.
    monkeypatch.setattr(driver_module, "IDLE_WAIT_S", 0.2)
    driver = make_driver(_App())
    read, write = os.pipe()
    try:
        driver.fileno = read
        threads = [_input_thread(driver), _input_thread(driver)]  # as a second start of application mode made
        clock.past_the_typing_window()
        assert wait_for(lambda: all(driver.asleep(t) for t in threads))  # each running, the stop not yet set
        # Textual's disable_input sets the stop, joins the thread it knows of and clears it; the
        # other thread, woken by the same byte on the wake-up pipe, finds it read already and sleeps on.
        driver.exit_event.set()
        with contextlib.suppress(BlockingIOError):
            os.read(driver._wake_r, 64)
        driver.exit_event.clear()
        for thread in threads:
            thread.join(LIMIT_S)
            assert not thread.is_alive()
    finally:
        for fd in (read, write):
            with contextlib.suppress(OSError):
                os.close(fd)
