"""Tenants and erasure on a real PostgreSQL: the tenant a conversation key names,
memory_read scoped by tenant, and erase_conversation leaving no row anywhere."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
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
    IngestStore,
    OutboxRecord,
)
from tests.integration.test_postgres_store import T0, make_plan, msg, stored
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
    assert await store.compactions.apply_compaction(plan, outbox) == Applied()
    return cid


async def test_the_conversations_row_holds_the_tenant_its_key_names(
    pg_store: PostgresStore,
) -> None:
    assert await saved(pg_store, msg(0, conversation_id="acme/a"), 5)
    assert not await saved(pg_store, msg(0, conversation_id="acme/a"), 5)
    assert await saved(pg_store, msg(0, conversation_id="globex/a"), 5)  # not acme's
    assert await saved(pg_store, msg(0, conversation_id="a"), 5)
    assert await counts(pg_store, "acme/a") == (5, 1)
    assert await tenant_row(pg_store, "acme/a") == (True, "acme")
    assert await tenant_row(pg_store, "globex/a") == (True, "globex")
    assert await tenant_row(pg_store, "a") == (True, None)
    assert await tenant_row(pg_store, "nobody") == (False, None)


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


async def test_the_erase_mark_is_checked_inside_the_ingest_transaction(
    pg_store: PostgresStore,
) -> None:
    async def group(
        *items: tuple[int, int | None, int | None, int], via: IngestStore = pg_store.ingest
    ) -> list[str]:
        """(index, partition, offset, seconds after T0) → the outcomes' statuses."""
        batch = [
            IncomingMessage(msg(i, conversation_id="doomed", seconds=at), 10, partition, offset)
            for i, partition, offset, at in items
        ]
        return [o.status for o in await via.save_messages(batch)]

    assert await group((0, 1, 5, 0), (1, 1, 6, 1)) == ["inserted", "inserted"]
    assert await group((9, 0, 3, 9)) == ["inserted"]  # another conversation's id space
    outcome = await pg_store.privacy.erase_conversation("doomed", erasure(p1=6, p3=100))
    assert outcome.epoch == 1 and outcome.removed["messages"] == 3
    # At or below the mark (redelivered, lagging, a new consumer group): not stored,
    # and no conversations row (tenant claim) either.
    assert await group((0, 1, 5, 0), (1, 1, 6, 1), (2, 3, 100, 2)) == ["erased"] * 3
    assert await counts(pg_store, "doomed") == (0, 0)
    assert await tenant_row(pg_store, "doomed") == (False, None)
    assert (
        await pg_store.pool.fetchval(
            "SELECT count(*) FROM conversations WHERE conversation_id = 'doomed'"
        )
        == 0
    )
    # Created before the erase was asked (a replay, at new offsets): not stored either.
    assert await group((4, 1, 50, -2 * 86_400)) == ["erased"]
    assert not await saved(
        pg_store, msg(5, conversation_id="doomed", seconds=-2 * 86_400), 10, partition=2, offset=1
    )
    assert not await saved(pg_store, msg(6, conversation_id="doomed"), 10, partition=1, offset=6)
    # Above the mark and after the cutoff: a new conversation, with the erase's epoch.
    assert await group((7, 1, 7, 7), (8, 2, 0, 8)) == ["inserted", "inserted"]
    assert await saved(pg_store, msg(10, conversation_id="doomed"), 10, partition=1, offset=8)
    totals = await pg_store.tallies.totals_of(["doomed", "never"])
    assert (totals["doomed"].rows, totals["doomed"].epoch) == (3, 1)
    assert (totals["never"].rows, totals["never"].epoch) == (0, 0)
    # Per conversation transactions (the distributed layout) apply the same rule.
    per_conversation = PostgresIngest(pg_store.pool, per_conversation=True)
    assert await group((0, 1, 5, 0), (11, 1, 9, 11), via=per_conversation) == [
        "erased",
        "inserted",
    ]


async def erase_audit(store: PostgresStore, conversation_id: str) -> list[asyncpg.Record]:
    """The audit rows of a conversation's erases, oldest first (what an operator reads)."""
    return list(
        await store.pool.fetch(
            "SELECT * FROM erase_audit WHERE conversation_id = $1 ORDER BY erased_at, request_id",
            conversation_id,
        )
    )


async def test_the_audit_survives_the_erase_and_a_redelivered_request_is_audited_once(
    pg_store: PostgresStore,
) -> None:
    await _conversation(pg_store, "doomed", None, "orchid")
    first = await pg_store.privacy.erase_conversation("doomed", erasure(p0=9))
    repeated = await pg_store.privacy.erase_conversation("doomed", erasure(p0=4))
    assert repeated.repeated and repeated.removed == first.removed and repeated.epoch == 1
    assert first.removed["messages"] > 0
    (entry,) = await erase_audit(pg_store, "doomed")
    assert (entry["request_id"], entry["requester"], entry["reason"]) == (
        "req-1",
        "ops@example",
        "subject access request #42",
    )
    assert entry["counts"] == first.removed and entry["epoch"] == 1
    later = await pg_store.privacy.erase_conversation("doomed", erasure("req-2", p0=2, p1=7))
    assert later.epoch == 2 and not later.repeated
    assert [e["request_id"] for e in await erase_audit(pg_store, "doomed")] == ["req-1", "req-2"]
    # A later erase never lowers an earlier mark.
    offsets = await pg_store.pool.fetchval(
        "SELECT offsets FROM erasures WHERE conversation_id = 'doomed'"
    )
    assert offsets == {"0": 9, "1": 7}
