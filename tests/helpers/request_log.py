"""What the twin's server saw of each request (`--request-log`), grouped as a
benchmark client sent them: the reference a client's first-token clock is
held to, since two clients on one busy 2-core machine differ by their own
work per request (tens of ms) more than by how they define a TTFT.

A client sends a level's batch, waits for all of it, then sends the next:
a request received after every request of the current batch had its last
chunk sent starts the next batch (`last_sent` is taken before that chunk
goes out). A sweep that measures a level again (sparktop's re-measuring of
a disturbed level) would add batches: the tests turn it off. A level is the run of batches of its size whose
prompts are its depth plus the prompt length; a context-load batch
(depth plus a short question) is not one of them, and a warm-up batch,
shaped as the level's, is its first when there is one more than the runs."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.scraper import scrape


@dataclass(frozen=True)
class Served:
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    received: float
    arrival: float
    first_token: float
    first_sent: float
    last_sent: float

    @property
    def ttft_ms(self) -> float:
        """Handler begun to first token written (the body read and tokenized in between): the first token as
        the server delivered it."""
        return (self.first_sent - self.received) * 1000

    @property
    def engine_ms(self) -> float:
        """Arrival at the engine (tokenized) to the end of the step that made the first token: the engine's
        part, without the API server's CPU time around it (wall clock: the twin sleeps its modeled steps in
        real time, and a busy CPU makes them late)."""
        return (self.first_token - self.arrival) * 1000


class RequestLog:
    """The twin's request log, read from where the previous `new()` stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def new(self, url: str, timeout: float = 60.0) -> list[Served]:
        """The requests served since the last call (one client's run). The twin writes a request's line after
        its last chunk, which the client may have read first: this waits until the log has a line for every
        request the twin at `url` counts finished (`vllm:request_success_total`, every reason), failing after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while (lines := self._lines()) < (done := finished(url)):
            if time.monotonic() > deadline:
                raise AssertionError(f"the request log has {lines} lines, the server finished {done:g} requests "
                                     f"({timeout:g} s)")
            time.sleep(0.05)
        if not self.path.exists():
            return []
        with self.path.open(encoding="utf-8") as f:
            f.seek(self._offset)
            text = f.read()
            self._offset = f.tell()
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [Served(r["prompt_tokens"], r["cached_tokens"], r["output_tokens"], r["received"], r["arrival"],
                       r["first_token"], r["first_sent"], r["last_sent"])
                for r in rows if r["stream"] and r["first_sent"] is not None and r["last_sent"] is not None]

    def _lines(self) -> int:
        """Whole lines written so far."""
        return self.path.read_bytes().count(b"\n") if self.path.exists() else 0


def finished(url: str) -> float:
    """Requests the server has finished, every reason (its /metrics)."""
    return scrape(url).get("vllm:request_success_total", 0.0)


def batches(served: list[Served]) -> list[list[Served]]:
    out: list[list[Served]] = []
    for r in sorted(served, key=lambda r: r.received):
        if out and r.received < max(x.last_sent for x in out[-1]):
            out[-1].append(r)
        else:
            out.append([r])
    return out


def levels(served: list[Served], keys: list[tuple[int, int]], pp: int,
           runs: int) -> dict[tuple[int, int], list[Served]]:
    """{(depth, concurrency): the measured requests}, the warm-up batch left out."""
    grouped = batches(served)
    out = {}
    for depth, c in keys:
        mine = [b for b in grouped if len(b) == c
                and abs(statistics.fmean(r.prompt_tokens for r in b) - (depth + pp)) <= 0.1 * pp]
        assert len(mine) in (runs, runs + 1), (
            f"d{depth} c{c}: {len(mine)} batches of {c} prompts of ~{depth + pp} tokens, not {runs} "
            f"(or {runs} and a warm-up); batch sizes seen: {[len(b) for b in grouped]}")
        out[(depth, c)] = [r for b in mine[len(mine) - runs:] for r in b]
    return out


def mean_ttft_ms(served: list[Served]) -> float:
    return statistics.fmean(r.ttft_ms for r in served)


def mean_engine_ms(served: list[Served]) -> float:
    return statistics.fmean(r.engine_ms for r in served)


def mean_step_ms(served: list[Served]) -> float:
    """The mean time between a request's tokens as the server sent them: one decode step."""
    return statistics.fmean((r.last_sent - r.first_sent) * 1000 / (r.output_tokens - 1)
                            for r in served if r.output_tokens > 1)
