"""Issue 37, journeys 3 and 4, as a new user met them: the demo's engines
stopped while the app watched, the app quit seconds later, `sparktop
history` read afterwards. Sessions end as what happened (stopped,
unreachable, the watch ended), never "serving" for engines nobody watches;
a session's tokens and its days' agree; a node without nvidia-smi has no
energy ("—"), not 0.0 Wh.

The writer is fed the poller's events on a hand clock (its own time is the
data's), as the app feeds it."""

from __future__ import annotations

import json
import re
import time

import pytest

from sparktop.cli import main
from sparktop.clock import Clock
from sparktop.history.query import HistoryReader
from sparktop.history.store import HistoryStore
from sparktop.history.writer import HistoryWriter
from sparktop.observe.snapshot import GIB, EngineGone, EngineSnapshot, Gpu, Memory, NodeSnapshot
from sparktop.observe.state import ClusterState

A, B = "http://127.0.0.2:8000", "http://127.0.0.3:8000"


class Feed:
    """The app's loop: poller events, `ClusterState.apply`, then the history writer; time is a hand clock."""

    def __init__(self, path, t0: float):
        self.t = t0
        clock = Clock(lambda: self.t, lambda: self.t, lambda: self.t)
        self.writer = HistoryWriter(HistoryStore.open(path), clock=clock)
        self.state = ClusterState(history=64)
        self.counters = {A: 0.0, B: 0.0}

    def send(self, event) -> None:
        self.state.apply(event)
        self.writer.observe(event, self.state)

    def node(self, name: str, power: float | None = 40.0) -> None:
        gpu = Gpu(name="NVIDIA GB10", util=50.0, temp=50.0, power=power) if power is not None else None
        self.send(NodeSnapshot(name=name, t=self.t, state="ok", gpu=gpu, cpu_pct=10.0,
                               memory=Memory(total=119 * GIB, available=60 * GIB, free=60 * GIB)))

    def engine(self, key: str, node: str, started: float, state: str = "ready", tps: float = 100.0) -> None:
        if state != "ready":
            self.send(EngineSnapshot(key=key, url=key, t=self.t, state=state, node=node, reason="connection refused",
                                     model="openai/gpt-oss-120b"))
            return
        self.send(EngineSnapshot(key=key, url=key, t=self.t, state="ready", node=node, model="openai/gpt-oss-120b",
                                 engine="vLLM", kind="vllm", gen_tps=tps, gen_tokens_total=self.counters[key],
                                 prompt_tokens_total=3 * self.counters[key], requests=self.counters[key] / 100,
                                 started_at=started, kv_usage=0.3, running=2.0, waiting=0.0))

    def serve(self, seconds: float, started: dict[str, float], nodes=("spark-a", "spark-b"),
              power: float | None = 40.0, step: float = 2.0) -> None:
        """Both engines serve 100 tokens/s, polled every `step` seconds."""
        end = self.t + seconds
        while self.t < end:
            self.t += step
            for name in nodes:
                self.node(name, power)
            for key, node in zip((A, B), nodes, strict=True):
                self.counters[key] += 100 * step
                self.engine(key, node, started[key])


