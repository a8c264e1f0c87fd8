"""The watchdog on twin nodes (`launch/watchdog.py`): an engine sparktop launched that hangs is caught by
the monitor (`hung`, with why), restarted by the watchdog through the twin's docker (every container of
its engine, in the plan's order), comes back ready and the hang is cleared; past its cap the watchdog gives
up and says so. What sparktop did not launch it never restarts: a container without the launch's label, a
`sparktop twin serve` process.

These run in real time (the twins are processes behind the twin's docker), so every threshold is a
parameter set small (hung after 5 s of the poller's clock, a restart's grace of 3 s) and the tests wait
for states and events, each with a generous limit, never for a time."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import time

import httpx
import pytest

from sparktop.demo import launch_layout, start_demo_cluster, stop_everything
from sparktop.launch.state import LaunchRecord, LaunchState
from sparktop.launch.watchdog import GAVE_UP, RESTART, RESTART_FAILED, Policy, watching
from sparktop.observe.poller import EngineTarget, NodeTarget, Poller
from sparktop.observe.snapshot import EngineSnapshot, Notice
from sparktop.observe.state import ClusterState
from sparktop.twin.cluster import DEFAULT_IMAGE, TwinCluster, loopback_aliases_work, wait_ready
from tests.helpers.cluster import load
from tests.helpers.twin_process import start_twin_process

pytestmark = pytest.mark.skipif(not loopback_aliases_work(), reason="needs 127.0.0.2 and 127.0.0.3")

HUNG_AFTER = 5.0  # short, yet longer than a busy two-core machine stalls the twins and the poller together
POLICY = Policy(max_restarts=1, window=1800.0, dead_after=5.0, backoff=3.0)


@pytest.fixture
def state_home(tmp_path, monkeypatch):
    """The twin nodes and sparktop's launch state under the test's own state directory."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


class Watch:
    """The poller's events, applied to a cluster state and fed to the watchdog, as `collect --watchdog` does."""

    def __init__(self, poller: Poller, watchdog):
        self.poller, self.watchdog = poller, watchdog
        self.state = ClusterState()
        self.events: list = []

    async def until(self, predicate, timeout: float, what: str) -> None:
        if predicate():
            return
        deadline = time.monotonic() + timeout
        async for event in self.poller.events():
            self.state.apply(event)
            self.watchdog.observe(event)
            self.events.append(event)
            if predicate():
                return
            assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s; notices: " + "; ".join(
                f"{n.key} {n.kind}: {n.text}" for n in self.notices())

    def notices(self, key: str | None = None, kind: str | None = None) -> list[Notice]:
        return [e for e in self.events if isinstance(e, Notice) and (key is None or e.key == key)
                and (kind is None or e.kind == kind)]

    def snap(self, key: str) -> EngineSnapshot | None:
        return self.state.engines.get(key)


async def started_at(cluster: TwinCluster, node: str, container: str) -> str:
    r = await cluster.node(node).transport().run(
        shlex.join(["docker", "inspect", "--format", "{{.State.Status}} {{.State.StartedAt}}", container]))
    assert r.ok, r.stderr
    return r.stdout.strip()


async def log_of(cluster: TwinCluster, node: str, container: str) -> str:
    r = await cluster.node(node).transport().run(shlex.join(["docker", "logs", container]))
    return r.stdout + r.stderr


@pytest.mark.slow
async def launched_by_hand(node, inventory, lid: str, port: int = 8200) -> tuple[str, str]:
    """A launch of sparktop's as `sparktop launch` leaves it, made by hand (fast): one twin engine's container
    on `node` with the launch's labels, and its record in the inventory's launch state; (url, container)."""
    url, name = f"http://{node.address}:{port}", f"sparktop-{lid}-vllm"
    run = ["docker", "run", "-d", "--name", name, "--label", f"sparktop.launch={lid}", "--label",
           f"sparktop.endpoint={url}", "--label", "sparktop.kind=vllm", "--gpus", "all", "--network", "host",
           DEFAULT_IMAGE, "llama-3.1-8b", "--host", node.address, "--port", str(port), "--speed", "4",
           "--startup-speed", "1000", "--max-model-len", "32768"]
    done = await node.transport().run(shlex.join(run))
    assert done.ok, done.stderr
    LaunchState(inventory).save(LaunchRecord(
        id=lid, recipe="llama-3.1-8b", topology="solo", nodes=[node.name], containers={node.name: [name]},
        status="ready", endpoints=[{"url": url, "kind": "vllm", "node": node.name, "model": "llama-3.1-8b",
                                    "topology": "solo", "container": name, "members": [[node.name, name]]}]))
    return url, name


