"""``IngestStore.save_messages``: each message once by (conversation, message id),
in the group's order; a duplicate, a message a compaction archived, a message an
erase covers: nothing written. ``save_free``, when no compaction holds a
conversation of the group, the same."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from core.domain.messages import ConversationMessage, ToolCall
from core.ports.storage import Applied, Erasure, IncomingMessage, ReadScope
from tests.contract.backends import Backend
from tests.support.plans import CONV, T0, make_plan, msg, save_all, stored
from tests.support.stores import saved, totals


def incoming(message: ConversationMessage, tokens: int = 10, **where: int) -> IncomingMessage:
    return IncomingMessage(message, tokens, where.get("partition"), where.get("offset"))


async def statuses(store: Any, *group: IncomingMessage, method: str = "save_messages") -> list[str]:
    if method == "save_free":
        free = await store.ingest.save_free(list(group))
        assert free.left == ()  # nothing held: everything stored
        return [free.outcomes[n].status for n in range(len(group))]
    return [outcome.status for outcome in await store.ingest.save_messages(list(group))]


async def test_save_free_stores_a_group_no_one_holds_as_save_messages_does(store: Any) -> None:
    group = [incoming(msg(0)), incoming(msg(0, conversation_id="other")), incoming(msg(1))]
    group.append(incoming(msg(1)))  # the same id again, in the same group
    assert await statuses(store, *group, method="save_free") == ["inserted"] * 3 + ["duplicate"]
    assert [m.id for m in await store.history.load_history(CONV)] == [msg(0).id, msg(1).id]
    assert await statuses(store, *group, method="save_free") == ["duplicate"] * 4


async def test_a_message_is_stored_once_and_round_trips(store: Any) -> None:
    call = ToolCall(id="call-1", name="search", arguments={"q": "kafka", "n": [1, 2]})
    assistant = msg(1, "let me look", role="assistant", tool_calls=[call])
    tool = msg(2, '{"hits": 3}', role="tool", tool_call_id="call-1")
    assert await saved(store, assistant, 7) is True
    assert await saved(store, assistant, 7) is False
    assert await saved(store, tool, 3) is True
    assert await store.history.load_history(CONV) == [assistant, tool]
    assert (await totals(store, CONV)).tokens == 10


async def test_empty_tool_calls_survive_the_round_trip(store: Any) -> None:
    message = ConversationMessage(
        id="x", conversation_id=CONV, role="assistant", content="", tool_calls=(), created_at=T0
    )
    await saved(store, message, 0)
    assert (await store.history.load_history(CONV))[0].tool_calls == ()


async def test_a_group_is_stored_in_its_order_each_id_once(store: Any) -> None:
    group = [
        incoming(msg(0)),
        incoming(msg(1)),
        incoming(msg(0, conversation_id="other")),
        incoming(msg(1)),  # the same id again, in the same group
        incoming(msg(2), tokens=7),
    ]
    outcomes = await store.ingest.save_messages(group)
    assert [o.status for o in outcomes] == ["inserted"] * 3 + ["duplicate", "inserted"]
    seqs = [o.seq for o in outcomes if o.status == "inserted"]
    assert None not in seqs and seqs == sorted(seqs)  # arrival numbers, in the group's order
    assert [m.id for m in await store.history.load_history(CONV)] == [msg(i).id for i in range(3)]
    assert (await totals(store, CONV)).tokens == 27
    assert await statuses(store, *group[:2]) == ["duplicate", "duplicate"]


async def test_conversations_may_reuse_a_message_id(store: Any) -> None:
    """Producers choose ids: "m1" in two conversations is two messages (it used to be
    one, the second dropped as a duplicate). Within a conversation it stays one, and
    compacting one conversation's "m0" leaves the other's alone."""
    a = [msg(i, conversation_id="conv-a").model_copy(update={"id": f"m{i}"}) for i in range(3)]
    b = [msg(i, conversation_id="conv-b").model_copy(update={"id": f"m{i}"}) for i in range(3)]
    assert await statuses(store, *map(incoming, [*a, *b, a[0]])) == ["inserted"] * 6 + ["duplicate"]
    assert [m.id for m in await store.history.load_history("conv-b")] == ["m0", "m1", "m2"]
    batch = stored("cmp-a", 0, "s", a[:2], conversation_id="conv-a")
    plan = make_plan("cmp-a", [batch], ["m0", "m1"], conversation_id="conv-a")
    assert await store.compactions.apply_compaction(plan) == Applied()
    conv_a = [m.id for m in await store.history.load_history("conv-a")]
    assert conv_a == [plan.clip_archive.id, "m2"]
    assert [m.id for m in await store.history.load_history("conv-b")] == ["m0", "m1", "m2"]
    # A redelivery of conv-a's compacted m0 stays compacted; conv-b's m0 is untouched.
    assert await statuses(store, incoming(a[0]), incoming(b[0])) == ["duplicate"] * 2
    assert (await totals(store, "conv-b")).rows == 3


async def test_a_compacted_message_does_not_come_back_when_redelivered(store: Any) -> None:
    history = [msg(i) for i in range(3)]
    await save_all(store, history)
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "s", history[:2])], [m.id for m in history[:2]])
    assert await store.compactions.apply_compaction(plan) == Applied()
    assert not await saved(store, history[0], 10)  # alone
    group = [*map(incoming, history), incoming(msg(3))]
    assert await statuses(store, *group) == ["duplicate"] * 3 + ["inserted"]
    assert [m.id for m in await store.history.load_history(CONV)] == [
        plan.clip_archive.id,
        history[2].id,
        msg(3).id,
    ]
    other = msg(0, conversation_id="other-conv").model_copy(update={"id": history[0].id})
    assert await saved(store, other, 1)  # the same id in another conversation


async def test_each_new_conversation_records_the_tenant_its_key_names(
    store: Any, backend: Backend
) -> None:
    keys = ("acme/c", "globex/c", "c")
    assert (
        await statuses(store, *(incoming(msg(0, conversation_id=k)) for k in keys))
        == ["inserted"] * 3
    )
    assert [await backend.tenant(k) for k in keys] == [
        (True, "acme"),
        (True, "globex"),
        (True, None),
    ]
    assert await backend.tenant("nobody") == (False, None)


async def test_what_an_erase_covers_is_erased_and_writes_nothing(
    store: Any, backend: Backend
) -> None:
    def doomed(i: int, at: int, partition: int | None, offset: int | None) -> IncomingMessage:
        message = msg(i, conversation_id="doomed", seconds=at)
        return IncomingMessage(message, 10, partition, offset)

    assert await statuses(store, doomed(0, 0, 1, 5), doomed(1, 1, 1, 6)) == ["inserted"] * 2
    erasure = Erasure(
        request_id="req-1",
        requester="ops@example",
        reason="asked",
        requested_at=T0 - timedelta(days=1),  # before every message: offsets decide
        erased_at=T0 + timedelta(days=1),
        offsets={1: 6, 2: 0},
    )
    await store.privacy.erase_conversation("doomed", erasure)
    # At or below the mark (redelivered, lagging, a new consumer group): not stored,
    # not even the conversation's tenant row.
    covered = await statuses(store, doomed(0, 0, 1, 5), doomed(1, 1, 1, 6), doomed(2, 2, 2, 0))
    assert covered == ["erased"] * 3
    assert await backend.tenant("doomed") == (False, None)
    # Created at or before the erase's cutoff (a replay at new offsets): erased too.
    assert await statuses(store, doomed(4, -2 * 86_400, 1, 50)) == ["erased"]
    # Above the mark and after the cutoff: a new conversation, with the erase's epoch.
    assert await statuses(store, doomed(7, 7, 1, 7), doomed(8, 8, 2, 1)) == ["inserted"] * 2
    after = await totals(store, "doomed")
    assert (after.rows, after.epoch) == (2, 1)


async def test_a_negative_token_count_is_refused(store: Any) -> None:
    with pytest.raises(ValueError, match=">= 0"):
        await store.ingest.save_messages([incoming(msg(0), tokens=-1)])
    assert await store.history.load_history(CONV) == []


@pytest.mark.parametrize("method", ["save_messages", "save_free"])
async def test_a_group_stores_its_other_conversations_past_an_erased_one(
    store: Any, backend: Backend, method: str
) -> None:
    """The group touching an erased conversation takes the careful path: each of its
    messages judged against the marks, the other conversations stored as usual."""

    def at(conversation_id: str, i: int, offset: int) -> IncomingMessage:
        return IncomingMessage(msg(i, conversation_id=conversation_id, seconds=i), 10, 1, offset)

    assert await statuses(store, at("doomed", 0, 5)) == ["inserted"]
    erasure = Erasure(
        request_id="req-2",
        requester="ops@example",
        reason="asked",
        requested_at=T0 - timedelta(days=1),
        erased_at=T0 + timedelta(days=1),
        offsets={1: 6},
    )
    await store.privacy.erase_conversation("doomed", erasure)
    group = (at("doomed", 0, 5), at("fresh", 1, 6), at("doomed", 2, 7), at("fresh", 3, 8))
    outcomes = await statuses(store, *group, method=method)
    assert outcomes == ["erased", "inserted", "inserted", "inserted"]
    assert (await totals(store, "fresh")).rows == 2
    assert ((await totals(store, "doomed")).rows, (await totals(store, "doomed")).epoch) == (1, 1)
    assert await backend.tenant("fresh") == (True, None)
    scope = ReadScope.everything()
    watermark = (await store.context.context_look("fresh", scope=scope)).version.watermark
    assert (watermark.message_id, watermark.offset) == (msg(3, conversation_id="fresh").id, 8)
