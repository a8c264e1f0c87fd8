"""The event log: which snapshot sequences give which notices, once each;
a recording keeps them and a replay shows them; the energy price setting."""

from __future__ import annotations

from collections import deque

import pytest

from sparktop.errors import ConfigError
from sparktop.observe.hang import HangWatch
from sparktop.observe.notices import NoticeDetector
from sparktop.observe.record import Recorder, Recording, decode
from sparktop.observe.snapshot import GIB, EngineGone, EngineSnapshot, Memory, NodeSnapshot, Notice
from sparktop.observe.state import ClusterState
from sparktop.settings import load_preferences

URL = "http://spark-a:8000"


def engine(t: float, state: str = "ready", **figures) -> EngineSnapshot:
    return EngineSnapshot(key=URL, url=URL, t=t, state=state, **figures)


def kinds(detector: NoticeDetector, snaps) -> list[str]:
    out = []
    for s in snaps:
        out += [n.kind for n in (detector.engine(s) if isinstance(s, EngineSnapshot) else detector.node(s))]
    return out


def test_kv_above_90_is_said_once_until_it_clearly_falls():
    d = NoticeDetector()
    usage = [0.5, 0.91, 0.95, 0.89, 0.92, 0.80, 0.93]
    assert kinds(d, [engine(i, kv_usage=u) for i, u in enumerate(usage)]) == ["kv_high", "kv_high"]


def test_preemptions_are_news_after_a_quiet_half_minute():
    d = NoticeDetector()
    counts = [(0, 0), (1, 5), (2, 9), (20, 12), (60, 12), (95, 20), (96, 30)]
    assert kinds(d, [engine(t, preemptions=n) for t, n in counts]) == ["preempting", "preempting"]


def test_down_back_and_restart_only_for_an_engine_that_was_serving():
    d = NoticeDetector()
    snaps = [engine(0, "connecting"), engine(1, "unreachable", reason="refused"),  # never up: nothing
             engine(2, started_at=100.0), engine(3, "stale"), engine(4, started_at=100.0),  # a blip: nothing
             engine(5, "unreachable", reason="connection refused"), engine(9, started_at=108.0)]
    assert kinds(d, snaps) == ["down", "back", "restarted"]


def test_an_engine_that_comes_back_through_a_new_start_is_back_and_restarted():
    d = NoticeDetector()
    snaps = [engine(0, started_at=100.0), engine(5, "unreachable", reason="container exited (137)"),
             engine(8, "starting", stage="loading weights"), engine(20, started_at=112.0)]
    assert kinds(d, snaps) == ["down", "back", "restarted"]


def test_a_failed_engine_says_why_and_a_starting_one_says_ready():
    d = NoticeDetector()
    got = []
    for s in [engine(0, "starting", stage="loading weights"), engine(1), engine(2, "failed", error="CUDA error: OOM")]:
        got += d.engine(s)
    assert [n.kind for n in got] == ["ready", "down"]
    assert "CUDA error: OOM" in got[1].text and got[1].level == "error"


def test_queue_waits_and_rejections_are_said_when_they_start():
    d = NoticeDetector()
    snaps = [engine(0, queue_slow=0), engine(1, queue_slow=3, latency={"queue": {"p95": 7.2}}), engine(2, queue_slow=1),
             engine(3, queue_slow=0, rejection_rate=2.0, rejections_by_reason={"max_num_queued_reqs": 4.0}),
             engine(4, rejection_rate=0.0, rejections_recent=4.0), engine(5, rejection_rate=1.0)]
    got = []
    for s in snaps:
        got += d.engine(s)
    assert [n.kind for n in got] == ["queue_slow", "rejecting"]
    assert "3 requests waited over 5 s" in got[0].text and "7.2 s" in got[0].text
    assert "max_num_queued_reqs" in got[1].text


def node(t: float, state: str = "ok", available_gib: float = 60.0) -> NodeSnapshot:
    return NodeSnapshot(name="spark-a", t=t, state=state,
                        memory=Memory(total=int(119.7 * GIB), available=int(available_gib * GIB)))


def test_a_node_lost_and_back_and_its_memory_low_and_recovered():
    d = NoticeDetector()
    snaps = [node(0), node(1, "stale"), node(2, "down"), node(3, "down"), node(4), node(5, available_gib=9.0),
             node(6, available_gib=11.0), node(7, available_gib=30.0)]
    assert kinds(d, snaps) == ["node_lost", "node_back", "memory_low", "memory_ok"]


