"""The messages of the app, and the one adapter from core events to them.

Core operations (the poller, a launch, a sweep, a study) are async iterators of
plain events. A worker reads one and `pump()`s each event into a message
for the widget that follows it; screens react to these messages and never
poll a state or call into the app: what a screen asks of the app (stop a
launch, paint me now, I have seen this launch's end) goes up as a message
too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, TypeVar

from rich.text import Text
from textual.message import Message
from textual.message_pump import MessagePump

from sparktop.bench.events import SweepEvent
from sparktop.launch.events import LaunchEvent
from sparktop.study.events import StudyEvent

if TYPE_CHECKING:
    from sparktop.launch.plan import Plan
    from sparktop.launch.recipe import Recipe
    from sparktop.launch.session import LaunchRun
    from sparktop.observe.state import ClusterState
    from sparktop.study.planning import Estimate
    from sparktop.study.state import Study
    from sparktop.ui.study import StudyRun

E = TypeVar("E")


async def pump(events: AsyncIterator[E], target: MessagePump, wrap: Callable[[E], Message]) -> None:
    """Post every event of `events` to `target` as the message `wrap` makes."""
    async for event in events:
        target.post_message(wrap(event))


# -- from the core, down to screens ---------------------------------------------


class StateChanged(Message, bubble=False):
    """The cluster state moved on (or the status line changed): repaint."""

    def __init__(self, state: ClusterState, status: Text) -> None:
        super().__init__()
        self.state = state
        self.status = status


class LaunchProgress(Message, bubble=False):
    """One event of the launch under way (`launch.events`)."""

    def __init__(self, event: LaunchEvent, run: LaunchRun) -> None:
        super().__init__()
        self.event = event
        self.run = run


class SweepProgress(Message, bubble=False):
    """One event of the sweep under way (`bench.events`)."""

    def __init__(self, event: SweepEvent) -> None:
        super().__init__()
        self.event = event


class StudyProgress(Message, bubble=False):
    """One event of the study the app runs or follows (`study.events`),
    already folded into `run`; None when only the fold changed (cancelling,
    or the events ended)."""

    def __init__(self, event: StudyEvent | None, run: StudyRun) -> None:
        super().__init__()
        self.event = event
        self.run = run


# -- from screens, up to the app --------------------------------------------------


class RepaintRequested(Message):
    """A screen just showed: paint it from the state now, not at the next event."""


class LaunchRequested(Message):
    """Start this plan (preflight passed) and show its progress."""

    def __init__(self, plan: Plan) -> None:
        super().__init__()
        self.plan = plan


class StopRequested(Message):
    """Tear these launches down on every node."""

    def __init__(self, launch_ids: list[str]) -> None:
        super().__init__()
        self.launch_ids = launch_ids


class LaunchSeen(Message):
    """The user has seen how this launch ended (no reminder in the status line)."""

    def __init__(self, run: LaunchRun) -> None:
        super().__init__()
        self.run = run


class StudyPlanRequested(Message):
    """`b` on the launcher: study this recipe (ask first), or show the study under way."""

    def __init__(self, recipe: Recipe, overrides: dict, port: int | None) -> None:
        super().__init__()
        self.recipe = recipe
        self.overrides = overrides
        self.port = port


class StudyRequested(Message):
    """Start this planned study (confirmed) and show it."""

    def __init__(self, study: Study, recipe: Recipe, estimates: dict[str, Estimate | None],
                 port: int | None = None) -> None:
        super().__init__()
        self.study = study
        self.recipe = recipe
        self.estimates = estimates
        self.port = port


class StudyCancelRequested(Message):
    """Cancel the study this app runs (confirmed): what runs is removed, what was measured is kept."""

    def __init__(self, run: StudyRun, then_quit: bool = False) -> None:
        super().__init__()
        self.run = run
        self.then_quit = then_quit


class StudySeen(Message):
    """The user has seen how this study ended (no reminder in the status line)."""

    def __init__(self, run: StudyRun) -> None:
        super().__init__()
        self.run = run
