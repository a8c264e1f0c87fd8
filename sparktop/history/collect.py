"""`sparktop collect`: the monitor's poller without a screen, writing the
history (and, with `--serve-metrics`, serving every figure to Prometheus),
so there is history for the nights nobody had the app open.

`--install` writes a systemd user unit that runs it at boot (with lingering
enabled, without anyone logged in): ordered as a user manager can order it
(no system units), with the XDG directories it was installed with.

A history that cannot be written (a full disk, a damaged file) does not stop
it: it says so in one line, keeps polling and serving metrics, holds the
minutes in memory and writes them when it can (`HistoryWriter.open`).
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
from sparktop.history.store import HistoryError, writer_pid
from sparktop.history.writer import HistoryWriter
from sparktop.observe.hang import HUNG_AFTER_S
from sparktop.settings import Inventory, config_dir, load_preferences

if TYPE_CHECKING:
    from sparktop.launch.watchdog import Policy
    from sparktop.observe.canary import CanaryPolicy

UNIT_NAME = "sparktop-collect.service"
COLLECT_HISTORY = 900  # points kept in memory per series: the energy's averaging needs a few seconds only


XDG_VARS = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME")


def unit_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user" / UNIT_NAME


def _systemd_word(word: str) -> str:
    """A word of ExecStart as systemd reads it: double-quoted with backslash escapes when it needs quoting."""
    if word and all(c.isalnum() or c in "/._-=:,@+" for c in word):
        return word
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def _systemd_path(path: Path) -> str:
    """A path in a unit: %h for the home directory (the unit's user's), specifiers escaped."""
    home = Path.home()
    text = str(path)
    if path == home or home in path.parents:
        return "%h" + _systemd_escape(text[len(str(home)):])
    return _systemd_escape(text)


def _systemd_escape(text: str) -> str:
    return text.replace("%", "%%")


def _assignment(name: str, value: str) -> str:
    """NAME=value for Environment=, double-quoted (with escapes) when the value has spaces or quotes."""
    if all(c.isalnum() or c in "/._-:,@+%" for c in value):
        return f"{name}={value}"
    return '"' + f"{name}={value}".replace("\\", "\\\\").replace('"', '\\"') + '"'


def env_file() -> Path:
    """Where the unit reads its secrets from (SPARKTOP_METRICS_TOKEN): the config directory of the install."""
    return config_dir() / "collect.env"


def unit_text(argv: list[str], env: dict[str, str] | None = None) -> str:
    """The unit for a user manager: it starts with the user's session or at boot with lingering
    (`default.target`; system units such as the network or docker are not a user manager's to wait for:
    the collector retries what it cannot reach), with the XDG directories in `env` (the install's), so it
    writes the history and reads the settings the user's shell does."""
    env = {k: v for k, v in (os.environ if env is None else env).items() if k in XDG_VARS and v}
    command = " ".join(_systemd_word(w) for w in argv)
    lines = [
        "[Unit]",
        "Description=sparktop collector: history of the Spark nodes and their engines",
        "",
        "[Service]",
    ]
    for name in XDG_VARS:
        if name in env:
            lines.append(f"Environment={_assignment(name, _systemd_path(Path(env[name])))}")
    config = Path(env["XDG_CONFIG_HOME"]) / "sparktop" if "XDG_CONFIG_HOME" in env else Path.home() / ".config/sparktop"
    lines += [
        # Secrets stay out of the unit: SPARKTOP_METRICS_TOKEN (to serve metrics beyond loopback) goes here.
        f"EnvironmentFile=-{_systemd_path(config / 'collect.env')}",
        f"ExecStart={command}",
        "Restart=on-failure",
        "RestartSec=10",
        # SIGTERM: the collector writes the minute in progress and exits.
        "KillSignal=SIGTERM",
        "TimeoutStopSec=20",
        "",
        "[Install]",
        "WantedBy=default.target",
    ]
    return "\n".join(lines) + "\n"


NOTIFY_ENV = "SPARKTOP_NOTIFY"  # webhooks, space-separated, where --notify gives none (the unit's env file)


def notify_from_env(given: list[str] | None, environ: dict[str, str] | None = None) -> list[str]:
    """--notify's URLs, else $SPARKTOP_NOTIFY's (the installed unit keeps them in its env file, not its
    command line: a webhook's URL is its key)."""
    return list(given or []) or (environ if environ is not None else dict(os.environ)).get(NOTIFY_ENV, "").split()


def _secret_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """argv without its --notify URLs, and those URLs."""
    kept, hooks, i = [], [], 0
    while i < len(argv):
        if argv[i] == "--notify" and i + 1 < len(argv):
            hooks.append(argv[i + 1])
            i += 2
            continue
        if argv[i].startswith("--notify="):
            hooks.append(argv[i].partition("=")[2])
        else:
            kept.append(argv[i])
        i += 1
    return kept, hooks


def install(argv: list[str], say: Callable[[str], None] = print) -> int:
    """Write the unit; print how to enable it (nothing is run: enabling is the user's choice). Secrets stay
    out of the unit: --notify's webhooks go to its env file (chmod 600); an --engine with credentials is
    refused."""
    from sparktop.errors import SparktopError
    from sparktop.masking import without_credentials

    argv, hooks = _secret_args(argv)
    for i, arg in enumerate(argv):
        if i and argv[i - 1] == "--engine" and without_credentials(arg) != arg:
            raise SparktopError(f"--install: --engine {without_credentials(arg)} carries credentials, which the "
                                "unit file would keep in plain text; give the engine an API key, or run collect "
                                "by hand")
    exe = shutil.which("sparktop") or sys.argv[0]
    path = unit_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(unit_text([str(Path(exe).resolve()), "collect", *argv]))
    say(f"wrote {path}")
    if hooks:
        env = env_file()
        env.parent.mkdir(parents=True, exist_ok=True)
        lines = [ln for ln in (env.read_text().splitlines() if env.exists() else [])
                 if not ln.startswith(NOTIFY_ENV + "=")]
        env.write_text("\n".join([*lines, f"{NOTIFY_ENV}={' '.join(hooks)}"]) + "\n")
        env.chmod(0o600)
        say(f"the --notify webhooks are in {env} (chmod 600), not in the unit")
    say("enable it (and keep it running after you log out):")
    say("  systemctl --user daemon-reload && systemctl --user enable --now sparktop-collect")
    say("  loginctl enable-linger \"$USER\"")
    if "--serve-metrics" in argv:
        say(f"a token for a non-loopback --serve-metrics: SPARKTOP_METRICS_TOKEN=... in {env_file()} "
            "(chmod 600), or a new one at every start")
    default = Path.home() / ".config" / "systemd" / "user"
    if path.parent != default:
        say(f"  (a user manager started without XDG_CONFIG_HOME looks in {default}: "
            f"systemctl --user link {path} if it does not find the unit)")
    say("then: systemctl --user status sparktop-collect; sparktop history")
    return 0


async def collect(inventory: Inventory, engines: list[str], *, interval: float = 1.0,
                  rate_window: float | None = None, path: str | None = None,
                  metrics: tuple[str, int, str | None, bool] | None = None,
                  say: Callable[[str], None] = print, stop: asyncio.Event | None = None,
                  clock: Clock = SYSTEM, notify: list[str] | None = None, alert_after: float | None = None,
                  watchdog: Policy | None = None, hung_after: float = HUNG_AFTER_S,
                  canary: CanaryPolicy | None = None) -> int:
    """Poll and write until SIGTERM/SIGINT (or `stop`). `metrics`: (host, port, token, whether the token
    was generated here, so it must be shown) to serve /metrics on. `clock`: the poller's and the writer's.
    `notify`: webhooks every alert goes to (`history.alerting`); `alert_after`: how long a condition holds
    before it fires (and is gone before it resolves). `watchdog`: restart the hung or dead engines of
    sparktop's launches, so (`launch.watchdog`); `hung_after`: seconds without a token with requests waiting
    that make an engine hung; `canary`: send each idle engine a tiny request now and then, as it says
    (`observe.canary`: a hang with nothing asked of it shows), never counted in the history or the metrics."""
    from sparktop.history.alerting import CollectAlerts
    from sparktop.launch.state import api_key_for
    from sparktop.observe.alerts import AFTER_S
    from sparktop.observe.poller import Poller
    from sparktop.observe.state import ClusterState
    from sparktop.observe.targets import engine_targets, node_targets

    # A webhook that is no URL is an error before anything starts.
    alerts = CollectAlerts(notify or [], say=say, after_s=AFTER_S if alert_after is None else alert_after)
    # First: from its first line on, a SIGTERM (systemd's stop) ends it in order, the minute in progress written.
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    prefs = load_preferences()
    # A history that cannot be written now (a full disk, a damaged file) pauses it, in a line that says what
    # to do; the collector goes on (polling, serving metrics) and writes what it held when it can.
    writer = HistoryWriter.open(path, prefs.history_retention_days, clock=clock, say=say)
    store = writer.store
    if store is not None and store.writer and not writer.paused:
        say(f"writing history to {store.path} (kept {prefs.history_retention_days:g} days)")
    elif store is not None and not store.writer:
        pid = writer_pid(store.path)
        say(f"{store.path} is written by {'pid ' + str(pid) if pid else 'another sparktop'}: collecting waits "
            "and takes over when it stops")
    poller = Poller(node_targets(inventory), engine_targets(engines), interval=interval,
                    default_port=inventory.defaults.port, router_key=api_key_for,
                    rate_window=rate_window or prefs.rate_window_s, latency_window=prefs.latency_window_s,
                    clock=clock, hung_after=hung_after, canary=canary)
    state = ClusterState(history=COLLECT_HISTORY)
    server = None
    guard = None
    try:
        if metrics is not None:
            from sparktop.history.exporter import scrape_config, start_metrics

            host, port, token, generated = metrics
            # Started before polling: a port in use or a refused token is an error now, not a silent task.
            server = await start_metrics(state, host, port, token, price_per_kwh=prefs.energy_price_per_kwh,
                                         currency=prefs.currency, history=writer)
            say(f"serving Prometheus metrics on {server.url}" + (" (bearer token required)" if token else ""))
            say("add to prometheus.yml:")
            for line in scrape_config(host, server.port, token, show_token=generated):
                say("  " + line)
        await poller.start()
        await alerts.start(clock.wall(), len(inventory.nodes), len(engines))
        guard = _watchdog(poller, inventory, watchdog, clock, say)
        if canary is not None:
            say(canary.describe())

        async def consume() -> None:
            async for event in poller.events():
                state.apply(event)
                writer.observe(event, state)
                # Alerts are notices: in the history as events, and posted to every --notify target.
                for notice in alerts.after(event, state, getattr(writer, "paused", None)):
                    state.apply(notice)
                    writer.observe(notice, state)
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
        await alerts.close()
        writer.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
    if writer.unwritten:
        raise HistoryError(f"{writer.path}: {writer.unwritten} minute rows were never written "
                           f"({writer.pause_reason}); the collector stopped with them in memory")
    say(f"history written to {writer.path}")
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
                 notify: list[str] | None = None, alert_after: float | None = None,
                 watchdog: Policy | None = None, hung_after: float | None = None,
                 canary: CanaryPolicy | None = None) -> int:
    return asyncio.run(collect(inventory, engines, interval=interval, rate_window=rate_window, path=path,
                               metrics=metrics, notify=notify, alert_after=alert_after, watchdog=watchdog,
                               hung_after=HUNG_AFTER_S if hung_after is None else hung_after, canary=canary))
