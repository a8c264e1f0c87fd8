"""The vLLM dialect's log lines, in vLLM's format, so whatever reads a vLLM log reads the twin's.

    (APIServer pid=1) INFO 06-07 13:19:30 [model.py:555] Resolved architecture: ...
    (EngineCore pid=96) INFO 06-07 13:27:19 [default_loader.py:384] Loading weights took 371.35 seconds
"""

from __future__ import annotations

import time
from typing import TextIO

from sparktop.clock import SYSTEM, Clock
from sparktop.twin.dialects.base import TwinLog


class VllmLog(TwinLog):
    """Its lines name their process: the API server's, or the engine core's (`engine`)."""

    def __init__(self, stream: TextIO | None = None, process: str = "APIServer", clock: Clock = SYSTEM):
        super().__init__(stream, process, clock)

    def engine(self, where: str, message: str) -> None:
        self.info(where, message, "EngineCore")

    def line(self, level: str, where: str, message: str, process: str | None = None) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        proc = process or self.process
        self._write(f"({proc} pid={self.pid}) {level} {stamp} [{where}] {message}")

    def raw(self, message: str, process: str | None = None) -> None:
        self._write(f"({process or self.process} pid={self.pid}) {message}")

    def banner(self, version: str, model: str) -> None:
        art = [
            "",
            "       █     █     █▄   ▄█",
            f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}",
            f"  █▄█▀ █     █     █     █  model   {model}",
            "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
            "",
        ]
        for row in art:
            self.info("utils.py:299", row)
