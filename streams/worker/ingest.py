"""A group of message records: decode, store in one call, count, send the commands due.

Per group: one store call for the messages, one for the counts of the
conversations it must resync, each conversation counted once by
``core.domain.tally``, and the group's commands and dead letters sent
together. A record that cannot be used is dead-lettered with its reason and
the rest of the group goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from core.domain.budget import BudgetConfig
from core.domain.messages import ConversationMessage
from core.domain.tally import on_messages, on_resync
from core.domain.tokens import (
    DEFAULT_COUNTER,
    TokenCounter,
    estimate_message_tokens,
    reported_tokens,
)
from core.ports.storage import IncomingMessage, IngestStore, SaveOutcome, StoreTotals, TallySource
from streams.events import CompactionCommand, MessageEvent
from streams.metrics import Metrics
from streams.worker.commands import Commands
from streams.worker.dead_letters import SendDeadLetter
from streams.worker.erasure import ConsumedOffsets
from streams.worker.producers import ProducerPolicy
from streams.worker.records import InvalidRecord, Record, decode_message
from streams.worker.tally_table import TallyTable

OFF_LOOP_BYTES = 200_000
"""A group carrying more is decoded off the event loop: decoding and counting
a turn costs time per character, and the accounting agent takes whole groups
of large turns at once (``streams.kafka.stream_take``), so a group of eight
1,000,000-character turns held the loop ~250 ms on a loaded machine."""

# One message of a group as stored: its record, what was stored and how it went.
Stored = tuple[Record, IncomingMessage, SaveOutcome]


@dataclass(frozen=True)
class Decoded:
    """A group decoded ahead of its store (``streams.worker.overlap``), with the
    table epochs of its partitions when it was taken: a partition revoked after
    that is not counted or acked here, however long the group waited."""

    records: Sequence[Record]
    epochs: dict[int, int]
    messages: list[tuple[Record, IncomingMessage]]
    letters: list[tuple[Record, InvalidRecord]]

    def covers(self, records: Sequence[Record]) -> bool:
        """Whether this is the decoding of exactly ``records`` (a retry may split them)."""
        return len(records) == len(self.records) and all(
            mine is theirs for mine, theirs in zip(self.records, records, strict=True)
        )


class IngestPorts(Protocol):
    """What ingest uses of the runtime (``streams.worker.runtime``)."""

    @property
    def ingest(self) -> IngestStore: ...

    @property
    def tallies(self) -> TallySource: ...

    @property
    def token_counter(self) -> TokenCounter: ...


def message_tokens(
    event: MessageEvent,
    counter: TokenCounter = DEFAULT_COUNTER,
    message: ConversationMessage | None = None,
) -> int:
    """The provider's count when the producer sent one, clamped to a band of the
    estimate (``reported_tokens``: ``0`` no longer turns compaction off), else the
    estimate (``counter``: the runtime's, calibrated with ``[budget].token_estimate``)
    of ``message`` (``event.to_message()`` unless given)."""
    estimate = estimate_message_tokens(message or event.to_message(), counter)
    if event.token_count is not None:
        return reported_tokens(event.token_count, estimate)
    return estimate


class Ingest:
    def __init__(
        self,
        *,
        budget: BudgetConfig,
        max_content_chars: int,
        producers: ProducerPolicy,
        runtime: IngestPorts,
        table: TallyTable,
        commands: Commands,
        dead_letter: SendDeadLetter,
        consumed: ConsumedOffsets,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        stored: Callable[[Collection[str]], None] = lambda _: None,
        published: Callable[[float], None] = lambda _: None,
    ) -> None:
        """``stored``: told the conversations of each group once its messages are
        stored (the readers waiting for them, ``IngestNotices``); ``published``:
        when the newest of them was published (the compaction pacer)."""
        self._budget = budget
        self._max_content_chars = max_content_chars
        self._producers = producers
        self._runtime = runtime
        self._table = table
        self._commands = commands
        self._dead_letter = dead_letter
        self._consumed = consumed
        self._metrics = metrics
        self._clock = clock
        self._stored = stored
        self._published = published

    def epochs(self, records: Sequence[Record]) -> dict[int, int]:
        """The table epoch of each partition of ``records``, now."""
        return {record.partition: self._table.epoch(record.partition) for record in records}

    async def decode(
        self, records: Sequence[Record], epochs: dict[int, int] | None = None
    ) -> Decoded:
        """``records`` decoded, with their partitions' epochs (``epochs``, else now)."""
        epochs = self.epochs(records) if epochs is None else epochs
        if sum(len(r.value or b"") for r in records) > OFF_LOOP_BYTES:
            decoded, letters = await asyncio.to_thread(self._decode, records)
        else:
            decoded, letters = self._decode(records)
        return Decoded(records, epochs, decoded, letters)

    async def ingest(self, records: Sequence[Record], ahead: Decoded | None = None) -> set[str]:
        """Store the group, then count each conversation once: from the store when
        this worker has not checked its entry since it got the partition (or a
        message was a redelivery), else by adding the new messages' tokens.
        ``ahead``: the group as decoded when it was taken (its epochs hold for any
        part of it). Returns the conversation keys counted."""
        if ahead is None or not ahead.covers(records):
            ahead = await self.decode(records, None if ahead is None else ahead.epochs)
        epochs, decoded, letters = ahead.epochs, ahead.messages, ahead.letters
        outcomes = await self._save([incoming for _, incoming in decoded])
        groups = self._by_conversation(decoded, outcomes)
        self._stored(groups.keys())
        newest = max((r.timestamp for r in records if r.timestamp), default=None)
        if newest is not None:
            self._published(newest)
        resync = [
            conversation_id
            for conversation_id, items in groups.items()
            if not self._table.synced(conversation_id)
            or any(outcome.status == "duplicate" for _, _, outcome in items)
        ]
        totals = await self._runtime.tallies.totals_of(resync) if resync else {}
        now = self._clock()
        commands = [
            command
            for conversation_id, items in groups.items()
            if (command := self._count(items, totals.get(conversation_id), now, epochs))
        ]
        self._count_arrivals(groups.values())
        await asyncio.gather(
            *(self._dead_letter(record, error) for record, error in letters),
            *(self._commands.publish(command, "over_budget") for command in commands),
        )
        self._consumed.note(records)
        return set(groups)

    async def _save(self, batch: list[IncomingMessage]) -> list[SaveOutcome]:
        """Stored first: what no compaction being written holds, and its readers told
        at once; then the rest, waiting for those compactions. A compaction's
        write holds its conversation for its whole transaction: in a wave of 200
        at once the part of a group they held waited 0.2-0.9 s more, and before
        this the whole group waited with it, a platform's turn in another
        conversation among them (docs/performance.md, section 10)."""
        store = self._runtime.ingest
        first = await store.save_free(batch)
        if not first.left:
            return [first.outcomes[n] for n in range(len(batch))]
        self._stored({batch[n].message.conversation_id for n in first.outcomes})
        self._metrics.ingest_left.inc(len(first.left))
        rest = await store.save_messages([batch[n] for n in first.left])
        outcomes = {**first.outcomes, **dict(zip(first.left, rest, strict=True))}
        return [outcomes[n] for n in range(len(batch))]

    def _decode(
        self, records: Sequence[Record]
    ) -> tuple[list[tuple[Record, IncomingMessage]], list[tuple[Record, InvalidRecord]]]:
        decoded: list[tuple[Record, IncomingMessage]] = []
        letters: list[tuple[Record, InvalidRecord]] = []
        for record in records:
            try:
                event = decode_message(record, self._max_content_chars)
                self._producers.check(record, event)
            except InvalidRecord as error:
                letters.append((record, error))
                continue
            message = event.to_message()  # under its conversation key: (tenant, id)
            incoming = IncomingMessage(
                message,
                message_tokens(event, self._runtime.token_counter, message),
                partition=record.partition,
                offset=record.offset,
            )
            decoded.append((record, incoming))
        return decoded, letters

    def _by_conversation(
        self,
        decoded: Sequence[tuple[Record, IncomingMessage]],
        outcomes: Sequence[SaveOutcome],
    ) -> dict[str, list[Stored]]:
        """The stored messages by conversation; a message an erase covers is dropped."""
        groups: dict[str, list[Stored]] = {}
        for (record, incoming), outcome in zip(decoded, outcomes, strict=True):
            if outcome.status == "erased":
                self._metrics.events_in.labels("erased").inc()
            else:
                groups.setdefault(incoming.message.conversation_id, []).append(
                    (record, incoming, outcome)
                )
        return groups

    def _count_arrivals(self, groups: Collection[Sequence[Stored]]) -> None:
        """``events_in`` by label, once per group (a label appears once it happened:
        the metrics views rely on it)."""
        new = sum(outcome.status == "inserted" for items in groups for _, _, outcome in items)
        duplicate = sum(len(items) for items in groups) - new
        for label, count in (("new", new), ("duplicate", duplicate)):
            if count:
                self._metrics.events_in.labels(label).inc(count)

    def _count(
        self,
        items: Sequence[Stored],
        totals: StoreTotals | None,
        now: float,
        epochs: dict[int, int],
    ) -> CompactionCommand | None:
        """One conversation's share of a group: its new tally, and a command if due."""
        conversation_id = items[0][1].message.conversation_id
        tally = self._table.get(conversation_id)
        if totals is not None:
            tally, issue = on_resync(
                tally, conversation_id, totals.tokens, totals.rows, self._budget, now, totals.epoch
            )
            last_seq = totals.last_seq
        else:
            assert tally is not None  # synced entries are cached
            # All inserted: a duplicate means a resync.
            arrived = [(incoming.tokens, outcome.seq) for _, incoming, outcome in items]
            tally, issue, last_seq = on_messages(tally, arrived, self._budget, now)
        partition = items[-1][0].partition
        if not self._table.put(
            tally, partition=partition, synced=totals is not None or None, epoch=epochs[partition]
        ):
            return None  # revoked meanwhile: the new owner counts it from the store
        return self._commands.command_for(tally, last_seq, "over_budget") if issue else None
