"""`sparktop collect`: the monitor's poller without a screen, writing the
history (and, with `--serve-metrics`, serving every figure to Prometheus),
so there is history for the nights nobody had the app open.

`--install` writes a systemd user unit that runs it at boot (with lingering
enabled, without anyone logged in).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sparktop.clock import SYSTEM, Clock
from sparktop.history.store import HistoryStore, writer_pid
from sparktop.history.writer import HistoryWriter
from sparktop.observe.hang import HUNG_AFTER_S
from sparktop.settings import Inventory, load_preferences

if TYPE_CHECKING:
    from sparktop.launch.watchdog import Policy

UNIT_NAME = "sparktop-collect.service"
COLLECT_HISTORY = 900  # points kept in memory per series: the energy's averaging needs a few seconds only


def unit_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user" / UNIT_NAME


def _systemd_word(word: str) -> str:
    """A word of ExecStart as systemd reads it: double-quoted with backslash escapes when it needs quoting."""
    if word and all(c.isalnum() or c in "/._-=:,@+" for c in word):
        return word
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def unit_text(argv: list[str]) -> str:
    command = " ".join(_systemd_word(w) for w in argv)
    return (
        "[Unit]\n"
        "Description=sparktop collector: history of the Spark nodes and their engines\n"
        "After=network-online.target docker.service\n"
        "Wants=network-online.target\n\n"
        "[Service]\n"
        # Secrets stay out of the unit: SPARKTOP_METRICS_TOKEN (to serve metrics beyond loopback) goes here.
        "EnvironmentFile=-%h/.config/sparktop/collect.env\n"
        f"ExecStart={command}\n"
        "Restart=on-failure\n"
        "RestartSec=10\n"
        # SIGTERM: the collector writes the minute in progress and exits.
        "KillSignal=SIGTERM\n"
        "TimeoutStopSec=20\n\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def install(argv: list[str], say: Callable[[str], None] = print) -> int:
    """Write the unit; print how to enable it (nothing is run: enabling is the user's choice)."""
    exe = shutil.which("sparktop") or sys.argv[0]
    path = unit_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(unit_text([str(Path(exe).resolve()), "collect", *argv]))
    say(f"wrote {path}")
    say("enable it (and keep it running after you log out):")
    say("  systemctl --user daemon-reload && systemctl --user enable --now sparktop-collect")
    say("  loginctl enable-linger \"$USER\"")
    if "--serve-metrics" in argv:
        say("a token for a non-loopback --serve-metrics: SPARKTOP_METRICS_TOKEN=... in "
            "~/.config/sparktop/collect.env (chmod 600), or a new one at every start")
    say("then: systemctl --user status sparktop-collect; sparktop history")
    return 0


async def collect(inventory: Inventory, engines: list[str], *, interval: float = 1.0,
                  rate_window: float | None = None, path: str | None = None,
                  metrics: tuple[str, int, str | None, bool] | None = None,
                  say: Callable[[str], None] = print, stop: asyncio.Event | None = None,
                  clock: Clock = SYSTEM, watchdog: Policy | None = None, hung_after: float = HUNG_AFTER_S) -> int:
    """Poll and write until SIGTERM/SIGINT (or `stop`). `metrics`: (host, port, token, whether the token
    was generated here, so it must be shown) to serve /metrics on. `clock`: the poller's and the writer's.
    `watchdog`: restart the hung or dead engines of sparktop's launches, so (`launch.watchdog`);
    `hung_after`: seconds without a token with requests waiting that make an engine hung."""
    from sparktop.launch.state import api_key_for
    from sparktop.observe.poller import Poller
    from sparktop.observe.state import ClusterState
    from sparktop.observe.targets import engine_targets, node_targets

    # First: from its first line on, a SIGTERM (systemd's stop) ends it in order, the minute in progress written.
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    prefs = load_preferences()
    store = HistoryStore.open(path)
    writer = HistoryWriter(store, prefs.history_retention_days, clock=clock)
    if store.writer:
        say(f"writing history to {store.path} (kept {prefs.history_retention_days:g} days)")
    else:
        pid = writer_pid(store.path)
        say(f"{store.path} is written by {'pid ' + str(pid) if pid else 'another sparktop'}: collecting waits "
            "and takes over when it stops")
    poller = Poller(node_targets(inventory), engine_targets(engines), interval=interval,
                    default_port=inventory.defaults.port, router_key=api_key_for,
                    rate_window=rate_window or prefs.rate_window_s, latency_window=prefs.latency_window_s,
                    clock=clock, hung_after=hung_after)
    state = ClusterState(history=COLLECT_HISTORY)
    server = None
    guard = None
    try:
        if metrics is not None:
            from sparktop.history.exporter import scrape_config, start_metrics

            host, port, token, generated = metrics
            # Started before polling: a port in use or a refused token is an error now, not a silent task.
            server = await start_metrics(state, host, port, token, price_per_kwh=prefs.energy_price_per_kwh,
                                         currency=prefs.currency)
            say(f"serving Prometheus metrics on {server.url}" + (" (bearer token required)" if token else ""))
            say("add to prometheus.yml:")
            for line in scrape_config(host, server.port, token, show_token=generated):
                say("  " + line)
        await poller.start()
        guard = _watchdog(poller, inventory, watchdog, clock, say)

        async def consume() -> None:
            async for event in poller.events():
                state.apply(event)
                writer.observe(event, state)
                if guard is not None:
                    guard.observe(event)

        work = asyncio.create_task(consume())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for task in (work, stopped):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # a poller that failed raises here
    finally:
        if guard is not None:
            await guard.close()  # a restart under way ends first
        if server is not None:
            await server.close()
        await poller.close()
        writer.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
    say(f"history written to {store.path}")
    return 0


def _watchdog(poller, inventory: Inventory, policy: Policy | None, clock: Clock, say: Callable[[str], None]):
    """`--watchdog`: the watchdog over sparktop's launches, its actions in the poller's stream; None without."""
    if policy is None:
        return None
    from sparktop.launch.watchdog import watching

    say(f"watchdog: restarting the hung or dead engines of sparktop's launches (each at most "
        f"{policy.cap_text()}); nothing else is touched")
    return watching(poller, inventory, policy, clock=clock)


def main_collect(inventory: Inventory, engines: list[str], interval: float, rate_window: float | None,
                 path: str | None, metrics: tuple[str, int, str | None, bool] | None,
                 watchdog: Policy | None = None, hung_after: float | None = None) -> int:
    return asyncio.run(collect(inventory, engines, interval=interval, rate_window=rate_window, path=path,
                               metrics=metrics, watchdog=watchdog,
                               hung_after=HUNG_AFTER_S if hung_after is None else hung_after))
