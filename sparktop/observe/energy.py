"""Energy and cost per generated token.

Power is what `nvidia-smi` reports as `power.draw` for the node's GPU. On a
GB10 that is the GPU part of the superchip only: not the Grace CPU, the
LPDDR5x memory, the ConnectX-7 NIC, the SSD or the fans, which together
add roughly 20–40 W at the wall (a Spark idles at 22–45 W at the wall while
`nvidia-smi` reads 2–11 W). The figures here are therefore the GPU's share:
a lower bound of what the socket pays, and a fair basis to compare layouts
and concurrencies on the same nodes.

    joules per token     = watts / (tokens per second)      over one window
    Wh per million tokens = J/token × 10⁶ / 3600
    cost per million      = Wh per million / 1000 × price per kWh
"""

from __future__ import annotations

from dataclasses import dataclass, field

POWER_COVERS = "GPU power as nvidia-smi reports it (GB10's GPU only: not the CPU, memory, NIC or fans)"
POWER_SHORT = "GPU power, nvidia-smi"


def joules_per_token(watts: float | None, tokens_per_s: float | None) -> float | None:
    if watts is None or not tokens_per_s or tokens_per_s <= 0:
        return None
    return watts / tokens_per_s


def wh_per_million(j_per_token: float | None) -> float | None:
    return None if j_per_token is None else j_per_token * 1e6 / 3600.0


def cost_per_million(j_per_token: float | None, price_per_kwh: float | None) -> float | None:
    wh = wh_per_million(j_per_token)
    if wh is None or price_per_kwh is None:
        return None
    return wh / 1000.0 * price_per_kwh


@dataclass
class Energy:
    """Power against tokens over one window, for an engine (its nodes' power
    summed) or a node (the tokens generated on it)."""

    watts: float
    tokens_per_s: float
    nodes: list[str] = field(default_factory=list)
    window_s: float = 5.0

    @property
    def j_per_token(self) -> float | None:
        return joules_per_token(self.watts, self.tokens_per_s)

    @property
    def wh_per_million(self) -> float | None:
        return wh_per_million(self.j_per_token)

    def cost_per_million(self, price_per_kwh: float | None) -> float | None:
        return cost_per_million(self.j_per_token, price_per_kwh)

    def to_dict(self, price_per_kwh: float | None = None) -> dict:
        def r(v: float | None, digits: int = 4) -> float | None:
            return None if v is None else round(v, digits)

        return {"watts": r(self.watts, 2), "gen_tps": r(self.tokens_per_s, 2), "nodes": self.nodes,
                "window_s": self.window_s, "j_per_token": r(self.j_per_token),
                "wh_per_mtok": r(self.wh_per_million, 2),
                "cost_per_mtok": r(self.cost_per_million(price_per_kwh))}
