"""``HistoryReader.load_history``: the conversation in model order (its clip-archive
first, then by time, then by id), cut by arrival or by time, in keyset pages
that walk it exactly once, also while messages arrive between pages; a read on
a caller's behalf sees only its scope."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from core.domain.messages import ConversationMessage
from core.domain.tokens import estimate_message_tokens
from core.ports.storage import Applied, MessageKey, ReadScope
from tests.support.plans import CONV, T0, clip, make_plan, msg, save_all, stored
from tests.support.stores import saved


async def walk(
    store: Any,
    limit: int,
    *,
    grow: Sequence[ConversationMessage] = (),
    after: MessageKey | None = None,
) -> list[str]:
    """The ids of every page of ``limit``, in order; ``grow``: one message arrives
    after each page."""
    seen: list[str] = []
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


async def test_the_history_orders_by_time_then_id_with_the_clip_archive_first(store: Any) -> None:
    late, tie_b, tie_a, early = msg(3, seconds=30), msg(2, seconds=20), msg(1, seconds=20), msg(0)
    await save_all(store, [late, tie_b, tie_a, early, msg(9, conversation_id="conv-other")])
    assert await store.history.load_history(CONV) == [early, tie_a, tie_b, late]
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "early summary", [early])], [early.id])
    # Dated at the end of the history, the clip-archive still comes first.
    plan = plan.model_copy(update={"clip_archive": clip("cmp-1", seconds=3600)})
    assert await store.compactions.apply_compaction(plan) == Applied()
    assert await store.history.load_history(CONV) == [plan.clip_archive, tie_a, tie_b, late]
    cutoff = T0 + timedelta(seconds=20)
    assert await store.history.load_history(CONV, as_of=cutoff) == [plan.clip_archive, tie_a, tie_b]
    assert await store.history.load_history(CONV, as_of=T0) == [plan.clip_archive]
    assert await store.history.load_history("nobody") == []


async def test_up_to_seq_excludes_later_arrivals_whatever_their_time(store: Any) -> None:
    history = [msg(i) for i in range(4)]
    await save_all(store, history[:3])
    cut = await store.tallies.last_seq(CONV)
    late = history[3].model_copy(update={"created_at": history[0].created_at})
    await saved(store, late, 1)
    assert cut is not None
    cut_history = await store.history.load_history(CONV, up_to_seq=cut)
    assert [m.id for m in cut_history] == [m.id for m in history[:3]]
    assert len(await store.history.load_history(CONV)) == 4


async def test_a_naive_cutoff_is_refused(store: Any) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.history.load_history(CONV, as_of=datetime(2026, 1, 1))


async def test_pages_walk_the_history_exactly_once_in_order(store: Any) -> None:
    # 30 messages, many sharing a created_at (ties broken by id), saved out of order.
    messages = [msg(i, seconds=(i // 3) * 10) for i in range(30)]
    await save_all(store, list(reversed(messages)))
    compressed = messages[:6]
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "six", compressed)], [m.id for m in compressed])
    plan = plan.model_copy(update={"clip_archive": clip("cmp-1", seconds=99_999)})  # dated last
    assert await store.compactions.apply_compaction(plan) == Applied()
    everything = [m.id for m in await store.history.load_history(CONV)]
    assert everything[0] == plan.clip_archive.id and len(everything) == 25
    for limit in (1, 2, 3, 7, 24, 25, 26):
        assert await walk(store, limit) == everything, limit
    first = await store.history.load_history(CONV, limit=1)
    assert [m.id for m in first] == [plan.clip_archive.id] and first[0].stored_clip_archive
    rest = await store.history.load_history(CONV, after=MessageKey.of(first[0]), limit=100)
    assert [m.id for m in rest] == everything[1:]
    # A page respects as_of too.
    cutoff = T0 + timedelta(seconds=20)
    capped = await store.history.load_history(CONV, as_of=cutoff, after=MessageKey.of(first[0]))
    assert [m.id for m in capped] == [m.id for m in messages[6:9]]


async def test_messages_arriving_between_pages_are_seen_once(store: Any) -> None:
    messages = [msg(i, seconds=i) for i in range(10)]
    await save_all(store, messages)
    later = [msg(100 + i, seconds=1000 + i) for i in range(3)]
    assert await walk(store, 4, grow=later) == [m.id for m in messages + later]


async def test_a_read_on_a_callers_behalf_sees_only_its_scope(store: Any) -> None:
    await save_all(store, [msg(0, conversation_id="acme/c"), msg(0, conversation_id="c")])
    history = store.history
    assert len(await history.load_history("acme/c", scope=ReadScope.of_tenant("acme"))) == 1
    assert await history.load_history("acme/c", scope=ReadScope.of_tenant("globex")) == []
    # A conversation without a tenant: for the every-tenant scope only.
    assert await history.load_history("c", scope=ReadScope.of_tenant("acme")) == []
    assert len(await history.load_history("c", scope=ReadScope.everything())) == 1
