"""Accounting: decode → store → tally → command, one record at a time.

It is the table's only writer. Messages and control events each have an
agent with concurrency 1 (acks stay in order), so a completion never waits
behind a backlog of messages; the two agents take a per-conversation lock,
which keeps each entry's read-modify-write single-file. Every rule about the
tally lives in ``core.domain.tally``; this class only does the I/O around
them: store the message, read and write the table entry, send the command.

A record is only acknowledged once its effect is durable: while PostgreSQL or
the broker is away the same record is retried (see ``streams.worker.retry``),
which also holds back the rest of its partition. ``/healthz`` says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from core.domain.budget import BudgetConfig
from core.domain.erasure import merged_offsets
from core.domain.tally import (
    Completion,
    ConversationTally,
    OperatorRequest,
    completes_outstanding,
    on_completion,
    on_message,
    on_reconcile,
    on_request,
    on_resync,
    rebuilt,
    resynced,
)
from core.domain.tenancy import ConversationRef
from core.domain.tokens import estimate_message_tokens
from core.ports.publisher import Publisher
from core.ports.storage import (
    EraseOutcome,
    Erasure,
    IncomingMessage,
    SaveOutcome,
    StoreRejected,
    StoreTotals,
)
from core.settings import Settings
from streams.events import (
    CompactionCommand,
    CompactionCompleted,
    EraseCompleted,
    EraseRequest,
    MessageEvent,
    OperatorRequestEvent,
    RecompactRequest,
    RestoreRequest,
)
from streams.metrics import Metrics
from streams.topics import TopicNames
from streams.worker.dead_letters import DeadLetters
from streams.worker.health import Health
from streams.worker.issued_commands import IssuedCommands
from streams.worker.keyed_lock import KeyedLock
from streams.worker.producers import ProducerPolicy
from streams.worker.records import (
    InvalidRecord,
    Record,
    decode_control,
    decode_erase,
    decode_message,
)
from streams.worker.retry import backoff_seconds, is_outage
from streams.worker.runtime import Runtime
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
    # What a message must show about its tenant ([tenancy]: signatures).
    producers: ProducerPolicy = field(default_factory=ProducerPolicy)

    @classmethod
    def of(cls, settings: Settings) -> AccountingRules:
        service = settings.service
        return cls(
            budget=settings.budget,
            max_content_chars=service.max_content_chars,
            command_timeout_seconds=service.command_timeout_seconds,
            producers=ProducerPolicy.of(settings.tenancy),
        )


class Accounting:
    def __init__(
        self,
        *,
        names: TopicNames,
        rules: AccountingRules,
        runtime: Runtime,
        table: TallyTable,
        publisher: Publisher,
        dead_letters: DeadLetters,
        metrics: Metrics,
        health: Health | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        still_assigned: Callable[[Record], bool] = lambda _: True,
        issued: IssuedCommands | None = None,
    ) -> None:
        self._names = names
        self._issued = IssuedCommands() if issued is None else issued  # reconciliation reads
        self._rules = rules
        self._runtime = runtime
        self._table = table
        self._publisher = publisher
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._health = health or Health(clock)
        self._clock = clock
        self._sleep = sleep
        self._still_assigned = still_assigned
        self._locks = KeyedLock()
        # messages partition → the highest offset this worker has stored or skipped:
        # an erase marks at least this much (what it deleted stays deleted).
        self._consumed: dict[int, int] = {}

    async def handle(self, record: Record) -> None:
        """Account one record, durably: returns only once its effect is written, and
        writes its table entry now (the control agent, the offline CLI)."""
        async with self._locks.hold(record.key):
            touched = await self._durably([record])
        self._table.flush(only=touched)

    async def handle_batch(self, records: Sequence[Record]) -> set[int]:
        """Account a group of message records, durably; their table entries are
        written by the next due flush (``streams.worker.batching.AcksAfterFlush``).

        Per group: one store call for the messages, one for the counts of the
        conversations it must resync, the commands and dead letters sent
        together. An unusable record is dead-lettered with its reason; during
        an outage the group waits, for as long as its partitions stay assigned
        here; a group that keeps failing otherwise is retried one record at a
        time, so one bad record cannot hold up or dead-letter the others.

        Returns the partitions revoked meanwhile: their records must not be
        acked (their effect on the table was not kept), so whoever reads the
        partition next reads them again, finds them stored and resyncs.
        """
        if not records:
            return set()
        epochs = {record.partition: self._table.epoch(record.partition) for record in records}
        async with self._locks.hold_many(record.key for record in records):
            await self._durably(records)
        self._metrics.accounting_batch_events.observe(len(records))
        return {p for p, epoch in epochs.items() if self._table.epoch(p) != epoch}

    async def _durably(self, records: Sequence[Record]) -> set[str]:
        failures = 0
        pending = list(records)
        while True:
            try:
                touched = await self._account(pending)
            except StoreRejected as error:
                # The store refuses the data for good: no waiting, no retries. A group
                # is retried one record at a time, once, to find the culprit.
                return await self._rejected(pending, error, failures)
            except Exception as error:
                failures += 1
                self._waiting(pending[0], error, failures)
                pending = [record for record in pending if self._still_assigned(record)]
                if not pending:
                    log.warning("abandoning %s: its partition was revoked", describe(records[0]))
                    return set()
                await self._sleep(backoff_seconds(failures - 1))
                if self._gives_up(error, failures):
                    return await self._give_up(pending, error, failures)
                continue
            if failures:
                self._recovered(pending[0], failures)
            return touched

    def _gives_up(self, error: Exception, failures: int) -> bool:
        return not is_outage(error) and failures >= self._rules.max_attempts

    async def _give_up(self, pending: list[Record], error: Exception, failures: int) -> set[str]:
        """One record left: dead-letter it with the error. More: retry each alone."""
        if len(pending) == 1:
            await self._dead_letter(pending[0], processing_error(error, failures))
            self._recovered(pending[0], failures)
            return set()
        touched: set[str] = set()
        for record in pending:
            touched |= await self._durably([record])
        return touched

    async def _rejected(
        self, pending: list[Record], error: StoreRejected, failures: int
    ) -> set[str]:
        if len(pending) > 1:
            touched: set[str] = set()
            for record in pending:
                touched |= await self._durably([record])
            return touched
        await self._dead_letter(pending[0], store_rejected(error))
        if failures:
            self._recovered(pending[0], failures)
        return set()

    async def _account(self, records: Sequence[Record]) -> set[str]:
        if len(records) == 1 and records[0].topic != self._names.messages:
            try:
                if records[0].topic == self._names.erasures:
                    return await self.on_erase(records[0])
                return await self.on_control(records[0])
            except InvalidRecord as error:
                await self._dead_letter(records[0], error)
                return set()
        return await self.on_messages(records)

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
                "accounting %s failed (%s, attempt %d), retrying the same records: %s: %s",
                describe(record),
                outage,
                failures,
                kind,
                error,
                extra={"partition": record.partition},
            )

    def _recovered(self, record: Record, failures: int) -> None:
        self._metrics.accounting_waiting.set(0)
        self._health.clear("accounting")
        log.warning(
            "accounting resumed at %s after %d failed attempts",
            describe(record),
            failures,
            extra={"partition": record.partition},
        )

    async def on_messages(self, records: Sequence[Record]) -> set[str]:
        """Store the group, then count each conversation once: from the store when
        this worker has not checked its entry since it got the partition (or a
        message was a redelivery), else by adding the new messages' tokens."""
        epochs = {record.partition: self._table.epoch(record.partition) for record in records}
        decoded, letters = self._decode(records)
        store = self._runtime.store
        outcomes = await store.save_messages([incoming for _, incoming in decoded])
        groups: dict[str, list[tuple[Record, IncomingMessage, SaveOutcome]]] = {}
        for (record, incoming), outcome in zip(decoded, outcomes, strict=True):
            if outcome.status == "erased":
                self._metrics.events_in.labels("erased").inc()  # an erase covers it: dropped
            else:
                groups.setdefault(incoming.message.conversation_id, []).append(
                    (record, incoming, outcome)
                )
        resync = [
            conversation_id
            for conversation_id, items in groups.items()
            if not self._table.synced(conversation_id)
            or any(outcome.status == "duplicate" for _, _, outcome in items)
        ]
        totals = await store.totals_of(resync) if resync else {}
        now = self._clock()
        commands = [
            command
            for conversation_id, items in groups.items()
            if (
                command := self._count(
                    conversation_id, items, totals.get(conversation_id), now, epochs
                )
            )
        ]
        await asyncio.gather(
            *(self._dead_letter(record, error) for record, error in letters),
            *(self._publish_command(command, "over_budget") for command in commands),
        )
        for record in records:
            self._consumed[record.partition] = max(
                self._consumed.get(record.partition, -1), record.offset
            )
        return set(groups)

    def _decode(
        self, records: Sequence[Record]
    ) -> tuple[list[tuple[Record, IncomingMessage]], list[tuple[Record, InvalidRecord]]]:
        decoded: list[tuple[Record, IncomingMessage]] = []
        letters: list[tuple[Record, InvalidRecord]] = []
        for record in records:
            try:
                event = decode_message(record, self._rules.max_content_chars)
                self._rules.producers.check(record, event)
            except InvalidRecord as error:
                letters.append((record, error))
                continue
            incoming = IncomingMessage(
                event.to_message(),  # under its conversation key: (tenant, id)
                message_tokens(event),
                partition=record.partition,
                offset=record.offset,
            )
            decoded.append((record, incoming))
        return decoded, letters

    def _count(
        self,
        conversation_id: str,
        items: Sequence[tuple[Record, IncomingMessage, SaveOutcome]],
        totals: StoreTotals | None,
        now: float,
        epochs: dict[int, int],
    ) -> CompactionCommand | None:
        """One conversation's share of a group: its new tally, and a command if due."""
        budget = self._rules.budget
        tally = self._table.get(conversation_id)
        inserted = [outcome for _, _, outcome in items if outcome.status == "inserted"]
        for label, count in (("new", len(inserted)), ("duplicate", len(items) - len(inserted))):
            if count:  # a label appears once it happened (the metrics views rely on it)
                self._metrics.events_in.labels(label).inc(count)
        if totals is not None:
            tally, issue = on_resync(
                tally, conversation_id, totals.tokens, totals.rows, budget, now, totals.epoch
            )
            last_seq = totals.last_seq
        else:
            assert tally is not None  # synced entries are cached
            issue, last_seq = False, None
            for _, incoming, outcome in items:  # all inserted: a duplicate means a resync
                tally, issued = on_message(tally, incoming.tokens, budget, now)
                if issued:  # as if alone: the command covers up to the message that crossed
                    issue, last_seq = True, outcome.seq
        partition = items[-1][0].partition
        if not self._table.put(
            tally, partition=partition, synced=totals is not None or None, epoch=epochs[partition]
        ):
            return None  # revoked meanwhile: the new owner counts it from the store
        return self._command(tally, last_seq, "over_budget") if issue else None

    async def on_control(self, record: Record) -> set[str]:
        control = decode_control(record)
        conversation_id = control.conversation_key
        epoch = self._table.epoch(record.partition)
        tally = self._table.get(conversation_id)
        store = self._runtime.store
        now = self._clock()
        budget = self._rules.budget
        totals: StoreTotals | None = None
        if tally is None:
            # No entry: lost (a new app id, a lost changelog) and rebuilt from the
            # store, or nothing to rebuild: an erased or unknown conversation gets
            # no entry from a completion or a reconcile request (a zero tally
            # would make an erased id answer again).
            totals = (await store.totals_of([conversation_id]))[conversation_id]
            if totals.rows == 0:
                if isinstance(control, CompactionCompleted):
                    await self._tombstone_again(control, totals)
                elif isinstance(control, RecompactRequest | RestoreRequest):
                    log.warning(
                        "%s request %s of %s: no such conversation (nothing stored)",
                        control.type, control.request_id, conversation_id,
                        extra={"conversation_id": conversation_id},
                    )  # fmt: skip
                return set()
            tally = rebuilt(conversation_id, totals.tokens, totals.rows, totals.epoch)
        if isinstance(control, RecompactRequest | RestoreRequest):
            return await self._on_request(control, tally, totals, record.partition, epoch)
        if isinstance(control, CompactionCompleted):
            if totals is None and completes_outstanding(tally, control.compaction_id):
                totals = (await store.totals_of([conversation_id]))[conversation_id]
            counts = None if totals is None else (totals.tokens, totals.rows)
            outstanding = tally.outstanding
            tally, issue = on_completion(tally, completion_of(control), budget, now, counts)
            if tally.outstanding != outstanding:
                self._issued.finished(conversation_id)
            reason = "continue"
        else:
            # Reconciliation does not trust the table: the store's counts repair
            # an entry that drifted, before deciding.
            if totals is None:
                totals = (await store.totals_of([conversation_id]))[conversation_id]
                if totals.rows == 0:
                    # Nothing stored (moved to a tenant, or its rows are gone): a
                    # conversation without rows has no entry (and answers 404).
                    self._table.delete(conversation_id, partition=record.partition)
                    return {conversation_id}
                tally = (
                    resynced(tally, totals.tokens, totals.rows)
                    if tally.epoch == totals.epoch
                    else rebuilt(conversation_id, totals.tokens, totals.rows, totals.epoch)
                )
            tally, issue = on_reconcile(tally, budget, now, self._rules.command_timeout_seconds)
            reason = "reconcile"
        if not self._table.put(
            tally, partition=record.partition, synced=totals is not None or None, epoch=epoch
        ):
            return set()  # revoked meanwhile: the new owner redoes it
        if issue:
            last_seq = totals.last_seq if totals else await store.last_seq(conversation_id)
            await self._publish_command(self._command(tally, last_seq, reason), reason)
        return {conversation_id}

    async def _on_request(
        self,
        control: OperatorRequestEvent,
        tally: ConversationTally,
        totals: StoreTotals | None,
        partition: int,
        epoch: int,
    ) -> set[str]:
        """An operator's recompact or restore: the outstanding command now, or queued
        behind it (``core.domain.tally.on_request``)."""
        key = control.conversation_key
        request = OperatorRequest(
            action=control.type,
            request_id=control.request_id,
            batch_id=control.batch_id if isinstance(control, RestoreRequest) else None,
        )
        updated, issue = on_request(tally, request, self._clock())
        fields = {"conversation_id": key, "request_id": control.request_id}
        if updated is tally and not issue:
            log.info("%s request %s of %s: already outstanding, queued or refused (queue full)",
                     control.type, control.request_id, key, extra=fields)  # fmt: skip
            return set()
        if not self._table.put(updated, partition=partition, synced=totals is not None or None,
                               epoch=epoch):  # fmt: skip
            return set()
        log.info("%s request %s of %s by %s: %s", control.type, control.request_id, key,
                 control.requester, "sent" if issue else "queued", extra=fields)  # fmt: skip
        if issue:
            store = self._runtime.store
            last_seq = totals.last_seq if totals else await store.last_seq(key)
            await self._publish_command(self._command(updated, last_seq, "request"), "request")
        return {key}

    async def on_erase(self, record: Record) -> set[str]:
        """An ``EraseRequest`` from the erase-requests topic (the only way to erase)."""
        request = decode_erase(record)
        await self.erase(request, partition=record.partition)
        return set()

    async def erase(self, request: EraseRequest, *, partition: int | None = None) -> EraseOutcome:
        """Every row in the store and the erase mark that keeps them erased (one
        transaction), the table entry (a changelog tombstone), a tombstone on the
        clip-archive topic so log-compacted copies forget it, then an
        ``EraseCompleted``. Each step is idempotent: a retried or redelivered
        request repeats them harmlessly (audited once, by its request id).

        The mark covers the messages topic up to the request's end offsets and,
        on ``partition`` (the erase topic is co-partitioned with the messages
        topic), up to what this worker had consumed: every message it deleted
        stays deleted, whoever reads the topic again."""
        conversation_id = request.conversation_key
        now = datetime.fromtimestamp(self._clock(), UTC)
        offsets = {p: end - 1 for p, end in request.messages_end_offsets.items()}
        if partition is not None and partition in self._consumed:
            offsets = merged_offsets(offsets, {partition: self._consumed[partition]})
        erasure = Erasure(
            request_id=request.request_id,
            requester=request.requester,
            reason=request.reason,
            requested_at=min(request.requested_at, now),  # never a cutoff in the future
            erased_at=now,
            offsets=offsets,
        )
        outcome = await self._runtime.store.erase_conversation(conversation_id, erasure)
        self._table.delete(conversation_id, partition=partition)
        key = conversation_id.encode()
        await self._publisher.publish("clip_archives", key, None)
        completed = EraseCompleted(
            request_id=request.request_id,
            conversation_id=request.conversation_id,
            tenant_id=request.tenant_id,
            requester=request.requester,
            counts=outcome.removed,
            epoch=outcome.epoch,
            requested_at=request.requested_at,
            erased_at=outcome.erased_at,
        )
        await self._publisher.publish(
            "erase_completions", key, completed.model_dump_json().encode()
        )
        self._metrics.erasures.inc()
        log.info(
            "erased conversation %s (request %s by %s%s, epoch %d): %s",
            conversation_id,
            request.request_id,
            request.requester,
            ", again" if outcome.repeated else "",
            outcome.epoch,
            ", ".join(f"{table} {count}" for table, count in outcome.removed.items()),
            extra={"conversation_id": conversation_id},
        )
        return outcome

    async def _tombstone_again(self, control: CompactionCompleted, totals: StoreTotals) -> None:
        """A compaction's completion for an erased conversation with nothing live: the
        compaction committed before the erase, and its clip-archive may have reached
        the topic after the erase's tombstone, so the tombstone is sent again (the
        clip-archive precedes its completion). Nothing is erased here: a completion
        on the control topic never erases."""
        if control.status != "compacted" or totals.epoch == 0:
            return
        if await self._runtime.store.compaction_applied(control.compaction_id):
            return
        await self._publisher.publish("clip_archives", control.conversation_key.encode(), None)
        log.info(
            "tombstone of erased conversation %s sent again (compaction %s completed late)",
            control.conversation_key,
            control.compaction_id,
            extra={
                "conversation_id": control.conversation_key,
                "compaction_id": control.compaction_id,
            },
        )

    def _command(
        self, tally: ConversationTally, up_to_seq: int | None, reason: str
    ) -> CompactionCommand:
        assert tally.outstanding is not None
        ref = ConversationRef.of_key(tally.conversation_id)
        request = tally.request  # a re-sent operator request carries it again
        return CompactionCommand(
            compaction_id=tally.outstanding,
            conversation_id=ref.conversation_id,
            tenant_id=ref.tenant_id,
            generation=tally.generation,
            up_to_seq=up_to_seq,
            issued_at=datetime.fromtimestamp(self._clock(), UTC),
            reason="reconcile"
            if reason == "reconcile"
            else "request"
            if request
            else "over_budget",
            action=request.action if request else "compact",
            request_id=request.request_id if request else None,
            batch_id=request.batch_id if request else None,
        )

    async def _publish_command(self, command: CompactionCommand, reason: str) -> None:
        position = await self._publisher.publish(
            "commands", command.conversation_id.encode(), command.to_json()
        )
        if position is not None:
            self._issued.sent(command.conversation_key, command.compaction_id, position)
        self._metrics.commands_issued.labels(reason).inc()
        log.info(
            "compaction %s of %s requested (%s), budget %d",
            command.compaction_id,
            command.conversation_key,
            reason,
            self._rules.budget.budget_tokens,
            extra={
                "conversation_id": command.conversation_key,
                "compaction_id": command.compaction_id,
            },
        )


def describe(record: Record) -> str:
    return f"{record.topic}[{record.partition}]@{record.offset}"


def processing_error(error: Exception, failures: int) -> InvalidRecord:
    return InvalidRecord(
        f"could not be processed after {failures} attempts: {type(error).__name__}: {error}"[:1000],
        "processing_error",
    )


def store_rejected(error: StoreRejected) -> InvalidRecord:
    return InvalidRecord(f"the store refuses this record: {error}"[:1000], "store_rejected")


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
