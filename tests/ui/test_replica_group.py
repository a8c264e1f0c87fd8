"""The router's card in the app says its replicas' percentiles taken together: a recording of two replicas
and their router (their window histograms written and read back as `--record` and `replay` do), replayed
into the app, paused at its end."""

from __future__ import annotations

from sparktop.observe.record import Recorder, Recording, ReplaySource
from sparktop.observe.replicas import group_latency
from sparktop.ui.app import SparktopApp
from sparktop.ui.cards import EngineCard
from tests.unit.test_replica_latency import router, twins


async def test_the_routers_card_says_its_replicas_p95_from_their_buckets_summed(tmp_path):
    fast, slow = twins()
    front = router()
    path = tmp_path / "replicas.jsonl"
    recorder = Recorder(path, interval=1.0)
    for e in (fast, slow, front):
        recorder.write(e)
    recorder.close()
    source = ReplaySource(Recording.load(path), speed=1.0)
    source.seek(1e12)
    source.pause()
    app = SparktopApp(source, replay=True)
    itl = f"{group_latency([fast, slow]).p95('itl') * 1000:.0f}ms"
    async with app.run_test(size=(160, 48)) as pilot:
        card = None
        for _ in range(100):
            await pilot.pause(0.05)
            card = next((c for c in app.screen.query(EngineCard) if c.key == front.key), None)
            if card is not None and len(app.state.engines) == 3 and card._card_lines:
                break
        assert card is not None
        text = [line.plain for line in card._card_lines]
        assert f"TTFT p95 3.5s · ITL p95 {itl} (all)" in text, text


async def test_haproxys_card_says_which_replica_its_health_check_took_out(tmp_path):
    """An HAProxy router's card names each replica as its health checks see it (recorded and replayed)."""
    import dataclasses

    fast, slow = twins()
    front = dataclasses.replace(router(), kind="haproxy", engine="HAProxy",
                                backends={"spark-a": "UP", "spark-b": "DOWN"})
    path = tmp_path / "haproxy.jsonl"
    recorder = Recorder(path, interval=1.0)
    for e in (fast, slow, front):
        recorder.write(e)
    recorder.close()
    source = ReplaySource(Recording.load(path), speed=1.0)
    source.seek(1e12)
    source.pause()
    app = SparktopApp(source, replay=True)
    async with app.run_test(size=(160, 48)) as pilot:
        card = None
        for _ in range(100):
            await pilot.pause(0.05)
            card = next((c for c in app.screen.query(EngineCard) if c.key == front.key), None)
            if card is not None and len(app.state.engines) == 3 and card._card_lines:
                break
        assert card is not None
        text = [line.plain for line in card._card_lines]
        assert "replicas spark-a UP · spark-b DOWN" in text, text
        assert "routes to 2 engines" in text, text
