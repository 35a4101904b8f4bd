"""``OutboxStore``: the rows a compaction wrote, oldest first; the timer's drain
leaves rows younger than its grace alone; a mark is once and per compaction;
every row of a compaction stays readable for a replay, published or not."""

from __future__ import annotations

from typing import Any

from core.domain.compaction import StoredTokens
from core.ports.storage import Applied, CompactionOutbox, OutboxRecord
from tests.contract.backends import Backend
from tests.support.plans import make_plan, msg, save_all, stored


async def compacted(store: Any, conversation_id: str, *payloads: str) -> str:
    """A compaction of ``conversation_id`` whose outbox holds ``payloads``; its id."""
    history = [msg(i, conversation_id=conversation_id) for i in range(3)]
    await save_all(store, history)
    compaction_id = f"cmp-{conversation_id}"
    batch = stored(compaction_id, 0, "s", history[:2], conversation_id=conversation_id)
    plan = make_plan(
        compaction_id, [batch], [m.id for m in history[:2]], conversation_id=conversation_id
    )
    inputs = await store.history.compaction_inputs(compaction_id, conversation_id, up_to_seq=None)
    topics = ("clip_archives", "control")
    records = tuple(
        OutboxRecord(topic=topics[i % 2], key=conversation_id, payload=payload)
        for i, payload in enumerate(payloads)
    )
    outbox = CompactionOutbox(records, StoredTokens.of(plan, inputs.stored_tokens))
    assert await store.compactions.apply_compaction(plan, outbox) == Applied()
    return compaction_id


async def test_pending_rows_come_oldest_first_up_to_the_limit(store: Any) -> None:
    await compacted(store, "conv-a", "a1", "a2")
    await compacted(store, "conv-b", "b1")
    assert [r.payload for r in await store.outbox.pending_outbox()] == ["a1", "a2", "b1"]
    assert [r.payload for r in await store.outbox.pending_outbox(limit=2)] == ["a1", "a2"]
    rows = await store.outbox.pending_outbox()
    assert [r.compaction_id for r in rows] == ["cmp-conv-a", "cmp-conv-a", "cmp-conv-b"]
    assert not any(r.published for r in rows)


async def test_the_drain_leaves_rows_younger_than_its_grace_alone(
    store: Any, backend: Backend
) -> None:
    await compacted(store, "conv-a", "a1", "a2")
    # The relay timer's view: a row younger than its grace is the processor's to send.
    assert await store.outbox.pending_outbox(older_than_seconds=3600) == []
    await backend.age_outbox(7200)  # a crash left them behind two hours ago
    assert [r.payload for r in await store.outbox.pending_outbox(older_than_seconds=3600)] == [
        "a1",
        "a2",
    ]


async def test_marked_rows_are_no_longer_pending(store: Any) -> None:
    await compacted(store, "conv-a", "a1", "a2")
    rows = await store.outbox.pending_outbox()
    await store.outbox.mark_published([rows[0].id])
    assert [r.payload for r in await store.outbox.pending_outbox()] == ["a2"]
    await store.outbox.mark_published([r.id for r in rows])  # again: harmless
    await store.outbox.mark_published([])
    assert await store.outbox.pending_outbox() == []


async def test_marking_a_compaction_published_touches_its_rows_only(store: Any) -> None:
    first = await compacted(store, "conv-a", "a1", "a2")
    await compacted(store, "conv-b", "b1")
    await store.outbox.mark_compaction_published(first)
    assert [r.payload for r in await store.outbox.pending_outbox()] == ["b1"]
    await store.outbox.mark_compaction_published(first)  # again: harmless
    assert [r.payload for r in await store.outbox.pending_outbox()] == ["b1"]


async def test_a_compactions_rows_stay_readable_published_or_not(store: Any) -> None:
    """What a replayed command republishes from: every row, saying which were sent."""
    compaction_id = await compacted(store, "conv-a", "a1", "a2")
    rows = await store.outbox.outbox_rows(compaction_id)
    assert [(r.payload, r.published) for r in rows] == [("a1", False), ("a2", False)]
    await store.outbox.mark_published([rows[0].id])
    rows = await store.outbox.outbox_rows(compaction_id)
    assert [(r.payload, r.published) for r in rows] == [("a1", True), ("a2", False)]
    await store.outbox.mark_compaction_published(compaction_id)
    assert all(r.published for r in await store.outbox.outbox_rows(compaction_id))
    assert await store.outbox.outbox_rows("cmp-unknown") == []
