"""What a simulated twin did, step by step, and what its model says a request takes: the figures the sweep
tests hold a sweep on simulated time (tests/helpers/simulated.py) to, exactly.

`record_steps(server)` keeps every engine step of an in-process twin as its scheduler reports it to the
metrics (the tokens the step generated, the requests running and waiting after it, the KV cache's use), the
numbers `/metrics` publishes, one step at a time instead of a gauge sampled now and then.
`modeled_ttft(server, prompt, cached)` is a lone request's first token as the twin's model times it: the API
server's per-request cost and one prefill step of the tokens not in the prefix cache."""

from __future__ import annotations

from dataclasses import dataclass

from sparktop.twin.server import TwinServer


@dataclass(frozen=True)
class Step:
    generation_tokens: int  # tokens the step generated (one per sequence that decoded or finished its prefill)
    running: int  # after the step
    waiting: int
    kv_usage: float
    iteration_tokens: int  # tokens the step computed: prefill chunks and decodes


def record_steps(server: TwinServer) -> list[Step]:
    """Every step the twin's engine takes from now on, appended as it is taken."""
    engine = server.engine
    assert engine is not None, "the twin has not started"
    steps: list[Step] = []
    sink = engine.metrics
    publish = sink.on_step

    def on_step(**figures) -> None:
        steps.append(Step(figures["generation_tokens"], figures["running"], figures["waiting"],
                          figures["kv_usage"], figures["iteration_tokens"]))
        publish(**figures)

    sink.on_step = on_step  # type: ignore[method-assign]  # the sink the engine reports to, on this twin only
    return steps


def modeled_ttft(server: TwinServer, prompt_tokens: int, cached_tokens: int = 0) -> float:
    """Seconds from a lone request's arrival to its first token, as the twin's model times it (a prompt that
    fits one prefill chunk): the API server's cost, then the step that prefills what the cache did not hold."""
    assert server.plan is not None, "the twin has not started"
    perf = server.plan.perf
    prefill = perf.step_time([], [(prompt_tokens - cached_tokens, cached_tokens)])
    return (perf.k.request_overhead_s + prefill) / server.speed
