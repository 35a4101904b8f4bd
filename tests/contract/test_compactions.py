"""What a compaction reads before it plans (``compaction_inputs``) and writes
(``apply_compaction``): all or nothing, once per compaction id, refused when the
history it was planned from changed or its announced stored tokens are not the
rows'."""

from __future__ import annotations

from typing import Any

import pytest

from core.domain.compaction import CompactionPlan, StoredTokens
from core.domain.tokens import estimate_message_tokens
from core.ports.storage import (
    AlreadyApplied,
    Applied,
    CompactionInputs,
    CompactionOutbox,
    HistoryConflictError,
    IncomingMessage,
    OutboxRecord,
)
from tests.contract.backends import Backend
from tests.support.plans import CONV, make_plan, msg, save_all, stored
from tests.support.stores import totals


async def outbox_of(store: Any, plan: CompactionPlan, *records: OutboxRecord) -> CompactionOutbox:
    """``records`` with the stored token counts ``plan`` removes and adds, as the
    processor announces them (from ``compaction_inputs``)."""
    inputs = await store.history.compaction_inputs(
        plan.compaction_id, plan.conversation_id, up_to_seq=None
    )
    return CompactionOutbox(records, StoredTokens.of(plan, inputs.stored_tokens))


async def separately(
    store: Any, backend: Backend, compaction_id: str, up_to_seq: int | None
) -> CompactionInputs:
    """What ``compaction_inputs`` answers in one call, asked of the ports one by one."""
    found = list(await store.history.load_history(CONV, up_to_seq=up_to_seq))
    stored_tokens = await backend.stored_tokens(CONV)
    return CompactionInputs(
        applied=await store.compactions.compaction_applied(compaction_id),
        total=(await totals(store, CONV)).tokens,
        history=found,
        stored_tokens={m.id: stored_tokens[m.id] for m in found},
    )


# -- compaction_inputs -----------------------------------------------------------------


async def test_an_unknown_conversation_has_nothing(store: Any) -> None:
    nothing = CompactionInputs(applied=False, total=0, history=[])
    for up_to_seq in (None, 3):
        assert await store.history.compaction_inputs("c", "nobody", up_to_seq=up_to_seq) == nothing


async def test_the_inputs_answer_what_the_ports_answer_one_by_one(
    store: Any, backend: Backend
) -> None:
    messages = [msg(i) for i in range(6)]
    group = [IncomingMessage(m, 10 + i) for i, m in enumerate(messages)]
    outcomes = await store.ingest.save_messages(
        [*group, IncomingMessage(msg(0, conversation_id="b"), 5)]
    )
    cut = outcomes[3].seq  # the command counted the first four messages
    for up_to_seq in (None, cut):
        got = await store.history.compaction_inputs("cmp-1", CONV, up_to_seq=up_to_seq)
        assert got == await separately(store, backend, "cmp-1", up_to_seq)
    inputs = await store.history.compaction_inputs("cmp-1", CONV, up_to_seq=cut)
    assert (inputs.applied, inputs.total) == (False, sum(range(10, 16)))  # every row counts
    assert [m.id for m in inputs.history] == [m.id for m in messages[:4]]  # up to the cut
    assert inputs.stored_tokens == {m.id: 10 + i for i, m in enumerate(messages[:4])}


async def test_after_a_compaction_its_clip_archive_leads_and_it_is_applied(
    store: Any, backend: Backend
) -> None:
    messages = [msg(i) for i in range(4)]
    await save_all(store, messages)
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "s", messages[:2])], [m.id for m in messages[:2]])
    await store.compactions.apply_compaction(plan)
    await save_all(store, [msg(9)])
    for up_to_seq in (None, 1):  # the clip-archive is kept whatever the cut
        got = await store.history.compaction_inputs("cmp-1", CONV, up_to_seq=up_to_seq)
        assert got == await separately(store, backend, "cmp-1", up_to_seq)
    inputs = await store.history.compaction_inputs("cmp-1", CONV, up_to_seq=None)
    assert inputs.applied is True
    ids = [plan.clip_archive.id, messages[2].id, messages[3].id, msg(9).id]
    assert [m.id for m in inputs.history] == ids


# -- apply_compaction ------------------------------------------------------------------


