"""The twin speaking llama.cpp, held to what a real llama-server b11434 answered.

`tests/fixtures/llama.cpp-b11434/` is what `scripts/capture_llamacpp.py`
recorded from a real llama-server serving a tiny GGUF; `capture()` below does
the same requests, in the same order and with the same flags, to in-process
twins, and the tests hold each answer to the recorded one: the same status
and `Server` header, the same metric families (type, HELP, labels), the same
JSON keys and types (in the same order) for /slots, /props, /v1/models,
/health and the errors, the same kinds of chunks in a streamed chat, and a
log that sparktop's own parser reads the same way. Values differ on purpose
(the twin serves a model it has a card for, at its own speed); only what a
value must be (a 400 for a prompt as long as its slot, the numbers in the
error's words, the rate gauges' definition) is checked.

A last test shows the comparisons fail when the twin strays: a renamed
family, a lost key, a missing stage each give a line that says so.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparktop.observe.engine_log import startup_state
from sparktop.observe.engines.llamacpp import LOG
from sparktop.twin.dialects.llamacpp import LlamaCppDialect
from sparktop.twin.server import TwinServer
from tests.helpers import conformance as c

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "llama.cpp-b11434"
INDEX: dict[str, dict] = json.loads((FIX / "INDEX.json").read_text())
NAME = "tiny-llama-gguf"  # the alias tests/helpers/llama_cpp.py gives the real server
# The twin serves a model it has a card for (the real one served a two-layer GGUF written by the tests).
GGUF = "/models/Llama-3.1-8B-Instruct-Q4_K_M.gguf"
# start_llama_server's flags (-a, -t 2; --metrics, -np 4 and -c 2048 unless given) for capture_llamacpp.py's
# three servers: the main one, one slot for a long generation, and one without metrics or slots.
BASE = ("-a", NAME, "-t", "2")
MAIN = (*BASE, "--metrics", "-np", "4", "-c", "2048")
ONE = (*BASE, "--metrics", "-np", "1", "-c", "2048")
BARE = (*BASE, "--no-slots", "-np", "4", "-c", "2048")
SPEED = 50.0  # the modeled 8B decodes ~40 tokens/s: a 50-token head start takes ~25 ms
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "the node reads the cache"}], "max_tokens": 8,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
TOO_LONG = {"model": NAME, "messages": [{"role": "user", "content": "node " * 1500}], "max_tokens": 8}
LONG = {"model": NAME, "prompt": "the node reads the cache " * 20, "max_tokens": 1800, "ignore_eos": True}
GETS = (("health.json", "/health"), ("models.json", "/v1/models"), ("props.json", "/props"),
        ("slots-idle.json", "/slots"), ("metrics-idle.txt", "/metrics"))


def recorded(name: str) -> str:
    return (FIX / name).read_text()


# -- the twins, asked what the real one was asked -----------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: str


async def start(*flags: str, speed: float = SPEED) -> TwinServer:
    dialect = LlamaCppDialect()
    args = dialect.parse(["-m", GGUF, "--host", "127.0.0.1", "--port", "0", "--speed", str(speed),
                          "--startup-speed", "1e6", *flags])
    server = TwinServer(args, log=io.StringIO(), dialect=dialect)
    await server.start()
    return server


async def fetch(http: aiohttp.ClientSession, url: str, body: dict | None = None) -> Answer:
    request = http.get(url) if body is None else http.post(url, json=body)
    async with request as r:
        return Answer(r.status, dict(r.headers), await r.text())


def log_of(server: TwinServer) -> list[str]:
    stream = server.log.stream
    assert isinstance(stream, io.StringIO)
    return stream.getvalue().splitlines()


async def busy_slots(http: aiohttp.ClientSession, server: TwinServer, decoded: int = 50) -> Answer:
    """/slots once a slot has decoded `decoded` tokens of a long generation (the capture waited for 50)."""
    for _ in range(500):
        answer = await fetch(http, server.url + "/slots")
        slots = json.loads(answer.body)
        if any(s.get("is_processing") and (s.get("next_token") or [{}])[0].get("n_decoded", 0) >= decoded
               for s in slots):
            return answer
        await asyncio.sleep(0.005)
    raise AssertionError(f"no slot was seen busy: {answer.body}")


async def capture() -> tuple[dict[str, Answer], list[str]]:
    """capture_llamacpp.py's requests to twins: {fixture name: the twin's answer}, and the main twin's log
    (its security line left out, as the capture leaves it out)."""
    out: dict[str, Answer] = {}
    servers: list[TwinServer] = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            main = await start(*MAIN)
            servers.append(main)
            for name, path in GETS:
                out[name] = await fetch(http, main.url + path)
            out["chat-stream.sse"] = await fetch(http, main.url + "/v1/chat/completions", CHAT)
            out["error-too-long.json"] = await fetch(http, main.url + "/v1/chat/completions", TOO_LONG)
            out["metrics-after.txt"] = await fetch(http, main.url + "/metrics")
            main.dialect.stopping(main)  # what it logs on SIGTERM
            log = [line for line in log_of(main) if "security:" not in line]
            one = await start(*ONE)
            servers.append(one)
            generation = asyncio.create_task(fetch(http, one.url + "/v1/completions", LONG))
            out["slots-busy.json"] = await busy_slots(http, one)
            out["metrics-busy.txt"] = await fetch(http, one.url + "/metrics")
            generation.cancel()
            await asyncio.gather(generation, return_exceptions=True)
            bare = await start(*BARE)
            servers.append(bare)
            out["error-no-metrics.json"] = await fetch(http, bare.url + "/metrics")
            out["error-no-slots.json"] = await fetch(http, bare.url + "/slots")
    finally:
        for server in servers:
            await server.stop()
    return out, log


@pytest.fixture(scope="module")
def twin_capture() -> tuple[dict[str, Answer], list[str]]:
    # Plain data, made once in an event loop of its own: every test below reads the same capture.
    return asyncio.run(capture())


@pytest.fixture
async def llama():
    """Factory: a started llama.cpp twin; every one is stopped at teardown."""
    servers: list[TwinServer] = []

    async def make(*flags: str, speed: float = SPEED) -> TwinServer:
        server = await start(*flags, speed=speed)
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.stop()


# -- comparing -------------------------------------------------------------------------------------------------


def families(text: str) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """{family: (type, HELP, label names)} as prometheus-client parses a /metrics answer."""
    return {f.name: (f.type, f.documentation, tuple(sorted({k for s in f.samples for k in s.labels})))
            for f in text_string_to_metric_families(text)}


def samples(text: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def key_order(value: object, where: str = "") -> list[str]:
    """Every key's path in the order a body writes them (a list's elements merged, first seen first)."""
    out: list[str] = []
    if isinstance(value, dict):
        for key, v in value.items():
            path = f"{where}.{key}" if where else key
            out.append(path)
            out += [p for p in key_order(v, path) if p not in out]
    elif isinstance(value, list):
        for item in value:
            out += [p for p in key_order(item, f"{where}[]") if p not in out]
    return out


def compare_json(real: str, mine: str) -> list[str]:
    """Where the twin's body differs from the real one's: keys and JSON types, then the keys' order."""
    a, b = json.loads(real), json.loads(mine)
    diffs = c.compare(c.shape(a), c.shape(b))
    if not diffs and key_order(a) != key_order(b):
        i = next(i for i, (x, y) in enumerate(zip(key_order(a), key_order(b), strict=False)) if x != y)
        diffs.append(f"key order: {key_order(a)[i]} expected at {i}, got {key_order(b)[i]}")
    return diffs


