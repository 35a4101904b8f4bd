"""Reconciliation: nudge conversations whose command got lost or whose compaction failed.

Only a request is sent: the accounting agent owns the table and decides
(``core.domain.tally.on_reconcile``, after taking the store's counts); this
pass only asks ``reconcile_due``, of the entries in the table's index of
those it may act on (``TallyTable.candidates``, rebuilt by one yielding scan
after each assignment), so a pass costs what it can do, not the size of the
table. Every few passes it also asks the store
which conversations are over budget, so an entry that drifted below the
store's count (or was lost) is repaired instead of being trusted.

A command outstanding longer than the timeout is re-sent only when the
``CommandBacklog`` does not know it to be still queued or in flight: under a
backlog, re-sending late commands made the backlog longer with copies that
ran as no-ops (``streams.kafka.command_backlog`` has the figures).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Protocol

from core.domain.budget import BudgetConfig, compaction_due
from core.domain.tally import reconcile_due
from core.domain.tenancy import ConversationRef
from core.ports.publisher import Publisher, RecordPosition
from core.ports.storage import RawTurnRetention, TallySource
from streams.events import ReconcileRequest
from streams.metrics import Metrics
from streams.worker.issued_commands import IssuedCommand, IssuedCommands
from streams.worker.tally_table import TallyTable

log = logging.getLogger("compactor.worker")

# Entries checked between two yields to the event loop: a large table must not
# freeze the agents and views sharing it (1.3 s at 100 000 RocksDB entries).
YIELD_EVERY = 500
# Passes between two comparisons with the store (one aggregate query each).
STORE_CHECK_EVERY = 10
# A reconcile request still unread after this long is sent again (a bound on
# what is remembered, not a retry policy: accounting reads every request).
STALE_REQUEST_SECONDS = 600.0


class CommandBacklog(Protocol):
    async def still_queued(self, issued: Mapping[str, IssuedCommand]) -> set[str]:
        """Of these conversation keys (each with when its outstanding command was
        issued, and where it went when known), those whose command is known to
        be still queued or in flight. May raise: then none is known, and all
        may be re-sent."""
        ...

    async def requests_unread(self, sent: Mapping[str, RecordPosition]) -> set[str]:
        """Of these reconcile requests (by conversation key, where each went on
        the control topic), those accounting has not read yet. May raise."""
        ...

    async def close(self) -> None: ...


class ReconcilerPorts(Protocol):
    """What reconciliation uses of the runtime (``streams.worker.runtime``)."""

    @property
    def tallies(self) -> TallySource: ...

    @property
    def archive(self) -> RawTurnRetention: ...


class Reconciler:
    def __init__(
        self,
        *,
        table: TallyTable,
        publisher: Publisher,
        budget: BudgetConfig,
        interval_seconds: float,
        command_timeout_seconds: float,
        runtime: ReconcilerPorts | None = None,
        owns: Callable[[str], bool] = lambda _: True,  # by conversation key
        clock: Callable[[], float] = time.time,
        ready: Callable[[], bool] = lambda: True,
        metrics: Metrics | None = None,
        backlog: CommandBacklog | None = None,
        issued: IssuedCommands | None = None,
    ) -> None:
        self._table = table
        self._publisher = publisher
        self._budget = budget
        self._interval = interval_seconds
        self._timeout = command_timeout_seconds
        self._clock = clock
        self._runtime = runtime
        self._owns = owns
        self._ready = ready  # tables restored: the index may be rebuilt
        self._metrics = metrics
        self._backlog = backlog
        self._issued = IssuedCommands() if issued is None else issued
        self._passes = 0
        # conversation key → the last request: when, and where it went on the control topic
        self._requests: dict[str, tuple[float, RecordPosition | None]] = {}

    async def close(self) -> None:
        """At shutdown: the backlog's broker connections (nothing is lost if it fails)."""
        if self._backlog is not None:
            try:
                await self._backlog.close()
            except Exception as error:
                log.warning("closing reconciliation's broker clients: %s", error)

    async def tick(self) -> int:
        """One pass (a timer): the number of requests sent. An error (the broker is
        away) waits for the next pass; it must not take the worker down."""
        try:
            return await self._pass()
        except Exception as error:
            log.warning("reconciliation pass failed, next in %.0fs: %s", self._interval, error)
            return 0

    async def _pass(self) -> int:
        started = time.perf_counter()
        if not self._table.index_valid and self._ready():
            await self._table.rebuild_index(YIELD_EVERY)
        now = self._clock()
        due: list[str] = []
        resends: dict[str, IssuedCommand] = {}  # outstanding commands past their timeout
        for scanned, conversation_id in enumerate(self._table.candidates()):
            if scanned % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            tally = self._table.get(conversation_id)
            if tally is None or not self._owns(conversation_id):
                self._table.drop_candidate(conversation_id)  # erased, or another worker's now
            elif reconcile_due(tally, self._budget, now, self._timeout):
                due.append(conversation_id)
                if tally.outstanding is not None:
                    resends[conversation_id] = IssuedCommand(
                        tally.outstanding_since or 0.0,
                        self._issued.position(conversation_id, tally.outstanding),
                    )
        queued = await self._still_queued(resends)
        sent = await self._request_all([c for c in due if c not in queued], now)
        self._passes += 1
        runtime = self._runtime
        if runtime is not None and self._passes % STORE_CHECK_EVERY == 1:
            sent += await self._check_against_store(runtime, now)
        if self._metrics is not None:
            self._metrics.reconcile_tick_seconds.observe(time.perf_counter() - started)
            self._metrics.reconcile_candidates.set(len(self._table.candidates()))
        return sent

    async def _still_queued(self, resends: Mapping[str, IssuedCommand]) -> set[str]:
        """The late commands not to re-send: still queued or in flight."""
        if not resends or self._backlog is None:
            return set()
        try:
            queued = await self._backlog.still_queued(resends)
        except Exception as error:  # the broker is away: re-send as before
            log.warning("could not tell which late commands are still queued: %s", error)
            return set()
        if self._metrics is not None:
            self._metrics.resends_held.inc(len(queued))
        return queued

    async def _check_against_store(self, runtime: ReconcilerPorts, now: float) -> int:
        """Conversations the store has over budget that the table does not (or lacks)."""
        try:
            over = await runtime.tallies.conversations_over(self._budget.trigger_tokens)
            await (
                runtime.archive.expire_raw_turns()
            )  # [archive].raw_retention_days; logs its own errors
        except Exception as error:  # the database may be away: next pass
            log.warning("reconciliation could not ask the store: %s", error)
            return 0
        disagree: list[str] = []
        for checked, (conversation_id, total) in enumerate(over):
            if checked % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            tally = self._table.get(conversation_id)
            if tally is not None and compaction_due(tally.token_total, self._budget):
                self._table.consider(conversation_id)  # the table agrees; reconcile_due decides
                continue
            if tally is None and not self._owns(conversation_id):
                continue  # another worker's conversation
            if tally is not None and tally.stalled:
                continue
            log.info(
                "table disagrees with the store on %s (%d tokens): resync", conversation_id, total
            )
            disagree.append(conversation_id)
        return await self._request_all(disagree, now)

    async def _request_all(self, conversation_ids: list[str], now: float) -> int:
        """Send the requests a few hundred at a time, their acks awaited together
        (one by one, 10 000 requests took over a minute). None for a conversation
        whose previous request accounting has not read yet: behind a backlog on
        the control topic, a request a pass piled up there and kept the
        completions behind them waiting (the hour soak: 90,000 requests deep)."""
        self._forget_old_requests(now)
        wanted = [c for c in conversation_ids if now - self._last_sent(c) >= self._interval]
        unread = await self._unread_requests(wanted)
        wanted = [c for c in wanted if c not in unread]
        for start in range(0, len(wanted), YIELD_EVERY):
            chunk = wanted[start : start + YIELD_EVERY]
            await asyncio.gather(
                *(self._request(conversation_id, now) for conversation_id in chunk)
            )
        return len(wanted)

    def _last_sent(self, conversation_key: str) -> float:
        sent = self._requests.get(conversation_key)
        return -math.inf if sent is None else sent[0]

    async def _unread_requests(self, conversation_ids: list[str]) -> set[str]:
        """Of these conversations, those whose last request is still unread."""
        positions = {
            c: sent[1]
            for c in conversation_ids
            if (sent := self._requests.get(c)) is not None and sent[1] is not None
        }
        if not positions or self._backlog is None:
            return set()
        try:
            unread = await self._backlog.requests_unread(positions)
        except Exception as error:  # the broker is away: send as before
            log.warning("could not tell which reconcile requests are still unread: %s", error)
            return set()
        if self._metrics is not None:
            self._metrics.requests_held.inc(len(unread))
        return unread

    def _forget_old_requests(self, now: float) -> None:
        """Bounded: a request unread for ``STALE_REQUEST_SECONDS`` is sent again."""
        if len(self._requests) > 10 * YIELD_EVERY:
            keep = max(self._interval, STALE_REQUEST_SECONDS)
            self._requests = {c: s for c, s in self._requests.items() if now - s[0] < keep}

    async def _request(self, conversation_key: str, now: float) -> None:
        self._requests[conversation_key] = (now, None)
        ref = ConversationRef.of_key(conversation_key)
        request = ReconcileRequest(
            conversation_id=ref.conversation_id,
            tenant_id=ref.tenant_id,
            requested_at=datetime.fromtimestamp(now, UTC),
        )
        position = await self._publisher.publish(
            "control", ref.conversation_id.encode(), request.model_dump_json().encode()
        )
        self._requests[conversation_key] = (now, position)
