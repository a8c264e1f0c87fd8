"""Tolerances for figures that real CPU time reaches: a first token waits for work no virtual clock counts."""

from __future__ import annotations


def first_token_tolerance(ttft_ms: float, fixed_ms: float, share: float = 0.05) -> float:
    """How far a TTFT (or the prefill rate read from it) may sit from its reference: `share` of it, or
    `fixed_ms` of per-request work outside the measured path, whichever is larger."""
    return max(share, fixed_ms / ttft_ms)
