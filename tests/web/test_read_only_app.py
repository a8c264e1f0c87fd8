"""The app's read-only mode (a `sparktop web` session without --allow-control),
driven with Pilot: l, x, s, y and b say why they do nothing and open no
screen; the footer and the help do not offer them; a normal app is unchanged."""

from __future__ import annotations

from sparktop.observe.poller import Poller
from sparktop.settings import Inventory, Node
from sparktop.ui.app import SparktopApp
from sparktop.ui.readonly import ReadOnlyHelpScreen, read_only_help
from sparktop.ui.screens import HELP, HelpScreen, MonitorScreen


def app(read_only: bool) -> SparktopApp:
    # An inventory: a session that could launch, were it not read-only.
    return SparktopApp(Poller([], [], interval=1.0, default_port=None), read_only=read_only,
                       inventory=Inventory(nodes=[Node(name="spark-a", host="localhost")]))


def shown(a: SparktopApp) -> set[str]:
    return {b.binding.action for b in a.screen.active_bindings.values() if b.binding.show}


async def test_the_keys_that_change_nodes_say_why_and_open_nothing():
    a = app(read_only=True)
    async with a.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.2)
        assert {"quit", "read_only_help", "pause"} <= shown(a) and not shown(a) & {"launch", "stop", "sweep", "study"}
        assert not any(action.startswith("read_only(") for action in shown(a))
        for key, what in (("l", "launching"), ("x", "stopping"), ("s", "sweeping"), ("y", "studying"),
                          ("b", "studying")):
            await pilot.press(key)
            await pilot.pause(0.1)
            assert isinstance(a.screen, MonitorScreen), key
            assert a._notifications, key
            message = list(a._notifications)[-1].message
            assert message == (f"read-only: {what} is off in this browser session (start `sparktop web "
                               "--allow-control` to allow it)")
        await pilot.press("question_mark")
        await pilot.pause(0.1)
        assert isinstance(a.screen, ReadOnlyHelpScreen)


async def test_a_normal_app_keeps_every_key():
    app(read_only=True)  # a read-only instance first: the class's bindings must not change
    a = app(read_only=False)
    async with a.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.2)
        assert {"launch", "stop", "sweep"} <= shown(a)
        await pilot.press("question_mark")
        await pilot.pause(0.1)
        assert type(a.screen) is HelpScreen


def test_the_read_only_help_leaves_out_the_refused_keys():
    text = read_only_help()
    assert "only watches" in text and "--allow-control" in text
    for line in ("launch a recipe", "stop something sparktop launched", "run a concurrency sweep",
                 "in the launcher: study", "the study under way"):
        assert line in HELP and line not in text
    for kept in ("quit", "this help", "pause or resume", "history charts", "Memory is unified", "Engine figures"):
        assert kept in text
