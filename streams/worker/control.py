"""Control events: completions, reconcile requests, operators' recompact and restore.

Each changes one conversation's table entry by a rule of ``core.domain.tally``
and may send its next command. An entry that is missing (a new app id, a lost
changelog) is rebuilt from the store; a conversation with nothing stored gets
no entry from a control event (a zero tally would make an erased id answer
again). A control event's entry is written at once (``Accounting.handle``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from core.domain.budget import BudgetConfig
from core.domain.tally import (
    MAX_ATTEMPTS,
    Completion,
    ConversationTally,
    OperatorRequest,
    completes_outstanding,
    given_up,
    on_completion,
    on_reconcile,
    on_request,
    rebuilt,
    resynced,
)
from core.ports.storage import StoreTotals, TallySource
from streams.events import (
    AnyControl,
    CompactionCompleted,
    OperatorRequestEvent,
    RecompactRequest,
    ReconcileRequest,
    RestoreRequest,
)
from streams.worker.commands import Commands, IssueReason
from streams.worker.erasure import Eraser
from streams.worker.issued_commands import IssuedCommands
from streams.worker.tally_table import TallyTable

log = logging.getLogger("compactor.worker")

#: Re-sent compaction ids whose sends a worker counts at most at once.
MAX_COUNTED_RESENDS = 10_000


class ControlPorts(Protocol):
    """What control events use of the runtime (``streams.worker.runtime``)."""

    @property
    def tallies(self) -> TallySource: ...


@dataclass(frozen=True)
class Subject:
    """The conversation a control event is about: its table entry as found, the
    store's counts if they were read for it (an entry written with them is
    synced), and the store's counts to read more with."""

    key: str
    tally: ConversationTally
    totals: StoreTotals | None
    partition: int
    epoch: int  # the partition's when the event was read: a put after a revoke is refused
    tallies: TallySource