async def test_a_launched_engine_that_hangs_is_restarted_by_the_watchdog_and_cleared_then_given_up_on(state_home):
    """A tp=2 engine launched over two twin nodes (workers before the head, as the plan starts them) and a
    hung engine's whole cycle twice: 20 to 50 s of launching, hanging, restarting and starting again on two
    cores."""
    cluster, _ = await start_demo_cluster("llama-3.1-8b", speed=4, startup_speed=200, nodes=2, engines=False)
    # An engine started by hand on the same nodes, which hangs as well: never the watchdog's.
    (by_hand, _) = await cluster.run_solo(model="llama-3.1-8b", port=8100, startup_speed=1000, name="byhand",
                                          extra=["--gpu-memory-utilization", "0.3", "--max-model-len", "32768"])
    launcher, plan = await launch_layout(cluster, "llama-3.1-8b", "cluster-mp", say=lambda _: None)
    inventory = cluster.inventory()
    (endpoint,) = plan.endpoints
    url = endpoint.url
    # Its containers, in the order the plan starts them: the headless worker on spark-b, then the head.
    assert [node for node, _ in endpoint.members] == ["spark-b", "spark-a"]
    poller = Poller([NodeTarget(n.name, n.transport(), n.address) for n in cluster.nodes], interval=0.5,
                    down_after=5, default_port=None, hung_after=HUNG_AFTER)
    await poller.start()
    watchdog = watching(poller, inventory, POLICY)
    watch = Watch(poller, watchdog)
    try:
        await wait_ready([url, by_hand], timeout=60)
        async with load([url, by_hand], concurrency=2), httpx.AsyncClient() as client:
            await watch.until(lambda: all((s := watch.snap(u)) is not None and s.state == "ready"
                                          and (s.gen_tokens_total or 0) > 0 for u in (url, by_hand)),
                              60, "both engines serving")
            before = {m: await started_at(cluster, *m) for m in endpoint.members}
            by_hand_before = await started_at(cluster, "spark-a", "byhand")
            by_hand_said = len(watch.notices(by_hand))  # its start, if the poller saw it
            for u in (url, by_hand):
                assert (await client.post(u + "/twin/hang")).json() == {"hung": True}

            # Caught: hung, with why; restarted by the watchdog, every container of the engine; back; cleared.
            await watch.until(lambda: watch.notices(url, "hung_cleared"), 120, "the launched engine cleared")
            kinds = [n.kind for n in watch.notices(url)]
            assert kinds.index("hung") < kinds.index(RESTART) < kinds.index("hung_cleared"), kinds
            assert "down" in kinds and "back" in kinds
            hung = next(e for e in watch.events if isinstance(e, EngineSnapshot) and e.key == url
                        and e.state == "hung")
            assert hung.reason.startswith("no tokens for ") and "requests waiting" in hung.reason
            (restart,) = watch.notices(url, RESTART)
            assert restart.level == "warn" and restart.text.endswith(f"hung: {hung.reason}")
            assert "(restart 1, at most 1 restart in 30 min): hung: no tokens for " in restart.text
            assert all(name in restart.text for _, name in endpoint.members)
            head_log = await log_of(cluster, "spark-a", endpoint.container)
            assert restart.lines and all(line in head_log for line in restart.lines)  # the log's last lines
            after = {m: await started_at(cluster, *m) for m in endpoint.members}
            assert all(after[m].startswith("running ") and after[m] > before[m] for m in endpoint.members), after
            # Started again in the plan's order: the worker before the head that waits for it.
            worker, head = endpoint.members
            assert after[worker].split()[1] <= after[head].split()[1]
            assert watch.snap(url).state == "ready"
            (cleared,) = watch.notices(url, "hung_cleared")
            assert cleared.text == "engine no longer hung: back and ready"
            record = LaunchState(inventory).get(plan.launch_id)
            assert record is not None and len(record.restarts) == 1 and record.gave_up is None

            # The engine started by hand hung all the while: shown so, never restarted.
            assert watch.snap(by_hand).state == "hung"
            assert [n.kind for n in watch.notices(by_hand)][by_hand_said:] == ["hung"]
            assert await started_at(cluster, "spark-a", "byhand") == by_hand_before

            # Past its cap (one restart in the window here) the watchdog gives up, says so, and leaves it.
            await watch.until(lambda: (s := watch.snap(url)) is not None and (s.gen_tokens_total or 0) > 0
                              and s.state == "ready", 60, "the restarted engine serving")
            assert (await client.post(url + "/twin/hang")).json() == {"hung": True}
            await watch.until(lambda: watch.notices(url, GAVE_UP), 60, "the watchdog giving up")
            (gave_up,) = watch.notices(url, GAVE_UP)
            assert gave_up.level == "error" and gave_up.text.startswith(
                f"watchdog gave up on {plan.launch_id} after 1 restart in 30 min: hung: no tokens for ")
            assert gave_up.text.endswith(f"; {url} is left as it is")
            assert watch.notices(url, RESTART) == [restart]
            assert {m: await started_at(cluster, *m) for m in endpoint.members} == after
            assert LaunchState(inventory).get(plan.launch_id).gave_up
            for u in (url, by_hand):
                await client.post(u + "/twin/hang", json={"hung": False})
    finally:
        await watchdog.close()
        await poller.close()
        await launcher.close()
        await stop_everything(cluster)


