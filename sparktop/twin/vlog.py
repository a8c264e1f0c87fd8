"""Log lines in vLLM's format, so whatever reads a vLLM log reads the twin's.

    (APIServer pid=1) INFO 06-07 13:19:30 [model.py:555] Resolved architecture: ...
    (EngineCore pid=96) INFO 06-07 13:27:19 [default_loader.py:384] Loading weights took 371.35 seconds
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO


class VllmLog:
    def __init__(self, stream: TextIO | None = None, process: str = "APIServer"):
        self.stream = stream or sys.stdout
        self.process = process
        self.pid = os.getpid()

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed log must not take the server down

    def line(self, level: str, where: str, message: str, process: str | None = None) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        proc = process or self.process
        self._write(f"({proc} pid={self.pid}) {level} {stamp} [{where}] {message}")

    def info(self, where: str, message: str, process: str | None = None) -> None:
        self.line("INFO", where, message, process)

    def warning(self, where: str, message: str, process: str | None = None) -> None:
        self.line("WARNING", where, message, process)

    def error(self, where: str, message: str, process: str | None = None) -> None:
        self.line("ERROR", where, message, process)

    def engine(self, where: str, message: str) -> None:
        self.info(where, message, "EngineCore")

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
