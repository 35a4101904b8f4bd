"""Per-conversation token accounting: when to ask for a compaction.

A pure state machine, so the stream agent only does I/O. Its invariants:

* at most one compaction command is outstanding per conversation;
* a command is identified by ``compaction_id_for(conversation, generation, epoch)``,
  so a re-issued command is recognised downstream as the same compaction, and
  a conversation started again under an erased id (``epoch``: erases so far)
  never repeats the erased one's ids;
* a completion is applied once: only the one for the outstanding command
  changes the tally, redeliveries and stale completions are ignored;
* a conversation that could not be compacted further (``noop``) is not asked
  again until a new message arrives;
* "must compact" means ``core.domain.budget.compaction_due_now``: over the
  budget, or over the soft trigger (``[budget].compact_at``) and, with
  ``[budget].idle_seconds``, quiet that long since the last message (the
  reconciliation timer asks again while it waits).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from core.domain.budget import BudgetConfig, compaction_due, compaction_due_now

_GENERATION_NAMESPACE = uuid.UUID("0b6f7f8e-3f51-4a7e-a1a9-4d35b7c0e2d4")

CompletionStatus = Literal["compacted", "noop"]
RequestAction = Literal["recompact", "restore"]
MAX_QUEUED_REQUESTS = 8  # operator requests waiting behind the outstanding command
#: Sends of one compaction id (the first and its re-sends) before reconciliation
#: gives up on it (``given_up``): a compaction that fails every time, each
#: attempt running the summariser again, is not re-sent for ever (issue 29).
MAX_ATTEMPTS = 5


def compaction_id_for(conversation_id: str, generation: int, epoch: int = 0) -> str:
    """Epoch 0 (never erased) keeps the ids issued before erases had epochs."""
    name = f"{conversation_id}\n{generation}"
    if epoch:
        name += f"\nerased {epoch}"
    return str(uuid.uuid5(_GENERATION_NAMESPACE, name))


def request_compaction_id(conversation_id: str, request_id: str, epoch: int = 0) -> str:
    """The compaction an operator request (recompact, restore) becomes: derived from
    the request id, so a redelivered or repeated request is the same compaction
    (applied once, then replayed), whatever the generation is by then."""
    name = f"{conversation_id}\nrequest {request_id}"
    if epoch:
        name += f"\nerased {epoch}"
    return str(uuid.uuid5(_GENERATION_NAMESPACE, name))


class OperatorRequest(BaseModel):
    """A recompact or restore asked for by an operator, as the tally keeps it until
    its command completes (so a re-sent command carries it again)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: RequestAction
    request_id: str
    batch_id: str | None = None  # restore: the batch (None: the newest live one)