def stages(lines: list[str]) -> list[str]:
    """The start-up stages sparktop's parser reads, in the order the log reaches them."""
    seen: list[str] = []
    for i in range(1, len(lines) + 1):
        stage = startup_state(lines[:i], LOG).stage
        if stage is not None and (not seen or seen[-1] != stage):
            seen.append(stage)
    return seen


def template(line: str) -> str:
    """A log line with its time stamp, numbers, paths and padding taken out: what kind of line it is."""
    line = re.sub(r"^\d+\.\d\d\.\d\d\d\.\d\d\d ", "", line)
    line = re.sub(r"'/[^']*'", "'<path>'", line)
    return re.sub(r"\s+", " ", re.sub(r"\d+", "N", line)).strip()


# -- every recorded answer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(INDEX))
def test_each_answer_has_the_recorded_status_and_server_header(twin_capture, name):
    answer = twin_capture[0][name]
    assert (answer.status, answer.headers.get("Server")) == (INDEX[name]["status"], INDEX[name]["server"]), name


# -- 1. /metrics --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["metrics-idle.txt", "metrics-busy.txt", "metrics-after.txt"])
def test_metrics_have_the_recorded_families_types_help_and_labels(twin_capture, name):
    real, mine = families(recorded(name)), families(twin_capture[0][name].body)
    assert c.compare(real, mine) == []
    # The rate gauges sparktop leaves aside (they reset on every read) are there, as gauges.
    for gauge in ("llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds"):
        assert mine[gauge][0] == real[gauge][0] == "gauge"


