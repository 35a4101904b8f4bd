"""Small conveniences over the storage ports for tests: one message stored, one
conversation's counts (the ports take groups: ``save_messages``, ``totals_of``;
tests often want one), and the store's round trips counted where they are the promise."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

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


ROLES = (
    "ingest", "history", "compactions", "outbox", "archive", "memory", "tallies", "privacy",
    "usage",
)  # fmt: skip


def round_trips(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call made of ``store``'s roles from now on, as ``"role.method"``, in order.

    For the tests whose promise is a number of store round trips (one call per
    group of messages, one question before a compaction): each call of a role
    is one round trip to PostgreSQL."""
    made: list[str] = []
    for role in ROLES:
        target = getattr(store, role)
        for name in dir(target):
            method = getattr(target, name)
            if name.startswith("_") or not inspect.iscoroutinefunction(method):
                continue
            monkeypatch.setattr(target, name, _recorded(method, f"{role}.{name}", made))
    return made


def _recorded(method: Any, label: str, made: list[str]) -> Any:
    async def call(*args: Any, **kwargs: Any) -> Any:
        made.append(label)
        return await method(*args, **kwargs)

    return call
