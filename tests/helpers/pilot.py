"""Waiting in Pilot tests for what a user would wait to see."""

from __future__ import annotations


async def until(pilot, predicate, timeout: float = 15.0, step: float = 0.2) -> None:
    waited = 0.0
    while not predicate():
        if waited >= timeout:
            raise AssertionError("condition not met in time")
        await pilot.pause(step)
        waited += step
