"""The terminal driver's input thread (sparktop/ui/driver.py), fed through a
pipe as a terminal would feed it: keys arrive at once, a lone Escape still
arrives after it has waited idle, stopping is immediate although the thread
sleeps for seconds, and a terminal that goes away does not leave the thread
spinning (Textual's own thread then takes a full core)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time

import psutil
import pytest
from textual import events

from sparktop.ui.driver import IDLE_WAIT_S, QuietLinuxDriver


class _Recording(QuietLinuxDriver):
    def process_message(self, message) -> None:
        self.got.append(message)


@pytest.fixture
def driver():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTSTP, signal.SIGCONT)}
    async def make() -> _Recording:  # a driver is made inside the app's loop
        return _Recording(object())  # the app is only handed the messages, which are recorded here instead

    loop = asyncio.new_event_loop()
    d = loop.run_until_complete(make())
    loop.close()
    d.got = []
    read, write = os.pipe()
    d.fileno = read
    thread = threading.Thread(target=d.run_input_thread, daemon=True)
    thread.start()
    d.write = lambda data: os.write(write, data)
    d.close_terminal = lambda: os.close(write)
    d.thread = thread
    yield d
    d.exit_event.set()
    thread.join(2)
    for fd in (read, write):
        with contextlib.suppress(OSError):
            os.close(fd)
    d.close()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _keys(d) -> list[str]:
    return [m.key for m in d.got if isinstance(m, events.Key)]


def _wait_for(predicate, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_keys_arrive_and_a_lone_escape_arrives_after_an_idle_wait(driver):
    driver.write(b"q")
    assert _wait_for(lambda: _keys(driver) == ["q"])
    time.sleep(1.5)  # past the typing window: the thread now sleeps until input comes
    driver.write(b"\x1b")  # Escape alone: sent once its sequence timeout passes, not at the next key
    assert _wait_for(lambda: _keys(driver) == ["q", "escape"], timeout=1.0), _keys(driver)
    driver.write(b"\x1b[A")  # a whole sequence is one key
    assert _wait_for(lambda: _keys(driver) == ["q", "escape", "up"])


def test_stopping_wakes_the_sleeping_thread_at_once(driver):
    time.sleep(1.5)  # asleep, for up to IDLE_WAIT_S
    started = time.monotonic()
    driver.exit_event.set()
    driver.thread.join(IDLE_WAIT_S)
    assert not driver.thread.is_alive()
    assert time.monotonic() - started < 1.0


def _thread_cpu(native_id: int) -> float:
    for t in psutil.Process().threads():
        if t.id == native_id:
            return t.user_time + t.system_time
    raise AssertionError("thread not found")


def test_an_idle_thread_and_a_closed_terminal_cost_nothing(driver):
    time.sleep(1.2)
    before = _thread_cpu(driver.thread.native_id)
    time.sleep(1.0)
    assert _thread_cpu(driver.thread.native_id) - before < 0.05  # asleep (a spinning thread: ~1 s)
    driver.close_terminal()
    time.sleep(0.3)
    before = _thread_cpu(driver.thread.native_id)
    time.sleep(1.0)
    assert _thread_cpu(driver.thread.native_id) - before < 0.05
    assert driver.thread.is_alive()  # it waits for the app to stop it (SIGHUP does)
    driver.exit_event.set()
    driver.thread.join(1.0)
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
