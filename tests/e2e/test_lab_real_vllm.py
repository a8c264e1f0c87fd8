"""Real vLLM engines launched in the lab: the lab's docker stand-in runs the
real `vllm serve` (vLLM 0.32's CPU build, a tiny Llama with dummy weights)
for an image whose ENV says so, and sparktop launches, uses, watches, sweeps,
studies and stops it over real OpenSSH, as it does on a Spark.

Each engine takes about half a minute to start on two cores (eager: no
torch.compile) and ~3 GB to run; these tests start eight in all, one or two
at a time: a solo engine, a pair behind LiteLLM's least-busy router, one that
fails, a study of solo and a pair behind the shuffle router, and one from the
app."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.lab import REAL_IMAGE, Lab, sshd_available
from tests.e2e.test_lab_launch import router_key, sparktop
from tests.helpers import real_vllm

pytestmark = [pytest.mark.lab, pytest.mark.realvllm, pytest.mark.slow]

TIMEOUT = "600"  # seconds a launch may take: a minute each on idle cores, more on a busy CI machine


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not sshd_available():
        pytest.fail("the lab needs OpenSSH's sshd: run the tests with scripts/test, which installs it")
    python = real_vllm.vllm_python()
    env = {"SPARKTOP_REAL_VLLM": str(python), **real_vllm.SERVER_ENV}
    lab = Lab(tmp_path_factory.mktemp("real-lab"), real_vllm_env=env).start()
    yield lab
    lab.stop()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return real_vllm.write_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def recipe(tmp_path: Path, model: Path, name: str = "tiny-llama", **vllm) -> Path:
    flags = {**real_vllm.FLAGS, **vllm}
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ndescription: a 2-layer Llama with dummy weights on vLLM's CPU build\n"
        f"model: {model}\nserved_model_name: tiny-llama\nimage: {REAL_IMAGE}\n"
        "memory: {weights_gib: 0.1}\n"
        "vllm:\n" + "".join(f"  {k}: {v}\n" for k, v in flags.items()))
    return path


def chat(url: str, key: str | None = None, tokens: int = 8) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(url + "/v1/chat/completions", headers=headers, timeout=120, json={
        "model": "tiny-llama", "messages": [{"role": "user", "content": "the node reads the cache"}],
        "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True})
    r.raise_for_status()
    return r.json()


def real_engines_running(model: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", f"vllm.entrypoints.openai.api_server --model {model}"],
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def assert_nothing_left(lab, model: Path) -> None:
    for host in lab.hosts:
        assert lab.containers(host) == [], host.name
    # The engine core exits a moment after its API server; on a loaded machine that moment is long (a
    # busy core, a 3 GB process to unmap): waited for until it has, up to three minutes, not a fixed 30 s.
    deadline = time.monotonic() + 180
    while real_engines_running(model) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert real_engines_running(model) == []


def ready_seconds(stdout: str) -> float:
    m = re.search(r"ready in (\d+(?:\.\d+)?)\s*s", stdout)
    assert m, stdout
    return float(m.group(1))


def test_solo_launches_answers_is_watched_swept_and_stops(lab, model, tmp_path):
    """The real vLLM (CPU build) launched, used, swept and stopped: its start-up alone is 20-40 s on two cores
    (torch and vLLM's imports, the engine core's profile run)."""
    inventory = lab.inventory(image=REAL_IMAGE)
    path = recipe(tmp_path, model)
    launched = sparktop(lab, "launch", str(path), "-t", "solo", "--inventory", str(inventory), "--yes",
                        "--timeout", TIMEOUT, timeout=900)
    try:
        assert launched.returncode == 0, launched.stdout + launched.stderr
        print(f"solo real engine ready in {ready_seconds(launched.stdout):.0f} s")
        api = f"http://{lab.hosts[0].address}:8000"
        assert chat(api)["usage"]["completion_tokens"] == 8
        status = json.loads(sparktop(lab, "status", "--inventory", str(inventory), "--json").stdout)
        engine = next(e for e in status["engines"] if e["url"] == api)
        assert (engine["state"], engine["kind"], engine["topology"], engine["model"], engine["version"]) == \
            ("ready", "vllm", "solo", "tiny-llama", real_vllm.VLLM_VERSION)
        results = tmp_path / "results"
        swept = subprocess.run(
            [sys.executable, "-m", "sparktop", "sweep", "--endpoint", api + "/v1", "--tokenizer",
             str(model / "tokenizer.json"), "--pp", "256", "--tg", "32", "-c", "1,2", "--runs", "2", "--exact-tg",
             "--json", "--results", str(results)], capture_output=True, text=True, timeout=300, env=lab.env())
        assert swept.returncode == 0, swept.stderr[-2000:]
        levels = {lv["concurrency"]: lv for lv in json.loads(swept.stdout)["levels"]}
        assert set(levels) == {1, 2} and all(lv["errors"] == 0 for lv in levels.values())
        # A decode rate where the streams came token by token; where a busy machine read a stream's 32 tokens
        # at once, the level says how many it could not time instead of printing a rate it did not measure.
        for lv in levels.values():
            assert lv["requests"] == lv["concurrency"] * 2
            assert (lv["tg_tps_req"] or 0) > 0 or lv["tg_unmeasured"] == lv["requests"], lv

        # The engine killed in the middle of a sweep ends it as it would on a Spark.
        long = subprocess.Popen(
            [sys.executable, "-m", "sparktop", "sweep", "--endpoint", api + "/v1", "--tokenizer",
             str(model / "tokenizer.json"), "--pp", "256", "--tg", "1500", "-c", "1,2,4", "--runs", "5",
             "--exact-tg", "--results", str(tmp_path / "killed")], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=lab.env())
        requests = lambda: list((tmp_path / "killed").glob("*/requests.jsonl"))  # noqa: E731
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (requests() and requests()[0].read_text().strip()):
            time.sleep(0.5)
        assert requests(), "the sweep never finished a request"
        lab.sh(lab.hosts[0], "docker kill sparktop-$(docker ps --format '{{.Names}}' | sed -n 's/^sparktop-//p' | "
                             "head -1)")
        out, err = long.communicate(timeout=300)
        assert long.returncode == 3, out[-1000:] + err[-1000:]
        assert requests()[0].read_text().strip(), "the finished requests were lost"
    finally:
        stopped = sparktop(lab, "stop", "--inventory", str(inventory), "--all")
    assert stopped.returncode == 0, stopped.stderr
    assert_nothing_left(lab, model)


def test_two_engines_behind_litellm(lab, model, tmp_path, topology="least-busy"):
    """Two real vLLM engines and a real LiteLLM in front: two engine start-ups of 20-40 s each on two cores."""
    # (shuffle, the other router, runs in the study below)
    inventory = lab.inventory(image=REAL_IMAGE)
    path = recipe(tmp_path, model)
    launched = sparktop(lab, "launch", str(path), "-t", topology, "--inventory", str(inventory), "--yes",
                        "--timeout", TIMEOUT, timeout=900)
    try:
        assert launched.returncode == 0, launched.stdout + launched.stderr
        print(f"{topology}: two real engines and LiteLLM ready in {ready_seconds(launched.stdout):.0f} s")
        key = router_key(lab)
        router = f"http://{lab.hosts[0].address}:4000"
        for _ in range(4):
            assert chat(router, key)["usage"]["completion_tokens"] == 8
        status = json.loads(sparktop(lab, "status", "--inventory", str(inventory), "--json").stdout)
        engines = {e["url"]: e for e in status["engines"]}
        for host in lab.hosts:
            e = engines[f"http://{host.address}:8000"]
            assert (e["state"], e["kind"], e["version"]) == ("ready", "vllm", real_vllm.VLLM_VERSION), e
        # Both engines served: the router spread the requests.
        served = [(engines[f"http://{h.address}:8000"]["requests"] or 0) for h in lab.hosts] \
            if "requests" in next(iter(engines.values())) else None
        if served is not None:
            assert all(n > 0 for n in served), served
    finally:
        stopped = sparktop(lab, "stop", "--inventory", str(inventory), "--all")
    assert stopped.returncode == 0, stopped.stderr
    assert_nothing_left(lab, model)


def test_a_real_startup_failure_shows_vllms_own_error(lab, model, tmp_path):
    """A real vLLM start that fails in its KV-cache check: the 20-40 s of its imports and model load come first."""
    inventory = lab.inventory(image=REAL_IMAGE)
    # Four blocks of 128 tokens cannot hold one request of the 2,048-token context.
    path = recipe(tmp_path, model, name="tiny-llama-no-kv", num_gpu_blocks_override=4)
    r = sparktop(lab, "launch", str(path), "-t", "solo", "--inventory", str(inventory), "--yes",
                 "--timeout", TIMEOUT, timeout=900)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert "launch failed: spark-a: " in r.stderr and "[dim]" not in r.stderr + r.stdout
    # vLLM's own first error line: the EngineCore's ValueError, not the API server's wrapper.
    assert "ValueError: To serve at least one request with the model's max seq len" in r.stderr, r.stderr[-2000:]
    sparktop(lab, "stop", "--inventory", str(inventory), "--all")
    assert_nothing_left(lab, model)


def test_a_study_on_real_engines_completes_and_names_a_winner(lab, model, tmp_path):
    """The first experiment here whose winner nobody computed: one engine or
    two behind the router, for a tiny model on two CPU "nodes"."""
    inventory = lab.inventory(image=REAL_IMAGE)
    path = recipe(tmp_path, model)
    began = time.monotonic()
    done = sparktop(lab, "study", str(path), "--topologies", "solo,shuffle", "-c", "1,4", "--runs", "2",
                    "--pp", "256", "--tg", "64", "--inventory", str(inventory), "--yes", "--timeout", TIMEOUT,
                    timeout=1500)
    wall = time.monotonic() - began
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    studies = Path(lab.env()["XDG_DATA_HOME"]) / "sparktop" / "studies"
    (study_dir,) = [p for p in studies.iterdir() if (p / "study.json").exists()]
    study = json.loads((study_dir / "study.json").read_text())
    assert study["status"] == "done"
    assert [(t["name"], t["status"]) for t in study["topologies"]] == [("solo", "done"), ("shuffle", "done")]
    report = json.loads(sparktop(lab, "report", study_dir.name, "--json").stdout)
    print(f"real-engine study wall time {wall:.0f} s; report: {json.dumps(report)[:1500]}")
    (decode,) = [t for t in report["tables"] if t["key"] == "tg_tps_total"]
    for row in decode["rows"]:
        cells = row["values"]
        assert set(cells) == {"solo", "shuffle"} and all(cell["measured"] > 0 for cell in cells.values())
        assert row["winner"]["best"] in cells  # a winner, or a tie said to be one with its runner-up
        print(f"c{row['concurrency']}: " + ", ".join(f"{k} {v['measured']:.0f} t/s" for k, v in cells.items())
              + f" -> {'tie' if row['winner']['tie'] else row['winner']['name']}")
    assert_nothing_left(lab, model)


async def test_launch_and_stop_a_real_engine_from_the_app(lab, model, monkeypatch):
    """`l`, the recipe, Enter (solo is the first topology); the card; `x`, Enter, `y`."""
    import asyncio
    from functools import partial

    from textual.widgets import DataTable

    from sparktop.observe.poller import Poller
    from sparktop.observe.targets import node_targets
    from sparktop.settings import load_inventory
    from sparktop.ui.app import SparktopApp
    from sparktop.ui.cards import EngineCard
    from sparktop.ui.launcher import ConfirmStop, LaunchScreen, ProgressScreen, StopScreen
    from tests.helpers.pilot import until as _until

    until = partial(_until, timeout=60.0, step=0.25)
    env = lab.env()
    for key in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(key, env[key])
    recipes = Path(env["XDG_CONFIG_HOME"]) / "sparktop" / "recipes"
    recipes.mkdir(parents=True, exist_ok=True)
    recipe(recipes, model)
    inventory = load_inventory(lab.inventory(image=REAL_IMAGE))
    poller = Poller(node_targets(inventory), [], interval=0.5, default_port=inventory.defaults.port)

    async def start():
        await poller.start()
        return poller

    app = SparktopApp(start_source=start, inventory=inventory, launch_timeout=int(TIMEOUT))
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: len(app.state.nodes) == 2)
            await pilot.press("l")
            await until(pilot, lambda: isinstance(app.screen, LaunchScreen))
            screen = app.screen
            table = screen.query_one("#recipes", DataTable)
            rows = [row.key.value for row in table.ordered_rows]
            for _ in range(rows.index("tiny-llama")):
                await pilot.press("down")
            await until(pilot, lambda: screen.recipe is not None and screen.recipe.id == "tiny-llama"
                        and screen.plan is not None and screen.plan.topology == "solo"
                        and screen.preflight_for == screen.plan.render(), timeout=30)
            assert screen.preflight.ok, screen.preflight.render()
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ProgressScreen))
            run = app.screen.run
            await until(pilot, lambda: run.status != "running", timeout=float(TIMEOUT))
            assert run.status == "ready", (run.reason, run.lines)
            api = run.plan.endpoints[-1]
            assert (await asyncio.to_thread(chat, api.url))["usage"]["completion_tokens"] == 8
            await pilot.press("escape")
            await until(pilot, lambda: api.url in app.state.engines and app.state.engines[api.url].state == "ready")
            assert app.state.engines[api.url].version == real_vllm.VLLM_VERSION
            card = next(c for c in app.screen.query(EngineCard) if c.key == api.url)
            await until(pilot, lambda: "● ready" in card.text)  # the card draws on the next refresh
            assert "tiny-llama" in card.text
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, StopScreen))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ConfirmStop))
            await pilot.press("y")
            await until(pilot, lambda: app.launcher.active() == [], timeout=60)
    finally:
        await poller.close()
    assert_nothing_left(lab, model)
