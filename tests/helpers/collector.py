"""`sparktop collect` in its own process for the history's tests: followed by
what it says and the figures it serves, stopped with SIGTERM as systemd stops
it (or killed with SIGKILL, as a crash is), optionally under a program that
changes its world (`faketime`)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import httpx

from sparktop.twin.host import ENV_HOME


def collect_env(**extra: str) -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


class Collector:
    """`sparktop collect ARGS` in its own process, its output read on a thread (so a test can wait for a
    line with a limit), stopped with SIGTERM as systemd stops it. `prefix`: a program it runs under
    (`["faketime", "-f", "+40d"]`)."""

    def __init__(self, tmp_path, *args: str, prefix: list[str] | None = None, env: dict | None = None,
                 name: str = "collect"):
        self._err = open(tmp_path / f"{name}.err", "w+")  # noqa: SIM115 - read after the process ends
        env = dict(env or collect_env())
        if "--inventory" not in args:
            # This machine is the collector's node, and its process list holds the engines of every other test
            # running beside this one: a private twin home makes the local probe list only processes of this
            # test's host (none), so the collector watches the engines the test gives it and no other.
            env.setdefault(ENV_HOME, str(tmp_path / "this-host"))
        self.proc = subprocess.Popen([*(prefix or []), sys.executable, "-m", "sparktop", "collect", *args],
                                     stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     env=env)
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self._new.put(line)
        self._new.put(None)

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        """The first line (from now on or already said) holding `text`; fails after `timeout` s or at exit."""
        for line in list(self.lines):
            if text in line:
                return line
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._new.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"collect never said {text!r} in {timeout:g} s: {self.lines}") from None
            if line is None:
                raise AssertionError(f"collect ended without saying {text!r}: {self.lines} {self.stderr()}")
            if text in line:
                return line

    def stop(self) -> tuple[int, str, str]:
        """SIGTERM; its exit status, all it printed, its stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(10)
        return code, "".join(self.lines), self.stderr()

    def kill(self) -> None:
        """SIGKILL: no cleanup, whatever it was doing."""
        self.proc.kill()
        self.proc.wait(30)
        self._reader.join(10)

    def stderr(self) -> str:
        self._err.seek(0)
        return self._err.read()


def served(port: int, name: str, url: str) -> float | None:
    """A figure the collector serves to Prometheus for engine `url` (None: not yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("engine") == url:
                return sample.value
    return None


def wait_served(port: int, name: str, url: str, value: float, timeout: float = 60.0) -> None:
    """Until the collector has read `value` for `url`'s `name` (its state, as it serves it)."""
    deadline = time.monotonic() + timeout
    while (now := served(port, name, url)) != value:
        assert time.monotonic() < deadline, f"the collector served {name} = {now} for {timeout:g} s, not {value}"
        time.sleep(0.2)


def ask(url: str, n: int, model: str = "llama-3.1-8b") -> int:
    """`n` short completions; the tokens the server says it generated."""
    tokens = 0
    for i in range(n):
        r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": f"hello {i}", "max_tokens": 24},
                       timeout=30)
        r.raise_for_status()
        tokens += r.json()["usage"]["completion_tokens"]
    return tokens


def history_json(path, since: str = "1h") -> dict:
    """`sparktop history --file PATH --json --since SINCE`, as a user runs it: what it printed, parsed."""
    import json

    shown = subprocess.run([sys.executable, "-m", "sparktop", "history", "--file", str(path), "--json", "--since",
                            since], capture_output=True, text=True, timeout=60, env=collect_env())
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)
