"""What compactions cost: their LLM spend, recorded with each compaction."""

from __future__ import annotations

from datetime import date, datetime
from typing import Protocol

from core.domain.usage import LlmUsage, UsageDay
from core.ports.storage.reads import ReadScope


class UsageStore(Protocol):
    """What compactions cost (their LLM spend, recorded with each compaction)."""

    async def tenant_llm_tokens(self, tenant_id: str, since: datetime) -> int:
        """LLM tokens (input, output, cache reads and writes) of the tenant's
        compactions since ``since``, the extractive summariser's not counted:
        what its ``llm_tokens_per_day`` is compared with."""
        ...

    async def record_failed_spend(self, tenant_id: str | None, usage: LlmUsage, day: date) -> None:
        """A failed compaction's LLM spend, as a row without conversation or content
        (``usage_aggregates``): counted by ``tenant_llm_tokens`` and ``usage_by_day``,
        and kept through an erase."""
        ...

    async def usage_by_day(
        self, *, scope: ReadScope, tenant_id: str | None = None, since: date | None = None
    ) -> list[UsageDay]:
        """Compactions and their spend summed by tenant and UTC day (from ``since``),
        oldest day first; only what ``scope`` sees. ``tenant_id``: that tenant's only."""
        ...
