"""Small conveniences over the storage ports for tests: one message stored, one
conversation's counts. The ports take groups (``save_messages``, ``totals_of``);
tests often want one."""

from __future__ import annotations

from typing import Any

from core.domain.messages import ConversationMessage
from core.ports.storage import IncomingMessage, StoreTotals


async def saved(
    store: Any,
    message: ConversationMessage,
    tokens: int,
    *,
    partition: int | None = None,
    offset: int | None = None,
) -> bool:
    """Store one message (``save_messages`` of a group of one): whether it was inserted."""
    (outcome,) = await store.ingest.save_messages(
        [IncomingMessage(message, tokens, partition, offset)]
    )
    return bool(outcome.status == "inserted")


async def totals(store: Any, conversation_id: str) -> StoreTotals:
    """One conversation's stored counts (``totals_of`` of one)."""
    found: StoreTotals = (await store.tallies.totals_of([conversation_id]))[conversation_id]
    return found


async def counts(store: Any, conversation_id: str) -> tuple[int, int]:
    """(stored tokens, rows) of one conversation."""
    found = await totals(store, conversation_id)
    return found.tokens, found.rows
