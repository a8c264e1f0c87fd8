"""Record what a running vLLM server answers, for parser tests and the twin.

    python scripts/capture_vllm.py http://127.0.0.1:8000 tests/fixtures/vllm-0.32.0 --model tiny-llama

Writes one file per answer: version.json, health.txt, models.json,
metrics-idle.txt, metrics-after.txt (after the requests below), the raw SSE of
a streamed chat with and without `return_token_ids`, a non-streamed chat, and
the JSON errors of an unknown model and of a prompt longer than the context.
Each file holds the server's bytes as they came; status codes go to
INDEX.json. The same requests are what tests/real/test_twin_conformance.py
sends to the twin and to vLLM side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path


def fetch(url: str, body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def requests_for(model: str, max_model_len: int) -> dict[str, tuple[str, dict | None]]:
    """name -> (path, JSON body or None for GET)."""
    chat = {"model": model, "messages": [{"role": "user", "content": "the node reads the cache"}],
            "max_tokens": 8, "min_tokens": 8, "ignore_eos": True, "temperature": 0}
    return {
        "version.json": ("/version", None),
        "health.txt": ("/health", None),
        "models.json": ("/v1/models", None),
        "chat-stream.sse": ("/v1/chat/completions",
                            {**chat, "stream": True, "stream_options": {"include_usage": True}}),
        "chat-stream-token-ids.sse": ("/v1/chat/completions",
                                      {**chat, "stream": True, "return_token_ids": True,
                                       "stream_options": {"include_usage": True}}),
        "chat.json": ("/v1/chat/completions", chat),
        "error-unknown-model.json": ("/v1/chat/completions", {**chat, "model": "no-such-model"}),
        "error-too-long.json": ("/v1/chat/completions",
                                {**chat, "messages": [{"role": "user",
                                                       "content": "node " * (max_model_len + 100)}]}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-model-len", type=int, default=2048)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    index = {}
    status, body = fetch(args.url + "/metrics")
    (args.out / "metrics-idle.txt").write_bytes(body)
    for name, (path, payload) in requests_for(args.model, args.max_model_len).items():
        status, body = fetch(args.url + path, payload)
        (args.out / name).write_bytes(body)
        shown = json.loads(json.dumps(payload)) if payload else payload
        for m in (shown or {}).get("messages", []):
            if len(m["content"]) > 200:  # the over-long prompt, described instead of stored
                m["content"] = f"<{len(m['content'])} characters: {m['content'][:20]!r}...>"
        index[name] = {"path": path, "status": status, "request": shown}
    status, body = fetch(args.url + "/metrics")
    (args.out / "metrics-after.txt").write_bytes(body)
    (args.out / "INDEX.json").write_text(json.dumps(index, indent=1) + "\n")
    print(f"wrote {len(index) + 2} answers to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
