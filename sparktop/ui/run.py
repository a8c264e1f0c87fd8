"""Running the app: wire a source (live poller or replay) to SparktopApp."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from sparktop.settings import Inventory, load_preferences
from sparktop.ui.app import SparktopApp


async def run_monitor(inventory: Inventory, engines: list[str], interval: float = 1.0,
                      record: str | None = None, label: str = "", poller=None,
                      recipe_dirs: list[str] | None = None, study_dir: Path | None = None,
                      read_only: bool = False, rate_window: float | None = None,
                      history_path: str | None | bool = None, canary=None) -> int:
    """With `study_dir`, the study screen follows that study (another
    process runs it, `sparktop study`) over the monitor. `read_only`: watch
    only (a browser session of `sparktop web` without --allow-control).
    `canary`: the poller's canary requests (`observe.canary.CanaryPolicy`; None: none)."""
    started = []
    prefs = load_preferences()  # the windows (and, in the app, the energy price): a bad file stops here
    windows = {"rate_window": rate_window or prefs.rate_window_s, "latency_window": prefs.latency_window_s}

    async def start_source():
        # Imported here, after the first frame: aiohttp and friends take a while.
        from sparktop.launch.state import api_key_for
        from sparktop.observe.poller import Poller
        from sparktop.observe.targets import engine_targets, node_targets

        source = poller or Poller(node_targets(inventory), engine_targets(engines), interval=interval,
                                  default_port=inventory.defaults.port, router_key=api_key_for, canary=canary,
                                  **windows)
        await source.start()
        started.append(source)
        return source

    recorder = None
    if record:
        from sparktop.observe.record import Recorder

        recorder = Recorder(record, interval)
    history, note = (open_history(prefs, history_path if isinstance(history_path, str) else None)
                     if history_path is not False else (None, None))
    app = SparktopApp(start_source=start_source, recorder=recorder, label=label, inventory=inventory,
                      recipe_dirs=recipe_dirs, study_dir=study_dir, read_only=read_only, history=history,
                      history_note=note)
    _exit_on_signals(app)
    try:
        await app.run_async()
    finally:
        for source in started:
            await source.close()
        if recorder:
            recorder.close()
    return 0


def open_history(prefs, path: str | None = None):
    """The history writer the app feeds (None and a line saying why when
    history is off or its file cannot be opened: the monitor runs anyway)."""
    if not prefs.history:
        return None, "history is off (history: false in settings.yaml)"
    from sparktop.errors import SparktopError
    from sparktop.history.store import HistoryStore
    from sparktop.history.writer import HistoryWriter

    try:
        return HistoryWriter(HistoryStore.open(path), prefs.history_retention_days), None
    except (SparktopError, OSError) as exc:
        return None, f"history is off: {exc}"


async def run_replay(path: str, speed: float = 1.0) -> int:
    from sparktop.observe.record import Recording, ReplaySource

    recording = Recording.load(path)
    app = SparktopApp(ReplaySource(recording, speed=speed), replay=True)
    _exit_on_signals(app)
    await app.run_async()
    return 0


def _exit_on_signals(app: SparktopApp) -> None:
    """A closed terminal (SIGHUP) or SIGTERM ends the app cleanly, so what it
    started (the demo's twins, a recording) is stopped and flushed."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGHUP, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, app.exit)


def main_monitor(inventory: Inventory, engines: list[str], interval: float, record: str | None,
                 recipe_dirs: list[str] | None = None, study: str | None = None, read_only: bool = False,
                 rate_window: float | None = None, history_path: str | None = None, canary=None) -> int:
    """`study`: an id or directory to attach to (`sparktop --study ID`); a
    wrong one is an error before the screen opens. `history_path`: the inventory's history file (None: the
    default one)."""
    study_dir = None
    if study:
        from sparktop.study.state import load_study

        study_dir = load_study(study).dir
    return asyncio.run(run_monitor(inventory, engines, interval, record, label="read-only" if read_only else "",
                                   recipe_dirs=recipe_dirs, study_dir=study_dir, read_only=read_only,
                                   rate_window=rate_window, history_path=history_path, canary=canary))


def main_replay(path: str, speed: float) -> int:
    return asyncio.run(run_replay(path, speed))
