"""`sparktop collect --notify URL`: an engine that goes down reaches a real webhook receiver as an alert,
once, and its return as the alert resolved; a heartbeat comes first; the history keeps both as events."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.helpers.collector import Collector
from tests.helpers.twin_process import start_twin_process


class Receiver:
    """A webhook receiver in a thread: every JSON body posted to it, in order."""

    def __init__(self) -> None:
        got = self.got = []

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook/SECRET-KEY"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def until(self, check, timeout: float = 90.0, what: str = "a post"):
        deadline = time.monotonic() + timeout
        while not check(self.got):
            assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s; got {self.got}"
            time.sleep(0.2)


def test_an_engine_down_fires_once_then_resolves_at_a_real_receiver_and_the_history_keeps_both(tmp_path):
    """An engine is watched, stopped long enough to fire, started again long enough to resolve (the alert's
    hold is 3 s here, 30 s by default)."""
    receiver = Receiver()
    engine, url = start_twin_process("llama-3.1-8b", speed=4)
    port = int(url.rsplit(":", 1)[1])
    history = tmp_path / "history.sqlite"
    collector = Collector(tmp_path, "--engine", url, "--interval", "0.5", "--file", str(history),
                          "--notify", receiver.url, "--alert-after", "3")
    try:
        receiver.until(lambda got: any(g["state"] == "heartbeat" for g in got), what="the heartbeat")
        collector.wait_for("writing history")
        engine.kill()
        engine.wait(10)
        receiver.until(lambda got: any(g["state"] == "firing" for g in got), what="the engine_down alert")
        engine, _ = start_twin_process("llama-3.1-8b", speed=4, port=port)
        receiver.until(lambda got: any(g["state"] == "resolved" for g in got), what="its resolution")
    finally:
        code, out, err = collector.stop()
        engine.kill()
        engine.wait(10)
        receiver.server.shutdown()
    states = [(g["state"], g["alert"]) for g in receiver.got]
    assert states == [("heartbeat", "heartbeat"), ("firing", "engine_down"), ("resolved", "engine_down")]
    assert receiver.got[1]["key"] == url and receiver.got[1]["severity"] == "critical"
    assert code == 0 and "Traceback" not in err and "SECRET-KEY" not in out + err
    assert "alerts go to json http://127.0.0.1/…" in out
    events = json.loads(subprocess.run([sys.executable, "-m", "sparktop", "history", "--file", str(history),
                                        "--json"], capture_output=True, text=True, check=True).stdout)["events"]
    kinds = [e["kind"] for e in events if e["kind"].startswith("alert")]
    assert kinds == ["alert", "alert_resolved"]