async def test_a_compaction_archives_deletes_and_inserts_its_clip_archive(
    store: Any, backend: Backend
) -> None:
    history = [msg(i, f"turn {i}") for i in range(6)]
    await save_all(store, history)
    batches = [
        stored("cmp-1", 0, "first summary", history[:2], start=0, end=1),
        stored("cmp-1", 1, "second summary", history[2:4], start=2, end=3),
    ]
    plan = make_plan("cmp-1", batches, [m.id for m in history[:4]])
    assert await store.compactions.compaction_applied("cmp-1") is False
    assert await store.compactions.apply_compaction(plan) == Applied()
    assert await store.compactions.compaction_applied("cmp-1") is True
    assert await store.history.load_history(CONV) == [plan.clip_archive, *history[4:]]
    assert await store.archive.live_batches(CONV) == batches
    rows = await backend.rows()
    assert (rows["messages"], rows["archival_memory"], rows["archived_messages"]) == (3, 2, 4)
    assert rows["compactions"] == 1 and rows["outbox"] == 0
    after = [plan.clip_archive, *history[4:]]
    assert (await totals(store, CONV)).tokens == sum(map(estimate_message_tokens, after))


async def test_applying_a_compaction_again_is_already_applied_and_writes_nothing(
    store: Any, backend: Backend
) -> None:
    history = [msg(i) for i in range(4)]
    await save_all(store, history)
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "s", history[:2])], [m.id for m in history[:2]])
    outbox = await outbox_of(store, plan, OutboxRecord(topic="control", key=CONV, payload="x"))
    assert await store.compactions.apply_compaction(plan, outbox) == Applied()
    before = await backend.rows()
    assert await store.compactions.apply_compaction(plan, outbox) == AlreadyApplied()
    assert await backend.rows() == before  # no second outbox row either
    assert len(await store.archive.live_batches(CONV)) == 1


async def test_a_plan_over_a_message_that_is_gone_conflicts_and_writes_nothing(
    store: Any, backend: Backend
) -> None:
    history = [msg(i) for i in range(8)]
    await save_all(store, history)
    first = make_plan("cmp-1", [stored("cmp-1", 0, "1", history[:4])], [m.id for m in history[:4]])
    assert await store.compactions.apply_compaction(first) == Applied()
    before, history_before = await backend.rows(), await store.history.load_history(CONV)
    # Planned from the history before cmp-1: two of its messages are gone now.
    stale = make_plan(
        "cmp-2", [stored("cmp-2", 0, "2", history[2:6])], [m.id for m in history[2:6]]
    )
    with pytest.raises(HistoryConflictError):
        await store.compactions.apply_compaction(stale)
    assert await backend.rows() == before
    assert await store.history.load_history(CONV) == history_before
    assert await store.compactions.compaction_applied("cmp-2") is False
    assert [b.id for b in await store.archive.live_batches(CONV)] == ["cmp-1:0"]


async def test_a_clip_archive_the_plan_did_not_replace_conflicts(
    store: Any, backend: Backend
) -> None:
    history = [msg(i) for i in range(6)]
    await save_all(store, history)
    assert await store.compactions.apply_compaction(make_plan("cmp-1", [], [history[0].id]))
    before = await backend.rows()
    # Leaves clip-archive-cmp-1 out of deleted_message_ids.
    stale = make_plan("cmp-2", [stored("cmp-2", 0, "x", history[1:3])], [history[1].id])
    with pytest.raises(HistoryConflictError):
        await store.compactions.apply_compaction(stale)
    assert await backend.rows() == before


async def test_superseding_a_batch_superseded_already_conflicts(
    store: Any, backend: Backend
) -> None:
    one, two = stored("cmp-1", 0, "one"), stored("cmp-1", 1, "two")
    assert await store.compactions.apply_compaction(make_plan("cmp-1", [one, two], []))
    merged = stored("cmp-2", "m", "merged", depth=1)
    ok = make_plan("cmp-2", [merged], ["clip-archive-cmp-1"], superseded=[(one.id, merged.id)])
    assert await store.compactions.apply_compaction(ok) == Applied()
    before = await backend.rows()
    again = make_plan(
        "cmp-3",
        [stored("cmp-3", "m", "merged again", depth=1)],
        ["clip-archive-cmp-2"],
        superseded=[(one.id, "cmp-3:m")],
    )
    with pytest.raises(HistoryConflictError):
        await store.compactions.apply_compaction(again)
    assert await backend.rows() == before


