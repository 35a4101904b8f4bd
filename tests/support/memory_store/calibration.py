"""Each model's measured tokens per character, in memory (``TokenRates``)."""

from __future__ import annotations

from core.domain.calibration import TokenRate
from tests.support.memory_store.tables import Tables


class MemoryTokenRates:
    def __init__(self, tables: Tables) -> None:
        self._t = tables

    async def token_rate(self, provider: str, model: str) -> TokenRate | None:
        self._t._call("token_rate")
        return self._t.token_rates.get((provider, model))

    async def save_token_rate(self, provider: str, model: str, rate: TokenRate) -> None:
        self._t._call("save_token_rate")
        self._t.token_rates[(provider, model)] = rate