class ConversationTally(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    conversation_id: str
    token_total: int = Field(default=0, ge=0)
    message_count: int = Field(default=0, ge=0)
    generation: int = Field(default=0, ge=0)  # completions applied
    compactions: int = Field(default=0, ge=0)  # completions that compacted something
    outstanding: str | None = None  # compaction id of the command in flight
    outstanding_since: float | None = None
    stalled: bool = False  # due, but the last compaction found nothing to compress
    epoch: int = Field(default=0, ge=0)  # erases of this conversation id before it started
    last_message_at: float | None = None  # the newest message counted ([budget].idle_seconds)
    request: OperatorRequest | None = None  # what the outstanding command does, if asked
    queued: tuple[OperatorRequest, ...] = ()  # requests waiting for the outstanding one


def _idle_for(tally: ConversationTally, now: float) -> float | None:
    return None if tally.last_message_at is None else now - tally.last_message_at


class Completion(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    compaction_id: str
    status: CompletionStatus
    messages_compressed: int = Field(ge=0)
    rows_removed: int = Field(default=0, ge=0)  # compressed messages + the replaced clip-archive
    rows_added: int = Field(default=0, ge=0)  # the new clip-archive
    tokens_removed: int = Field(ge=0)
    tokens_added: int = Field(ge=0)


def _issue(tally: ConversationTally, now: float) -> ConversationTally:
    return tally.model_copy(
        update={
            "outstanding": compaction_id_for(tally.conversation_id, tally.generation, tally.epoch),
            "outstanding_since": now,
        }
    )


def on_message(
    tally: ConversationTally, tokens: int, budget: BudgetConfig, now: float
) -> tuple[ConversationTally, bool]:
    """Count a new message; ``True`` when a compaction command must be sent.

    ``last_message_at`` is kept only with ``[budget].idle_seconds``, its only
    reader: an entry holding it cannot be read by a worker of the previous
    release, so idle compaction is turned on once the upgrade is done
    (``streams.worker.tally_table``, docs/operations.md "Upgrading")."""
    tally = tally.model_copy(
        update={
            "token_total": tally.token_total + tokens,
            "message_count": tally.message_count + 1,
            "stalled": False,
            "last_message_at": now if budget.idle_seconds is not None else tally.last_message_at,
        }
    )
    if tally.outstanding is None and compaction_due_now(tally.token_total, budget, 0.0):
        return _issue(tally, now), True
    return tally, False


def on_messages(
    tally: ConversationTally,
    arrived: Sequence[tuple[int, int | None]],
    budget: BudgetConfig,
    now: float,
) -> tuple[ConversationTally, bool, int | None]:
    """Count a conversation's new messages of a group, each ``(tokens, arrival
    number)`` in order, as if each came alone: the tally, whether a command must
    be sent, and the arrival number of the message that made it due (the
    command covers up to it)."""
    issue, due_at = False, None
    for tokens, seq in arrived:
        tally, issued = on_message(tally, tokens, budget, now)
        if issued:
            issue, due_at = True, seq
    return tally, issue, due_at


def completes_outstanding(tally: ConversationTally, completion_id: str) -> bool:
    """Only the outstanding command's completion changes the tally."""
    return tally.outstanding is not None and completion_id == tally.outstanding


def on_completion(
    tally: ConversationTally,
    completion: Completion,
    budget: BudgetConfig,
    now: float,
    store_totals: tuple[int, int] | None = None,
) -> tuple[ConversationTally, bool]:
    """Apply the outstanding command's completion; ``True`` when the next one must be sent.

    Still due after a real compaction (a long tail of new messages arrived
    while it ran, past the command's ``up_to_seq``) means compacting again
    right away; after a ``noop`` it means waiting.

    ``store_totals`` are the store's (tokens, rows) read now, after the
    compaction committed. They are exact where the completion's deltas are
    not: a tally resynced from the store after the commit (a redelivered
    message did that) already lacks the removed tokens, and subtracting them
    again left it below the store, so the conversation was never compacted
    again. Without them (tests, a store that cannot count) the deltas apply.
    """
    if not completes_outstanding(tally, completion.compaction_id):
        return tally, False
    counts = store_totals if store_totals is not None else _counts_after(tally, completion)
    tally = _completed(tally, completion, counts, budget)
    if tally.queued:
        return _issue_request(tally, tally.queued[0], now, tally.queued[1:]), True
    again = completion.status == "compacted" and completion.messages_compressed > 0
    if again and compaction_due_now(tally.token_total, budget, _idle_for(tally, now)):
        return _issue(tally, now), True
    return tally, False


def _completed(
    tally: ConversationTally, completion: Completion, counts: tuple[int, int], budget: BudgetConfig
) -> ConversationTally:
    """The tally with the completion applied: its counts, the next generation, nothing
    outstanding."""
    token_total, message_count = counts
    compacted = completion.status == "compacted"
    return tally.model_copy(
        update={
            "token_total": token_total,
            "message_count": message_count,
            "generation": tally.generation + 1,
            "compactions": tally.compactions + (1 if compacted else 0),
            "outstanding": None,
            "outstanding_since": None,
            # An operator's request that found nothing to do says nothing about
            # whether an ordinary compaction would.
            "stalled": not compacted
            and tally.request is None
            and compaction_due(token_total, budget),
            "request": None,
        }
    )


def _counts_after(tally: ConversationTally, completion: Completion) -> tuple[int, int]:
    """(tokens, rows) once the completion's deltas are applied to the tally's counts."""
    return (
        max(0, tally.token_total - completion.tokens_removed + completion.tokens_added),
        max(0, tally.message_count - completion.rows_removed + completion.rows_added),
    )


def _issue_request(
    tally: ConversationTally,
    request: OperatorRequest,
    now: float,
    queued: tuple[OperatorRequest, ...],
) -> ConversationTally:
    return tally.model_copy(
        update={
            "outstanding": request_compaction_id(
                tally.conversation_id, request.request_id, tally.epoch
            ),
            "outstanding_since": now,
            "request": request,
            "queued": queued,
            "stalled": False,
        }
    )


def on_request(
    tally: ConversationTally, request: OperatorRequest, now: float
) -> tuple[ConversationTally, bool]:
    """An operator's recompact or restore; ``True`` when its command must be sent now.

    It becomes the outstanding command at once when nothing is outstanding, else
    it waits its turn (``queued``) and goes when the outstanding one completes:
    one command at a time per conversation, as always. A redelivered request
    (its command outstanding, or already queued) changes nothing; one delivered
    again after it completed is sent again under the same compaction id, which
    the processor finds applied (idempotent by request id). More than
    ``MAX_QUEUED_REQUESTS`` waiting: refused (``False``, tally unchanged).
    """
    compaction_id = request_compaction_id(tally.conversation_id, request.request_id, tally.epoch)
    waiting = {queued.request_id for queued in tally.queued}
    if tally.outstanding == compaction_id or request.request_id in waiting:
        return tally, False
    if tally.outstanding is None:
        return _issue_request(tally, request, now, tally.queued), True
    if len(tally.queued) >= MAX_QUEUED_REQUESTS:
        return tally, False
    return tally.model_copy(update={"queued": (*tally.queued, request)}), False


def reconcile_due(
    tally: ConversationTally, budget: BudgetConfig, now: float, command_timeout: float
) -> bool:
    """Would ``on_reconcile`` send a command now? (What the reconcile timer asks.)"""
    if tally.outstanding is not None:
        return now - (tally.outstanding_since or 0.0) >= command_timeout
    return not tally.stalled and compaction_due_now(
        tally.token_total, budget, _idle_for(tally, now)
    )


def on_reconcile(
    tally: ConversationTally, budget: BudgetConfig, now: float, command_timeout: float
) -> tuple[ConversationTally, bool]:
    """Heal lost commands and crashed compactions; ``True`` when a command must be sent.

    An outstanding command with no completion within ``command_timeout`` is
    sent again under the same compaction id; a conversation due a compaction
    with nothing outstanding (and not stalled) gets a new one.
    """
    if not reconcile_due(tally, budget, now, command_timeout):
        return tally, False
    if tally.outstanding is not None:
        return tally.model_copy(update={"outstanding_since": now}), True
    return _issue(tally, now), True


def given_up(tally: ConversationTally, now: float) -> tuple[ConversationTally, bool]:
    """The outstanding command sent ``MAX_ATTEMPTS`` times with no completion, not
    re-sent: nothing outstanding and ``stalled``, which reconciliation leaves
    alone until a new message arrives or an operator asks for a recompact (both
    clear it). An operator request queued behind it goes now (``True``: send).
    Only fields the previous release knows: a rolling upgrade reads the entry."""
    tally = tally.model_copy(
        update={"outstanding": None, "outstanding_since": None, "stalled": True, "request": None}
    )
    if tally.queued:
        return _issue_request(tally, tally.queued[0], now, tally.queued[1:]), True
    return tally, False


def resynced(tally: ConversationTally, token_total: int, message_count: int) -> ConversationTally:
    """The tally with counts taken from the store, the source of truth."""
    return tally.model_copy(update={"token_total": token_total, "message_count": message_count})


def rebuilt(
    conversation_id: str, token_total: int, message_count: int, epoch: int = 0
) -> ConversationTally:
    """A table entry made anew from the store's counts (a lost or new entry)."""
    fresh = ConversationTally(conversation_id=conversation_id, epoch=epoch)
    return resynced(fresh, token_total, message_count)


def on_resync(
    tally: ConversationTally | None,
    conversation_id: str,
    token_total: int,
    message_count: int,
    budget: BudgetConfig,
    now: float,
    epoch: int = 0,
) -> tuple[ConversationTally, bool]:
    """Take the store's counts for an entry the table may have wrong; ``True`` to send.

    Used for a conversation new to the table and for a redelivered message,
    which the table may or may not have counted. ``epoch`` is the store's: an
    entry of another epoch belonged to the conversation before an erase and
    is started anew. An outstanding command is
    never re-sent from here (only its timeout does that), so a burst of
    redeliveries cannot multiply commands.
    """
    base = (
        rebuilt(conversation_id, token_total, message_count, epoch)
        if tally is None or tally.epoch != epoch  # an entry from before an erase
        else resynced(tally, token_total, message_count)
    )
    if budget.idle_seconds is not None:  # a message has just arrived (see on_message)
        base = base.model_copy(update={"last_message_at": now})
    return on_reconcile(base, budget, now, command_timeout=math.inf)