async def test_what_sparktop_did_not_launch_is_never_restarted(state_home, tmp_path):
    """A container without the launch's label, though a launch record names it (a name taken over, a
    record gone stale), and a `sparktop twin serve` process (SIGUSR1 hangs it): both hang, both are shown
    hung, neither is touched; the first is refused with why."""
    cluster = TwinCluster(tmp_path / "lab", names=("spark-a",), speed=4).setup()
    inventory = cluster.inventory()
    (url,) = await cluster.run_solo(model="llama-3.1-8b", port=8100, startup_speed=1000, name="byhand",
                                    extra=["--max-model-len", "32768"])
    state = LaunchState(inventory)
    state.save(LaunchRecord(id="llama-3.1-8b-solo-abc123", recipe="llama-3.1-8b", topology="solo",
                            nodes=["spark-a"], containers={"spark-a": ["byhand"]}, status="ready",
                            endpoints=[{"url": url, "kind": "vllm", "node": "spark-a", "model": "llama-3.1-8b",
                                        "topology": "solo", "container": "byhand",
                                        "members": [["spark-a", "byhand"]]}]))
    proc, process_url = start_twin_process("llama-3.1-8b", "--max-model-len", "32768", speed=4)
    poller = Poller([NodeTarget(n.name, n.transport(), n.address) for n in cluster.nodes],
                    [EngineTarget(process_url)], interval=0.5, down_after=5, default_port=None, hung_after=HUNG_AFTER)
    await poller.start()
    watchdog = watching(poller, inventory, POLICY)
    watch = Watch(poller, watchdog)
    try:
        await wait_ready([url], timeout=60)
        async with load([url, process_url], concurrency=2), httpx.AsyncClient() as client:
            await watch.until(lambda: all((s := watch.snap(u)) is not None and (s.gen_tokens_total or 0) > 0
                                          for u in (url, process_url)), 60, "both serving")
            before = await started_at(cluster, "spark-a", "byhand")
            said = {u: len(watch.notices(u)) for u in (url, process_url)}  # their starts, if the poller saw them
            await client.post(url + "/twin/hang")
            os.kill(proc.pid, signal.SIGUSR1)  # the twin's own signal: its engine hangs
            await watch.until(lambda: watch.notices(url, RESTART_FAILED) and watch.notices(process_url, "hung"), 60,
                              "both hung, the container refused")
            (refused,) = watch.notices(url, RESTART_FAILED)
            assert "carries no sparktop.launch=llama-3.1-8b-solo-abc123 label" in refused.text
            assert "left alone" in refused.text and refused.text.endswith("left alone")
            # Nothing more happens to either, however long they stay hung.
            await watch.until(lambda: sum(isinstance(e, EngineSnapshot) and e.key in (url, process_url)
                                          and e.state == "hung" for e in watch.events) >= 20, 60, "hung for a while")
            assert [n.kind for n in watch.notices(url)][said[url]:] == ["hung", RESTART_FAILED]
            assert [n.kind for n in watch.notices(process_url)][said[process_url]:] == ["hung"]
            assert await started_at(cluster, "spark-a", "byhand") == before
            assert proc.poll() is None
            assert (await client.get(process_url + "/twin/hang")).json() == {"hung": True}
            assert LaunchState(inventory).get("llama-3.1-8b-solo-abc123").restarts == []
    finally:
        await watchdog.close()
        await poller.close()
        proc.kill()
        proc.wait()
        await cluster.stop_all("byhand")


