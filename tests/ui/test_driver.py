"""The terminal driver's input thread (sparktop/ui/driver.py), fed through a
pipe as a terminal would feed it: keys arrive at once, a lone Escape still
arrives after it has waited idle, stopping is immediate although the thread
sleeps for seconds, and a terminal that goes away does not leave the thread
spinning (Textual's own thread then takes a full core).

Counted, not timed: the thread's waits are written down as it makes them
(`CountedWaits`), so "asleep" is a state the tests wait for and "costs
nothing" is a count of waits per wake-up. The driver's clock stands still
unless a test moves it (`DriverClock`): the typing window after a key ends
when the test says, not when this machine gets round to it. Its idle wait
is made ten minutes here, so a wake-up that came from the wait running
out, not from a key or the wake-up pipe, cannot pass: it shows as a test
that fails at its generous limit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import selectors
import signal
import threading
import time
from collections import defaultdict

import pytest
from textual import events

from sparktop.ui import driver as driver_module
from sparktop.ui.driver import QuietLinuxDriver

IDLE = 600.0  # the idle wait in these tests: far past any limit a test waits
LIMIT_S = 30.0  # how long a test waits for a state before it fails (it takes well under a second)


class _RecordedSelector(selectors.PollSelector):
    def __init__(self, log: list):
        super().__init__()
        self._log = log

    def select(self, timeout=None):
        self._log.append(("wait", timeout))
        ready = super().select(timeout)
        self._log.append(("woke", frozenset(key.data for key, _ in ready)))
        return ready


class CountedWaits(QuietLinuxDriver):
    """The driver with its input threads' waits written down, per thread, in
    order: ("wait", timeout) as one starts and ("woke", what ended it:
    "input", "wake", both, or nothing when its timeout ran out)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.waits: dict[int, list[tuple]] = defaultdict(list)

    def _selector(self) -> selectors.BaseSelector:
        return _RecordedSelector(self.waits[threading.get_ident()])  # called on the input thread

    def log(self, thread: threading.Thread) -> list[tuple]:
        return list(self.waits.get(thread.ident or 0, []))

    def asleep(self, thread: threading.Thread) -> bool:
        """In its idle wait, nothing pending: the last thing it did was start one."""
        log = self.log(thread)
        return bool(log) and log[-1] == ("wait", driver_module.IDLE_WAIT_S)

    def nudge(self) -> None:
        """A byte on the wake-up pipe without a stop (a stop sets the event, too)."""
        os.write(self._wake_w, b"x")


