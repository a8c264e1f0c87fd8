"""An engine that dies at run time: vLLM's EngineCore fatal error in the
container's log, and the engine no longer answers. The card says failed,
in red, with the first error line; `status --json` carries it too."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from sparktop.observe.engine_log import runtime_failure, startup_state
from sparktop.status import engine_json
from sparktop.ui.app import SparktopApp
from sparktop.ui.cards import EngineCard
from tests.helpers.cluster import poller_for
from tests.helpers.pilot import until
from tests.ui.test_monitor_app import cards, cluster  # noqa: F401 - the twin cluster fixture

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DEATH = FIXTURES / "vllm-logs" / "vllm-runtime_enginecore-fatal_lmcache-issue-2306.log"
CAPTURES = FIXTURES / "captures"


def test_runtime_failure_reads_a_real_enginecore_death():
    assert runtime_failure(DEATH.read_text().splitlines()) == "EngineCore encountered a fatal error."


def test_runtime_failure_names_the_cause_when_the_traceback_does():
    lines = DEATH.read_text().splitlines()
    at = lines.index(next(x for x in lines if x.startswith("(APIServer")))
    cause = "(EngineCore_DP0 pid=697344) ERROR 01-08 17:16:15 [core.py:844] ValueError: something broke"
    assert runtime_failure([*lines[:at], cause, *lines[at:]]) == (
        "EngineCore encountered a fatal error. ValueError: something broke")


def test_a_healthy_log_and_a_startup_failure_are_no_runtime_death():
    for name in ("vllm-startup_spark-solo_v0.20.0_gemma4-26b-bf16_jethac.log",
                 "vllm-startup_spark-solo_v0.20.0_FAILED-valueerror_jethac.log"):
        assert runtime_failure((CAPTURES / name).read_text().splitlines()) is None, name
    # A request's own error is not a dead engine.
    assert runtime_failure(["(APIServer pid=1) ERROR 05-12 01:48:42 [serving.py:1] Error in preprocessing prompt"]) \
        is None


def test_the_startup_parser_still_reads_the_death_as_no_stage():
    assert startup_state(DEATH.read_text().splitlines()).stage is None


async def test_an_engine_that_dies_at_run_time_shows_failed_with_the_first_error_line(cluster):  # noqa: F811
    a = cluster.nodes[0]
    poller = poller_for(cluster, interval=0.3)
    await poller.start()
    app = SparktopApp(poller)
    key = f"http://{a.address}:{cluster.port_for(0, 8000)}"
    stopped = None
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            card = lambda: next((c for c in cards(app, EngineCard) if c.key == key), None)  # noqa: E731
            await until(pilot, lambda: card() is not None and "● ready" in card().text, timeout=20)
            # The engine dies the way vLLM's does: its log gets the EngineCore's fatal error and the
            # API server's EngineDeadError (a real log), and it answers no more (stopped, not exited).
            r = await a.transport().run("docker inspect --format '{{.State.Pid}}' sparktop-vllm")
            pid = r.stdout.strip()
            log = a.host.home / "logs" / "sparktop-vllm.log"  # where the twin's docker keeps the container's log
            with open(log, "a") as f:
                f.write(DEATH.read_text())
            stopped = int(pid)
            os.killpg(stopped, signal.SIGSTOP)
            await until(pilot, lambda: "● failed" in card().text, timeout=20)
            assert "EngineCore encountered a fatal error." in card().text
            snap = app.state.engines[key]
            assert snap.state == "failed" and snap.error == "EngineCore encountered a fatal error."
            assert engine_json(snap)["error"] == "EngineCore encountered a fatal error."
            # Red, and the first line under the address.
            line = card()._card_lines[1]
            assert line.plain.startswith("EngineCore encountered a fatal error.")
            assert "red" in str(line.style)
    finally:
        if stopped is not None:
            os.killpg(stopped, signal.SIGCONT)
        await poller.close()
