"""``ContextReader``: the version changes whenever the history does, the history
comes with it only when the caller does not hold that version and the message
it asked about is in, the watermark is the newest record processed for the
conversation (never moved back, gone with an erase), ``through`` finds a
message live or summarised, and a scope sees only its tenant's conversations."""

from __future__ import annotations

from typing import Any

from core.domain.compaction import StoredTokens
from core.domain.messages import ToolCall
from core.ports.storage import (
    Applied,
    CompactionOutbox,
    ContextSnapshot,
    ContextVersion,
    Erasure,
    IncomingMessage,
    ReadScope,
    Watermark,
)
from tests.contract.test_privacy import erasure
from tests.support.plans import CONV, make_plan, msg, stored

ALL = ReadScope.everything()


async def snapshot_of(store: Any, key: str = CONV, *, scope: ReadScope = ALL) -> ContextSnapshot:
    look = await store.context.context_look(key, scope=scope)
    assert isinstance(look, ContextSnapshot)
    return look


async def version_of(store: Any, key: str = CONV, **kwargs: Any) -> ContextVersion:
    """The version alone: asked with ``known`` set to what it is, so no history."""
    scope = kwargs.pop("scope", ALL)
    first = await store.context.context_look(key, scope=scope, **kwargs)
    found = first.version if isinstance(first, ContextSnapshot) else first
    look = await store.context.context_look(key, scope=scope, known=found.version, **kwargs)
    assert isinstance(look, ContextVersion) and look == found
    return look


async def ingest(store: Any, *items: tuple[int, int, int]) -> None:
    """Messages (index, partition, offset) of CONV, one group."""
    group = [IncomingMessage(msg(i), 10, partition, offset) for i, partition, offset in items]
    await store.ingest.save_messages(group)


async def test_the_snapshot_is_the_history_with_its_stored_tokens(store: Any) -> None:
    await ingest(store, (0, 3, 100), (1, 3, 101))
    snapshot = await snapshot_of(store)
    assert [(s.message.id, s.tokens) for s in snapshot.history] == [
        (msg(0).id, 10),
        (msg(1).id, 10),
    ]
    assert snapshot.version == await version_of(store)
    assert snapshot.version.exists and snapshot.version.watermark == Watermark(msg(1).id, 3, 101)


async def test_the_history_comes_only_when_the_caller_does_not_hold_it(store: Any) -> None:
    await ingest(store, (0, 3, 100))
    known = (await snapshot_of(store)).version.version
    assert isinstance(
        await store.context.context_look(CONV, scope=ALL, known=known), ContextVersion
    )
    await ingest(store, (1, 3, 101))
    moved = await store.context.context_look(CONV, scope=ALL, known=known)
    assert isinstance(moved, ContextSnapshot) and len(moved.history) == 2
    waiting = await store.context.context_look(CONV, scope=ALL, through="not-yet")
    assert isinstance(waiting, ContextVersion) and not waiting.includes and waiting.exists


async def test_tool_calls_and_results_are_read_as_stored(store: Any) -> None:
    call = ToolCall(id="call-1", name="lookup", arguments={"order": "8812", "n": 2})
    asked = msg(0).model_copy(update={"role": "assistant", "tool_calls": (call,)})
    answer = msg(1).model_copy(update={"role": "tool", "tool_call_id": "call-1"})
    await store.ingest.save_messages(
        [IncomingMessage(asked, 10, 0, 1), IncomingMessage(answer, 10, 0, 2)]
    )
    read = [s.message for s in (await snapshot_of(store)).history]
    assert read[0].tool_calls == (call,) and read[1].tool_call_id == "call-1"
    assert [m.role for m in read] == ["assistant", "tool"]


async def test_a_pinned_message_is_read_pinned(store: Any) -> None:
    pinned = msg(0).model_copy(update={"pinned": True})
    await store.ingest.save_messages([IncomingMessage(pinned, 10, 0, 1)])
    await ingest(store, (1, 0, 2))
    assert [s.message.pinned for s in (await snapshot_of(store)).history] == [True, False]


async def test_the_version_moves_with_every_message_and_compaction(store: Any) -> None:
    await ingest(store, (0, 3, 100), (1, 3, 101), (2, 3, 102))
    seen = {(await version_of(store)).version}
    await ingest(store, (3, 3, 103))
    seen.add((await version_of(store)).version)
    history = [msg(i) for i in range(4)]
    inputs = await store.history.compaction_inputs("cmp-1", CONV, up_to_seq=None)
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "s", history[:2])], [m.id for m in history[:2]])
    outbox = CompactionOutbox((), StoredTokens.of(plan, inputs.stored_tokens))
    assert await store.compactions.apply_compaction(plan, outbox) == Applied()
    seen.add((await version_of(store)).version)
    assert len(seen) == 3
    snapshot = await snapshot_of(store)
    assert snapshot.history[0].message.stored_clip_archive
    assert [s.message.id for s in snapshot.history[1:]] == [msg(2).id, msg(3).id]


async def test_through_finds_a_message_live_or_summarised(store: Any) -> None:
    await ingest(store, (0, 1, 5), (1, 1, 6), (2, 1, 7))
    assert (await version_of(store, through=msg(2).id)).includes
    assert not (await version_of(store, through="not-yet")).includes
    history = [msg(i) for i in range(3)]
    inputs = await store.history.compaction_inputs("cmp-1", CONV, up_to_seq=None)
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "s", history[:2])], [m.id for m in history[:2]])
    outbox = CompactionOutbox((), StoredTokens.of(plan, inputs.stored_tokens))
    await store.compactions.apply_compaction(plan, outbox)
    assert (await version_of(store, through=msg(0).id)).includes  # in the summary now


async def test_the_watermark_never_moves_back(store: Any) -> None:
    await ingest(store, (0, 2, 50), (1, 2, 51))
    await ingest(store, (0, 2, 50))  # redelivered after a crash: a duplicate, an older offset
    found = (await version_of(store)).watermark
    assert found == Watermark(msg(1).id, 2, 51)
    assert found.covers(2, 51) and found.covers(2, 10) and not found.covers(2, 52)
    assert not found.covers(1, 10)
    await ingest(store, (2, 2, 52))  # a duplicate id with a newer offset still moves it
    await ingest(store, (2, 2, 60))
    assert (await version_of(store)).watermark.offset == 60


async def test_an_erase_takes_the_watermark_with_it(store: Any) -> None:
    await ingest(store, (0, 2, 50))
    request: Erasure = erasure(p2=50)
    await store.privacy.erase_conversation(CONV, request)
    version = await version_of(store)
    assert not version.exists and version.watermark == Watermark()


async def test_a_scope_sees_only_its_tenants_conversations(store: Any) -> None:
    key = "acme/support-1"
    await store.ingest.save_messages([IncomingMessage(msg(0, conversation_id=key), 10, 0, 1)])
    mine = await version_of(store, key, scope=ReadScope.of_tenant("acme"))
    theirs = await snapshot_of(store, key, scope=ReadScope.of_tenant("globex"))
    assert mine.exists and mine.watermark.offset == 1
    assert not theirs.version.exists and theirs.history == ()
    assert theirs.version.watermark == Watermark()
