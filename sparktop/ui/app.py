"""The Textual app: turns streams of core events into screens.

The app polls nothing itself. A source (the live Poller or a ReplaySource)
yields plain events; a worker applies them to a ClusterState (and a
Recorder, when recording) and the visible screen gets a `StateChanged`
message, at most once per `repaint` seconds however many events arrive. A
launch runs in an app worker too (it outlives the screen that started
it): its events become `LaunchProgress` messages for the progress screen.
Screens ask the app for things with messages (`ui/messages.py`).
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual.app import App
from textual.binding import Binding
from textual.timer import Timer

from sparktop.errors import SparktopError
from sparktop.observe.state import ClusterState
from sparktop.ui.messages import (
    LaunchProgress,
    LaunchRequested,
    LaunchSeen,
    RepaintRequested,
    StateChanged,
    StopRequested,
    pump,
)
from sparktop.ui.screens import HelpScreen, LiveScreen, MonitorScreen, clock

INTERVALS = [0.25, 0.5, 1.0, 2.0, 5.0, 10.0]
SPEEDS = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 60.0]


class SparktopApp(App):
    CSS_PATH = "sparktop.tcss"
    TITLE = "sparktop"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("p,space", "pause", "Pause"),
        Binding("plus,equals_sign", "faster", "Faster"),
        Binding("minus", "slower", "Slower"),
        Binding("left_square_bracket", "seek(-10)", "-10s", show=False),
        Binding("right_square_bracket", "seek(10)", "+10s", show=False),
        Binding("l", "launch", "Launch"),
        Binding("x", "stop", "Stop"),
        Binding("s", "sweep", "Sweep"),
    ]

    def __init__(self, source=None, *, start_source=None, recorder=None, replay: bool = False, label: str = "",
                 repaint: float = 1.0, inventory=None, recipe_dirs: list[str] | None = None,
                 launch_timeout: float | None = None, results_root=None):
        """`source` yields events; or `start_source`, an async callable that
        makes one, is called once the first frame is on screen (so heavy
        imports and connections never delay it). With an `inventory` the
        app can launch and stop recipes on its nodes."""
        super().__init__()
        self.inventory = inventory
        self.recipe_dirs = recipe_dirs
        self.launch_timeout = launch_timeout
        self.results_root = results_root  # where sweeps are written (default: the results dir)
        self._launcher = None
        self._notified: set[int] = set()  # runs whose end was announced
        self._looked_at: set[int] = set()  # runs whose end the user saw on their progress screen
        self.source = source
        self._start_source = start_source
        self.recorder = recorder
        self.replay = replay
        self.label = label
        self.state = ClusterState()
        self._repaint = repaint
        self._painted_version = -1
        self._painted_at = 0.0
        self._paint_timer: Timer | None = None
        self.first_frame_at: float | None = None

    # -- lifecycle --------------------------------------------------------------

    def on_mount(self) -> None:
        self.push_screen(MonitorScreen())
        self.call_after_refresh(self._paint)
        self.call_after_refresh(lambda: self.run_worker(self._consume(), name="events", group="observe",
                                                        exclusive=True))

    async def _consume(self) -> None:
        if self.source is None:
            self.source = await self._start_source()
            self._paint(force=True)
        async for event in self.source.events():
            self.state.apply(event)
            if self.recorder is not None:
                self.recorder.write(event)
            self._schedule_paint()

    def _schedule_paint(self) -> None:
        """Paint once the last paint is `repaint` seconds old: a burst of
        events (a poll of every node and engine) makes one paint."""
        if self._paint_timer is not None:
            return
        wait = max(0.01, self._painted_at + self._repaint - time.monotonic())  # Textual: a 0 s timer divides by 0
        self._paint_timer = self.set_timer(wait, self._paint_due)

    def _paint_due(self) -> None:
        self._paint_timer = None
        self._paint(force=True)  # something happened since the last paint

    def _paint(self, force: bool = False) -> None:
        screen = self.screen
        if not isinstance(screen, LiveScreen) or not screen.is_mounted:
            return
        if not force and self.state.version == self._painted_version:
            return
        self._painted_version = self.state.version
        self._painted_at = time.monotonic()
        self._notice_launch()
        screen.post_message(StateChanged(self.state, self.status_text()))
        if self.first_frame_at is None:
            self.first_frame_at = time.monotonic()

    def status_text(self) -> Text:
        s = self.state
        text = Text(" sparktop ", style="bold reverse")
        if self.source is None:
            text.append(" connecting…", style="dim")
            return text
        text.append(f" {len(s.nodes)} node{'s' if len(s.nodes) != 1 else ''} · "
                    f"{len(s.engines)} engine{'s' if len(s.engines) != 1 else ''}")
        if self.replay:
            src = self.source
            rec = src.recording
            text.append(f" · replay {Path(rec.path).name} at {src.speed:g}x · ", style="cyan")
            text.append(f"{clock(src.position)} ({src.position - rec.start:.0f}s of {rec.end - rec.start:.0f}s)")
            if src.finished:
                text.append(" · end", style="dim")
        else:
            text.append(f" · every {self.source.interval:g}s · {clock()}")
            if self.recorder is not None:
                text.append(f" · recording to {self.recorder.path.name}", style="red")
        if self.source.paused:
            text.append("  PAUSED ", style="bold black on yellow")
        run = self._launcher.run if self._launcher else None
        if run is not None and run.status == "running":
            text.append(f" · launching {run.plan.recipe_id} ({run.current_stage or 'starting'}, "
                        f"{run.elapsed:.0f}s)", style="bold yellow")
        elif run is not None and run.status in ("failed", "cancelled") and id(run) not in self._looked_at:
            text.append(f" · launch {run.status} (l shows why)", style="bold red")
        if self.label:
            text.append(f" · {self.label}", style="dim")
        return text

    # -- actions ----------------------------------------------------------------

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_pause(self) -> None:
        if self.source is None:
            return
        if self.source.paused:
            self.source.resume()
        else:
            self.source.pause()
        self._paint(force=True)

    def _step(self, values: list[float], current: float, up: bool) -> float:
        if up:
            bigger = [v for v in values if v > current + 1e-9]
            return bigger[0] if bigger else values[-1]
        smaller = [v for v in values if v < current - 1e-9]
        return smaller[-1] if smaller else values[0]

    def action_faster(self) -> None:
        if self.source is None:
            return
        if self.replay:
            self.source.speed = self._step(SPEEDS, self.source.speed, up=True)
        else:
            self.source.interval = self._step(INTERVALS, self.source.interval, up=False)
        self._paint(force=True)

    def action_slower(self) -> None:
        if self.source is None:
            return
        if self.replay:
            self.source.speed = self._step(SPEEDS, self.source.speed, up=False)
        else:
            self.source.interval = self._step(INTERVALS, self.source.interval, up=True)
        self._paint(force=True)

    def action_seek(self, seconds: float) -> None:
        if self.replay:
            self.source.seek(float(seconds))

    # -- launching and stopping ----------------------------------------------------

    @property
    def launcher(self):
        if self._launcher is None and self.inventory is not None:
            from sparktop.launch.executor import DEFAULT_TIMEOUT
            from sparktop.launch.session import Launcher

            self._launcher = Launcher(self.inventory, self.recipe_dirs, self.launch_timeout or DEFAULT_TIMEOUT)
        return self._launcher

    def action_launch(self) -> None:
        if self.replay or self.launcher is None:
            why = "not in a replay" if self.replay else "this session watches endpoints only"
            self.notify(f"Launching needs live nodes: {why}.", title="Launch", severity="warning")
            return
        from sparktop.ui.launcher import LaunchScreen, ProgressScreen

        run = self.launcher.run
        if run is not None and (run.status == "running" or id(run) not in self._looked_at):
            # A launch under way, or one whose end was not looked at yet, shows its progress first.
            self.push_screen(ProgressScreen(self.launcher, run))
            return
        self.push_screen(LaunchScreen(self.launcher))

    def action_stop(self) -> None:
        if self.replay or self.launcher is None:
            why = "not in a replay" if self.replay else "this session watches endpoints only"
            self.notify(f"Stopping needs live nodes: {why}.", title="Stop", severity="warning")
            return
        from sparktop.ui.launcher import StopScreen

        self.push_screen(StopScreen(self.launcher))

    def on_launch_requested(self, message: LaunchRequested) -> None:
        from sparktop.ui.launcher import ProgressScreen

        try:
            run = self.launcher.begin(message.plan)
        except SparktopError as exc:
            self.notify(str(exc), title="cannot launch", severity="error")
            return
        self.pop_screen()  # the launch screen that asked
        self.push_screen(ProgressScreen(self.launcher, run))
        # An app worker: the launch goes on when its screen is closed.
        self.run_worker(pump(self.launcher.follow(), self, lambda event: LaunchProgress(event, run)),
                        group="launch", name="launch", exclusive=True)

    def on_launch_progress(self, message: LaunchProgress) -> None:
        from sparktop.ui.launcher import ProgressScreen

        for screen in self.screen_stack:
            if isinstance(screen, ProgressScreen):
                screen.post_message(LaunchProgress(message.event, message.run))
        if message.run.status != "running":
            self._paint(force=True)  # say how it ended, wherever the user is
        else:
            self._schedule_paint()  # the status line's "launching …" moves on

    def on_launch_seen(self, message: LaunchSeen) -> None:
        if message.run.status != "running":
            self._looked_at.add(id(message.run))

    def on_repaint_requested(self, message: RepaintRequested) -> None:
        self.call_after_refresh(self._paint, True)

    def on_stop_requested(self, message: StopRequested) -> None:
        self.notify(f"stopping {', '.join(message.launch_ids)}…", title="Stop")
        self.run_worker(self._stop(message.launch_ids), group="stop", name="stop")

    async def _stop(self, launch_ids: list[str]) -> None:
        try:
            removed = await self.launcher.stop(launch_ids)
        except Exception as exc:  # a node that cannot be reached is reported, not raised
            self.notify(f"{type(exc).__name__}: {exc}", title="stop failed", severity="error", timeout=10)
            return
        for lid, count in removed.items():
            self.notify(f"stopped {lid}: removed {count} container(s)", title="Stop")

    def _notice_launch(self) -> None:
        """Say so once when a launch becomes ready or fails, wherever the user is."""
        run = self._launcher.run if self._launcher else None
        if run is None or run.status == "running" or id(run) in self._notified:
            return
        from sparktop.ui.launcher import ProgressScreen

        self._notified.add(id(run))
        if isinstance(self.screen, ProgressScreen):
            return  # the user is watching it
        if run.status == "ready":
            self.notify(f"{run.plan.recipe_id} is ready ({run.plan.topology}, {run.seconds:.0f}s)",
                        title="Launch")
            self._looked_at.add(id(run))  # nothing more to see
        else:
            self.notify(f"{run.plan.recipe_id}: {run.reason}", title=f"launch {run.status}", severity="error",
                        timeout=15)

    async def on_unmount(self) -> None:
        if self._launcher is not None:
            await self._launcher.close()

    def action_sweep(self) -> None:
        if self.replay:
            self.notify("Sweeping needs live engines: not in a replay.", title="Sweep", severity="warning")
            return
        from sparktop.settings import results_dir
        from sparktop.ui.sweep import SweepScreen

        engines = [e for e in self.state.ordered_engines() if e.state == "ready"]
        focused = self.screen.focused
        default = getattr(focused, "key", None) if getattr(focused, "kind", None) == "engine" else None
        self.push_screen(SweepScreen(engines, self.results_root or results_dir(), default_url=default))

