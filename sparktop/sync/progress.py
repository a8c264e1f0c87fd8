"""What the copying tools print, parsed: rsync's `--info=progress2` lines and `--stats`, and `dd status=progress`.

rsync redraws its progress2 line with carriage returns; the command that
runs it turns those into newlines (`stdbuf -o0 tr '\\r' '\\n'`), so every
redraw arrives as a line here. A line looks like

    1,081,344  36% 1000.98kB/s    0:00:01 (xfr#1, to-chk=5/10)

(bytes so far over the whole run, percent, rate, time, then which file).
`--stats` ends a run with the bytes it really sent: `Literal data` (bytes
sent as data, not matched against what the receiver had: what a resumed
copy saves shows there) and `Total transferred file size`.

`dd status=progress` reports the bytes through a pipe once a second:

    104857600 bytes (105 MB, 100 MiB) copied, 1.00033 s, 105 MB/s
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PROGRESS2 = re.compile(r"^\s*([\d,.]+)\s+(\d+)%\s+([\d.,]+)([kMGT]?B)/s\s+(\d+:\d\d:\d\d)")
_RATE_UNITS = {"B": 1, "kB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}  # rsync's are powers of 1024
_STAT = re.compile(r"^(Total file size|Total transferred file size|Literal data|Matched data|Total bytes sent|"
                   r"Total bytes received|Number of regular files transferred):\s+([\d,.]+)")
_DD = re.compile(r"^(\d+) bytes .*copied, ([\d.,]+) s(?:, ([\d.,]+) ([kMGT]?B)/s)?")
_DD_UNITS = {"B": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}  # dd's are powers of 1000


@dataclass(frozen=True)
class Progress2:
    bytes: int
    percent: int
    rate: float  # bytes per second, as rsync reckons it
    elapsed_or_eta: str


def _number(text: str) -> int:
    # rsync groups digits with the locale's separator (a comma in C and en_US; a dot in some locales).
    return int(text.replace(",", "").replace(".", ""))


def parse_progress2(line: str) -> Progress2 | None:
    m = _PROGRESS2.match(line)
    if not m:
        return None
    rate = float(m.group(3).replace(",", "")) * _RATE_UNITS.get(m.group(4), 1)
    return Progress2(_number(m.group(1)), int(m.group(2)), rate, m.group(5))


def parse_stats(text: str) -> dict[str, int]:
    """`--stats`' byte counts by their names (`Literal data`, `Total transferred file size`, ...)."""
    out = {}
    for line in text.splitlines():
        m = _STAT.match(line.strip())
        if m:
            out[m.group(1)] = _number(m.group(2).removesuffix(" bytes"))
    return out


_STATS_LINE = re.compile(r"^(Number of |Total |Literal data|Matched data|File list |sent [\d,.]+ bytes|total size is)")
_CONSEQUENCES = ("connection unexpectedly closed", "Broken pipe", "some files/attrs were not transferred")


def rsync_reason(lines: list[str]) -> str:
    """The line that says why an rsync failed: its own diagnostic about a file (`rsync: [receiver] write failed
    on ...: No space left on device`), else what ssh said (`Host key verification failed.`), else the rest.
    A diagnostic can follow a progress line on the same line (rsync writes no newline between them)."""
    messages = []
    for line in lines:
        at = line.find("rsync: ")
        text = line[at:].strip() if at >= 0 else line.strip()
        if text and (at >= 0 or parse_progress2(text) is None) and not _STATS_LINE.match(text):
            messages.append(text)
    tiers = (
        [m for m in messages if m.startswith("rsync: ") and not any(c in m for c in _CONSEQUENCES)],
        [m for m in messages if not m.startswith("rsync")],
        [m for m in messages if m.startswith("rsync: ")],
        messages,
    )
    return next((tier[0] for tier in tiers if tier), "no message")


# rsync's exit codes (its manual's EXIT VALUES) in words, for the ones a copy between nodes meets.
_EXITS = {1: "syntax or usage error", 2: "protocol incompatibility", 3: "errors selecting files",
          5: "error starting the client-server protocol", 10: "error in socket I/O",
          11: "error in file I/O: a full disk, or a folder it cannot write", 12: "error in the protocol data stream",
          20: "interrupted", 23: "some files were not transferred", 24: "some source files vanished",
          30: "timeout in data send/receive", 127: "command not found", 35: "timeout waiting for daemon connection",
          255: "ssh failed, or the connection was lost"}


def exit_words(status: int) -> str:
    """`exit 11: error in file I/O: ...` (rsync over ssh does not always pass the receiver's own message on)."""
    words = _EXITS.get(status)
    if words is None and 128 < status < 160:  # the shell's status for a process a signal ended
        words = f"killed by signal {status - 128}"
    return f"exit {status}: {words}" if words else f"exit {status}"


def parse_dd(line: str) -> tuple[int, float | None] | None:
    """(bytes so far, bytes per second) from one `dd status=progress` line."""
    m = _DD.match(line.strip())
    if not m:
        return None
    rate = float(m.group(3).replace(",", ".")) * _DD_UNITS.get(m.group(4), 1) if m.group(3) else None
    return int(m.group(1)), rate