def history(capsys, path, *args) -> dict:
    assert main(["history", "--file", str(path), "--since", "1d", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def table(capsys, path) -> str:
    assert main(["history", "--file", str(path), "--since", "1d"]) == 0
    return capsys.readouterr().out


@pytest.fixture
def t0() -> float:
    return (time.time() // 60) * 60 - 3600  # an hour ago, on a minute


def test_demo_stopped_while_the_app_watched_ends_its_sessions_stopped(tmp_path, capsys, t0):
    """`sparktop demo --stop` from another shell: the poller says the engines are gone; the user quits ~10 s
    later. History says when they stopped and that they did, not "serving"."""
    path = tmp_path / "h.sqlite"
    feed = Feed(path, t0)
    started = {A: t0 - 20, B: t0 - 20}
    feed.serve(120, started)
    last_answer = feed.t
    feed.t += 1
    feed.send(EngineGone(A))
    feed.send(EngineGone(B))
    for _ in range(5):  # "2 nodes · 0 engines" for ten seconds, then q
        feed.t += 2
        feed.node("spark-a")
        feed.node("spark-b")
    feed.writer.close()
    sessions = history(capsys, path)["sessions"]
    assert [(s["url"], s["open"], s["end_reason"]) for s in sessions] == [(A, False, "stopped"),
                                                                             (B, False, "stopped")]
    assert all(s["ended"] == last_answer for s in sessions)
    out = table(capsys, path)
    assert "serving" not in out.split("per day")[0].replace("serving sessions", "")


def test_engines_unreachable_when_the_app_quits_end_as_the_poller_said(tmp_path, capsys, t0):
    """Killed engines that the poller only saw stop answering (no container removed yet): the app quits
    within the session gap; their sessions end "unreachable" at their last answer."""
    path = tmp_path / "h.sqlite"
    feed = Feed(path, t0)
    started = {A: t0 - 20, B: t0 - 20}
    feed.serve(60, started)
    last_answer = feed.t
    for _ in range(5):
        feed.t += 2
        feed.engine(A, "spark-a", started[A], state="unreachable")
        feed.engine(B, "spark-b", started[B], state="unreachable")
    feed.writer.close()
    sessions = history(capsys, path)["sessions"]
    assert [(s["open"], s["end_reason"], s["ended"]) for s in sessions] == [(False, "unreachable", last_answer)] * 2


def test_quitting_while_engines_serve_says_the_watch_ended_and_the_next_watch_goes_on(tmp_path, capsys, t0):
    """The app quit with the engines still serving: "watch ended", not "serving"; the next sparktop on the
    same engine processes goes on with the same sessions (one row each)."""
    path = tmp_path / "h.sqlite"
    started = {A: t0 - 20, B: t0 - 20}
    feed = Feed(path, t0)
    feed.serve(60, started)
    feed.writer.close()
    first = history(capsys, path)["sessions"]
    assert [(s["open"], s["end_reason"]) for s in first] == [(False, "watch ended")] * 2
    # Back ten minutes later: the same processes (their start times), their counters went on.
    later = Feed(path, feed.t + 600)
    later.counters = {k: v + 60_000 for k, v in feed.counters.items()}
    later.serve(60, started)
    assert later.writer._sessions[A].id == first[0]["id"]  # the same session goes on
    later.writer.close()
    sessions = history(capsys, path)["sessions"]
    assert [s["id"] for s in sessions] == [s["id"] for s in first]
    assert all(s["end_reason"] == "watch ended" and s["ended"] == later.t for s in sessions)
    assert all(s["gen_tokens"] == later.counters[s["url"]] for s in sessions)  # all it served, since it started


def test_the_next_demo_does_not_call_stopped_engines_restarted(tmp_path, capsys, t0):
    """The first demo's engines were seen stopped; the next demo starts new engines on the same addresses.
    The first sessions stay "stopped" at their last answer; the new ones are new sessions."""
    path = tmp_path / "h.sqlite"
    first_start = {A: t0 - 20, B: t0 - 20}
    feed = Feed(path, t0)
    feed.serve(60, first_start)
    stopped_at = feed.t
    feed.t += 1
    feed.send(EngineGone(A))
    feed.send(EngineGone(B))
    feed.writer.close()
    t1 = feed.t + 1200
    second = Feed(path, t1)
    second.serve(60, {A: t1 - 10, B: t1 - 10})
    second.writer.close()
    sessions = history(capsys, path)["sessions"]
    assert [(s["end_reason"], s["ended"]) for s in sessions[:2]] == [("stopped", stopped_at)] * 2
    assert [s["end_reason"] for s in sessions[2:]] == ["watch ended"] * 2
    assert "restarted" not in {s["end_reason"] for s in sessions}


def test_engines_that_served_when_the_app_quit_and_are_new_next_time_are_not_called_restarted(tmp_path, capsys, t0):
    """Quitting the demo app ends its watch while the engines serve ("watch ended"), then tears the demo down
    with nobody watching; the next demo's engines are new processes. Nobody saw whether they stopped or
    restarted: the first sessions end "gone while sparktop was closed", at their last answer."""
    path = tmp_path / "h.sqlite"
    feed = Feed(path, t0)
    feed.serve(60, {A: t0 - 20, B: t0 - 20})
    last = feed.t
    feed.writer.close()
    t1 = feed.t + 600
    second = Feed(path, t1)
    second.serve(60, {A: t1 - 10, B: t1 - 10})
    second.writer.close()
    sessions = history(capsys, path)["sessions"]
    assert sorted((s["end_reason"], s["ended"]) for s in sessions[:2]) == [("gone while sparktop was closed", last)] * 2
    assert "restarted" not in {s["end_reason"] for s in sessions}


def test_a_restart_is_called_restarted_only_when_the_start_time_changed(tmp_path, capsys, t0):
    path = tmp_path / "h.sqlite"
    feed = Feed(path, t0)
    feed.serve(60, {A: t0 - 20, B: t0 - 20})
    feed.counters[A] = 0.0  # A restarts: a new process, its counters from zero
    feed.serve(60, {A: feed.t + 1, B: t0 - 20})
    feed.writer.close()
    sessions = history(capsys, path, "--engine", "127.0.0.2")["sessions"]
    assert [s["end_reason"] for s in sessions] == ["restarted", "watch ended"]
    other = history(capsys, path, "--engine", "127.0.0.3")["sessions"]
    assert [s["end_reason"] for s in other] == ["watch ended"]


def test_a_session_and_its_days_count_the_same_tokens(tmp_path, capsys, t0):
    """The demo's load runs before the app's first poll: the engine's counter already holds some tokens.
    They are the session's and the minute's alike, so `sparktop history` says one number twice."""
    path = tmp_path / "h.sqlite"
    feed = Feed(path, t0)
    feed.counters = {A: 145.0, B: 290.0}  # served between the engines' start and the first poll
    feed.serve(300, {A: t0 - 3, B: t0 - 3})
    feed.writer.close()
    found = history(capsys, path)
    for key in (A, B):
        (session,) = [s for s in found["sessions"] if s["url"] == key]
        days = sum(d["gen_tokens"] for d in found["daily"] if d["url"] == key)
        assert session["gen_tokens"] == days == feed.counters[key]
        assert session["unwatched_tokens"] == 0
    out = table(capsys, path)
    assert "served while nobody watched" not in out


def test_tokens_served_while_nobody_watched_are_said_where_they_differ(tmp_path, capsys, t0):
    """An engine first seen hours after it started: what it served before is its session's, and in no
    minute; the table says so instead of two unexplained numbers."""
    path = tmp_path / "h.sqlite"
    feed = Feed(path, t0)
    feed.counters = {A: 9_000.0, B: 0.0}
    feed.serve(120, {A: t0 - 5 * 3600, B: t0 - 5})
    feed.writer.close()
    found = history(capsys, path)
    (session,) = [s for s in found["sessions"] if s["url"] == A]
    days = sum(d["gen_tokens"] for d in found["daily"] if d["url"] == A)
    assert session["gen_tokens"] == feed.counters[A]
    assert session["unwatched_tokens"] == 9_200  # what its counter held at the first poll
    assert days == session["gen_tokens"] - session["unwatched_tokens"]
    out = " ".join(table(capsys, path).split())
    assert "served while nobody watched (127.0.0.2:8000: 9,200)" in out
    assert "127.0.0.3:8000" not in out.split("served while nobody watched")[1].split(")")[0]


def test_a_node_without_nvidia_smi_has_no_energy_not_zero(tmp_path, capsys, t0):
    """The `vm` node has no GPU power: its engine's energy is unknown ("—", null), never 0.0 Wh; the GB10's
    engine's is measured."""
    path = tmp_path / "h.sqlite"
    feed = Feed(path, t0)
    end = t0 + 120
    while feed.t < end:
        feed.t += 2
        feed.node("spark-a", power=40.0)
        feed.node("vm", power=None)
        for key, node in ((A, "spark-a"), (B, "vm")):
            feed.counters[key] += 200
            feed.engine(key, node, t0 - 5)
    feed.writer.close()
    found = history(capsys, path)
    by_url = {s["url"]: s for s in found["sessions"]}
    assert by_url[A]["energy_j"] > 0 and by_url[B]["energy_j"] is None and by_url[B]["j_per_token"] is None
    days = [d for d in found["daily"] if d["url"] == B]
    assert days and all(d["energy_j"] is None and d["wh"] is None for d in days)
    assert all(d["energy_j"] > 0 for d in found["daily"] if d["url"] == A)
    # The table as a terminal of 160 columns shows it (at 80 the energy column makes room).
    from rich.console import Console

    from sparktop.history.commands import gather, print_tables
    from sparktop.settings import Preferences

    console = Console(width=160, record=True)
    with HistoryStore.open(path, write=False) as s:
        found_rows = gather(HistoryReader(s), t0 - 60, time.time(), None, Preferences())
        print_tables(found_rows, console, Preferences(), t0 - 60, time.time(), str(path))
    text = console.export_text()
    # Its session's row and its day's row (the peaks' rows name it too, without energy).
    vm_rows = [line for line in text.splitlines() if "127.0.0.3:8000" in line and ("watch ended" in line
                                                                                  or line[:2] == "20")]
    assert len(vm_rows) == 2
    assert vm_rows and all("—" in line and not re.search(r"\b0\.0 Wh", line) for line in vm_rows)
