"""What compactions cost, per tenant and UTC day, read from ``compactions`` (0012)
and the content-free ``usage_aggregates`` (0014: failed compactions' spend):
``PostgresUsage``."""

from __future__ import annotations

from datetime import date, datetime
from typing import TYPE_CHECKING

import asyncpg

from core.adapters.postgres.connection import reading
from core.adapters.postgres.errors import port_errors_on_methods
from core.domain.usage import LlmUsage, UsageDay
from core.ports.storage import ReadScope, UsageStore

#: Tokens a tenant's LLM budget counts: every token an LLM processed (the
#: extractive summariser's, and rows from before 0012, are no LLM's), the
#: compactions' and the content-free aggregates' (0014: failed compactions' spend).
_SPENT_SQL = """
SELECT (SELECT coalesce(sum(input_tokens + output_tokens + cache_read_tokens
                            + cache_write_tokens), 0)
          FROM compactions
         WHERE tenant_id = $1 AND created_at >= $2
           AND summarizer IS NOT NULL AND summarizer <> 'extractive')
     + (SELECT coalesce(sum(budget_tokens), 0)
          FROM usage_aggregates
         WHERE tenant_id = $1 AND day >= ($2 AT TIME ZONE 'UTC')::date)
"""

_BY_DAY_SQL = """
WITH spent AS (
    SELECT tenant_id, (created_at AT TIME ZONE 'UTC')::date AS day, 1 AS compactions,
           0 AS failed_compactions, llm_calls, input_tokens, output_tokens,
           cache_read_tokens, cache_write_tokens, coalesce(cost_usd, 0) AS cost_usd,
           budget_fallback::int AS fallback_compactions
      FROM compactions
     WHERE ($1::text IS NULL OR tenant_id = $1)
       AND ($2::date IS NULL OR created_at >= ($2::date)::timestamp AT TIME ZONE 'UTC')
    UNION ALL
    SELECT tenant_id, day, compactions, failed_compactions, llm_calls, input_tokens,
           output_tokens, cache_read_tokens, cache_write_tokens, cost_usd,
           fallback_compactions
      FROM usage_aggregates
     WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::date IS NULL OR day >= $2::date)
)
SELECT tenant_id, day, sum(compactions) AS compactions,
       sum(failed_compactions) AS failed_compactions, sum(llm_calls) AS llm_calls,
       sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,
       sum(cache_read_tokens) AS cache_read_tokens,
       sum(cache_write_tokens) AS cache_write_tokens,
       sum(cost_usd) AS cost_usd, sum(fallback_compactions) AS fallback_compactions
  FROM spent
 GROUP BY 1, 2
 ORDER BY 2, 1 NULLS FIRST
"""

_FAILED_SQL = """
INSERT INTO usage_aggregates (tenant_id, day, source, failed_compactions, llm_calls,
                              input_tokens, output_tokens, cache_read_tokens,
                              cache_write_tokens, budget_tokens, cost_usd)
VALUES ($1, $2, 'failed', 1, $3, $4, $5, $6, $7, $8, $9)
"""


@port_errors_on_methods
class PostgresUsage:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def tenant_llm_tokens(self, tenant_id: str, since: datetime) -> int:
        return int(await self._pool.fetchval(_SPENT_SQL, tenant_id, since))

    async def record_failed_spend(self, tenant_id: str | None, usage: LlmUsage, day: date) -> None:
        budget = usage.total_tokens if usage.summarizer != "extractive" else 0
        await self._pool.execute(
            _FAILED_SQL, tenant_id, day, usage.calls, usage.input_tokens, usage.output_tokens,
            usage.cache_read_tokens, usage.cache_write_tokens, budget, usage.cost_usd or 0.0,
        )  # fmt: skip

    async def usage_by_day(
        self, *, scope: ReadScope, tenant_id: str | None = None, since: date | None = None
    ) -> list[UsageDay]:
        """Read as ``scope`` (row-level security), like the other views' reads."""
        async with reading(self._pool, scope) as conn:
            rows = await conn.fetch(_BY_DAY_SQL, tenant_id, since)
        return [
            UsageDay(
                tenant_id=row["tenant_id"],
                day=row["day"],
                compactions=int(row["compactions"]),
                failed_compactions=int(row["failed_compactions"]),
                llm_calls=int(row["llm_calls"]),
                input_tokens=int(row["input_tokens"]),
                output_tokens=int(row["output_tokens"]),
                cache_read_tokens=int(row["cache_read_tokens"]),
                cache_write_tokens=int(row["cache_write_tokens"]),
                cost_usd=round(float(row["cost_usd"]), 9),
                fallback_compactions=int(row["fallback_compactions"]),
            )
            for row in rows
        ]


if TYPE_CHECKING:

    def _implements(usage: PostgresUsage) -> UsageStore:
        """Never called: makes mypy prove the class implements its port."""
        return usage
