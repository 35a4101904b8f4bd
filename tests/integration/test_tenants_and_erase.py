"""Tenants and erasure on a real PostgreSQL: save_message's tenant rule,
memory_read scoped by tenant, and erase_conversation leaving no row anywhere."""

from __future__ import annotations

import pytest

from core.adapters.postgres.privacy import ERASED_TABLES
from core.adapters.postgres.store import PostgresStore
from core.domain.compaction import AppliedStats
from core.ports.storage import OutboxRecord, TenantConflictError
from tests.integration.test_postgres_store import make_plan, msg, stored

pytestmark = pytest.mark.integration


async def _conversation(store: PostgresStore, cid: str, tenant: str | None, word: str) -> None:
    messages = [msg(i, f"{word} turn {i} about {word}", conversation_id=cid) for i in range(4)]
    for m in messages:
        assert await store.save_message(m, 10, tenant_id=tenant)
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

    def outbox(stats: AppliedStats) -> list[OutboxRecord]:
        return [OutboxRecord(topic="clip_archives", key=cid, payload="{}")]

    assert (await store.apply_compaction(plan, outbox)).outcome == "applied"


async def test_a_conversation_never_changes_tenant(pg_store: PostgresStore) -> None:
    assert await pg_store.save_message(msg(0, conversation_id="a"), 5, tenant_id="acme")
    assert not await pg_store.save_message(msg(0, conversation_id="a"), 5, tenant_id="acme")
    for other in ("globex", None):
        with pytest.raises(TenantConflictError):
            await pg_store.save_message(msg(1, conversation_id="a"), 5, tenant_id=other)
    assert await pg_store.save_message(msg(0, conversation_id="b"), 5)
    with pytest.raises(TenantConflictError):
        await pg_store.save_message(msg(1, conversation_id="b"), 5, tenant_id="acme")
    assert await pg_store.conversation_totals("a") == (5, 1)  # nothing written by refusals
    assert await pg_store.conversation_tenant("a") == "acme"
    assert await pg_store.conversation_tenant("b") is None
    assert await pg_store.conversation_tenant("nobody") is None


async def test_memory_read_by_tenant_sees_only_that_tenants_memory(pg_store: PostgresStore) -> None:
    await _conversation(pg_store, "acme-1", "acme", "orchid")
    await _conversation(pg_store, "globex-1", "globex", "orchid")
    for tenant in ("acme", "globex"):
        for sources in ("both", "summaries", "raw"):
            result = await pg_store.memory_read("orchid", tenant_id=tenant, sources=sources)
            assert result.hits
            assert {h.conversation_id for h in result.hits} == {f"{tenant}-1"}
    scoped = await pg_store.memory_read("orchid", conversation_id="globex-1", tenant_id="acme")
    assert scoped.hits == ()


async def test_erase_leaves_no_row_with_the_conversation_id_in_any_table(
    pg_store: PostgresStore,
) -> None:
    await _conversation(pg_store, "doomed", "acme", "orchid")
    await _conversation(pg_store, "kept", "acme", "falcon")
    pool = pg_store.pool
    tables = [
        r["table_name"]
        for r in await pool.fetch(
            "SELECT table_name FROM information_schema.columns "
            "WHERE column_name = 'conversation_id' AND table_schema = 'public' "
            "ORDER BY table_name"
        )
    ]
    assert sorted(tables) == sorted(ERASED_TABLES), "a table with conversation_id is not erased"

    async def rows(cid: str) -> dict[str, int]:
        return {
            t: int(await pool.fetchval(f"SELECT count(*) FROM {t} WHERE conversation_id = $1", cid))
            for t in tables
        }

    before = await rows("doomed")
    assert all(before.values()), before  # every table held some of it
    removed = await pg_store.erase_conversation("doomed")
    assert removed == before
    assert set((await rows("doomed")).values()) == {0}
    assert all((await rows("kept")).values())
    # Anywhere else the id could hide: outbox keys and payloads, batch sources.
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE key = 'doomed'") == 0
    assert await pg_store.erase_conversation("doomed") == dict.fromkeys(ERASED_TABLES, 0)
    # A later message starts a new conversation, of any tenant.
    assert await pg_store.save_message(msg(0, conversation_id="doomed"), 5, tenant_id="globex")
    assert await pg_store.conversation_tenant("doomed") == "globex"
    assert await pg_store.conversation_totals("doomed") == (5, 1)
