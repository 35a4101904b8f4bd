"""Honest time ranges (covered days), chunk_order, and the retention timer."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from core.adapters.llm.extractive import ExtractiveProvider
from core.domain.clip_archive import (
    build_clip_archive,
    covered_days,
    covers_line,
    parse_clip_archive,
)
from core.domain.compaction import CompactionConfig, SummaryBatch
from core.domain.messages import ConversationMessage
from tests.support.compaction import applying_compactor
from tests.support.memory_store import InMemoryStore
from tests.support.stores import saved
from tests.unit.worker.harness import harness, over_budget

pytestmark = pytest.mark.unit

JAN = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _batch(days: tuple[date, ...], start: datetime, end: datetime) -> SummaryBatch:
    return SummaryBatch(
        content="User: something",
        depth=0,
        start_time=start,
        end_time=end,
        message_count=3,
        days=days,
    )


def test_a_batch_spanning_months_lists_the_days_it_covers() -> None:
    end = JAN + timedelta(days=200)
    days = covered_days([JAN, JAN + timedelta(hours=2), JAN + timedelta(days=40), end])
    assert days == (date(2026, 1, 5), date(2026, 2, 14), date(2026, 7, 24))
    line = covers_line(_batch(days, JAN, end))
    assert line == "(covers 3 days: 2026-01-05, 2026-02-14, 2026-07-24)"
    # A batch covering every day of its range needs no such line.
    assert covers_line(_batch((JAN.date(),), JAN, JAN + timedelta(hours=1))) is None
    assert covers_line(_batch((), JAN, end)) is None  # unknown (an old batch)


def test_the_covers_line_round_trips_through_the_clip_archive() -> None:
    end = JAN + timedelta(days=200)
    batch = _batch(covered_days([JAN, end]), JAN, end)
    text = build_clip_archive([batch], clip_first=2, clip_last=2, messages_compressed=3, cycles=1)
    assert "(covers 2 days: 2026-01-05, 2026-07-24)" in text
    (shown,) = parse_clip_archive(text).shown
    assert shown.content == "User: something"
    assert shown.covers == "(covers 2 days: 2026-01-05, 2026-07-24)"


def _history(n: int) -> list[ConversationMessage]:
    # Every third message is a question (more important): importance order
    # groups messages from all over the history.
    return [
        ConversationMessage(
            id=f"m{i:03d}",
            conversation_id="c1",
            role="user" if i % 2 == 0 else "assistant",
            content=(f"Question {i} about the deploy?" if i % 3 == 0 else f"note number {i} ok"),
            created_at=JAN + timedelta(days=i),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("order", ["importance", "chronological"])
async def test_chunk_order_decides_what_a_batch_spans(order: str) -> None:
    store = InMemoryStore()
    for m in _history(30):
        await saved(store, m, 10)
    config = CompactionConfig(
        chunk_size=5,
        keep_recent=5,
        chunk_order=order,
        min_chunk_tokens=0,  # type: ignore[arg-type]
    )
    compactor = applying_compactor(
        store=store,
        model=ExtractiveProvider(),
        config=config,
        model_name="x",
    )
    result = await compactor.compress(await store.history.load_history("c1"), "c1")
    depth0 = [b for b in result.batches if b.batch.depth == 0]
    assert depth0
    ids = [list(b.batch.source_message_ids) for b in depth0]
    contiguous = all(
        [int(i[1:]) for i in chunk]
        == list(range(int(chunk[0][1:]), int(chunk[0][1:]) + len(chunk)))
        for chunk in ids
    )
    assert contiguous == (order == "chronological")
    for b in depth0:
        assert b.batch.days == covered_days(
            JAN + timedelta(days=int(i[1:])) for i in b.batch.source_message_ids
        )


async def test_the_reconciliation_timer_expires_old_raw_turns() -> None:
    h = harness()
    h.store.raw_retention_days = 30
    await h.components.processor.compact(await over_budget(h))
    archived = set(h.store.archived)
    assert archived  # the compacted turns, kept raw for memory_read
    h.clock.now += 31 * 86_400  # past the retention
    await h.components.reconciler.tick()  # the first pass asks the store
    assert not archived & set(h.store.archived)
