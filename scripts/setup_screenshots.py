"""Pictures of `sparktop setup` at 80x24, 120x40 and 160x48, from a real run between two bare lab hosts.

Two lab hosts (tests/e2e/lab.py: real OpenSSH servers on 127.0.0.2 and
127.0.0.3, needs root and sshd), their ConnectX-7 ports addressed as NVIDIA's
playbook addresses a pair and left at the out-of-the-box MTU of 1500. The
first run (`--yes`) raises the MTU, tests the link and writes the inventory;
the second finds everything in place. Each picture is what the terminal
shows at the end of a run: the last lines it printed, as many as the screen
holds, at that width.

    python scripts/screenshots.py --only setup
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.text import Text

SIZES = ((80, 24), (120, 40), (160, 48))


def _run(lab, width: int, *args: str) -> str:
    """`sparktop setup ...` as a terminal `width` columns wide sees it, colours included."""
    env = {**lab.env(), "COLUMNS": str(width), "LINES": "1000", "FORCE_COLOR": "1", "TERM": "xterm-256color"}
    r = subprocess.run([sys.executable, "-m", "sparktop", "setup", *args], capture_output=True, text=True,
                       env=env, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"sparktop setup {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def _picture(output: str, size: tuple[int, int], path: Path, command: str) -> None:
    """The screen at `size` once the run has ended: the prompt and command, the last lines, a prompt again."""
    width, height = size
    measure = Console(width=width, file=io.StringIO())
    lines = list(Text.from_ansi(output).wrap(measure, width))
    keep = height - 2  # the shell's prompt line below, the command above (when it fits)
    screen = Console(record=True, width=width, height=height, file=io.StringIO(), force_terminal=True,
                     color_system="truecolor")
    shown = lines[-keep:]
    if len(lines) < keep:
        screen.print(Text(f"$ {command}", style="bold"), soft_wrap=True, highlight=False)
    for line in shown:
        screen.print(line, soft_wrap=True, highlight=False)
    screen.print(Text("$ ", style="bold"), highlight=False)
    screen.save_svg(str(path), title=f"sparktop setup ({width}x{height})")


def shoot(out: Path, png) -> None:
    from sparktop.twin.fabric_tools import set_addresses
    from tests.e2e.lab import Lab

    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(Path(tmp) / "lab").start()
        try:
            for host in lab.hosts:
                n = host.address.rsplit(".", 1)[1]
                set_addresses(host.twin.home, {"enp1s0f1np1": [f"{host.address}/24"],
                                               "enP2p1s0f1np1": [f"127.0.1.{n}/24"]})
            hosts = [f"lab-{h.name}" for h in lab.hosts]
            for size in SIZES:
                inventory = lab.root / f"setup-{size[0]}" / "cluster.yaml"
                for host in lab.hosts:  # bare again: the out-of-the-box MTU
                    for port in ("enp1s0f1np1", "enP2p1s0f1np1"):
                        lab.sh(host, f"ip link set dev {port} mtu 1500")
                args = [*hosts, "--yes", "--inventory", str(inventory)]
                command = "sparktop setup " + " ".join(hosts) + " --yes"
                first = _run(lab, size[0], *args)
                name = out / f"setup-{size[0]}x{size[1]}.svg"
                _picture(first, size, name, command)
                png(name)
                print("wrote", name.name)
                again = _run(lab, size[0], *args)
                name = out / f"setup-again-{size[0]}x{size[1]}.svg"
                _picture(again, size, name, command)
                png(name)
                print("wrote", name.name)
        finally:
            lab.stop()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from scripts.screenshots import OUT
    from scripts.screenshots import png as _png

    os.chdir(Path(__file__).resolve().parents[1])
    shoot(OUT, _png)
