"""The measured tokens per character of each provider's model (``token_calibration``,
0016): ``PostgresTokenRates``."""

from __future__ import annotations

import asyncpg

from core.adapters.postgres.errors import port_errors_on_methods
from core.domain.calibration import TokenRate

_SAVE = """
INSERT INTO token_calibration (provider, model, tokens, chars, measured, updated_at)
VALUES ($1, $2, $3, $4, $5, now())
ON CONFLICT (provider, model) DO UPDATE
   SET tokens = EXCLUDED.tokens, chars = EXCLUDED.chars,
       measured = EXCLUDED.measured, updated_at = EXCLUDED.updated_at
"""


@port_errors_on_methods
class PostgresTokenRates:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def token_rate(self, provider: str, model: str) -> TokenRate | None:
        row = await self._pool.fetchrow(
            "SELECT tokens, chars, measured FROM token_calibration"
            " WHERE provider = $1 AND model = $2",
            provider,
            model,
        )
        if row is None:
            return None
        return TokenRate(tokens=row["tokens"], chars=row["chars"], measured=row["measured"])

    async def save_token_rate(self, provider: str, model: str, rate: TokenRate) -> None:
        await self._pool.execute(_SAVE, provider, model, rate.tokens, rate.chars, rate.measured)
