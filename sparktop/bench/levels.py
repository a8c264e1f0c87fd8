"""The sweep's levels as they are typed (`-c 1,2,4,8`, `--depth 0,4096`), parsed.

Apart from `sweep` so that what only parses them (`sparktop predict`, the
study's form) does not import the sweep's HTTP client (aiohttp: a quarter
of a second).
"""

from __future__ import annotations

from sparktop.errors import SparktopError


class SweepError(SparktopError):
    """The sweep cannot start (endpoint, model, settings)."""


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise SweepError(f"-c {text!r}: expected concurrency levels like 1,2,4,8") from None
    if not levels or any(c < 1 for c in levels):
        raise SweepError(f"-c {text!r}: levels must be positive integers")
    return levels


def parse_depths(text: str | int) -> list[int]:
    """`--depth 0,4096,16384`: context tokens before the prompt, one level set per depth."""
    try:
        depths = [int(x) for x in str(text).replace(",", " ").split()]
    except ValueError:
        raise SweepError(f"--depth {text!r}: expected token counts like 0,4096,16384") from None
    if not depths or any(d < 0 for d in depths):
        raise SweepError(f"--depth {text!r}: depths are token counts, 0 or more")
    return list(dict.fromkeys(depths))