def test_an_engine_removed_after_serving_is_gone():
    d = NoticeDetector()
    d.engine(engine(0))
    assert [n.kind for n in d.gone(EngineGone(URL), t=5.0)] == ["gone"]
    assert d.gone(EngineGone("http://never:8000")) == []


def test_a_recording_keeps_the_notices_and_replay_puts_them_in_the_log(tmp_path):
    path = tmp_path / "session.jsonl"
    recorder = Recorder(path, interval=1.0)
    d = NoticeDetector()
    for s in [engine(100.0, kv_usage=0.5), engine(101.0, kv_usage=0.97)]:
        recorder.write(s)
        for n in d.engine(s):
            recorder.write(n)
    recorder.close()
    recording = Recording.load(path)
    state = ClusterState()
    for _, event in recording.rows:
        state.apply(event)
    (notice,) = state.log(URL)
    assert isinstance(notice, Notice) and notice.kind == "kv_high" and notice.t == 101.0
    assert state.last_notice(URL, now=150.0) is notice and state.last_notice(URL, now=400.0) is None
    assert decode({"t": 1.0, "notice": notice.to_dict()}) == notice


def test_the_energy_price_comes_from_settings_yaml(tmp_path, monkeypatch):
    path = tmp_path / "settings.yaml"
    path.write_text("energy_price_per_kwh: 0.32\ncurrency: EUR\n")
    monkeypatch.setenv("SPARKTOP_SETTINGS", str(path))
    prefs = load_preferences()
    assert prefs.energy_price_per_kwh == 0.32 and prefs.money(0.0712) == "0.0712 EUR"
    path.write_text("currency: EUR\nenergy_price_per_kwh: cheap\n")
    with pytest.raises(ConfigError, match=r"settings.yaml:2: energy_price_per_kwh: must be a price"):
        load_preferences()
    path.write_text("energy_price: 0.3\n")
    with pytest.raises(ConfigError, match=r"settings.yaml:1: energy_price: unknown key; did you mean"):
        load_preferences()


def test_the_monitors_windows_come_from_settings_yaml(tmp_path, monkeypatch):
    path = tmp_path / "settings.yaml"
    monkeypatch.setenv("SPARKTOP_SETTINGS", str(path))
    assert (load_preferences().rate_window_s, load_preferences().latency_window_s) == (10.0, 60.0)
    path.write_text("rate_window_s: 30\nlatency_window_s: 300\n")
    assert (load_preferences().rate_window_s, load_preferences().latency_window_s) == (30.0, 300.0)
    path.write_text("currency: EUR\nrate_window_s: 0.2\n")
    with pytest.raises(ConfigError, match=r"settings.yaml:2: rate_window_s: must be a number of seconds from 1"):
        load_preferences()
    path.write_text("latency_window_s: a minute\n")
    with pytest.raises(ConfigError, match=r"settings.yaml:1: latency_window_s: must be a number of seconds"):
        load_preferences()


def test_a_hung_engine_is_said_once_and_cleared_when_tokens_flow():
    d = NoticeDetector()
    reason = "no tokens for 31 s with 3 requests waiting (3 running)"
    snaps = [engine(0), engine(1, "hung", reason=reason), engine(2, "hung", reason=reason), engine(3, "stale"),
             engine(4, "hung", reason=reason), engine(5)]
    got = []
    for s in snaps:
        got += d.engine(s)
    assert [(n.kind, n.level, n.text) for n in got] == [
        ("hung", "error", f"engine hung: {reason}"),
        ("hung_cleared", "info", "engine no longer hung: tokens flow again")]


def test_a_hung_engine_restarted_is_down_back_restarted_then_cleared():
    d = NoticeDetector()
    snaps = [engine(0, started_at=100.0), engine(40, "hung", reason="no tokens for 31 s with 1 request waiting",
                                                  started_at=100.0),
             engine(42, "unreachable", reason="connection refused"), engine(50, "starting", stage="loading weights"),
             engine(60, started_at=155.0)]
    assert kinds(d, snaps) == ["hung", "down", "back", "restarted", "hung_cleared"]
    assert d.engines[URL].restarts == deque([50])  # one start, counted once (seen starting, then its counters)