class DriverClock:
    """What the driver reads as `time.monotonic`: it stands still, so the
    typing window after a key (Textual's pace of waits) lasts until the test
    moves the clock past it, however long the machine leaves the thread
    unscheduled."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def past_the_typing_window(self) -> None:
        self.now += driver_module.TYPING_WINDOW_S + 1


def still_clock(monkeypatch) -> DriverClock:
    """Every driver's input thread on a clock of the test's, with a ten-minute idle wait."""
    clock = DriverClock()
    monkeypatch.setattr(driver_module, "time", clock)
    monkeypatch.setattr(driver_module, "IDLE_WAIT_S", IDLE)
    return clock


class _Recording(CountedWaits):
    def process_message(self, message) -> None:
        self.got.append(message)


@pytest.fixture
def driver(monkeypatch):
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTSTP, signal.SIGCONT)}
    clock = still_clock(monkeypatch)
    async def make() -> _Recording:  # a driver is made inside the app's loop
        return _Recording(object())  # the app is only handed the messages, which are recorded here instead

    loop = asyncio.new_event_loop()
    d = loop.run_until_complete(make())
    loop.close()
    d.got = []
    d.clock = clock
    read, write = os.pipe()
    d.fileno = read
    thread = threading.Thread(target=d.run_input_thread, daemon=True)
    thread.start()
    d.write = lambda data: os.write(write, data)
    d.close_terminal = lambda: os.close(write)
    d.thread = thread
    yield d
    d.exit_event.set()
    thread.join(LIMIT_S)
    for fd in (read, write):
        with contextlib.suppress(OSError):
            os.close(fd)
    d.close()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _keys(d) -> list[str]:
    return [m.key for m in d.got if isinstance(m, events.Key)]


def wait_for(predicate, timeout: float = LIMIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_keys_arrive_and_a_lone_escape_arrives_after_an_idle_wait(driver):
    driver.write(b"q")
    assert wait_for(lambda: _keys(driver) == ["q"])
    driver.clock.past_the_typing_window()
    assert wait_for(lambda: driver.asleep(driver.thread))  # the thread now sleeps until input comes
    driver.write(b"\x1b")  # Escape alone: sent once its sequence timeout passes, not at the next key
    assert wait_for(lambda: _keys(driver) == ["q", "escape"]), _keys(driver)  # (asleep: in ten minutes)
    driver.write(b"\x1b[A")  # a whole sequence is one key
    assert wait_for(lambda: _keys(driver) == ["q", "escape", "up"])


def test_stopping_wakes_the_sleeping_thread_at_once(driver):
    driver.clock.past_the_typing_window()
    assert wait_for(lambda: driver.asleep(driver.thread))  # for ten minutes, unless woken
    driver.exit_event.set()
    driver.thread.join(LIMIT_S)
    assert not driver.thread.is_alive()
    assert driver.log(driver.thread)[-1] == ("woke", {"wake"})  # the pipe ended its wait, not the timeout


def _nudged(d: CountedWaits, times: int) -> list[tuple]:
    """What the thread did for `times` wake-ups, each sent once it is asleep again."""
    start = len(d.log(d.thread))
    for n in range(1, times + 1):
        d.nudge()
        assert wait_for(lambda n=n: d.asleep(d.thread) and len(d.log(d.thread)) >= start + 2 * n)
    return d.log(d.thread)[start:]


def test_an_idle_thread_and_a_closed_terminal_cost_nothing(driver):
    """Asleep, the thread waits once per wake-up and for the whole idle wait
    (not at Textual's tenth of a second); once its input has ended (a pipe:
    no terminal to lose) it hears of it once, not at every wait after."""
    asleep = ("wait", IDLE)
    driver.clock.past_the_typing_window()
    assert wait_for(lambda: driver.asleep(driver.thread))
    assert _nudged(driver, 3) == [("woke", {"wake"}), asleep] * 3
    ended = len(driver.log(driver.thread))
    driver.close_terminal()
    assert wait_for(lambda: driver.asleep(driver.thread) and len(driver.log(driver.thread)) > ended)
    assert driver.log(driver.thread)[ended:] == [("woke", {"input"}), asleep]  # its end, read once
    # Still readable at its end: were it still watched, every wait would end at once with "input" again.
    assert _nudged(driver, 3) == [("woke", {"wake"}), asleep] * 3
    assert driver.thread.is_alive()  # it waits for the app to stop it (SIGHUP does)
    driver.exit_event.set()
    driver.thread.join(LIMIT_S)
    assert not driver.thread.is_alive()


def test_the_app_uses_it_on_a_terminal_and_keeps_a_driver_chosen_for_it(monkeypatch):
    from textual.drivers.linux_driver import LinuxDriver

    from sparktop.ui.app import SparktopApp

    monkeypatch.delenv("TEXTUAL_DRIVER", raising=False)
    assert SparktopApp().get_driver_class() is QuietLinuxDriver
    assert issubclass(QuietLinuxDriver, LinuxDriver)
    import textual.constants

    monkeypatch.setattr(textual.constants, "DRIVER", "textual.drivers.web_driver:WebDriver")
    from textual.drivers.web_driver import WebDriver

    assert SparktopApp().get_driver_class() is WebDriver  # a browser session of `sparktop web`