def test_rate_gauges_are_tokens_per_second_of_work_since_the_last_scrape(twin_capture):
    # After one request, in the real server and the twin alike: prompt tokens over the seconds spent on
    # them; generation steps (the first token is free) over the seconds spent generating.
    for text in (recorded("metrics-after.txt"), twin_capture[0]["metrics-after.txt"].body):
        v = samples(text)
        assert v["llamacpp:prompt_tokens_seconds"] == pytest.approx(
            v["llamacpp:prompt_tokens_total"] / v["llamacpp:prompt_seconds_total"], rel=1e-3)
        assert v["llamacpp:predicted_tokens_seconds"] == pytest.approx(
            (v["llamacpp:tokens_predicted_total"] - 1) / v["llamacpp:tokens_predicted_seconds_total"], rel=1e-3)
        assert v["llamacpp:tokens_predicted_total"] == 8 and v["llamacpp:n_decode_total"] >= 8


async def test_a_scrape_empties_the_rate_gauges(llama):
    # server-context.cpp: a /metrics task resets the buckets the two gauges are read from.
    server = await llama(*MAIN, speed=500)
    async with aiohttp.ClientSession() as http:
        await fetch(http, server.url + "/v1/chat/completions", {**CHAT, "stream": False})
        first = samples((await fetch(http, server.url + "/metrics")).body)
        second = samples((await fetch(http, server.url + "/metrics")).body)
    assert first["llamacpp:predicted_tokens_seconds"] > 0 and first["llamacpp:prompt_tokens_seconds"] > 0
    assert second["llamacpp:predicted_tokens_seconds"] == second["llamacpp:prompt_tokens_seconds"] == 0
    assert second["llamacpp:tokens_predicted_total"] == first["llamacpp:tokens_predicted_total"] == 8


# -- 2. /slots ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["slots-idle.json", "slots-busy.json"])
def test_slots_have_the_recorded_keys_and_types(twin_capture, name):
    real, mine = recorded(name), twin_capture[0][name].body
    assert compare_json(real, mine) == []
    # Same flags, same slots: how many and each one's context.
    assert [s["n_ctx"] for s in json.loads(mine)] == [s["n_ctx"] for s in json.loads(real)]


def test_the_busy_slot_is_processing_and_counts_what_it_decoded(twin_capture):
    (slot,) = json.loads(twin_capture[0]["slots-busy.json"].body)
    (real,) = json.loads(recorded("slots-busy.json"))
    assert slot["is_processing"] is real["is_processing"] is True
    token = slot["next_token"][0]
    assert token["has_next_token"] is True and token["n_decoded"] >= 50
    assert token["n_remain"] == LONG["max_tokens"] - token["n_decoded"]  # as 1245 + 555 == 1800 in the recording
    assert slot["n_prompt_tokens"] == slot["n_prompt_tokens_processed"] + token["n_decoded"]  # as 102 + 555 == 657
    assert slot["params"]["n_predict"] == slot["params"]["max_tokens"] == LONG["max_tokens"]
    assert slot["params"]["ignore_eos"] is True


