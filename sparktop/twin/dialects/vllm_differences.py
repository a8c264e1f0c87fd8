"""Where the vLLM dialect knowingly answers differently from vLLM 0.32, and why.

The twin is held to what a real vLLM 0.32.0 answers
(`tests/fixtures/vllm-0.32.0/`, and a live server in the real-vLLM tests):
every `vllm:` metric family with its type and labels, the keys and JSON
types of every body. What it does not imitate is listed here, each with its
reason, and the conformance tests skip exactly these (`tests/helpers/
conformance.py`, `ignored(scope)`).

Keys are `scope:pattern`. The scope is what is compared: `metrics` (a map
of family name to type and label names), `sse` (a map of chunk kind to the
chunk's shape: role, content, finish, usage, error, done) or `json` (a
body's shape). The pattern is an fnmatch pattern over the path `compare`
reports (`content.choices[].delta.content`); a match skips that path and
everything under it. Values are differences, not shapes: a twin that still
needs an entry here is the twin to fix first when the reason goes away.
"""

from __future__ import annotations

DIFFERENCES: dict[str, str] = {
    "metrics:http_*": (
        "HTTP request counters and latencies come from prometheus-fastapi-instrumentator around vLLM's FastAPI "
        "app; the twin serves with aiohttp and exports only what vLLM itself (and prometheus-client's process "
        "and platform collectors) export."
    ),
    "sse:*.choices[].delta.reasoning": (
        "A reasoning model's streamed thoughts: vLLM 0.32 names the delta key `reasoning`, the twin still streams "
        "`reasoning_content` because tests/integration/test_twin_server.py (the reasoning-effort and decode-rate "
        "tests) and tests/benchmarks/twin_decode.py read that key; switch once they read `reasoning`. "
        "(A non-streamed message already carries `reasoning`.)"
    ),
    "sse:*.choices[].delta.reasoning_content": "The other side of the `reasoning` difference above.",
}
