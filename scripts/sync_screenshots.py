"""Pictures of `sparktop sync` and the cache screen at 80x24, 120x40 and 160x48, from a real copy.

Two lab hosts (tests/e2e/lab.py: real OpenSSH servers on 127.0.0.2 and
127.0.0.3, needs root and sshd) and Debian's rsync: a generated snapshot is
synced from spark-a to spark-b, throttled so the bar is caught mid-copy. The
sync's picture is what its terminal shows at that moment (the lines printed
so far, the last ones a screen holds, and the bar as rich draws it), then at
the end; the cache screen is the app's, read from both hosts.

    python scripts/screenshots.py --only sync
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path

from rich.console import Console
from rich.text import Text

SIZES = ((80, 24), (120, 40), (160, 48))
MODEL = "nvidia/Llama-3.1-8B-Instruct-FP8"


def _inventory(lab) -> Path:
    rsh = lab.ssh_mesh()
    lines = ["nodes:"]
    for host in lab.hosts:
        lines += [f"  - name: {host.name}", f"    host: lab-{host.name}", f"    fabric_ip: {host.address}",
                  "    eth_if: enp1s0f1np1", "    env:", f"      RSYNC_RSH: {rsh[host.name]}"]
    path = lab.root / "cluster.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _picture(printed: Console, bar, size: tuple[int, int], path: Path, title: str) -> None:
    """The screen at `size`: the last lines printed (as a terminal scrolls) and the bar under them."""
    width, height = size
    shown = Text.from_ansi(printed.export_text(styles=True, clear=False)).wrap(printed, width)
    keep = height - 1 - (1 if bar is not None else 0)
    screen = Console(record=True, width=width, height=height, file=io.StringIO(), force_terminal=True,
                     color_system="truecolor")
    for line in list(shown)[-keep:]:
        screen.print(line, soft_wrap=True, highlight=False)
    if bar is not None:
        screen.print(bar, highlight=False)
    screen.save_svg(str(path), title=title)


async def shoot(out: Path, png) -> None:
    from sparktop.remote import transport_for
    from sparktop.settings import load_inventory
    from sparktop.sync.cached import cluster_cache
    from sparktop.sync.commands import _Renderer
    from sparktop.sync.events import TransferDone, TransferProgress
    from sparktop.sync.transfer import Syncer, SyncRequest
    from sparktop.ui.cache import CacheScreen
    from tests.e2e.lab import Lab
    from tests.helpers.hfsnapshot import write_snapshot
    from tests.ui.test_history_screen import Host

    home = os.environ.get("HOME")
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(Path(tmp) / "lab").start()
        try:
            path = _inventory(lab)
            os.environ["HOME"] = str(lab.client_home)  # the lab's ssh config and known_hosts, as the CLI's
            a, b = lab.hosts[:2]
            write_snapshot(a.home / ".cache/huggingface/hub", MODEL, {
                "model-00001-of-00002.safetensors": 90_000_000, "model-00002-of-00002.safetensors": 40_000_000,
                "tokenizer.json": 9_000_000})
            inventory = load_inventory(path)
            for size in SIZES:
                shutil.rmtree(b.home / ".cache/huggingface", ignore_errors=True)
                printed = Console(record=True, width=size[0], file=io.StringIO(), force_terminal=False, highlight=False)
                renderer = _Renderer(printed, verbose=False)
                transports = {n.name: transport_for(n) for n in inventory.nodes}
                mid = False
                try:
                    async for event in Syncer(inventory, transports).events(SyncRequest(MODEL, "model",
                                                                                         bwlimit="40M")):
                        renderer.show(event)
                        if isinstance(event, TransferProgress) and not mid and event.done > event.total * 0.45:
                            mid = True
                            name = out / f"sync-{size[0]}x{size[1]}.svg"
                            _picture(printed, renderer.progress.get_renderable() if renderer.progress else None,
                                     size, name, "sparktop sync")
                            png(name)
                            print("wrote", name.name)
                        if isinstance(event, TransferDone):
                            renderer.stop()
                finally:
                    renderer.stop()
                    for t in transports.values():
                        await t.close()
                name = out / f"sync-done-{size[0]}x{size[1]}.svg"
                _picture(printed, None, size, name, "sparktop sync")
                png(name)
                print("wrote", name.name)
            for size in SIZES:
                transports = {n.name: transport_for(n) for n in inventory.nodes}
                try:
                    screen = CacheScreen(lambda t=transports: cluster_cache(inventory, t))
                    app = Host(screen)  # type: ignore[arg-type]
                    app.title = "sparktop"
                    async with app.run_test(size=size) as pilot:
                        for _ in range(100):
                            if screen.reads:
                                break
                            await pilot.pause(0.1)
                        await pilot.pause(0.3)
                        name = out / f"cache-{size[0]}x{size[1]}.svg"
                        app.save_screenshot(str(name))
                        png(name)
                        print("wrote", name.name)
                finally:
                    for t in transports.values():
                        await t.close()
        finally:
            if home is not None:
                os.environ["HOME"] = home
            lab.stop()