async def test_a_plan_writing_into_another_conversation_is_refused(
    store: Any, backend: Backend
) -> None:
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "x", conversation_id="conv-b")], [])
    with pytest.raises(ValueError, match="outside conversation"):
        await store.compactions.apply_compaction(plan)
    assert set((await backend.rows()).values()) == {0}


async def test_the_outbox_is_written_with_the_compaction_and_its_announced_tokens(
    store: Any, backend: Backend
) -> None:
    history = [msg(i) for i in range(3)]
    await store.ingest.save_messages([IncomingMessage(m, 100 + i) for i, m in enumerate(history)])
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "s", history[:2])], [m.id for m in history[:2]])
    records = (
        OutboxRecord(topic="clip_archives", key=CONV, payload="a"),
        OutboxRecord(topic="control", key=CONV, payload="b"),
    )
    outbox = await outbox_of(store, plan, *records)
    assert outbox.tokens == StoredTokens(201, estimate_message_tokens(plan.clip_archive))
    assert await store.compactions.apply_compaction(plan, outbox) == Applied()
    rows = await store.outbox.outbox_rows("cmp-1")
    assert [(r.topic, r.key, r.payload, r.published) for r in rows] == [
        ("clip_archives", CONV, "a", False),
        ("control", CONV, "b", False),
    ]


async def test_stored_tokens_other_than_announced_roll_the_whole_compaction_back(
    store: Any, backend: Backend
) -> None:
    history = [msg(i) for i in range(3)]
    await save_all(store, history)
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "s", history[:2])], [m.id for m in history[:2]])
    outbox = await outbox_of(store, plan, OutboxRecord(topic="control", key=CONV, payload="x"))
    before = await backend.rows()
    removed, added = outbox.tokens.removed, outbox.tokens.added
    for tokens in (StoredTokens(removed - 1, added), StoredTokens(removed, added + 1)):
        with pytest.raises(HistoryConflictError):
            await store.compactions.apply_compaction(plan, CompactionOutbox(outbox.records, tokens))
        assert await backend.rows() == before
    assert await store.compactions.compaction_applied("cmp-1") is False


async def test_a_resummarised_batch_supersedes_and_takes_the_earliest_slot(store: Any) -> None:
    history = [msg(i) for i in range(12)]
    await save_all(store, history)
    b0, b1, b2 = (stored("cmp-1", i, f"b{i}", history[2 * i : 2 * i + 2]) for i in range(3))
    first = make_plan("cmp-1", [b0, b1, b2], [m.id for m in history[:6]])
    assert await store.compactions.apply_compaction(first) == Applied()
    # As the compactor plans it: fresh batches first (one folded in at once), the
    # merged batch last, although it covers the oldest time.
    merged_id = "cmp-2:resummarized"
    f0 = stored("cmp-2", 0, "f0", history[6:8], superseded_by=merged_id)
    f1 = stored("cmp-2", 1, "f1", history[8:10])
    sources = history[0:4] + history[6:8]
    merged = stored("cmp-2", "resummarized", "merged", sources, depth=1)
    second = make_plan(
        "cmp-2",
        [f0, f1, merged],
        [*(m.id for m in history[6:10]), first.clip_archive.id],
        superseded=[(b0.id, merged_id), (b1.id, merged_id)],
    )
    assert await store.compactions.apply_compaction(second) == Applied()
    assert [b.id for b in await store.archive.live_batches(CONV)] == [merged_id, b2.id, f1.id]
    # The next compaction appends after the merged batch and the survivors.
    third = make_plan(
        "cmp-3",
        [stored("cmp-3", 0, "z", history[10:12])],
        [history[10].id, history[11].id, second.clip_archive.id],
    )
    assert await store.compactions.apply_compaction(third) == Applied()
    live = [b.id for b in await store.archive.live_batches(CONV)]
    assert live == [merged_id, b2.id, f1.id, "cmp-3:0"]
