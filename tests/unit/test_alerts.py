"""Alerts fire once when a condition has held, resolve once when it has gone, on the snapshots' own clock."""

from __future__ import annotations

from sparktop.observe.alerts import FIRE, RESOLVE, AlertWatch
from sparktop.observe.snapshot import EngineSnapshot, Gpu, Memory, NodeSnapshot
from sparktop.observe.state import ClusterState

GIB = 2**30


def node(t: float, state: str = "ok", avail_gib: float = 60.0, throttle: list[str] | None = None) -> NodeSnapshot:
    return NodeSnapshot(name="spark-a", t=t, state=state, reason=None if state == "ok" else "ssh: timed out",
                        memory=Memory(total=int(120 * GIB), available=int(avail_gib * GIB)),
                        gpu=Gpu(util=90, throttle=throttle))


def engine(t: float, state: str = "ready", **figures) -> EngineSnapshot:
    return EngineSnapshot(key="http://127.0.0.2:8000", url="http://127.0.0.2:8000", t=t, state=state,
                          model="gpt-oss-120b", **figures)


def run(events, watch: AlertWatch | None = None):
    """Apply `events` in turn; every alert notice raised, as (t, kind, first word of its text)."""
    state, watch = ClusterState(), watch or AlertWatch()
    out = []
    for event in events:
        state.apply(event)
        out += [(n.t, n.kind, n.text.split(" ")[0]) for n in watch.check(state)]
    return out


def test_a_node_lost_fires_after_it_has_held_and_resolves_once_back_for_a_while():
    events = [node(0)] + [node(t, "down") for t in range(1, 45)] + [node(t) for t in range(45, 90)]
    assert run(events) == [(31, FIRE, "node_lost"), (75, RESOLVE, "node_lost")]


def test_a_blip_shorter_than_the_hold_sends_nothing_and_a_hovering_figure_sends_one_message():
    blip = [node(0)] + [node(t, "down") for t in range(1, 20)] + [node(t) for t in range(20, 60)]
    assert run(blip) == []
    # Memory under 20 % for a minute, then hovering about it for five: one alert, not one per crossing.
    low = [node(t, avail_gib=23.0) for t in range(0, 60)]
    hovering = [node(t, avail_gib=23.0 if t % 20 < 10 else 25.0) for t in range(60, 360)]
    assert run(low + hovering) == [(30, FIRE, "memory_low")]


def test_memory_escalates_from_low_to_critical_as_the_card_does():
    events = [node(t, avail_gib=20.0) for t in range(0, 40)] + [node(t, avail_gib=10.0) for t in range(40, 60)]
    assert run(events) == [(30, FIRE, "memory_low"), (50, FIRE, "memory_critical")]


def test_an_engine_down_then_back_and_a_hung_one_at_once():
    down = [engine(t) for t in range(0, 5)] + [engine(t, "unreachable", reason="connection refused")
                                               for t in range(5, 50)] + [engine(t) for t in range(50, 90)]
    assert run(down) == [(35, FIRE, "engine_down"), (80, RESOLVE, "engine_down")]
    hung = [engine(0), engine(1, "hung", reason="no tokens for 45 s with 3 requests waiting"), engine(2, "hung")]
    assert run(hung) == [(1, FIRE, "engine_hung")]


def test_preemptions_that_go_on_for_a_minute_fire_and_stop_when_they_stop():
    growing = [engine(t, preemptions=float(t // 5)) for t in range(0, 100)]
    quiet = [engine(t, preemptions=19.0) for t in range(100, 250)]
    alerts = run(growing + quiet)
    assert [(kind, name) for _, kind, name in alerts] == [(FIRE, "preempting"), (RESOLVE, "preempting")]
    assert alerts[0][0] == 65 and alerts[1][0] > 160


def test_the_collectors_history_pause_is_an_alert_and_its_end_resolves_it():
    state, watch = ClusterState(), AlertWatch()
    state.apply(node(0))
    watch.history("disk full (No space left on device)", 0)
    fired = watch.check(state)
    assert [(n.kind, n.text) for n in fired] == [(FIRE, "history_paused [warning]: history paused: disk full "
                                                        "(No space left on device)")]
    for t in range(1, 40):
        watch.history(None, t)
        state.apply(node(t))
        fired = watch.check(state)
        if fired:
            break
    assert [n.kind for n in fired] == [RESOLVE] and t == 31  # 30 s after the first poll that wrote again


def replica(n: int, t: float, ttft_p95: float, finished: float, kv: float = 0.3) -> EngineSnapshot:
    return EngineSnapshot(key=f"http://127.0.0.{n}:8000", url=f"http://127.0.0.{n}:8000", t=t, state="ready",
                          model="gpt-oss-120b", topology="2x tp=2", ttft_p95=ttft_p95, itl_p95=0.02,
                          finished_rate=finished, kv_usage=kv)


def test_a_replica_that_lags_the_others_is_named_with_why_and_its_share_of_the_requests():
    from sparktop.observe.replicas import groups, replicas

    ones = [replica(2, 0, 0.4, 3.0), replica(4, 0, 1.3, 1.0)]
    (group,) = groups(ones).values()
    shares = {r.key: (r.share, r.lagging) for r in replicas(group)}
    assert shares == {"http://127.0.0.2:8000": (0.75, None),
                      "http://127.0.0.4:8000": (0.25, "TTFT p95 1300 ms, 3.2× the other replicas'")}
    events = [e for t in range(0, 130) for e in (replica(2, t, 0.4, 3.0), replica(4, t, 1.3, 1.0))]
    assert run(events) == [(120, FIRE, "replica_lagging")]
    # Two solo engines are not replicas of one layout: nothing to compare.
    assert groups([engine(0), engine(0)]) == {}