async def test_a_dead_engine_of_a_launch_is_started_again_and_its_log_says_why(state_home, tmp_path):
    """A launch's engine whose container dies (killed): unreachable, then dead after `dead_after` seconds of
    the watchdog's clock; started again with the lines its log ended on, and back."""
    cluster = TwinCluster(tmp_path / "lab", names=("spark-a",), speed=4).setup()
    a = cluster.nodes[0]
    inventory = cluster.inventory()
    lid = "llama-3.1-8b-solo-d1e2f3"
    url, name = await launched_by_hand(a, inventory, lid)
    poller = Poller([NodeTarget(n.name, n.transport(), n.address) for n in cluster.nodes], interval=0.5,
                    down_after=3, default_port=None, hung_after=HUNG_AFTER)
    await poller.start()
    watchdog = watching(poller, inventory, Policy(max_restarts=3, dead_after=2.0, backoff=3.0))
    watch = Watch(poller, watchdog)
    try:
        await wait_ready([url], timeout=60)
        await watch.until(lambda: (s := watch.snap(url)) is not None and s.state == "ready", 60, "serving")
        before = await started_at(cluster, "spark-a", name)
        assert (await a.transport().run(shlex.join(["docker", "kill", name]))).ok
        await watch.until(lambda: watch.notices(url, "restarted"), 90, "the engine back, started anew")
        # Its start ("ready") comes first, when the poller saw it, which under load may be after it served.
        kinds = [n.kind for n in watch.notices(url)]
        kinds = kinds[1:] if kinds[:1] == ["ready"] else kinds
        assert kinds == ["down", RESTART, "back", "restarted"], kinds
        (restart,) = watch.notices(url, RESTART)
        assert "(restart 1, at most 3 restarts in 30 min): down for " in restart.text
        # Its exit code (137 once the twin's supervisor has recorded the kill; "none" in the moment before).
        assert f"container {name} exited (" in restart.text
        assert restart.lines and "Application startup complete." in "\n".join(restart.lines)
        after = await started_at(cluster, "spark-a", name)
        assert after.startswith("running ") and after > before
        assert LaunchState(inventory).get(lid).restarts and watch.snap(url).state == "ready"
    finally:
        await watchdog.close()
        await poller.close()
        await cluster.stop_all(name)


async def test_collect_with_the_watchdog_restarts_a_hung_engine_and_its_history_keeps_why(state_home, tmp_path):
    """`sparktop collect --watchdog --hung-after 5 --notify URL`: the collector's own watchdog restarts a
    launch's hung engine, a real webhook receiver gets the alert and its end, and the history it writes keeps
    the hang, the restart (with why) and the hang cleared. The
    collector is followed through what it serves to Prometheus (the engine up, down while hung, up again)."""
    import yaml

    from sparktop.history.query import HistoryReader
    from sparktop.history.store import HistoryStore
    from sparktop.settings import load_inventory
    from tests.conftest import free_port
    from tests.integration.test_collect_alerts import Receiver
    from tests.integration.test_history_collect import Collector, wait_served

    cluster = TwinCluster(tmp_path / "lab", names=("spark-a",), speed=4).setup()
    a = cluster.nodes[0]
    inventory_file = tmp_path / "cluster.yaml"
    inventory_file.write_text(yaml.safe_dump({"nodes": [
        {"name": n.name, "host": n.host, "fabric_ip": n.fabric_ip, "bind": n.bind, "env": n.env}
        for n in cluster.inventory().nodes]}))
    lid = "llama-3.1-8b-solo-c0ffee"
    url, name = await launched_by_hand(a, load_inventory(str(inventory_file)), lid)

    async def sh(*argv: str) -> str:
        r = await a.transport().run(shlex.join(argv))
        assert r.ok, r.stderr
        return r.stdout.strip()
    history, port = tmp_path / "history.sqlite", free_port()
    receiver = Receiver()  # a real webhook receiver: the "alerted, restarted and cleared"
    collect = Collector(tmp_path, "--inventory", str(inventory_file), "-i", "0.5", "--file", str(history),
                        "--serve-metrics", f"127.0.0.1:{port}", "--watchdog", "--hung-after", "5",
                        "--notify", receiver.url, "--alert-after", "2")
    try:
        said = await asyncio.to_thread(collect.wait_for,
                                       "watchdog: restarting the hung or dead engines of sparktop's launches")
        assert "(each at most 3 restarts in 30 min); nothing else is touched" in said
        await wait_ready([url], timeout=60)
        await asyncio.to_thread(wait_served, port, "sparktop_engine_up", url, 1.0)
        before = await sh("docker", "inspect", "--format", "{{.State.StartedAt}}", name)
        async with load([url], concurrency=2), httpx.AsyncClient() as client:
            deadline = time.monotonic() + 30
            while "vllm:generation_tokens_total{" not in (await client.get(url + "/metrics")).text:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            await client.post(url + "/twin/hang")
            deadline = time.monotonic() + 90
            while await sh("docker", "inspect", "--format", "{{.State.StartedAt}}", name) == before:
                assert time.monotonic() < deadline, "the collector's watchdog never restarted it"
                await asyncio.sleep(0.3)
        await asyncio.to_thread(wait_served, port, "sparktop_engine_up", url, 1.0, 90)  # back, as it reads it
        await asyncio.to_thread(receiver.until, lambda got: any(g["state"] == "resolved" for g in got), 60,
                                "the hung alert resolved at the receiver")
    finally:
        receiver.server.shutdown()
        code, out, err = await asyncio.to_thread(collect.stop)
        await cluster.stop_all(name)
    assert code == 0, err
    with HistoryStore.open(history, write=False) as store:
        events = [e for e in HistoryReader(store).events(0) if e.key == url]
    kinds = [e.kind for e in events]
    assert kinds.index("hung") < kinds.index(RESTART) < kinds.index("hung_cleared"), kinds
    restart = events[kinds.index(RESTART)]
    assert restart.level == "warn" and f"restarting {name}" in restart.text and "hung: no tokens for " in restart.text
    assert LaunchState(load_inventory(str(inventory_file))).get(lid).restarts
    # The phone's view: the collector's heartbeat, the engine hung (once), then its end (once).
    # (The node's own alerts may come too: vLLM's 90 % share leaves a GB10 under the card's 20 % available.)
    alerts = [(g["state"], g["alert"]) for g in receiver.got
              if g["state"] == "heartbeat" or (g["key"] == url and g["alert"] != "engine_down")]
    assert alerts == [("heartbeat", "heartbeat"), ("firing", "engine_hung"), ("resolved", "engine_hung")], alerts
    assert "SECRET-KEY" not in out + err


