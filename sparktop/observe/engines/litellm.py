"""The LiteLLM proxy sparktop puts in front of replicas (`shuffle`,
`least-busy`): recognised by `/health/liveliness` ("I'm alive!", which needs
no key where /v1/models does), found as a `litellm` command; read by
liveness and its model list. Its tokens are its engines', so it has no
figures of its own to show.
"""

from __future__ import annotations

from sparktop import engine_ids
from sparktop.engine_ids import ROUTER
from sparktop.observe import argv as a
from sparktop.observe.engines.base import Answer, Engine, EngineUnreachable, Get
from sparktop.observe.prometheus import Derived


class Litellm(Engine):
    row = engine_ids.get(ROUTER)
    info_path = "/health/liveliness"

    @classmethod
    def claims_info(cls, answer: Answer) -> str | None:
        if answer.status == 200 and "alive" in (answer.text or "").lower():
            return "/health/liveliness answered as LiteLLM's proxy"
        return None

    @classmethod
    def command(cls, argv: list[str]) -> str | None:
        return "litellm" if any(a.basename(x) == "litellm" for x in argv[:3]) else None

    async def read(self, get: Get, t: float, histograms: bool) -> Derived:
        answer = await get("/health/liveliness")
        if answer.status != 200:
            raise EngineUnreachable(f"/health/liveliness answered HTTP {answer.status}", bound=True)
        return Derived()  # a router's figures are its engines'
