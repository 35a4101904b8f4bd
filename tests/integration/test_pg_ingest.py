"""``PostgresIngest.save_messages``: a group stored in one transaction, one message as a group of one.

The group path is the worker's hot path, so it must agree with the
one-at-a-time path on everything the contract says: idempotent by id (within
the group too), arrival order, tool calls round-tripped, the tenants recorded, and
a compacted message never coming back.
"""

from __future__ import annotations

import asyncio

import pytest

from core.adapters.postgres.store import PostgresStore
from core.domain.messages import ToolCall
from core.ports.storage import Applied, IncomingMessage
from tests.integration.test_postgres_store import CONV, make_plan, msg, save_all, stored
from tests.support.stores import saved

pytestmark = pytest.mark.integration


def incoming(message: object, tokens: int = 10) -> IncomingMessage:
    return IncomingMessage(message, tokens)  # type: ignore[arg-type]


@pytest.mark.parametrize("per_conversation", [False, True])
async def test_a_group_is_stored_in_order_once_with_tool_calls(
    pg_database: str, per_conversation: bool
) -> None:
    store = await PostgresStore.connect(
        pg_database, max_size=2, single_conversation_transactions=per_conversation
    )
    try:
        call = ToolCall(id="t1", name="search", arguments={"q": "kafka"})
        group = [
            incoming(msg(0, role="assistant", tool_calls=[call])),
            incoming(msg(1, role="tool", tool_call_id="t1")),
            incoming(msg(0, conversation_id="other")),
            incoming(msg(1)),  # the same id again, in the same group
            incoming(msg(2), tokens=7),
        ]
        outcomes = await store.ingest.save_messages(group)
        assert [o.status for o in outcomes] == [
            "inserted",
            "inserted",
            "inserted",
            "duplicate",
            "inserted",
        ]
        mine = [o.seq for o in outcomes if o.seq is not None]
        assert mine == sorted(mine) or per_conversation  # per conversation: grouped order
        history = await store.history.load_history(CONV)
        assert [m.id for m in history] == [msg(i).id for i in range(3)]
        assert history[0].tool_calls == (call,) and history[1].tool_call_id == "t1"
        totals = await store.tallies.totals_of([CONV, "other", "nobody"])
        assert (totals[CONV].tokens, totals[CONV].rows) == (27, 3)
        assert totals[CONV].last_seq == max(o.seq for o in (outcomes[0], outcomes[1], outcomes[4]))
        assert (totals["nobody"].rows, totals["nobody"].last_seq) == (0, None)
        again = await store.ingest.save_messages(group[:2])
        assert [o.status for o in again] == ["duplicate", "duplicate"]
    finally:
        await store.close()


async def test_a_group_records_each_new_conversations_tenant_from_its_key(
    pg_store: PostgresStore,
) -> None:
    outcomes = await pg_store.ingest.save_messages(
        [
            incoming(msg(0, conversation_id="acme/c")),
            incoming(msg(0, conversation_id="globex/c")),  # the same id: another conversation
            incoming(msg(0, conversation_id="c")),
            incoming(msg(1, conversation_id="acme/c")),
        ]
    )
    assert [o.status for o in outcomes] == ["inserted"] * 4
    rows = await pg_store.pool.fetch("SELECT conversation_id, tenant_id FROM conversations")
    assert {r["conversation_id"]: r["tenant_id"] for r in rows} == {
        "acme/c": "acme",
        "globex/c": "globex",
        "c": None,
    }


async def test_a_compacted_message_does_not_come_back_in_a_group(pg_store: PostgresStore) -> None:
    history = [msg(i) for i in range(3)]
    await save_all(pg_store, history)
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "s", history[:2])], [m.id for m in history[:2]])
    assert await pg_store.compactions.apply_compaction(plan) == Applied()
    outcomes = await pg_store.ingest.save_messages(
        [incoming(m) for m in history] + [incoming(msg(3))]
    )
    assert [o.status for o in outcomes] == ["duplicate", "duplicate", "duplicate", "inserted"]
    assert [m.id for m in await pg_store.history.load_history(CONV)] == [
        plan.clip_archive.id,
        history[2].id,
        msg(3).id,
    ]


async def test_concurrent_groups_over_the_same_conversations_do_not_deadlock(
    pg_store: PostgresStore,
) -> None:
    """Each group locks its conversations in one global order."""
    names = [f"conv-{i}" for i in range(20)]
    groups = [
        [incoming(msg(k, conversation_id=name)) for name in (names if k % 2 else names[::-1])]
        for k in range(6)
    ]
    results = await asyncio.wait_for(
        asyncio.gather(*(pg_store.ingest.save_messages(g) for g in groups)), timeout=60
    )
    assert all(o.status == "inserted" for outcomes in results for o in outcomes)
    totals = await pg_store.tallies.totals_of(names)
    assert all(t.rows == 6 for t in totals.values())


def same_id(message_id: str, conversation_id: str, index: int) -> object:
    return msg(index, conversation_id=conversation_id).model_copy(update={"id": message_id})


@pytest.mark.parametrize("grouped", [False, True])
async def test_conversations_may_reuse_a_message_id(pg_store: PostgresStore, grouped: bool) -> None:
    """Producers choose ids: "m1" in two conversations is two messages (it used to be
    one, the second dropped as a duplicate). Within a conversation it stays one."""
    a = [same_id(f"m{i}", "conv-a", i) for i in range(3)]
    b = [same_id(f"m{i}", "conv-b", i) for i in range(3)]
    if grouped:
        outcomes = await pg_store.ingest.save_messages([incoming(m) for m in [*a, *b, a[0]]])
        assert [o.status for o in outcomes] == ["inserted"] * 6 + ["duplicate"]
    else:
        for m in [*a, *b]:
            assert await saved(pg_store, m, 10)  # type: ignore[arg-type]
        assert not await saved(pg_store, a[0], 10)  # type: ignore[arg-type]
    assert [m.id for m in await pg_store.history.load_history("conv-b")] == ["m0", "m1", "m2"]

    plan = make_plan(
        "cmp-a",
        [stored("cmp-a", 0, "s", a[:2], conversation_id="conv-a")],  # type: ignore[arg-type]
        ["m0", "m1"],
        conversation_id="conv-a",
    )
    assert await pg_store.compactions.apply_compaction(plan) == Applied()
    assert [m.id for m in await pg_store.history.load_history("conv-a")] == [
        plan.clip_archive.id,
        "m2",
    ]
    assert [m.id for m in await pg_store.history.load_history("conv-b")] == ["m0", "m1", "m2"]
    # A redelivery of conv-a's compacted m0 stays compacted; conv-b's m0 is untouched.
    again = await pg_store.ingest.save_messages([incoming(a[0]), incoming(b[0])])
    assert [o.status for o in again] == ["duplicate", "duplicate"]
    assert (await pg_store.tallies.totals_of(["conv-b"]))["conv-b"].rows == 3