class Control:
    def __init__(
        self,
        *,
        budget: BudgetConfig,
        command_timeout_seconds: float,
        runtime: ControlPorts,
        table: TallyTable,
        commands: Commands,
        eraser: Eraser,
        issued: IssuedCommands,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._budget = budget
        self._command_timeout = command_timeout_seconds
        self._runtime = runtime
        self._table = table
        self._commands = commands
        self._eraser = eraser
        self._issued = issued
        self._clock = clock
        # Sends of each re-sent compaction id (this worker's; a restart starts
        # the count again): past MAX_ATTEMPTS it is given up (``_count_resend``).
        self._sends: dict[str, int] = {}

    async def apply(self, event: AnyControl, partition: int) -> set[str]:
        """The conversation keys whose entry changed; ``partition``: where the event
        was read."""
        key = event.conversation_key
        epoch = self._table.epoch(partition)
        tally, totals = self._table.get(key), None
        tallies = self._runtime.tallies  # until the worker opened it: StoreUnavailable, waited out
        now = self._clock()
        if tally is None:
            totals = (await tallies.totals_of([key]))[key]
            if totals.rows == 0:
                await self._nothing_stored(event, totals)
                return set()
            tally = rebuilt(key, totals.tokens, totals.rows, totals.epoch)
        subject = Subject(key, tally, totals, partition, epoch, tallies)
        match event:
            case CompactionCompleted():
                return await self._completed(event, subject, now)
            case ReconcileRequest():
                return await self._reconcile(subject, now)
            case RecompactRequest() | RestoreRequest():
                return await self._operator_request(event, subject)

    async def _nothing_stored(self, event: AnyControl, totals: StoreTotals) -> None:
        """No entry and no rows: an erased or unknown conversation."""
        match event:
            case CompactionCompleted():
                await self._eraser.tombstone_again(event, totals.epoch)
            case RecompactRequest() | RestoreRequest():
                log.warning(
                    "%s request %s of %s: no such conversation (nothing stored)",
                    event.type, event.request_id, event.conversation_key,
                    extra={"conversation_id": event.conversation_key},
                )  # fmt: skip

    async def _completed(
        self, event: CompactionCompleted, subject: Subject, now: float
    ) -> set[str]:
        """Only the outstanding command's completion counts, against the store's
        counts read after it committed. Another one, in a conversation erased and
        started again since, may be a compaction from before the erase whose
        clip-archive followed the erase's tombstone: the tombstone goes again."""
        totals = subject.totals
        if not completes_outstanding(subject.tally, event.compaction_id):
            await self._eraser.tombstone_again(event, subject.tally.epoch)
        elif totals is None:
            totals = await _totals(subject)
        counts = None if totals is None else (totals.tokens, totals.rows)
        tally, issue = on_completion(subject.tally, completion_of(event), self._budget, now, counts)
        if tally.outstanding != subject.tally.outstanding:
            self._issued.finished(subject.key)
        return await self._put_and_send(subject, tally, totals, issue, "continue")

    async def _reconcile(self, subject: Subject, now: float) -> set[str]:
        """Reconciliation does not trust the table: the store's counts repair an
        entry that drifted, before deciding."""
        tally, totals = subject.tally, subject.totals
        if totals is None:
            totals = await _totals(subject)
            if totals.rows == 0:
                # Nothing stored (moved to a tenant, or its rows are gone): a
                # conversation without rows has no entry (and answers 404).
                self._table.delete(subject.key, partition=subject.partition)
                return {subject.key}
            tally = (
                resynced(tally, totals.tokens, totals.rows)
                if tally.epoch == totals.epoch
                else rebuilt(subject.key, totals.tokens, totals.rows, totals.epoch)
            )
        late = tally.outstanding
        tally, issue = on_reconcile(tally, self._budget, now, self._command_timeout)
        if issue and late is not None and tally.outstanding == late:
            tally, issue = self._count_resend(tally, late, now)
        return await self._put_and_send(subject, tally, totals, issue, "reconcile")

    def _count_resend(
        self, tally: ConversationTally, compaction_id: str, now: float
    ) -> tuple[ConversationTally, bool]:
        """A late command about to be re-sent: re-sent while its sends stay within
        ``MAX_ATTEMPTS``, else given up (``core.domain.tally.given_up``): a
        compaction failing at every attempt ran the summariser again each time."""
        sends = self._sends.pop(compaction_id, 1) + 1
        if sends <= MAX_ATTEMPTS:
            if len(self._sends) >= MAX_COUNTED_RESENDS:
                self._sends.clear()  # bounded memory; the counts start again
            self._sends[compaction_id] = sends
            return tally, True
        self._commands.gave_up(tally.conversation_id, compaction_id, MAX_ATTEMPTS)
        return given_up(tally, now)

    async def _operator_request(self, event: OperatorRequestEvent, subject: Subject) -> set[str]:
        """An operator's recompact or restore: the outstanding command now, or queued
        behind it (``core.domain.tally.on_request``)."""
        key, request_id = subject.key, event.request_id
        request = OperatorRequest(
            action=event.type,
            request_id=request_id,
            batch_id=event.batch_id if isinstance(event, RestoreRequest) else None,
        )
        tally, issue = on_request(subject.tally, request, self._clock())
        fields = {"conversation_id": key, "request_id": request_id}
        if tally is subject.tally and not issue:
            log.info("%s request %s of %s: already outstanding, queued or refused (queue full)",
                     event.type, request_id, key, extra=fields)  # fmt: skip
            return set()
        if not self._written(subject, tally, subject.totals):
            return set()
        log.info("%s request %s of %s by %s: %s", event.type, request_id, key,
                 event.requester, "sent" if issue else "queued", extra=fields)  # fmt: skip
        if issue:
            await self._send(subject, tally, subject.totals, "request")
        return {key}

    async def _put_and_send(
        self,
        subject: Subject,
        tally: ConversationTally,
        totals: StoreTotals | None,
        issue: bool,
        reason: IssueReason,
    ) -> set[str]:
        if not self._written(subject, tally, totals):
            return set()  # revoked meanwhile: the new owner redoes it
        if issue:
            await self._send(subject, tally, totals, reason)
        return {subject.key}

    def _written(
        self, subject: Subject, tally: ConversationTally, totals: StoreTotals | None
    ) -> bool:
        return self._table.put(
            tally,
            partition=subject.partition,
            synced=totals is not None or None,
            epoch=subject.epoch,
        )

    async def _send(
        self,
        subject: Subject,
        tally: ConversationTally,
        totals: StoreTotals | None,
        reason: IssueReason,
    ) -> None:
        last_seq = totals.last_seq if totals else await subject.tallies.last_seq(subject.key)
        await self._commands.send(tally, last_seq, reason)


async def _totals(subject: Subject) -> StoreTotals:
    return (await subject.tallies.totals_of([subject.key]))[subject.key]


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
