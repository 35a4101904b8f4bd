"""Reconciliation: nudge conversations whose command got lost or whose compaction failed.

Only a request is sent: the accounting agent owns the table and decides
(``core.accounting.on_reconcile``); this pass only asks ``reconcile_due``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime

from core.accounting import reconcile_due
from core.budget import BudgetConfig
from streams.events import ReconcileRequest
from streams.worker.publisher import Publisher
from streams.worker.tally_table import TallyTable

# Entries checked between two yields to the event loop: a large table must not
# freeze the agents and views sharing it (1.3 s at 100 000 RocksDB entries).
YIELD_EVERY = 500


class Reconciler:
    def __init__(
        self,
        *,
        table: TallyTable,
        publisher: Publisher,
        budget: BudgetConfig,
        interval_seconds: float,
        command_timeout_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._table = table
        self._publisher = publisher
        self._budget = budget
        self._interval = interval_seconds
        self._timeout = command_timeout_seconds
        self._clock = clock
        self._last_request: dict[str, float] = {}

    async def tick(self) -> int:
        """One pass over the table; the number of requests sent."""
        now = self._clock()
        sent = 0
        for scanned, (conversation_id, tally) in enumerate(self._table.items()):
            if scanned % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            if not reconcile_due(tally, self._budget, now, self._timeout):
                continue
            if now - self._last_request.get(conversation_id, 0.0) < self._interval:
                continue
            self._last_request[conversation_id] = now
            request = ReconcileRequest(
                conversation_id=conversation_id, requested_at=datetime.fromtimestamp(now, UTC)
            )
            await self._publisher.publish(
                "control", conversation_id.encode(), request.model_dump_json().encode()
            )
            sent += 1
        return sent