async def test_a_slot_is_processing_while_its_request_runs_and_keeps_its_task_after(llama):
    server = await llama(*ONE)
    keys = list(json.loads(recorded("slots-busy.json"))[0])
    async with aiohttp.ClientSession() as http:
        generation = asyncio.create_task(fetch(http, server.url + "/v1/completions", {**LONG, "max_tokens": 400}))
        (busy,) = json.loads((await busy_slots(http, server, decoded=1)).body)
        assert (await generation).status == 200
        (idle,) = json.loads((await fetch(http, server.url + "/slots")).body)
    assert busy["is_processing"] is True and list(busy) == keys
    # server_slot::to_json shows the previous task of an idle slot: its keys stay, its counts are reset.
    assert idle["is_processing"] is False and list(idle) == keys and idle["id_task"] == busy["id_task"]
    assert idle["next_token"] == [{"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}]


# -- 3. /props, /v1/models, /health ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["props.json", "models.json", "health.json"])
def test_props_models_and_health_have_the_recorded_keys_and_types(twin_capture, name):
    assert compare_json(recorded(name), twin_capture[0][name].body) == []


def test_props_and_models_say_what_the_flags_say_as_the_real_one_does(twin_capture):
    answers = twin_capture[0]
    props, real = json.loads(answers["props.json"].body), json.loads(recorded("props.json"))
    for key in ("total_slots", "model_alias", "endpoint_slots", "endpoint_props", "endpoint_metrics"):
        assert props[key] == real[key], key
    assert props["default_generation_settings"] == real["default_generation_settings"]  # llama-server's defaults
    model = json.loads(answers["models.json"].body)["data"][0]
    real_model = json.loads(recorded("models.json"))["data"][0]
    assert (model["id"], model["aliases"], model["owned_by"]) == (real_model["id"], real_model["aliases"], "llamacpp")
    assert model["meta"]["n_ctx"] == real_model["meta"]["n_ctx"] == 512
    # llama-server writes JSON without spaces: the same bytes where the values are the same.
    assert answers["health.json"].body == recorded("health.json")


# -- 4. errors ------------------------------------------------------------------------------------------------------


def test_a_prompt_longer_than_its_slot_is_refused_in_the_recorded_words(twin_capture):
    answer = twin_capture[0]["error-too-long.json"]
    real = json.loads(recorded("error-too-long.json"))
    assert answer.status == INDEX["error-too-long.json"]["status"] == 400
    assert compare_json(recorded("error-too-long.json"), answer.body) == []
    mine = json.loads(answer.body)["error"]
    assert (mine["code"], mine["type"], mine["n_ctx"]) == (real["error"]["code"], real["error"]["type"], 512)
    # The recorded message with its two numbers substituted: the prompt's tokens and the slot's context.
    words = re.escape(real["error"]["message"]).replace("1521", r"(\d+)").replace("512", r"(\d+)")
    m = re.fullmatch(words, mine["message"])
    assert m is not None, mine["message"]
    assert (int(m.group(1)), int(m.group(2))) == (mine["n_prompt_tokens"], mine["n_ctx"])


@pytest.mark.parametrize("name", ["error-no-metrics.json", "error-no-slots.json"])
def test_metrics_and_slots_turned_off_answer_501_with_the_recorded_body(twin_capture, name):
    answer = twin_capture[0][name]
    assert (answer.status, answer.body) == (INDEX[name]["status"], recorded(name))


async def test_a_prompt_as_long_as_its_slot_is_refused_and_one_token_shorter_is_served(llama):
    # update_slots: n_tokens >= n_ctx is refused; with no context shift, the rest of the slot is what
    # can be generated, and max_tokens beyond it is not an error.
    server = await llama(*MAIN, speed=1000)
    async with aiohttp.ClientSession() as http:
        full = await fetch(http, server.url + "/v1/completions", {"prompt": [7] * 512, "max_tokens": 3})
        fits = await fetch(http, server.url + "/v1/completions", {"prompt": [7] * 500, "max_tokens": 5000})
    assert full.status == 400 and json.loads(full.body)["error"]["n_prompt_tokens"] == 512
    body = json.loads(fits.body)
    assert fits.status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["total_tokens"] == 512 and set(body["timings"]) == set(
        c.sse_events(recorded("chat-stream.sse"))[-2]["timings"])


# -- 5. a streamed chat ---------------------------------------------------------------------------------------------


def test_a_streamed_chat_has_the_recorded_chunks(twin_capture):
    real, mine = recorded("chat-stream.sse"), twin_capture[0]["chat-stream.sse"].body
    assert c.sse_kinds(mine) == c.sse_kinds(real) == ["role", "content", "finish", "usage", "done"]
    assert c.compare(c.sse_shapes(real), c.sse_shapes(mine)) == []
    assert mine.endswith("data: [DONE]\n\n") and real.endswith("data: [DONE]\n\n")
    usage = c.sse_events(mine)[-2]
    assert "timings" in usage and usage["usage"]["completion_tokens"] == usage["timings"]["predicted_n"] == 8
    assert key_order(usage) == key_order(c.sse_events(real)[-2])


async def test_without_include_usage_the_finish_chunk_carries_the_timings(llama):
    # to_json_oaicompat_chat_stream: `timings` go on the last chunk there is.
    server = await llama(*MAIN, speed=500)
    async with aiohttp.ClientSession() as http:
        answer = await fetch(http, server.url + "/v1/chat/completions", {**CHAT, "stream_options": None})
    assert c.sse_kinds(answer.body) == ["role", "content", "finish", "done"]
    events = c.sse_events(recorded("chat-stream.sse"))
    finish, usage = events[-3], events[-2]
    assert isinstance(finish, dict) and isinstance(usage, dict)
    expected = c.shape({**finish, "timings": usage["timings"]})
    assert c.compare(expected, c.shape(c.sse_events(answer.body)[-2])) == []


# -- 6. the log -----------------------------------------------------------------------------------------------------


def test_sparktop_reads_the_same_stages_and_kv_size_from_both_logs(twin_capture):
    real, mine = recorded("server.log").splitlines(), twin_capture[1]
    assert stages(mine) == stages(real) == ["initializing", "loading weights", "kv cache", "ready"]
    # b11434 at its default verbosity prints no `llama_kv_cache: size = ...` line: neither log gives a size.
    assert startup_state(mine, LOG).kv_tokens == startup_state(real, LOG).kv_tokens
    assert not startup_state(mine, LOG).failed and not startup_state(real, LOG).failed


def test_the_log_has_the_recorded_lines_in_the_recorded_order(twin_capture):
    # Start-up, a chat (slot taken, timings, release), a prompt too long (its error), the exit: line by line.
    real = [template(line) for line in recorded("server.log").splitlines()]
    assert [template(line) for line in twin_capture[1]] == real


# -- when the twin strays ---------------------------------------------------------------------------------------------


def test_the_comparisons_say_where_a_twin_strays():
    text = recorded("metrics-idle.txt")
    renamed = families(text.replace("llamacpp:requests_deferred", "llamacpp:requests_waiting"))
    assert c.compare(families(text), renamed) == [
        "llamacpp:requests_deferred: missing (expected ('gauge', 'Number of requests deferred', ()))",
        "llamacpp:requests_waiting: unexpected (got ('gauge', 'Number of requests deferred', ()))"]
    retyped = families(text.replace("TYPE llamacpp:n_tokens_max counter", "TYPE llamacpp:n_tokens_max gauge"))
    assert c.compare(families(text), retyped) == [
        "llamacpp:n_tokens_max: ('counter', 'Largest observed sequence length (prompt + generation)', ()) expected, "
        "got ('gauge', 'Largest observed sequence length (prompt + generation)', ())"]
    reworded = families(text.replace("Number of requests processing", "Requests processing"))
    assert len(c.compare(families(text), reworded)) == 1

    busy = json.loads(recorded("slots-busy.json"))
    del busy[0]["params"]["n_predict"]
    assert compare_json(recorded("slots-busy.json"), json.dumps(busy)) == [
        '[].params.n_predict: missing (expected "int")']
    busy[0]["params"]["n_predict"] = 1800  # back, but last
    assert compare_json(recorded("slots-busy.json"), json.dumps(busy)) == [
        "key order: [].params.n_predict expected at 34, got [].params.n_keep"]
    props = {("model" if k == "model_alias" else k): v for k, v in json.loads(recorded("props.json")).items()}
    assert compare_json(recorded("props.json"), json.dumps(props)) == [
        'model_alias: missing (expected "str")', 'model: unexpected (got "str")']

    stream = recorded("chat-stream.sse")
    assert [d.split(":")[0] for d in c.compare(c.sse_shapes(stream), c.sse_shapes(
        stream.replace(',"timings":', ',"timing":')))] == ["usage.timings", "usage.timing"]
    assert c.sse_kinds(stream.replace("data: [DONE]\n\n", "")) == ["role", "content", "finish", "usage"]

    log = recorded("server.log").splitlines()
    assert stages([line for line in log if "n_slots =" not in line]) == ["initializing", "loading weights", "ready"]
    assert stages(log[::-1]) == ["ready"]  # stages only move forward: a log out of order reads as one stage
