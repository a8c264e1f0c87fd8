"""The Textual app: turns streams of core events into screens.

The app polls nothing itself. A source (the live Poller or a ReplaySource)
yields plain events; a worker applies them to a ClusterState (and a
Recorder, when recording) and the visible screen gets a `StateChanged`
message, at most once per `repaint` seconds however many events arrive. A
launch runs in an app worker too (it outlives the screen that started
it): its events become `LaunchProgress` messages for the progress screen.
So does a study (`StudyProgress`, folded into a `StudyRun` first), whether
it runs here or is followed from its files (`sparktop --study ID`).
Screens ask the app for things with messages (`ui/messages.py`).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import App, ScreenStackError
from textual.binding import Binding
from textual.timer import Timer

from sparktop.errors import SparktopError
from sparktop.observe.alerts import AlertWatch
from sparktop.observe.snapshot import EngineSnapshot, NodeSnapshot
from sparktop.observe.state import ClusterState
from sparktop.study.events import LaunchUpdate, StudyEvent
from sparktop.ui.messages import (
    LaunchProgress,
    LaunchRequested,
    LaunchSeen,
    RepaintRequested,
    StateChanged,
    StopRequested,
    StudyCancelRequested,
    StudyPlanRequested,
    StudyProgress,
    StudyRequested,
    StudySeen,
    pump,
)
from sparktop.ui.screens import HelpScreen, LiveScreen, MonitorScreen, clock

if TYPE_CHECKING:
    from sparktop.study.runner import StudyRunner
    from sparktop.ui.study import StudyRun

INTERVALS = [0.25, 0.5, 1.0, 2.0, 5.0, 10.0]
SPEEDS = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 60.0]


GC_SETTLE_S = 10.0  # after start-up: the modules and the first figures are in


def _settle_gc() -> None:
    """Move what start-up left (Textual, Rich, aiohttp, the model cards: some
    70k objects that live as long as the app) out of the collector's sight.
    A full collection walked them all about once a minute, 40 ms each time,
    for nothing: a monitor left open all day pays for that."""
    gc.collect()
    gc.freeze()
    # What a monitor allocates each second is mostly short-lived lines and strips freed by reference
    # counting: a young collection every 10,000 allocations (not 700) finds the same, 16 times less often.
    gc.set_threshold(10_000, 10, 10)


SPEED = Binding.Group("Speed")  # + and -: polls (in a replay, playback) faster or slower


class SparktopApp(App):
    CSS_PATH = "sparktop.tcss"
    TITLE = "sparktop"
    # In the footer's order, which is their priority (ui/footer.py): what a new user needs first (quit, help,
    # the three things sparktop does, the history), then what tunes the watching (pause, the pace: + and -
    # as one key group).
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("l", "launch", "Launch"),
        Binding("x", "stop", "Stop"),
        Binding("s", "sweep", "Sweep"),
        Binding("h", "history", "History"),
        Binding("p,space", "pause", "Pause"),
        Binding("plus,equals_sign", "faster", "Faster", group=SPEED),
        Binding("minus", "slower", "Slower", group=SPEED),
        Binding("left_square_bracket", "seek(-10)", "-10s", show=False),
        Binding("right_square_bracket", "seek(10)", "+10s", show=False),
        Binding("y,b", "study", "Study", show=False),
        Binding("c", "cache", "Cache", show=False),
    ]

    def __init__(self, source=None, *, start_source=None, recorder=None, replay: bool = False, label: str = "",
                 repaint: float = 1.0, inventory=None, recipe_dirs: list[str] | None = None,
                 launch_timeout: float | None = None, results_root=None, study_dir: Path | None = None,
                 read_only: bool = False, preferences=None, history=None, history_note: str | None = None):
        """`source` yields events; or `start_source`, an async callable that
        makes one, is called once the first frame is on screen (so heavy
        imports and connections never delay it). With an `inventory` the
        app can launch and stop recipes on its nodes, and study them. With a
        `study_dir` it follows that study (run by another process) from the
        start. `history`: a `HistoryWriter` fed every event (or None, with
        `history_note` saying why there is none). `read_only` (a browser session of `sparktop web`) watches
        only: launching, stopping, sweeping and studies are off."""
        super().__init__()
        from sparktop.settings import load_preferences

        # The energy price and currency (settings.yaml); a bad file stops here, before the screen opens.
        self.preferences = preferences if preferences is not None else load_preferences()
        self.read_only = read_only
        if read_only:
            self._go_read_only()
        self.study_dir = study_dir
        self._study: StudyRun | None = None  # the study this session runs or follows
        self._study_runner: StudyRunner | None = None
        self._study_task: asyncio.Task | None = None  # its events, under the worker
        self._study_task_cancelled = False
        self._study_seen: set[int] = set()  # studies whose end the user saw on their screen
        self._quit_after_study = False
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
        self.history = history
        self.alerts = AlertWatch()
        self.history_note = history_note
        self.replay = replay
        self.label = label
        self.state = ClusterState()
        self._repaint = repaint
        self._painted_version = -1
        self._painted_at = 0.0
        self._paint_timer: Timer | None = None
        self.first_frame_at: float | None = None

    def get_driver_class(self):
        """Textual's driver for this terminal, or on Linux the same with an
        input thread that sleeps while nobody types (`ui/driver.py`); a
        driver chosen through TEXTUAL_DRIVER (a browser session) is kept."""
        driver = super().get_driver_class()
        from textual.drivers.linux_driver import LinuxDriver

        if driver is LinuxDriver:
            from sparktop.ui.driver import QuietLinuxDriver

            return QuietLinuxDriver
        return driver

    # -- lifecycle --------------------------------------------------------------

    def on_mount(self) -> None:
        self.push_screen(MonitorScreen())
        if self.study_dir is not None:
            self._attach_study(self.study_dir)
        self.call_after_refresh(self._paint)
        self.call_after_refresh(lambda: self.run_worker(self._consume(), name="events", group="observe",
                                                        exclusive=True))

    async def _consume(self) -> None:
        if self.source is None:
            self.source = await self._start_source()
            self._paint(force=True)
        self.set_timer(GC_SETTLE_S, _settle_gc)
        async for event in self.source.events():
            self._apply(event)
            if isinstance(event, NodeSnapshot | EngineSnapshot) and not self.replay:
                # Alerts (observe.alerts) are notices like any other: on screen, in the history and a recording
                # (a replay has them from its recording).
                for alert in self.alerts.check(self.state):
                    self._apply(alert)
            self._schedule_paint()

    def _apply(self, event) -> None:
        self.state.apply(event)
        if self.recorder is not None:
            self.recorder.write(event)
        if self.history is not None:
            self.history.observe(event, self.state)

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
        try:
            screen = self.screen
        except ScreenStackError:
            return  # shutting down: a paint scheduled just before found no screen left
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
            problem = self.history.status if self.history is not None else None
            if problem and problem.startswith("history paused"):
                text.append(f" · {problem}", style="bold yellow")
        firing = self.alerts.firing()
        if firing:
            text.append(f" · ⚠ {len(firing)} alert{'s' * (len(firing) != 1)}: {firing[0][0]}"
                        + (" …" if len(firing) > 1 else ""), style="bold red")
        if self.source.paused:
            text.append("  PAUSED ", style="bold black on yellow")
        run = self._launcher.run if self._launcher else None
        if run is not None and run.status == "running":
            text.append(f" · launching {run.plan.recipe_id} ({run.current_stage or 'starting'}, "
                        f"{run.elapsed:.0f}s)", style="bold yellow")
        elif run is not None and run.status in ("failed", "cancelled") and id(run) not in self._looked_at:
            text.append(f" · launch {run.status} (l shows why)", style="bold red")
        study = self._study
        if study is not None and (study.running or id(study) not in self._study_seen):
            text.append_text(study.status_text())
        if self.label:
            text.append(f" · {self.label}", style="dim")
        return text

    # -- read-only (a browser session of `sparktop web` without --allow-control) --------

    def _go_read_only(self) -> None:
        """The keys that would change something on the nodes (l, x, s, y, b)
        say why they do nothing instead, and leave the footer; ? shows the
        help without them. The screens behind them cannot be reached."""
        from dataclasses import replace

        from sparktop.ui.readonly import READ_ONLY_ACTIONS

        keys = self._bindings.key_to_bindings
        for key, bindings in keys.items():
            keys[key] = [replace(b, action=f"read_only({b.action!r})", show=False) if b.action in READ_ONLY_ACTIONS
                         else replace(b, action="read_only_help") if b.action == "help" else b for b in bindings]

    def action_read_only(self, action: str) -> None:
        from sparktop.ui.readonly import refusal

        self.notify(refusal(action), title="read-only", severity="warning", timeout=8)

    def action_read_only_help(self) -> None:
        from sparktop.ui.readonly import ReadOnlyHelpScreen

        self.push_screen(ReadOnlyHelpScreen())

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

        if self._study is not None and self._study.running and not self._study.attached:
            self.notify("A study is running: it launches each topology itself (y shows it).", title="cannot launch",
                        severity="error")
            return
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

        self._containers_changed(message.event)

        for screen in self.screen_stack:
            if isinstance(screen, ProgressScreen):
                screen.post_message(LaunchProgress(message.event, message.run))
        if message.run.status != "running":
            self._paint(force=True)  # say how it ended, wherever the user is
        else:
            self._schedule_paint()  # the status line's "launching …" moves on

    def _containers_changed(self, event) -> None:
        """A launch started or removed containers: the nodes' slow tier (containers,
        processes) is read on their next poll, so the new engine's card comes at once."""
        from sparktop.launch.events import Failed, Ready, StepDone, TornDown

        refresh = getattr(self.source, "refresh", None)  # a live poller; a replay has nothing to read
        if refresh is None:
            return
        match event:
            case StepDone(step=step) if step.container:
                refresh([step.node])
            case Ready(plan=plan):
                refresh(list(plan.nodes))
            case TornDown(nodes=nodes):
                refresh(list(nodes))
            case Failed() | None:  # a launch that failed, or a stop: every node
                refresh()

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
        self._containers_changed(None)  # the stopped engines' cards go at once, not at the next slow read
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
        task = self._study_task
        if task is not None and not task.done():
            # Quitting mid-study: the runner stops what it started (over the
            # launcher's connections, so they close after it).
            self._cancel_study_task()
            await asyncio.gather(task, return_exceptions=True)
        if self._launcher is not None:
            await self._launcher.close()
        if self.history is not None:
            self.history.close()  # the minute in progress goes to the file
            self.history = None

    def action_history(self) -> None:
        """The last 24 hours or 7 days from the history file (or why there is none)."""
        from sparktop.history.query import HistoryReader
        from sparktop.ui.history import HistoryScreen

        if isinstance(self.screen, HistoryScreen):
            return
        writer = self.history
        if writer is None or writer.store is None:  # no writer, or one that could not open its file
            note = (writer.status if writer is not None else None) or self.history_note or (
                "a replay keeps no history" if self.replay else "history is off")
            self.push_screen(HistoryScreen(None, self.preferences, note=note))
            return
        self.push_screen(HistoryScreen(HistoryReader(writer.store), self.preferences, note=writer.status))

    def action_cache(self) -> None:
        """Each node's cached models and images (ui/cache.py), read over the launcher's connections."""
        from sparktop.ui.cache import CacheScreen

        if isinstance(self.screen, CacheScreen):
            return
        if self.replay or self.launcher is None:
            why = "a replay reads no nodes" if self.replay else "this session watches endpoints only"
            self.push_screen(CacheScreen(None, note=f"No nodes to read: {why}."))
            return
        from sparktop.sync.cached import cluster_cache

        inventory = self.inventory
        transports = self.launcher.transports([n.name for n in inventory.nodes])
        self.push_screen(CacheScreen(lambda: cluster_cache(inventory, transports)))

    def action_sweep(self) -> None:
        if self.replay:
            self.notify("Sweeping needs live engines: not in a replay.", title="Sweep", severity="warning")
            return
        from sparktop.settings import results_dir
        from sparktop.ui.sweep import SweepScreen

        engines = [e for e in self.state.ordered_engines() if e.state == "ready"]
        focused = self.screen.focused
        default = getattr(focused, "key", None) if getattr(focused, "kind", None) == "engine" else None
        self.push_screen(SweepScreen(engines, self.results_root or results_dir(), default_url=default,
                                     state=self.state))


    # -- studies ----------------------------------------------------------------------

    def action_study(self) -> None:
        from sparktop.ui.study import StudyScreen

        if self._study is None:
            self.notify("No study yet: l opens the launcher, pick a recipe, b studies it "
                        "(or attach with sparktop --study ID).", title="Study")
            return
        if isinstance(self.screen, StudyScreen) and self.screen.run is self._study:
            return
        self.push_screen(StudyScreen(self._study))

    def on_study_plan_requested(self, message: StudyPlanRequested) -> None:
        from sparktop.study.planning import choose_topologies
        from sparktop.ui.study import StudyPlanScreen

        if self._study is not None and self._study.running:
            self.notify("A study is running already: here it is.", title="Study")
            self.action_study()
            return
        if self.launcher is None:
            return
        if self.launcher.busy:
            self.notify("A launch is under way: a study launches each topology itself; stop it first.",
                        title="cannot study", severity="error")
            return
        try:
            topologies = choose_topologies(message.recipe, "all", len(self.launcher.inventory.nodes))
        except SparktopError as exc:
            self.notify(str(exc), title="cannot study", severity="error")
            return
        self.push_screen(StudyPlanScreen(message.recipe, self.launcher.inventory, topologies, message.overrides,
                                         message.port))

    def on_study_requested(self, message: StudyRequested) -> None:
        from sparktop.launch.executor import DEFAULT_TIMEOUT
        from sparktop.study.runner import StudyRunner
        from sparktop.ui.launcher import LaunchScreen
        from sparktop.ui.study import StudyRun, StudyScreen

        launcher = self.launcher
        if launcher is None:
            return
        if (self._study is not None and self._study.running) or launcher.busy:
            self.notify("A study or a launch is under way.", title="cannot study", severity="error")
            return
        study = message.study
        try:
            study.save()
        except OSError as exc:
            self.notify(f"{study.dir}: {exc}", title="cannot study", severity="error")
            return
        inventory = launcher.inventory
        # The launcher's connections, one per node, shared: the runner closes only what it opened.
        runner = StudyRunner(study, message.recipe, inventory, timeout=self.launch_timeout or DEFAULT_TIMEOUT,
                             port=message.port, transports=launcher.transports([n.name for n in inventory.nodes]))
        run = StudyRun(study, message.estimates)
        self._study, self._study_runner, self._quit_after_study = run, runner, False
        if isinstance(self.screen, LaunchScreen):
            self.pop_screen()  # the launcher that asked
        self.push_screen(StudyScreen(run))
        self._start_study(run, runner.events())

    def _attach_study(self, study_dir: Path) -> None:
        """Follow a study another process runs (or ran), from its files."""
        from sparktop.study.follow import follow
        from sparktop.study.state import load_study
        from sparktop.ui.study import StudyRun, StudyScreen

        try:
            study = load_study(study_dir)
        except SparktopError as exc:
            self.notify(str(exc), title="Study", severity="error")
            return
        run = StudyRun(study, attached=True)
        self._study = run
        self.push_screen(StudyScreen(run))
        self._start_study(run, follow(study.dir))

    def _start_study(self, run: StudyRun, events: AsyncIterator[StudyEvent]) -> None:
        self._study_task_cancelled = False
        # An app worker: the study goes on when its screen is closed.
        self.run_worker(self._study_work(run, events), group="study", name="study", exclusive=True)

    async def _study_work(self, run: StudyRun, events: AsyncIterator[StudyEvent]) -> None:
        # The study's events are read by a task of their own that is cancelled
        # once only: a second cancellation (the app quitting while a cancelled
        # study removes its containers) would cut that cleanup short.
        task = asyncio.ensure_future(self._follow_study(run, events))
        self._study_task = task
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            self._cancel_study_task()
            raise

    def _cancel_study_task(self) -> None:
        if self._study_task is not None and not self._study_task_cancelled:
            self._study_task_cancelled = True
            self._study_task.cancel()

    async def _follow_study(self, run: StudyRun, events: AsyncIterator[StudyEvent]) -> None:
        try:
            async for event in events:
                run.apply(event)
                self.post_message(StudyProgress(event, run))
            if not run.attached and run.study.status == "done":
                await self._write_study_report(run)
        except asyncio.CancelledError:
            if run.running:
                run.finish(run.study.status if run.study.status in ("cancelled", "interrupted")
                           else "interrupted", run.study if not run.attached else None)
            raise
        except Exception as exc:  # a study must never take the app down; what it started is already removed
            run.fail(f"{type(exc).__name__}: {exc}")
            self.notify(run.error or "", title="study stopped", severity="error", timeout=15)
        finally:
            if run.running:
                run.finish("interrupted")  # the events ended without saying how
            if self.is_running:
                self.post_message(StudyProgress(None, run))  # how it ended, wherever the user is
                if self._quit_after_study:
                    self.exit()

    async def _write_study_report(self, run: StudyRun) -> None:
        """The report, as `sparktop study` writes it at the end (charts take a moment: off the loop)."""
        from sparktop.study import report

        try:
            paths = await asyncio.to_thread(report.write_all, run.study)
        except Exception as exc:  # noqa: BLE001 - the measurements are on disk; the report can be redone
            self.notify(f"the report could not be written ({type(exc).__name__}: {exc}); run "
                        f"`sparktop report {run.study.id}`", title="Study", severity="warning", timeout=15)
            return
        self.notify(f"report: {paths[-1]}", title="Study done", timeout=15)

    def on_study_progress(self, message: StudyProgress) -> None:
        from sparktop.ui.study import StudyScreen

        if isinstance(message.event, LaunchUpdate):
            self._containers_changed(message.event.event)

        for screen in self.screen_stack:
            if isinstance(screen, StudyScreen):
                screen.post_message(StudyProgress(message.event, message.run))
        if not message.run.running:
            self._notice_study(message.run)
            self._paint(force=True)
        else:
            self._schedule_paint()  # the status line's stage moves on

    def _notice_study(self, run: StudyRun) -> None:
        from sparktop.ui.study import StudyScreen

        if id(run) in self._notified:
            return
        self._notified.add(id(run))
        if isinstance(self.screen, StudyScreen):
            return  # the user is watching it
        self.notify(run.outcome().plain + " (y shows it)", title=f"study {run.status}",
                    severity="information" if run.status == "done" else "warning", timeout=15)

    def on_study_seen(self, message: StudySeen) -> None:
        if not message.run.running:
            self._study_seen.add(id(message.run))

    def on_study_cancel_requested(self, message: StudyCancelRequested) -> None:
        run = message.run
        if run is not self._study or run.attached or not run.running:
            if message.then_quit:
                self.exit()
            return
        self._quit_after_study = self._quit_after_study or message.then_quit
        if run.cancelling:
            return
        run.cancelling = True
        if self._study_runner is not None:
            self._study_runner.cancel()  # the user's: the study ends `cancelled`, not `interrupted`
        self.workers.cancel_group(self, "study")
        self.notify("Cancelling the study: stopping what runs and checking every node…", title="Study")
        self.post_message(StudyProgress(None, run))  # its screen says it is cancelling

    async def action_quit(self) -> None:
        from sparktop.ui.study import ConfirmCancelStudy

        run = self._study
        if run is not None and run.running and not run.attached:
            if run.cancelling:
                self._quit_after_study = True
                self.notify("Quitting once the study's containers are removed.", title="Study")
                return
            self.push_screen(ConfirmCancelStudy(run, then_quit=True))
            return
        self.exit()
