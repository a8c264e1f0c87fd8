"""Waiting in Pilot tests for what a user would wait to see."""

from __future__ import annotations


async def until(pilot, predicate, timeout: float = 15.0, step: float = 0.2, what=None) -> None:
    """Pause until `predicate()`; `what` (a text, or a callable giving one when it fails: the state
    that was wrong) says what was waited for."""
    waited = 0.0
    while not predicate():
        if waited >= timeout:
            said = what() if callable(what) else what
            raise AssertionError(f"{said or 'condition'} not met in {timeout:g} s")
        await pilot.pause(step)
        waited += step


async def open_launcher(pilot, recipe: str):
    """`l`, then down the recipe list to `recipe`, as a user would: the launcher screen."""
    from textual.widgets import DataTable

    from sparktop.ui.launcher import LaunchScreen

    await pilot.press("l")
    await until(pilot, lambda: isinstance(pilot.app.screen, LaunchScreen), timeout=30)
    screen = pilot.app.screen
    table = screen.query_one("#recipes", DataTable)
    rows = [row.key.value for row in table.ordered_rows]
    for _ in range(rows.index(recipe)):
        await pilot.press("down")
    await until(pilot, lambda: screen.recipe is not None and screen.recipe.id == recipe, timeout=30)
    return screen
