"""Regenerate the pictures in screenshots/ from the real app on a twin cluster.

    python scripts/screenshots.py            # monitor at 80x24 and 160x48, detail view, launcher
    python scripts/screenshots.py --record tests/fixtures/recording.jsonl [--incident]
    python scripts/screenshots.py --only 120x40   # every screen at 120x40, no twin needed
    python scripts/screenshots.py --only nodes    # the monitor with 4 and 8 nodes (a fanned-out replay)
    python scripts/screenshots.py --only engines [--record-dir tests/fixtures]
        # mixed engines: vLLM beside llama.cpp on two nodes, and vLLM, llama.cpp, SGLang and
        # TensorRT-LLM on four (recorded as recording-engines-2/4.jsonl for the snapshot tests)
    python scripts/screenshots.py --only sync     # sparktop sync and the cache screen (two lab hosts: root, sshd)
    python scripts/screenshots.py --only setup    # sparktop setup from two bare lab hosts (root, sshd)

Starts a two-node twin cluster serving gpt-oss-120b under a light load,
lets the histories fill, then drives the app headless (Textual's
run_test) and saves SVGs plus PNGs (cairosvg) that show what a user sees.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparktop.observe.poller import NodeTarget, Poller  # noqa: E402
from sparktop.observe.record import Recorder  # noqa: E402
from sparktop.settings import Defaults  # noqa: E402
from sparktop.twin.cluster import DEFAULT_IMAGE, TwinCluster  # noqa: E402
from sparktop.ui.app import SparktopApp  # noqa: E402
from sparktop.ui.cards import EngineCard  # noqa: E402

OUT = ROOT / "screenshots"


_LEADING = re.compile(r'(<text [^>]*?x=")([\d.]+)("[^>]*?textLength=")([\d.]+)("[^>]*>)((?:&#160;)+)([^<]*)</text>')


def _shift_leading_spaces(svg_text: str) -> str:
    """SVG renderers drop the leading spaces of a text run; move the run right instead."""
    def fix(m: re.Match) -> str:
        spaces = m.group(6).count("&#160;")
        rest = m.group(7)
        total = spaces + len(rest.replace("&#160;", " ").replace("&amp;", "&").replace("&lt;", "<")
                             .replace("&gt;", ">"))
        cell = float(m.group(4)) / max(1, total)
        x = float(m.group(2)) + cell * spaces
        return f"{m.group(1)}{x:.1f}{m.group(3)}{cell * (total - spaces):.1f}{m.group(5)}{rest}</text>"
    return _LEADING.sub(fix, svg_text)


def png(svg: Path) -> None:
    """rsvg-convert with Fira Code installed renders Textual's SVG faithfully;
    cairosvg is the fallback."""
    import shutil

    target = svg.with_suffix(".png")
    fixed = svg.with_suffix(".render.svg")
    fixed.write_text(_shift_leading_spaces(svg.read_text()))
    try:
        if shutil.which("rsvg-convert"):
            subprocess.run(["rsvg-convert", "-w", "1600", "-o", str(target), str(fixed)], check=True)
        else:
            import cairosvg

            cairosvg.svg2png(url=str(fixed), write_to=str(target), output_width=1600)
    finally:
        fixed.unlink()


async def shoot(app: SparktopApp, size: tuple[int, int], name: str, keys: list[str] = (), wait: float = 1.5) -> None:
    async with app.run_test(size=size) as pilot:
        await pilot.pause(wait)
        for key in keys:
            await pilot.press(key)
            await pilot.pause(0.8)
        path = OUT / f"{name}.svg"
        app.save_screenshot(str(path))
        png(path)
        print("wrote", path.relative_to(ROOT), "and .png")


def save(app: SparktopApp, name: str) -> None:
    path = OUT / f"{name}.svg"
    app.save_screenshot(str(path))
    png(path)
    print("wrote", path.relative_to(ROOT), "and .png")


async def shoot_launcher(cluster: TwinCluster, reuse) -> None:
    """A small model launched next to the big one: the launcher, its progress, the monitor after."""
    from textual.widgets import DataTable

    from sparktop.ui.launcher import LaunchScreen, ProgressScreen

    recipe, model = "nemotron-nano-9b-v2", "nvidia/NVIDIA-Nemotron-Nano-9B-v2-NVFP4"
    for node in cluster.nodes:
        (node.home / ".cache/huggingface/hub" / ("models--" + model.replace("/", "--")) / "snapshots/x").mkdir(
            parents=True, exist_ok=True)
    app = reuse()
    app.inventory = cluster.inventory()
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(1.0)
        await pilot.press("l")
        await pilot.pause(0.5)
        screen = app.screen
        assert isinstance(screen, LaunchScreen)
        rows = [row.key.value for row in screen.query_one("#recipes", DataTable).ordered_rows]
        for _ in range(rows.index(recipe)):
            await pilot.press("down")
        for _ in range(50):
            await pilot.pause(0.2)
            if screen.plan is not None and screen.preflight_for == screen.plan.render() and \
                    "predicted" in str(screen.query_one("#preflight").content):
                break
        save(app, "launcher-160x48")
        await pilot.press("enter")
        for _ in range(100):
            await pilot.pause(0.1)
            if isinstance(app.screen, ProgressScreen) and app.screen.run.stages:
                break
        await pilot.pause(2.5)
        save(app, "launch-progress-160x48")
        run = app.screen.run
        for _ in range(200):
            await pilot.pause(0.2)
            if run.status != "running":
                break
        await pilot.press("escape")
        await pilot.pause(6.0)
        save(app, "monitor-after-launch-160x48")
        await app.launcher.stop([run.plan.launch_id])


async def start_sweep(app: SparktopApp, pilot, url: str, mode: str, **form: str):
    """`s` in the monitor, the endpoint, mode and form filled in, Enter: the sweep screen, sweeping."""
    from sparktop.ui.sweep import SweepScreen

    await pilot.pause(2.0)
    await pilot.press("s")
    await pilot.pause(0.5)
    screen = app.screen
    assert isinstance(screen, SweepScreen)
    screen.query_one("#sweep-engine").value = url
    screen.query_one("#sweep-mode").value = mode
    await pilot.pause(0.3)  # the mode shows its own fields
    for wid, value in form.items():
        screen.query_one(f"#{wid}").value = value
    await pilot.press("enter")
    return screen


async def shoot_sweep(reuse, urls: list[str], results: Path) -> None:
    """A sweep of spark-a's engine with an earlier run of spark-b's overlaid:
    mid-run, then finished; then the comparison of the two."""
    from sparktop.bench.sweep import Sweep, SweepSettings
    from sparktop.ui.sweep import CompareScreen, RunsScreen

    settings = dict(levels=[1, 2, 4, 8, 16], runs=2, pp=1024, tg=64)
    await Sweep(SweepSettings(urls[1], topology="solo", label="solo on spark-b", **settings), results).run()
    app = reuse()
    app.results_root = results
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await start_sweep(app, pilot, urls[0], "concurrency",
                                   levels="1,2,4,8,16", runs="2", pp="1024", tg="64")
        while len(screen.levels) < 3:
            await pilot.pause(0.2)
        await pilot.pause(1.0)
        save(app, "sweep-running-160x48")
        while screen.finished is None:
            await pilot.pause(0.5)
        await pilot.pause(1.0)
        save(app, "sweep-finished-160x48")
        await pilot.press("ctrl+r")
        await pilot.pause(0.5)
        assert isinstance(app.screen, RunsScreen)
        await pilot.press("space", "down", "space", "enter")
        await pilot.pause(1.0)
        assert isinstance(app.screen, CompareScreen)
        save(app, "sweep-compare-160x48")
    await shoot_rate_sweep(reuse, urls[0], results)


async def shoot_rate_sweep(reuse, url: str, results: Path) -> None:
    """The sweep screen searching for the highest request rate meeting an SLO, finished, at three sizes."""
    app = reuse()
    app.results_root = results
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await start_sweep(app, pilot, url, "max-rate", levels="1", seconds="8", pp="1024", tg="64",
                                   slo="ttft_p95=1s,itl_p95=60ms")
        while screen.finished is None:
            await pilot.pause(0.5)
        await pilot.pause(1.0)
        for size in ((160, 48), (120, 40), (80, 24)):
            await pilot.resize_terminal(*size)
            await pilot.pause(1.0)
            save(app, f"sweep-max-rate-{size[0]}x{size[1]}")


async def shoot_every_screen(size: tuple[int, int] = (120, 40)) -> None:
    """Every screen at one size, from the same deterministic set-up as
    tests/ui/test_layouts.py (a replay, a study and sweep runs from files)."""
    import os
    import time

    from tests.helpers import layouts
    from tests.ui.test_study_screen import every_kind_of_cell

    os.environ["TZ"] = "UTC"
    time.tzset()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_STATE_HOME"] = str(Path(tmp) / "state")
        os.environ["XDG_DATA_HOME"] = str(Path(tmp) / "data")
        results = layouts.write_runs(Path(tmp) / "results")
        app = layouts.replay_app(results_root=results, study_dir=every_kind_of_cell(Path(tmp) / "studies"),
                                 inventory=layouts.inventory())

        async def shot(name: str) -> None:
            save(app, f"{name}-{size[0]}x{size[1]}")

        async with app.run_test(size=size) as pilot:
            await layouts.every_screen(pilot, results, shot)


async def shoot_history() -> None:
    """The history screen (h) at the three sizes, on the deterministic week tests/ui/test_history_screen.py
    writes (a restart, a night of low memory, a KV spike, an engine down for an hour)."""
    import os
    import time

    from sparktop.history.query import HistoryReader
    from sparktop.history.store import HistoryStore
    from tests.ui.test_history_screen import host, write_week

    os.environ["TZ"] = "UTC"
    time.tzset()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_week(Path(tmp) / "history.sqlite")
        store = HistoryStore.open(path, write=False)
        try:
            for size in ((80, 24), (120, 40), (160, 48)):
                app = host(HistoryReader(store))
                async with app.run_test(size=size) as pilot:
                    await pilot.pause(0.5)
                    save(app, f"history-{size[0]}x{size[1]}")
        finally:
            store.close()


async def shoot_many_nodes() -> None:
    """The monitor with four and eight nodes at 80x24, 120x40 and 160x48, from
    the demo recording fanned out to that many nodes (as the snapshot tests)."""
    import os
    import time

    from tests.helpers.fanout import fanned_app, settle_fanned

    os.environ["TZ"] = "UTC"
    time.tzset()
    recording = ROOT / "tests" / "fixtures" / "recording-demo.jsonl"
    for nodes in (4, 8):
        for size in ((80, 24), (120, 40), (160, 48)):
            app = fanned_app(recording, nodes)
            async with app.run_test(size=size) as pilot:
                await settle_fanned(pilot, nodes)
                save(app, f"monitor-{nodes}-nodes-{size[0]}x{size[1]}")


ENGINE_MIXES = {2: ["vllm", "llama.cpp"], 4: ["vllm", "llama.cpp", "sglang", "trtllm"]}


async def shoot_engines(model: str, warmup: float, record_dir: Path | None) -> None:
    """Each mix of engines on twin nodes under load, watched for `warmup`
    seconds (recorded when asked), then the monitor at the three sizes."""
    from sparktop.twin.cluster import RUNTIME_IMAGES

    for count, engines in ENGINE_MIXES.items():
        with tempfile.TemporaryDirectory() as tmp:
            names = tuple(f"spark-{chr(ord('a') + i)}" for i in range(count))
            cluster = TwinCluster(Path(tmp) / "demo", startup_speed=20, names=names,
                                  images=[DEFAULT_IMAGE, *RUNTIME_IMAGES.values()]).setup()
            urls = await cluster.run_solo(model=model, startup_speed=60, engines=engines)
            load = subprocess.Popen([sys.executable, "-m", "sparktop.twin.load", *urls, "--min", "2", "--max", "6",
                                     "--period", "40"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            poller = Poller([NodeTarget(n.name, n.transport(), n.address) for n in cluster.nodes], interval=1.0,
                            default_port=None)
            await poller.start()
            path = record_dir / f"recording-engines-{count}.jsonl" if record_dir else None
            if path is not None:
                path.unlink(missing_ok=True)  # a Recorder appends
            recorder = Recorder(str(path), 1.0) if path else None
            label = f"demo: {', '.join(engines)} serving {model}"
            try:
                warm = SparktopApp(poller, recorder=recorder, label=label)
                async with warm.run_test(size=(160, 48)) as pilot:
                    await pilot.pause(warmup)
                state = warm.state
                for size in ((80, 24), (120, 40), (160, 48)):
                    app = SparktopApp(poller, recorder=None, label=label)
                    app.state = state
                    await shoot(app, size, f"monitor-engines-{count}-{size[0]}x{size[1]}")
            finally:
                if recorder:
                    recorder.close()
                    print("recorded", path)
                load.terminate()
                await poller.close()
                await cluster.stop_all()


async def shoot_link(model: str, warmup: float) -> None:
    """A tp=2 layout launched as `sparktop demo --layout tp=2` does, under load: the node cards' link
    line (RDMA each way, the kernel's, what NCCL should send) and the node's detail screen, at the three
    sizes; then the same pair with NCCL put on sockets (NCCL_IB_DISABLE=1): the warning, at the three sizes too."""
    import shlex

    from sparktop.demo import launch_layout, start_demo_cluster, stop_everything
    from sparktop.launch.state import api_key_for

    for sockets in (False, True):
        cluster, _ = await start_demo_cluster(model, speed=1.0, nodes=2, engines=False, startup_speed=500)
        launcher = None
        load = None
        try:
            if sockets:
                a, b = cluster.nodes
                env = ["-e", "NCCL_SOCKET_IFNAME=enp1s0f1np1", "-e", "NCCL_IB_DISABLE=1"]
                labels = ["--label", "sparktop.launch=pair", "--label", "sparktop.topology=tp=2"]
                common = [model, "-tp", "2", "--nnodes", "2", "--master-addr", a.address, "--master-port", "29511",
                          "--startup-speed", "500"]
                await b.transport().run(shlex.join(
                    ["docker", "run", "-d", "--name", "worker1-spark-a", "--network", "host", *env, *labels,
                     "--label", "sparktop.role=worker1-spark-a", DEFAULT_IMAGE, *common, "--node-rank", "1",
                     "--headless"]), timeout=30)
                await a.transport().run(shlex.join(
                    ["docker", "run", "-d", "--name", "vllm-spark-a", "--network", "host", *env, *labels,
                     "--label", "sparktop.role=vllm-spark-a", DEFAULT_IMAGE, *common, "--node-rank", "0",
                     "--host", a.address, "--port", "8000"]), timeout=30)
                url = f"http://{a.address}:8000"
                from sparktop.twin.cluster import wait_ready

                await wait_ready([url], timeout=60)
            else:
                launcher, plan = await launch_layout(cluster, model, "tp=2", say=lambda _: None)
                url = plan.endpoints[0].url.removesuffix("/v1")
            load = subprocess.Popen([sys.executable, "-m", "sparktop.twin.load", url, "--min", "4", "--max", "8",
                                     "--period", "40"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            poller = Poller([NodeTarget(n.name, n.transport(), n.address) for n in cluster.nodes], interval=1.0,
                            default_port=None, router_key=api_key_for)
            await poller.start()
            label = f"demo: {model} tp=2" + (" with NCCL on sockets" if sockets else "")
            try:
                warm = SparktopApp(poller, recorder=None, label=label)
                async with warm.run_test(size=(160, 48)) as pilot:
                    await pilot.pause(warmup)
                state = warm.state
                for size in ((80, 24), (120, 40), (160, 48)):
                    stem = "link-sockets" if sockets else "link"
                    app = SparktopApp(poller, recorder=None, label=label)
                    app.state = state
                    await shoot(app, size, f"monitor-{stem}-{size[0]}x{size[1]}")
                    if not sockets:
                        app = SparktopApp(poller, recorder=None, label=label)
                        app.state = state
                        # The first node card, Enter: its detail (the link's ports, chart, the machine).
                        await shoot(app, size, f"detail-node-link-{size[0]}x{size[1]}", keys=["tab", "enter"])
            finally:
                await poller.close()
        finally:
            if load is not None:
                load.terminate()
            if launcher is not None:
                await launcher.close()
            await stop_everything(cluster)


async def incident(cluster: TwinCluster, model: str) -> None:
    """spark-b's engine dies and is started again under the same name, so
    the event log has something to show: down, back, restarted."""
    import shlex

    node = cluster.nodes[1]
    await node.transport().run(shlex.join(["docker", "kill", "sparktop-vllm"]), timeout=30)
    await asyncio.sleep(8)  # long enough to be seen down
    await node.transport().run(shlex.join(["docker", "rm", "-f", "sparktop-vllm"]), timeout=30)
    argv = ["docker", "run", "-d", "--name", "sparktop-vllm", "--gpus", "all", "--ipc=host", "--network", "host",
            cluster.images[0], model, "--host", node.address, "--port", str(cluster.port_for(1, 8000)),
            "--gpu-memory-utilization", "0.7", "--speed", str(cluster.speed), "--startup-speed", "60"]
    await node.transport().run(shlex.join(argv), timeout=30)


async def main(args) -> None:
    OUT.mkdir(exist_ok=True)
    if args.only == "120x40":
        await shoot_every_screen((120, 40))
        return
    if args.only == "nodes":
        await shoot_many_nodes()
        return
    if args.only == "history":
        await shoot_history()
        return
    if args.only == "sync":  # `sparktop sync` and the cache screen, between two lab hosts (scripts/sync_screenshots.py)
        from scripts.sync_screenshots import shoot as shoot_sync

        await shoot_sync(OUT, png)
        return
    if args.only == "setup":  # `sparktop setup` from two bare lab hosts (scripts/setup_screenshots.py)
        from scripts.setup_screenshots import shoot as shoot_setup

        shoot_setup(OUT, png)
        return
    if args.only == "link":
        await shoot_link(args.model, args.warmup)
        return
    if args.only == "engines":
        await shoot_engines(args.model, args.warmup, Path(args.record_dir) if args.record_dir else None)
        return
    with tempfile.TemporaryDirectory() as tmp:
        defaults = Defaults()
        cluster = TwinCluster(Path(tmp) / "demo", startup_speed=20,
                              images=[DEFAULT_IMAGE, defaults.image, defaults.router_image]).setup()
        urls = await cluster.run_solo(model=args.model, startup_speed=60)
        load = subprocess.Popen([sys.executable, "-m", "sparktop.twin.load", *urls, "--min", "2", "--max", "8",
                                 "--period", "40"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        poller = Poller([NodeTarget(n.name, n.transport(), n.address) for n in cluster.nodes], interval=1.0,
                        default_port=None)
        await poller.start()
        recorder = Recorder(args.record, 1.0) if args.record else None
        try:
            # Let the engines start and the sparklines fill before the first picture.
            warm = SparktopApp(poller, recorder=recorder, label=f"demo: twin cluster serving {args.model}")
            async with warm.run_test(size=(160, 48)) as pilot:
                if args.incident:
                    await pilot.pause(args.warmup / 3)
                    await incident(cluster, args.model)
                    await pilot.pause(args.warmup * 2 / 3)
                else:
                    await pilot.pause(args.warmup)
            state = warm.state

            def reuse() -> SparktopApp:
                app = SparktopApp(poller, recorder=recorder, label=f"demo: twin cluster serving {args.model}")
                app.state = state
                return app

            if args.only == "sweep":
                load.terminate()
                await shoot_sweep(reuse, urls, Path(tmp) / "results")
                return
            if args.only == "launcher":
                await shoot_launcher(cluster, reuse)
                return
            await shoot(reuse(), (80, 24), "monitor-80x24")
            await shoot(reuse(), (160, 48), "monitor-160x48")
            app = reuse()
            async with app.run_test(size=(160, 48)) as pilot:
                await pilot.pause(1.0)
                engine = next(iter(app.screen.query(EngineCard)))
                engine.focus()
                await pilot.press("enter")
                await pilot.pause(1.2)
                path = OUT / "detail-engine-160x48.svg"
                app.save_screenshot(str(path))
                png(path)
                print("wrote", path.relative_to(ROOT), "and .png")
            await shoot_launcher(cluster, reuse)
            load.terminate()  # the sweep wants the engines to itself
            await shoot_sweep(reuse, urls, Path(tmp) / "results")
        finally:
            if recorder:
                recorder.close()
            load.terminate()
            await poller.close()
            await cluster.stop_all()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-oss-120b")
    ap.add_argument("--warmup", type=float, default=40.0, help="seconds of history before the pictures")
    ap.add_argument("--record", help="also record the session to this JSONL file")
    ap.add_argument("--incident", action="store_true",
                    help="during the warm-up, kill spark-b's engine and start it again (events to show)")
    ap.add_argument("--only", choices=["sweep", "launcher", "120x40", "nodes", "engines", "link", "history",
                                       "sync", "setup"],
                    help="only these pictures")
    ap.add_argument("--record-dir", help="with --only engines: record each mix there (recording-engines-N.jsonl)")
    asyncio.run(main(ap.parse_args()))
