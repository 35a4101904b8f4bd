"""The archive a compaction reads and the views page: the live batches in the
clip-archive's order, one batch with its raw turns (keyset pages, each turn's
stored token count), the compaction log, the raw turns' retention."""

from __future__ import annotations

from typing import Any

from core.domain.compaction import CompactionPlan
from core.ports.storage import Applied, IncomingMessage, MessageKey, ReadScope
from tests.contract.backends import Backend
from tests.support.plans import CONV, make_plan, msg, stored

TURNS = [
    "We could host the offsite in Lisbon next spring.",
    "photo photo photo: a caption of the beach",
    "The budget for the offsite is 4,250 euros, approved by Dana.",
    "Let's meet on 14 May at the harbour cafe.",
    "I changed my mind: the offsite moves to Porto.",
]
SUMMARIES = [
    "Offsite planning: Lisbon host; the budget is 4,250 euros, approved by Dana.",
    "Meet on 14 May at the harbour cafe; the offsite moves to Porto.",
]


async def compact_all(store: Any) -> CompactionPlan:
    """Every turn archived, in two batches; each turn stored with 10 + its index tokens."""
    messages = [msg(i, text) for i, text in enumerate(TURNS)]
    await store.ingest.save_messages([IncomingMessage(m, 10 + i) for i, m in enumerate(messages)])
    plan = make_plan(
        "cmp-1",
        [
            # Each summary keeps its turns' specifics, as the store's gate requires.
            stored("cmp-1", 0, SUMMARIES[0], messages[:3], end=2),
            stored("cmp-1", 1, SUMMARIES[1], messages[3:], start=3, end=5),
        ],
        [m.id for m in messages],
    )
    assert await store.compactions.apply_compaction(plan) == Applied()
    return plan


async def test_live_batches_keep_the_plans_order_not_time_order(store: Any) -> None:
    later = stored("cmp-1", 0, "later", start=50, end=60)
    earlier = stored("cmp-1", 1, "earlier", start=0, end=10)
    assert await store.compactions.apply_compaction(make_plan("cmp-1", [later, earlier], []))
    plan = make_plan(
        "cmp-2", [stored("cmp-2", 0, "next", start=70, end=80)], ["clip-archive-cmp-1"]
    )
    assert await store.compactions.apply_compaction(plan) == Applied()
    other = make_plan(
        "cmp-x", [stored("cmp-x", 0, "b", conversation_id="b")], [], conversation_id="b"
    )
    assert await store.compactions.apply_compaction(other) == Applied()
    assert [b.id for b in await store.archive.live_batches(CONV)] == [
        "cmp-1:0",
        "cmp-1:1",
        "cmp-2:0",
    ]
    assert await store.archive.live_batches("nobody") == []


async def test_a_batch_expands_to_its_raw_turns_with_their_stored_counts(store: Any) -> None:
    await compact_all(store)
    expanded = await store.archive.expand_batch(CONV, "cmp-1:1")
    assert expanded is not None and expanded.batch.id == "cmp-1:1"
    assert [t.content for t in expanded.turns] == TURNS[3:]
    assert expanded.turns_missing == 0
    assert expanded.turn_tokens == {t.id: 13 + i for i, t in enumerate(expanded.turns)}
    assert await store.archive.expand_batch(CONV, "nope") is None
    assert await store.archive.expand_batch("other-conversation", "cmp-1:1") is None


async def test_a_batchs_turns_page_by_keyset(store: Any) -> None:
    await compact_all(store)
    full = await store.archive.expand_batch(CONV, "cmp-1:0")
    assert full is not None and len(full.turns) == 3
    seen: list[str] = []
    after: MessageKey | None = None
    while True:
        page = await store.archive.expand_batch(CONV, "cmp-1:0", after=after, limit=2)
        assert page is not None and page.turns_missing == 0 and len(page.turns) <= 2
        assert set(page.turn_tokens) == {t.id for t in page.turns}  # the page's own
        seen += [t.id for t in page.turns]
        if len(page.turns) < 2:
            break
        after = MessageKey.of(page.turns[-1])
    assert seen == [t.id for t in full.turns]


async def test_a_resummarised_batch_expands_to_its_sources_turns(store: Any) -> None:
    await compact_all(store)
    merged = stored("cmp-2", "resummarized", "All of it.", depth=1, end=5)
    sources = tuple(f"{CONV}-m{i:03d}" for i in range(len(TURNS)))
    merged = merged.model_copy(
        update={"batch": merged.batch.model_copy(update={"source_message_ids": sources})}
    )
    superseded = [("cmp-1:0", merged.id), ("cmp-1:1", merged.id)]
    plan = make_plan("cmp-2", [merged], ["clip-archive-cmp-1"], superseded=superseded)
    assert await store.compactions.apply_compaction(plan) == Applied()
    expanded = await store.archive.expand_batch(CONV, merged.id)
    assert expanded is not None and [t.content for t in expanded.turns] == TURNS


async def test_a_read_on_a_callers_behalf_sees_only_its_scope(store: Any) -> None:
    await compact_all(store)
    assert await store.archive.expand_batch(CONV, "cmp-1:0", scope=ReadScope.everything())
    tenant = ReadScope.of_tenant("acme")  # CONV has no tenant
    assert await store.archive.expand_batch(CONV, "cmp-1:0", scope=tenant) is None
    assert await store.archive.compaction_log(CONV, scope=tenant) == []


async def test_the_compaction_log_lists_each_compaction_with_its_batches(store: Any) -> None:
    plan = await compact_all(store)
    (record,) = await store.archive.compaction_log(CONV)
    assert record.compaction_id == "cmp-1" and record.messages_compressed == len(TURNS)
    assert (record.tokens_before, record.tokens_after) == (1000, 100)
    assert [b.batch_id for b in record.batches] == [b.id for b in plan.new_batches]
    assert await store.archive.compaction_log("nobody") == []


async def test_retention_removes_old_raw_turns_only(store: Any, backend: Backend) -> None:
    await compact_all(store)
    assert await store.archive.expire_raw_turns() == 0  # 0 days = forever
    archive = backend.archive_keeping(30)
    assert await archive.expire_raw_turns() == 0  # all archived just now
    await backend.age_archived("cmp-1:0", 31)
    assert await archive.expire_raw_turns() == 3
    expanded = await archive.expand_batch(CONV, "cmp-1:0")
    assert expanded is not None and expanded.turns == () and expanded.turns_missing == 3
    assert len((await archive.expand_batch(CONV, "cmp-1:1")).turns) == 2
    # A redelivered compacted message stays out.
    (again,) = await store.ingest.save_messages([IncomingMessage(msg(1, TURNS[1]), 10)])
    assert again.status == "duplicate"
