"""Any other OpenAI-compatible server: it lists models at /v1/models and
nothing else sparktop recognises. Watched by that list alone (up, and which
model), every figure said to be not exported by it.
"""

from __future__ import annotations

from sparktop import engine_ids
from sparktop.engine_ids import GENERIC
from sparktop.observe.engines.base import Engine, EngineUnreachable, Get
from sparktop.observe.prometheus import Derived
from sparktop.observe.snapshot import FIGURES


class OpenAICompatible(Engine):
    row = engine_ids.get(GENERIC)

    async def read(self, get: Get, t: float, histograms: bool) -> Derived:
        answer = await get("/v1/models")
        if answer.status != 200:
            raise EngineUnreachable(f"/v1/models answered HTTP {answer.status}", bound=True)
        await self.details(get, answer)
        return Derived(missing=list(FIGURES))
