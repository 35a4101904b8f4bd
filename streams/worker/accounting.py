"""Accounting: decode → store → tally → command, one record at a time.

It is the table's only writer, so it runs as one agent with concurrency 1
over the messages and control topics (acks stay in order). Every rule about
the tally lives in ``core.accounting``; this class only does the I/O around
them: store the message, read and write the table entry, send the command.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from core.accounting import (
    Completion,
    ConversationTally,
    on_completion,
    on_message,
    on_reconcile,
    on_resync,
    rebuilt,
)
from core.budget import BudgetConfig
from core.tokens import estimate_message_tokens
from streams.events import CompactionCommand, CompactionCompleted, MessageEvent
from streams.metrics import Metrics
from streams.topics import TopicNames
from streams.worker.dead_letters import DeadLetters
from streams.worker.publisher import Publisher
from streams.worker.records import InvalidRecord, Record, decode_control, decode_message
from streams.worker.resources import Resources
from streams.worker.tally_table import TallyTable

log = logging.getLogger("compactor.worker")


def message_tokens(event: MessageEvent) -> int:
    """The provider's count when the producer sent one, else the estimate."""
    if event.token_count is not None:
        return event.token_count
    return estimate_message_tokens(event.to_message())


@dataclass(frozen=True)
class AccountingRules:
    budget: BudgetConfig
    max_content_chars: int
    command_timeout_seconds: float


class Accounting:
    def __init__(
        self,
        *,
        names: TopicNames,
        rules: AccountingRules,
        resources: Resources,
        table: TallyTable,
        publisher: Publisher,
        dead_letters: DeadLetters,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._names = names
        self._rules = rules
        self._resources = resources
        self._table = table
        self._publisher = publisher
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._clock = clock

    async def handle(self, record: Record) -> None:
        """Account one record; an unusable one is dead-lettered with its reason."""
        try:
            if record.topic == self._names.messages:
                await self.on_message(record)
            else:
                await self.on_control(record)
        except InvalidRecord as error:
            if record.topic == self._names.messages:
                self._metrics.events_in.labels("dead_lettered").inc()
            await self._dead_letters.send(record, error)

    async def on_message(self, record: Record) -> None:
        parsed = decode_message(record, self._rules.max_content_chars)
        store = await self._resources.store()
        tokens = message_tokens(parsed)
        inserted = await store.save_message(parsed.to_message(), tokens)
        conversation_id = parsed.conversation_id
        tally = self._table.get(conversation_id)
        now = self._clock()
        if tally is None or not inserted:
            # New to this table, or a redelivery the table may already have
            # counted: PostgreSQL (which has just stored the message) decides.
            total, count = await store.conversation_totals(conversation_id)
            tally, issue = on_resync(tally, conversation_id, total, count, self._rules.budget, now)
            self._metrics.events_in.labels("new" if inserted else "duplicate").inc()
        else:
            tally, issue = on_message(tally, tokens, self._rules.budget, now)
            self._metrics.events_in.labels("new").inc()
        self._table.put(tally)
        if issue:
            await self._send_command(tally, "over_budget")

    async def on_control(self, record: Record) -> None:
        control = decode_control(record)
        conversation_id = control.conversation_id
        tally = self._table.get(conversation_id)
        if tally is None:
            store = await self._resources.store()
            tally = rebuilt(conversation_id, *await store.conversation_totals(conversation_id))
        now = self._clock()
        budget = self._rules.budget
        if isinstance(control, CompactionCompleted):
            tally, issue = on_completion(tally, completion_of(control), budget, now)
            reason = "continue"
        else:
            timeout = self._rules.command_timeout_seconds
            tally, issue = on_reconcile(tally, budget, now, timeout)
            reason = "reconcile"
        self._table.put(tally)
        if issue:
            await self._send_command(tally, reason)

    async def _send_command(self, tally: ConversationTally, reason: str) -> None:
        assert tally.outstanding is not None
        store = await self._resources.store()
        command = CompactionCommand(
            compaction_id=tally.outstanding,
            conversation_id=tally.conversation_id,
            generation=tally.generation,
            up_to_seq=await store.last_seq(tally.conversation_id),
            issued_at=datetime.fromtimestamp(self._clock(), UTC),
            reason="reconcile" if reason == "reconcile" else "over_budget",
        )
        await self._publisher.publish(
            "commands", tally.conversation_id.encode(), command.model_dump_json().encode()
        )
        self._metrics.commands_issued.labels(reason).inc()
        log.info(
            "compaction %s of %s requested (%s): %d tokens over budget %d",
            command.compaction_id,
            tally.conversation_id,
            reason,
            tally.token_total,
            self._rules.budget.budget_tokens,
        )


def completion_of(event: CompactionCompleted) -> Completion:
    return Completion(
        compaction_id=event.compaction_id,
        status=event.status,
        messages_compressed=event.messages_compressed,
        rows_removed=event.rows_removed,
        rows_added=event.rows_added,
        tokens_removed=event.tokens_removed,
        tokens_added=event.tokens_added,
    )
