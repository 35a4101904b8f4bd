"""Accounting: decode → store → tally → command, one record at a time.

It is the table's only writer. Messages and control events each have an
agent with concurrency 1 (acks stay in order), so a completion never waits
behind a backlog of messages; the two agents take a per-conversation lock,
which keeps each entry's read-modify-write single-file. Every rule about the
tally lives in ``core.accounting``; this class only does the I/O around
them: store the message, read and write the table entry, send the command.

A record is only acknowledged once its effect is durable: while PostgreSQL or
the broker is away the same record is retried (see ``streams.worker.retry``),
which also holds back the rest of its partition. ``/healthz`` says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from core.accounting import (
    Completion,
    ConversationTally,
    completes_outstanding,
    on_completion,
    on_message,
    on_reconcile,
    on_resync,
    rebuilt,
    resynced,
)
from core.budget import BudgetConfig
from core.storage.ports import TenantConflictError
from core.tokens import estimate_message_tokens
from streams.events import CompactionCommand, CompactionCompleted, EraseRequest, MessageEvent
from streams.metrics import Metrics
from streams.topics import TopicNames
from streams.worker.dead_letters import DeadLetters
from streams.worker.health import Health
from streams.worker.keyed_lock import KeyedLock
from streams.worker.publisher import Publisher
from streams.worker.records import InvalidRecord, Record, decode_control, decode_message
from streams.worker.resources import Resources
from streams.worker.retry import backoff_seconds, is_outage
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
    # A failure that is not an outage (a bug, a record breaking an assumption)
    # is retried this often, then the record is dead-lettered with the error.
    max_attempts: int = 5


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
        health: Health | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        still_assigned: Callable[[Record], bool] = lambda _: True,
    ) -> None:
        self._names = names
        self._rules = rules
        self._resources = resources
        self._table = table
        self._publisher = publisher
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._health = health or Health(clock)
        self._clock = clock
        self._sleep = sleep
        self._still_assigned = still_assigned
        self._locks = KeyedLock()

    async def handle(self, record: Record) -> None:
        """Account one record, durably: returns only once its effect is written.

        An unusable record is dead-lettered with its reason; one that keeps
        failing for another reason than an outage is dead-lettered with the
        error after ``max_attempts``; during an outage it waits, for as long
        as its partition stays assigned here.
        """
        async with self._locks.hold(record.key):
            failures = 0
            last: Exception | None = None
            while True:
                try:
                    if last is not None and self._gives_up(last, failures):
                        await self._dead_letter(record, processing_error(last, failures))
                    else:
                        await self._account(record)
                except Exception as error:
                    failures += 1
                    last = error
                    self._waiting(record, error, failures)
                    if not self._still_assigned(record):
                        log.warning("abandoning %s: its partition was revoked", describe(record))
                        return
                    await self._sleep(backoff_seconds(failures - 1))
                    continue
                if failures:
                    self._recovered(record, failures)
                return

    def _gives_up(self, error: Exception, failures: int) -> bool:
        return not is_outage(error) and failures >= self._rules.max_attempts

    async def _account(self, record: Record) -> None:
        try:
            if record.topic == self._names.messages:
                await self.on_message(record)
            else:
                await self.on_control(record)
        except InvalidRecord as error:
            await self._dead_letter(record, error)

    async def _dead_letter(self, record: Record, error: InvalidRecord) -> None:
        await self._dead_letters.send(record, error)
        if record.topic == self._names.messages:
            self._metrics.events_in.labels("dead_lettered").inc()

    def _waiting(self, record: Record, error: Exception, failures: int) -> None:
        kind = type(error).__name__
        self._metrics.accounting_retries.labels(kind).inc()
        self._metrics.accounting_waiting.set(1)
        outage = "outage" if is_outage(error) else "error"
        self._health.report(
            "accounting", f"{outage} on {describe(record)}, attempt {failures}: {kind}: {error}"
        )
        if failures == 1 or failures % 20 == 0:  # once, then every few minutes
            log.warning(
                "accounting %s failed (%s, attempt %d), retrying the same record: %s: %s",
                describe(record),
                outage,
                failures,
                kind,
                error,
            )

    def _recovered(self, record: Record, failures: int) -> None:
        self._metrics.accounting_waiting.set(0)
        self._health.clear("accounting")
        log.warning("accounting resumed at %s after %d failed attempts", describe(record), failures)

    async def on_message(self, record: Record) -> None:
        parsed = decode_message(record, self._rules.max_content_chars)
        store = await self._resources.store()
        tokens = message_tokens(parsed)
        try:
            inserted = await store.save_message(
                parsed.to_message(), tokens, tenant_id=parsed.tenant_id
            )
        except TenantConflictError as error:
            raise InvalidRecord(str(error), "tenant_mismatch") from None
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
        if isinstance(control, EraseRequest):
            await self.erase(conversation_id, "erase request")
            return
        tally = self._table.get(conversation_id)
        store = await self._resources.store()
        now = self._clock()
        budget = self._rules.budget
        if isinstance(control, CompactionCompleted):
            if tally is None and await self._erased_meanwhile(control):
                return
            if tally is None:
                tally = rebuilt(conversation_id, *await store.conversation_totals(conversation_id))
            totals = None
            if completes_outstanding(tally, control.compaction_id):
                totals = await store.conversation_totals(conversation_id)
            tally, issue = on_completion(tally, completion_of(control), budget, now, totals)
            reason = "continue"
        else:
            # Reconciliation does not trust the table: the store's counts repair
            # an entry that drifted, before deciding.
            totals = await store.conversation_totals(conversation_id)
            tally = rebuilt(conversation_id, *totals) if tally is None else resynced(tally, *totals)
            tally, issue = on_reconcile(tally, budget, now, self._rules.command_timeout_seconds)
            reason = "reconcile"
        self._table.put(tally)
        if issue:
            await self._send_command(tally, reason)

    async def erase(self, conversation_id: str, why: str) -> None:
        """Every row in the store, the table entry (a changelog tombstone), then a
        tombstone on the clip-archive topic so log-compacted copies forget it.
        Each step is idempotent: a retried record repeats them harmlessly."""
        store = await self._resources.store()
        removed = await store.erase_conversation(conversation_id)
        self._table.delete(conversation_id)
        await self._publisher.publish("clip_archives", conversation_id.encode(), None)
        self._metrics.erasures.inc()
        log.info(
            "erased conversation %s (%s): %s",
            conversation_id,
            why,
            ", ".join(f"{table} {count}" for table, count in removed.items()),
        )

    async def _erased_meanwhile(self, control: CompactionCompleted) -> bool:
        """A completion with no table entry whose compaction the store does not know:
        the conversation was erased after that compaction committed, and its
        clip-archive may have reached the topic after the erase's tombstone, so
        the tombstone is sent again (the clip-archive precedes its completion)."""
        if control.status != "compacted":
            return False
        store = await self._resources.store()
        if await store.compaction_applied(control.compaction_id):
            return False
        await self.erase(control.conversation_id, "completion after an erase")
        return True

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


def describe(record: Record) -> str:
    return f"{record.topic}[{record.partition}]@{record.offset}"


def processing_error(error: Exception, failures: int) -> InvalidRecord:
    return InvalidRecord(
        f"could not be processed after {failures} attempts: {type(error).__name__}: {error}"[:1000],
        "processing_error",
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