def test_an_engine_that_keeps_restarting_is_a_restart_loop_said_once():
    d = NoticeDetector()
    snaps = [engine(0, started_at=0.0)]
    for k in range(1, 6):  # a start every 100 s, seen through its log or only through its counters
        t = 100.0 * k
        snaps += [engine(t, "unreachable", reason="container exited (1)"), engine(t + 10, "starting")] if k % 2 else []
        snaps += [engine(t + 20, started_at=t + 15)]
    got = kinds(d, snaps)
    assert got.count("restarted") == 5 and got.count("restart_loop") == 1, got
    # Quiet for longer than the window, then one more start: not a loop.
    assert "restart_loop" not in kinds(d, [engine(5000, started_at=4990.0)])


def test_a_start_up_crash_loop_is_a_restart_loop_though_it_never_served():
    d = NoticeDetector()
    snaps = [engine(0, "connecting"), engine(1, "starting")]
    for t in (10, 20, 30):
        snaps += [engine(t, "unreachable", reason="container exited (1)"), engine(t + 1, "starting")]
    assert kinds(d, snaps) == ["restart_loop"]


def test_the_hang_watch_needs_requests_waiting_and_counters_that_stand_still():
    w = HangWatch(after=30)

    def read(t, gen, running=0.0, waiting=0.0, **kw):
        return w.judge(engine(t, gen_tokens_total=gen, prompt_tokens_total=0.0, running=running, waiting=waiting,
                              **kw), t)

    assert read(0, 100) is None  # idle
    assert read(40, 100) is None  # idle for long: nothing is late
    assert read(41, 100, running=2) is None  # requests now: the count starts here
    assert read(70, 100, running=2) is None  # 29 s
    assert read(71, 100, running=2, waiting=1) == "no tokens for 30 s with 3 requests waiting (2 running, 1 queued)"
    assert read(72, 105, running=2) is None  # a token: not hung
    assert read(150, 105, waiting=1) == "no tokens for 78 s with 1 request waiting (1 queued)"
    assert read(151, 105, waiting=1, state="sleeping") is None  # asleep on purpose
    assert read(152, 105, waiting=1) is None  # judged afresh
    # Prompt tokens are progress too (a long prefill makes no token of output for a while).
    w.reset()
    assert read(0, 100, running=1) is None
    assert w.judge(engine(45, gen_tokens_total=100.0, prompt_tokens_total=8192.0, running=1.0, waiting=0.0), 45) is None
    # An engine that exports no token counter, a router, or a watch told never: never hung.
    assert HangWatch(after=30).judge(engine(0, running=3.0), 0) is None
    never = HangWatch(after=None)
    for t in (0, 100):
        assert never.judge(engine(t, gen_tokens_total=1.0, running=3.0), t) is None
    router = HangWatch(after=30)
    for t in (0, 100):
        assert router.judge(engine(t, gen_tokens_total=1.0, running=3.0, kind="router"), t) is None


def test_a_notice_keeps_its_lines_through_a_recording():
    n = Notice(1.0, "engine", URL, "watchdog_restart", "warn", "restarting", lines=["a", "b"])
    assert Notice.from_dict(n.to_dict()) == n
    plain = Notice(1.0, "engine", URL, "hung", "error", "engine hung")
    assert "lines" not in plain.to_dict() and Notice.from_dict(plain.to_dict()) == plain


def test_a_restarted_containers_log_is_read_from_its_latest_start():
    from sparktop.observe.engine_log import latest_run, runtime_failure, startup_state

    earlier = ["(APIServer pid=1) INFO 11-29 07:36:40 [utils.py:233] non-default args: {}",
               "(APIServer pid=1) INFO:     Application startup complete.",
               "(EngineCore pid=1) ERROR 11-29 07:37:02 [core.py:1] EngineCore encountered a fatal error.",
               "Traceback (most recent call last):", "RuntimeError: the head node went away"]
    latest = ["(APIServer pid=2) INFO 11-29 07:37:08 [utils.py:233] non-default args: {}",
              "(EngineCore pid=2) INFO 11-29 07:37:08 [gpu_model_runner.py:1] Starting to load model x..."]
    log = earlier + latest
    assert latest_run(log) == latest
    assert runtime_failure(latest_run(log)) is None and runtime_failure(log) is not None
    state = startup_state(latest_run(log))
    assert (state.stage, state.failed) == ("loading weights", False)
    tail = earlier[1:]  # no start in it: all of it, the very list
    assert latest_run(tail) is tail
