"""``ContextReader``: the version changes whenever the history does, the watermark
is the newest record processed for the conversation (never moved back, gone
with an erase), ``through`` finds a message live or summarised, and a scope
sees only its tenant's conversations."""

from __future__ import annotations

from typing import Any

from core.domain.compaction import StoredTokens
from core.ports.storage import (
    Applied,
    CompactionOutbox,
    Erasure,
    IncomingMessage,
    ReadScope,
    Watermark,
)
from tests.contract.test_privacy import erasure
from tests.support.plans import CONV, make_plan, msg, stored

ALL = ReadScope.everything()


async def ingest(store: Any, *items: tuple[int, int, int]) -> None:
    """Messages (index, partition, offset) of CONV, one group."""
    group = [IncomingMessage(msg(i), 10, partition, offset) for i, partition, offset in items]
    await store.ingest.save_messages(group)


async def test_the_snapshot_is_the_history_with_its_stored_tokens(store: Any) -> None:
    await ingest(store, (0, 3, 100), (1, 3, 101))
    snapshot = await store.context.context_snapshot(CONV, scope=ALL)
    assert [(s.message.id, s.tokens) for s in snapshot.history] == [
        (msg(0).id, 10),
        (msg(1).id, 10),
    ]
    assert snapshot.version == await store.context.context_version(CONV, scope=ALL)
    assert snapshot.version.exists and snapshot.version.watermark == Watermark(msg(1).id, 3, 101)


async def test_the_version_moves_with_every_message_and_compaction(store: Any) -> None:
    await ingest(store, (0, 3, 100), (1, 3, 101), (2, 3, 102))
    seen = {(await store.context.context_version(CONV, scope=ALL)).version}
    await ingest(store, (3, 3, 103))
    seen.add((await store.context.context_version(CONV, scope=ALL)).version)
    history = [msg(i) for i in range(4)]
    inputs = await store.history.compaction_inputs("cmp-1", CONV, up_to_seq=None)
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "s", history[:2])], [m.id for m in history[:2]])
    outbox = CompactionOutbox((), StoredTokens.of(plan, inputs.stored_tokens))
    assert await store.compactions.apply_compaction(plan, outbox) == Applied()
    seen.add((await store.context.context_version(CONV, scope=ALL)).version)
    assert len(seen) == 3
    snapshot = await store.context.context_snapshot(CONV, scope=ALL)
    assert snapshot.history[0].message.stored_clip_archive
    assert [s.message.id for s in snapshot.history[1:]] == [msg(2).id, msg(3).id]


async def test_through_finds_a_message_live_or_summarised(store: Any) -> None:
    await ingest(store, (0, 1, 5), (1, 1, 6), (2, 1, 7))
    version = store.context.context_version
    assert (await version(CONV, scope=ALL, through=msg(2).id)).includes
    assert not (await version(CONV, scope=ALL, through="not-yet")).includes
    history = [msg(i) for i in range(3)]
    inputs = await store.history.compaction_inputs("cmp-1", CONV, up_to_seq=None)
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "s", history[:2])], [m.id for m in history[:2]])
    outbox = CompactionOutbox((), StoredTokens.of(plan, inputs.stored_tokens))
    await store.compactions.apply_compaction(plan, outbox)
    assert (await version(CONV, scope=ALL, through=msg(0).id)).includes  # in the summary now


async def test_the_watermark_never_moves_back(store: Any) -> None:
    await ingest(store, (0, 2, 50), (1, 2, 51))
    await ingest(store, (0, 2, 50))  # redelivered after a crash: a duplicate, an older offset
    found = (await store.context.context_version(CONV, scope=ALL)).watermark
    assert found == Watermark(msg(1).id, 2, 51)
    assert found.covers(2, 51) and found.covers(2, 10) and not found.covers(2, 52)
    assert not found.covers(1, 10)
    await ingest(store, (2, 2, 52))  # a duplicate id with a newer offset still moves it
    await ingest(store, (2, 2, 60))
    assert (await store.context.context_version(CONV, scope=ALL)).watermark.offset == 60


async def test_an_erase_takes_the_watermark_with_it(store: Any) -> None:
    await ingest(store, (0, 2, 50))
    request: Erasure = erasure(p2=50)
    await store.privacy.erase_conversation(CONV, request)
    version = await store.context.context_version(CONV, scope=ALL)
    assert not version.exists and version.watermark == Watermark()


async def test_a_scope_sees_only_its_tenants_conversations(store: Any) -> None:
    key = "acme/support-1"
    await store.ingest.save_messages([IncomingMessage(msg(0, conversation_id=key), 10, 0, 1)])
    mine = await store.context.context_version(key, scope=ReadScope.of_tenant("acme"))
    theirs = await store.context.context_snapshot(key, scope=ReadScope.of_tenant("globex"))
    assert mine.exists and mine.watermark.offset == 1
    assert not theirs.version.exists and theirs.history == ()
    assert theirs.version.watermark == Watermark()