@pytest.mark.slow
async def test_launch_with_the_watchdog_stays_to_guard_its_engine_until_ctrl_c(state_home):
    """`sparktop launch RECIPE --yes --watchdog --hung-after 5` on the demo's twin nodes: it launches, then
    stays in the foreground printing what happens to its engine; its engine made to hang is restarted with
    the log lines before it printed; Ctrl-C ends the watch, not the engine. Some 15 to 25 s of launching and
    restarting on two cores."""
    import queue
    import subprocess
    import sys
    import threading

    cluster, _ = await start_demo_cluster("llama-3.1-8b", speed=4, startup_speed=200, nodes=1, engines=False)
    proc = subprocess.Popen([sys.executable, "-m", "sparktop", "launch", "llama-3.1-8b", "--inventory", "demo",
                             "--yes", "--watchdog", "--hung-after", "5"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                                       "COLUMNS": "400"})
    lines: list[str] = []
    new: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            new.put(line)
        new.put(None)

    threading.Thread(target=read, daemon=True).start()

    def wait_for(text: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = new.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"never said {text!r}: {''.join(lines)}") from None
            if line is None:
                raise AssertionError(f"ended without saying {text!r}: {''.join(lines)}")
            if text in line:
                return line

    url = f"http://{cluster.nodes[0].address}:8000"
    try:
        said = await asyncio.to_thread(wait_for, "watchdog on ")
        assert "a hung or dead engine is restarted (at most 3 restarts in 30 min)" in said
        async with load([url], concurrency=2), httpx.AsyncClient() as client:
            deadline = time.monotonic() + 60
            while "vllm:generation_tokens_total{" not in (await client.get(url + "/metrics")).text:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            await client.post(url + "/twin/hang")
            hung = await asyncio.to_thread(wait_for, "engine hung: no tokens for ")
            restart = await asyncio.to_thread(wait_for, "watchdog: restarting ")
            assert url in hung and url in restart and "(restart 1, at most 3 restarts in 30 min): hung: " in restart
            # The engine's last log lines before the restart, indented under it.
            after = await asyncio.to_thread(wait_for, "")
            assert after.startswith("    ") and after.strip(), after
            await asyncio.to_thread(wait_for, "engine no longer hung: back and ready")
        proc.send_signal(signal.SIGINT)
        await asyncio.to_thread(wait_for, "stopping the watch")
        # Ctrl-C waits for a restart under way to finish (the watchdog's close): under load one may have begun.
        assert await asyncio.to_thread(proc.wait, 150) == 130
        assert (await httpx.AsyncClient().get(url + "/health")).status_code == 200  # the engine keeps running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await stop_everything(cluster)
