"""What compactions cost, in memory (``UsageStore``)."""

from __future__ import annotations

from datetime import UTC, date, datetime

from core.domain.usage import LlmUsage, UsageDay
from core.ports.storage import (
    ReadScope,
)
from tests.support.memory_store.tables import (
    Tables,
)


class MemoryUsage:
    def __init__(self, tables: Tables) -> None:
        self._t = tables

    async def tenant_llm_tokens(self, tenant_id: str, since: datetime) -> int:
        self._t._call("tenant_llm_tokens")
        compacted = [*self._t.compaction_usage.values(), *self._t.erased_usage]
        return sum(
            usage.total_tokens
            for tenant, at, usage in compacted
            if tenant == tenant_id and at >= since and usage.summarizer != "extractive"
        ) + sum(
            usage.total_tokens
            for tenant, day, usage in self._t.failed_spend
            if tenant == tenant_id
            and day >= since.astimezone(UTC).date()
            and usage.summarizer != "extractive"
        )

    async def record_failed_spend(self, tenant_id: str | None, usage: LlmUsage, day: date) -> None:
        self._t._call("record_failed_spend")
        self._t.failed_spend.append((tenant_id, day, usage))

    async def usage_by_day(
        self, *, scope: ReadScope, tenant_id: str | None = None, since: date | None = None
    ) -> list[UsageDay]:
        self._t._call("usage_by_day")
        self._t.read_scopes.append(("usage_by_day", scope))
        days: dict[tuple[str | None, date], list[LlmUsage]] = {}
        failed: dict[tuple[str | None, date], list[LlmUsage]] = {}
        for tenant, day, usage in self._t.failed_spend:
            if not scope.sees(tenant):
                continue
            if (tenant_id is None or tenant == tenant_id) and (since is None or day >= since):
                failed.setdefault((tenant, day), []).append(usage)
                days.setdefault((tenant, day), [])
        for compaction_id, (tenant, at, usage) in self._t.compaction_usage.items():
            conversation = self._t.compaction_owner[compaction_id]
            if not self._t._visible(scope, conversation):
                continue
            day = at.astimezone(UTC).date()
            if (tenant_id is None or tenant == tenant_id) and (since is None or day >= since):
                days.setdefault((tenant, day), []).append(usage)
        for tenant, at, usage in self._t.erased_usage:
            day = at.astimezone(UTC).date()
            if not scope.sees(tenant) or (tenant_id is not None and tenant != tenant_id):
                continue
            if since is None or day >= since:
                days.setdefault((tenant, day), []).append(usage)
        return [
            _day(tenant, day, spent, failed.get((tenant, day), []))
            for (tenant, day), spent in sorted(
                days.items(),
                key=lambda item: (item[0][1], item[0][0] is not None, item[0][0] or ""),
            )
        ]


def _day(tenant: str | None, day: date, spent: list[LlmUsage], failed: list[LlmUsage]) -> UsageDay:
    every = spent + failed
    return UsageDay(
        tenant_id=tenant,
        day=day,
        compactions=len(spent),
        failed_compactions=len(failed),
        llm_calls=sum(u.calls for u in every),
        input_tokens=sum(u.input_tokens for u in every),
        output_tokens=sum(u.output_tokens for u in every),
        cache_read_tokens=sum(u.cache_read_tokens for u in every),
        cache_write_tokens=sum(u.cache_write_tokens for u in every),
        cost_usd=round(sum(u.cost_usd or 0.0 for u in every), 9),
        fallback_compactions=sum(u.fallback for u in spent),
    )
