"""A hung engine on its card: a twin made to hang (`POST /twin/hang`) answers /health and its metrics but
makes no tokens while requests wait; the card says hung, in red, with why, first under its address, and the
event log says it; let go, the card is ready again and the log says the hang is cleared."""

from __future__ import annotations

import httpx

from sparktop.ui.app import SparktopApp
from sparktop.ui.cards import EngineCard
from tests.helpers.cluster import load, poller_for
from tests.helpers.pilot import until
from tests.ui.test_monitor_app import cards, cluster  # noqa: F401 - the twin cluster fixture


async def test_a_hung_engine_shows_hung_with_why_and_comes_back_ready(cluster):  # noqa: F811
    a = cluster.nodes[0]
    # A short threshold on the poller's clock: the test waits for states, never for a time.
    poller = poller_for(cluster, interval=0.3, hung_after=4.0)
    await poller.start()
    app = SparktopApp(poller)
    key = cluster.urls[0]
    try:
        async with load([key], concurrency=2), app.run_test(size=(100, 30)) as pilot:
            card = lambda: next((c for c in cards(app, EngineCard) if c.key == key), None)  # noqa: E731
            await until(pilot, lambda: card() is not None and "● ready" in card().text
                        and (app.state.engines[key].gen_tokens_total or 0) > 0, timeout=30)
            async with httpx.AsyncClient() as client:
                await client.post(key + "/twin/hang")
                await until(pilot, lambda: "● hung" in card().text, timeout=30)
                snap = app.state.engines[key]
                assert snap.state == "hung" and snap.reason.startswith("no tokens for ")
                line = card()._card_lines[1]  # first under the address, in red
                assert line.plain.startswith("hung: no tokens for ") and "red" in str(line.style)
                assert [n.kind for n in app.state.log(key)][-1] == "hung"
                assert a.name in card().text  # still placed on its node: it answers
                await client.post(key + "/twin/hang", json={"hung": False})
            await until(pilot, lambda: "● ready" in card().text, timeout=30)
            assert [n.kind for n in app.state.log(key)][-2:] == ["hung", "hung_cleared"]
    finally:
        await poller.close()
