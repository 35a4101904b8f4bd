"""Per-tenant LLM budgets: a tenant whose tokens for the day are spent is
compacted by the extractive summariser until the next UTC day.

The spend is read from the store (the compactions table records every
compaction's LLM tokens, migration 0012), not counted in memory, so it is the
same on every worker and survives restarts. It is read once per compaction,
before planning: a compaction that starts under the budget may end past it by
its own spend, and the next one falls back. The history never goes over its
context budget for it: the fallback summariser compacts just the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime
from typing import Protocol

from core.domain.tenancy import tenant_of
from core.ports.storage import UsageStore
from streams.metrics import Metrics

log = logging.getLogger("compactor.worker")


class UsagePorts(Protocol):
    """What tenant budgets use of the runtime (``streams.worker.runtime``)."""

    @property
    def usage(self) -> UsageStore: ...


def day_start(moment: datetime) -> datetime:
    """UTC midnight of ``moment``'s day: when a tenant's daily budget starts again."""
    day = moment.astimezone(UTC).date()
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


class TenantBudgets:
    """Whether a conversation's tenant has LLM tokens left today."""

    def __init__(
        self,
        limits: Mapping[str, int | None],
        runtime: UsagePorts,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._limits = {tenant: limit for tenant, limit in limits.items() if limit is not None}
        self._runtime = runtime
        self._metrics = metrics
        self._clock = clock
        self._said: dict[str, date] = {}  # the day each tenant's fallback was last logged

    async def spent(self, conversation_key: str) -> bool:
        """True when the conversation's tenant has used its ``llm_tokens_per_day``
        today: compact it with the fallback summariser."""
        tenant = tenant_of(conversation_key)
        limit = self._limits.get(tenant) if tenant is not None else None
        if tenant is None or limit is None:
            return False
        start = day_start(datetime.fromtimestamp(self._clock(), UTC))
        used = await self._runtime.usage.tenant_llm_tokens(tenant, start)
        if used < limit:
            return False
        self._metrics.tenant_budget_fallbacks.inc()
        if self._said.get(tenant) != start.date():
            self._said[tenant] = start.date()
            log.warning(
                "tenant %s has used its LLM budget for %s (%d of %d tokens): its compactions "
                "use the extractive summariser until 00:00 UTC",
                tenant,
                start.date().isoformat(),
                used,
                limit,
                extra={"tenant_id": tenant},
            )
        return True
