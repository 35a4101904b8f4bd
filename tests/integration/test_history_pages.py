"""Keyset pagination of ``load_history`` and ``expand_batch`` against real PostgreSQL.

Pages walk the history in its order (clip-archive first, then created_at, then
id: ties on created_at included) exactly once, also while messages arrive
between pages; the in-memory store pages the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest

from core.adapters.postgres.store import PostgresStore
from core.domain.messages import ConversationMessage
from core.domain.tokens import estimate_message_tokens
from core.ports.storage import Applied, MessageKey
from tests.integration.test_postgres_store import (
    CONV,
    T0,
    clip,
    make_plan,
    msg,
    save_all,
    stored,
)
from tests.support.memory_store import InMemoryStore
from tests.support.stores import saved

pytestmark = pytest.mark.integration


async def walk(
    store: PostgresStore | InMemoryStore,
    limit: int,
    *,
    grow: Sequence[ConversationMessage] = (),
) -> list[str]:
    seen: list[str] = []
    after: MessageKey | None = None
    pending = list(grow)
    while True:
        page = await store.history.load_history(CONV, after=after, limit=limit)
        assert len(page) <= limit
        seen += [m.id for m in page]
        assert len(seen) <= 1000, "the key does not advance"
        if pending:  # a message arriving mid-walk, after the current position
            added = pending.pop(0)
            assert await saved(store, added, estimate_message_tokens(added))
        if len(page) < limit:
            return seen
        after = MessageKey.of(page[-1])


async def test_pages_walk_the_history_exactly_once_in_order(pg_store: PostgresStore) -> None:
    # 30 messages, many sharing a created_at (ties broken by id), saved out of order.
    messages = [msg(i, seconds=(i // 3) * 10) for i in range(30)]
    await save_all(pg_store, list(reversed(messages)))
    compressed = messages[:6]
    plan = make_plan(
        "cmp-1",
        [stored("cmp-1", 0, "the first six", compressed)],
        [m.id for m in compressed],
    )
    # dated last, it still comes first
    plan = plan.model_copy(update={"clip_archive": clip("cmp-1", seconds=99_999)})
    assert await pg_store.compactions.apply_compaction(plan) == Applied()
    everything = [m.id for m in await pg_store.history.load_history(CONV)]
    assert everything[0] == plan.clip_archive.id and len(everything) == 25

    memory = InMemoryStore()
    for m in messages:
        assert await saved(memory, m, estimate_message_tokens(m))
    assert await memory.compactions.apply_compaction(plan) == Applied()
    assert [m.id for m in await memory.history.load_history(CONV)] == everything

    for limit in (1, 2, 3, 7, 24, 25, 26):
        assert await walk(pg_store, limit) == everything, limit
        assert await walk(memory, limit) == everything, limit

    first = await pg_store.history.load_history(CONV, limit=1)
    assert [m.id for m in first] == [plan.clip_archive.id]
    assert first[0].stored_clip_archive
    rest = await pg_store.history.load_history(CONV, after=MessageKey.of(first[0]), limit=100)
    assert [m.id for m in rest] == everything[1:]
    # a page respects up_to_seq / as_of too
    cutoff = T0 + timedelta(seconds=20)
    capped = await pg_store.history.load_history(CONV, as_of=cutoff, after=MessageKey.of(first[0]))
    assert [m.id for m in capped] == [m.id for m in messages[6:9]]


async def test_messages_arriving_between_pages_are_seen_once(pg_store: PostgresStore) -> None:
    messages = [msg(i, seconds=i) for i in range(10)]
    await save_all(pg_store, messages)
    later = [msg(100 + i, seconds=1000 + i) for i in range(3)]
    seen = await walk(pg_store, 4, grow=later)
    assert seen == [m.id for m in messages + later]


async def test_batch_turns_page_by_keyset(pg_store: PostgresStore) -> None:
    messages = [msg(i, seconds=(i // 2) * 10) for i in range(9)]
    await save_all(pg_store, messages)
    batch = stored("cmp-1", 0, "all nine", messages)
    plan = make_plan("cmp-1", [batch], [m.id for m in messages])
    assert await pg_store.compactions.apply_compaction(plan) == Applied()
    full = await pg_store.archive.expand_batch(CONV, batch.id)
    assert full is not None and len(full.turns) == 9 and full.turns_missing == 0
    seen: list[str] = []
    after: MessageKey | None = None
    while True:
        page = await pg_store.archive.expand_batch(CONV, batch.id, after=after, limit=2)
        assert page is not None and page.turns_missing == 0 and len(page.turns) <= 2
        seen += [t.id for t in page.turns]
        if len(page.turns) < 2:
            break
        after = MessageKey.of(page.turns[-1])
    assert seen == [t.id for t in full.turns]
