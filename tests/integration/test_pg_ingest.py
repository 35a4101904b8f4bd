"""``PostgresIngest.save_messages``: a group stored in one transaction, one message as a group of one.

The group path is the worker's hot path, so it must agree with the
one-at-a-time path on everything the contract says: idempotent by id (within
the group too), arrival order, tool calls round-tripped, the tenants recorded, and
a compacted message never coming back.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from core.adapters.postgres.connection import CONVERSATION_LOCK_CLASS
from core.adapters.postgres.store import PostgresStore
from core.domain.messages import ToolCall
from core.ports.storage import IncomingMessage
from tests.support.plans import CONV, msg

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


async def _advisory_waiters(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        )
    )


async def test_save_free_stores_around_a_conversation_a_compaction_holds(
    pg_store: PostgresStore, pg_database: str
) -> None:
    """A compaction's write holds its conversation's lock for its whole transaction:
    ``save_free`` stores the group's other conversations without waiting for it and
    leaves that one's messages, which ``save_messages`` then stores, waiting."""
    holder = await asyncpg.connect(pg_database)
    try:
        writing = holder.transaction()  # as apply_compaction: the lock, held to the end
        await writing.start()
        await holder.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))", CONVERSATION_LOCK_CLASS, "busy"
        )
        group = [incoming(msg(n // 2, conversation_id=("busy", "free")[n % 2])) for n in range(4)]
        first = await asyncio.wait_for(pg_store.ingest.save_free(group), timeout=30)
        assert first.left == (0, 2)  # the held conversation's, in order
        assert [first.outcomes[n].status for n in (1, 3)] == ["inserted", "inserted"]
        assert [m.id for m in await pg_store.history.load_history("free")] == [
            msg(0, conversation_id="free").id,
            msg(1, conversation_id="free").id,
        ]
        assert await pg_store.history.load_history("busy") == []
        rest = asyncio.create_task(pg_store.ingest.save_messages([group[0], group[2]]))
        deadline = asyncio.get_running_loop().time() + 30
        while await _advisory_waiters(holder) == 0:  # it waits for the compaction
            assert asyncio.get_running_loop().time() < deadline and not rest.done()
            await asyncio.sleep(0.02)
        await writing.rollback()
        assert [o.status for o in await asyncio.wait_for(rest, 30)] == ["inserted"] * 2
        assert len(await pg_store.history.load_history("busy")) == 2
    finally:
        await holder.close()


async def test_ingest_has_its_own_connections_whatever_compactions_hold(pg_database: str) -> None:
    """Every writers' connection taken (a wave of compactions): a group is still stored
    at once, on the accounting agent's own pool."""
    store = await PostgresStore.connect(pg_database, max_size=2, run_migrations=False)
    held = [await store.pool.acquire() for _ in range(2)]  # the writers' pool, all of it
    try:
        group = [incoming(msg(n, conversation_id=f"c{n % 3}")) for n in range(30)]
        saved = await asyncio.wait_for(store.ingest.save_free(group), timeout=30)
        assert saved.left == () and len(saved.outcomes) == 30
        assert await asyncio.wait_for(store.ingest.save_messages(group[:1]), timeout=30)
    finally:
        for connection in held:
            await store.pool.release(connection)
        await store.close()
