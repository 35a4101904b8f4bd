"""Tenants and erasure on a real PostgreSQL: the tenant a conversation key names,
memory_read scoped by tenant, and erase_conversation leaving no row anywhere."""

from __future__ import annotations

from datetime import timedelta

import pytest

from core.adapters.postgres.ingest import PostgresIngest
from core.adapters.postgres.privacy import ERASED_TABLES, KEPT_TABLES
from core.adapters.postgres.store import PostgresStore
from core.domain.compaction import StoredTokens
from core.domain.tenancy import conversation_key
from core.ports.storage import (
    Applied,
    CompactionOutbox,
    Erasure,
    IncomingMessage,
    OutboxRecord,
)
from tests.support.plans import T0, make_plan, msg, stored
from tests.support.stores import counts, saved

pytestmark = pytest.mark.integration


def erasure(request_id: str = "req-1", **offsets: int) -> Erasure:
    """Asked before the test messages were created: only offsets cover them."""
    return Erasure(
        request_id=request_id,
        requester="ops@example",
        reason="subject access request #42",
        requested_at=T0 - timedelta(days=1),
        erased_at=T0 + timedelta(days=1),
        offsets={int(p.removeprefix("p")): o for p, o in offsets.items()},
    )


async def tenant_row(store: PostgresStore, key: str) -> tuple[bool, str | None]:
    """(has a conversations row, its tenant)."""
    row = await store.pool.fetchrow(
        "SELECT tenant_id FROM conversations WHERE conversation_id = $1", key
    )
    return (row is not None, None if row is None else row["tenant_id"])


async def _conversation(store: PostgresStore, bare: str, tenant: str | None, word: str) -> str:
    """A compacted conversation; its key."""
    cid = conversation_key(tenant, bare)
    messages = [msg(i, f"{word} turn {i} about {word}", conversation_id=cid) for i in range(4)]
    for m in messages:
        assert await saved(store, m, 10)
    plan = make_plan(
        f"cmp-{cid}",
        [stored(f"cmp-{cid}", 0, f"Summary of {word}.", messages[:2], end=1)],
        [m.id for m in messages[:2]],
    )
    plan = plan.model_copy(
        update={
            "conversation_id": cid,
            "clip_archive": plan.clip_archive.model_copy(
                update={"conversation_id": cid, "id": f"clip-{cid}"}
            ),
            "new_batches": tuple(
                b.model_copy(update={"conversation_id": cid, "id": f"{cid}-{b.id}"})
                for b in plan.new_batches
            ),
        }
    )

    record = OutboxRecord(topic="clip_archives", key=cid, payload="{}")
    inputs = await store.history.compaction_inputs(plan.compaction_id, cid, up_to_seq=None)
    outbox = CompactionOutbox((record,), StoredTokens.of(plan, inputs.stored_tokens))
    # First a summary the gate refuses (an empty one): its refusal is the
    # conversation's row in compaction_rejections.
    empty = plan.model_copy(
        update={"new_batches": tuple(
            b.model_copy(update={"batch": b.batch.model_copy(update={"content": " "})})
            for b in plan.new_batches
        )}
    )  # fmt: skip
    assert not isinstance(await store.compactions.apply_compaction(empty, outbox), Applied)
    assert await store.compactions.apply_compaction(plan, outbox) == Applied()
    return cid


async def test_memory_read_by_tenant_sees_only_that_tenants_memory(pg_store: PostgresStore) -> None:
    await _conversation(pg_store, "shared-1", "acme", "orchid")
    await _conversation(pg_store, "shared-1", "globex", "orchid")
    for tenant in ("acme", "globex"):
        for sources in ("both", "summaries", "raw"):
            result = await pg_store.memory.memory_read("orchid", tenant_id=tenant, sources=sources)
            assert result.hits
            assert {h.conversation_id for h in result.hits} == {f"{tenant}/shared-1"}
    scoped = await pg_store.memory.memory_read(
        "orchid", conversation_id="globex/shared-1", tenant_id="acme"
    )
    assert scoped.hits == ()


async def test_erase_leaves_no_row_with_the_conversation_id_in_any_table(
    pg_store: PostgresStore,
) -> None:
    await _conversation(pg_store, "doomed", None, "orchid")
    kept = await _conversation(pg_store, "doomed", "acme", "falcon")  # acme's, same id
    pool = pg_store.pool
    tables = [
        r["table_name"]
        for r in await pool.fetch(
            "SELECT table_name FROM information_schema.columns "
            "WHERE column_name = 'conversation_id' AND table_schema = 'public' "
            "ORDER BY table_name"
        )
    ]
    assert sorted(tables) == sorted(ERASED_TABLES + KEPT_TABLES), (
        "a table with conversation_id is neither erased nor known to be kept"
    )
    kept_columns = {
        r["column_name"]
        for r in await pool.fetch(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name = ANY($1::text[])",
            list(KEPT_TABLES),
        )
    }
    assert not kept_columns & {"content", "payload", "tool_calls", "summary"}, kept_columns
    tables = list(ERASED_TABLES)

    async def rows(cid: str) -> dict[str, int]:
        return {
            t: int(await pool.fetchval(f"SELECT count(*) FROM {t} WHERE conversation_id = $1", cid))
            for t in tables
        }

    before = await rows("doomed")
    assert all(before.values()), before  # every table held some of it
    removed = (await pg_store.privacy.erase_conversation("doomed", erasure())).removed
    assert removed == before
    assert set((await rows("doomed")).values()) == {0}
    assert all((await rows(kept)).values())
    # Anywhere else the id could hide: outbox keys and payloads, batch sources.
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE key = 'doomed'") == 0
    again = await pg_store.privacy.erase_conversation("doomed", erasure("req-2"))
    assert again.removed == dict.fromkeys(ERASED_TABLES, 0) and again.epoch == 2
    # A later message starts a new conversation.
    assert await saved(pg_store, msg(0, conversation_id="doomed"), 5)
    assert await tenant_row(pg_store, "doomed") == (True, None)
    assert await counts(pg_store, "doomed") == (5, 1)


async def test_the_erase_mark_holds_in_the_per_conversation_layout_too(
    pg_store: PostgresStore,
) -> None:
    """One transaction per conversation (the distributed layout) reads the mark
    under the lock as the group transaction does (tests/contract/test_ingest.py)."""
    per_conversation = PostgresIngest(pg_store.pool, per_conversation=True)

    async def group(*items: tuple[int, int, int]) -> list[str]:
        """(index, partition, offset) → the outcomes' statuses."""
        batch = [
            IncomingMessage(msg(i, conversation_id="doomed", seconds=i), 10, partition, offset)
            for i, partition, offset in items
        ]
        batch.append(IncomingMessage(msg(99, conversation_id="other"), 10, 1, 1))  # alongside
        return [o.status for o in await per_conversation.save_messages(batch)]

    assert await group((0, 1, 5), (1, 1, 6)) == ["inserted"] * 3
    await pg_store.privacy.erase_conversation("doomed", erasure(p1=6))
    assert await group((0, 1, 5), (11, 1, 9)) == ["erased", "inserted", "duplicate"]
    assert await tenant_row(pg_store, "doomed") == (True, None)
