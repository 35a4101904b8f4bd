"""The ``CompactionCommand`` a tally's outstanding compaction becomes, and its sending.

Every path that issues a command (a message over the trigger, a completion
that leaves it due, a reconcile request, an operator's request) builds it
here, so a re-sent command is the same record: its id is the tally's
``outstanding``, and an operator's request travels with it again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

from core.domain.tally import ConversationTally
from core.domain.tenancy import ConversationRef
from core.ports.publisher import Publisher
from streams.events import CompactionCommand
from streams.metrics import Metrics
from streams.worker.issued_commands import IssuedCommands

log = logging.getLogger("compactor.worker")

# Why a command goes out, as ``compactor_commands_issued_total`` labels it:
# "continue" is a completion that left the conversation due (or a queued request).
IssueReason = Literal["over_budget", "continue", "reconcile", "request"]


class Commands:
    def __init__(
        self,
        publisher: Publisher,
        issued: IssuedCommands,
        metrics: Metrics,
        *,
        budget_tokens: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._publisher = publisher
        self._issued = issued  # where each went: reconciliation asks the broker about it
        self._metrics = metrics
        self._budget_tokens = budget_tokens  # logged with each command
        self._clock = clock

    def command_for(
        self, tally: ConversationTally, up_to_seq: int | None, reason: IssueReason
    ) -> CompactionCommand:
        """The command of the tally's outstanding compaction, up to message ``up_to_seq``."""
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

    def gave_up(self, conversation_key: str, compaction_id: str, attempts: int) -> None:
        """Reconciliation stopped re-sending ``compaction_id``: said in the log, counted."""
        self._metrics.compactions_given_up.inc()
        log.warning(
            "compaction %s of %s sent %d times without a completion: not re-sent; the "
            "conversation stays stalled until a new message or an operator's recompact "
            "(compactor recompact)",
            compaction_id, conversation_key, attempts,
            extra={"conversation_id": conversation_key, "compaction_id": compaction_id},
        )  # fmt: skip

    async def send(
        self, tally: ConversationTally, up_to_seq: int | None, reason: IssueReason
    ) -> None:
        await self.publish(self.command_for(tally, up_to_seq, reason), reason)

    async def publish(self, command: CompactionCommand, reason: IssueReason) -> None:
        """Returns once the broker has it; notes where it went."""
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
            self._budget_tokens,
            extra={
                "conversation_id": command.conversation_key,
                "compaction_id": command.compaction_id,
            },
        )
