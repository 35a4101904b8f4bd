"""Row-level security (migration 0009) on a real PostgreSQL: a read that forgets
its tenant filter still sees only its tenant's rows, no setting sees nothing,
and the worker's writes go on as before, also as a table owner that is not a
superuser (whom FORCE ROW LEVEL SECURITY holds to the policies).

The test database's user is a superuser, which bypasses row-level security:
every scoped read switches to ``compactor_reader`` itself (``reading``), and
these tests check it does.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from core.adapters.postgres import memory_statements
from core.adapters.postgres.connection import (
    ALL_TENANTS,
    READER_ROLE,
    TENANT_SETTING,
    WRITER_ROLE,
    reading,
)
from core.adapters.postgres.store import PostgresStore
from core.domain.compaction import StoredTokens
from core.ports.storage import (
    Applied,
    CompactionOutbox,
    ContextSnapshot,
    IncomingMessage,
    OutboxRecord,
    ReadScope,
    Watermark,
)
from tests.support.plans import make_plan, msg, stored
from tests.support.stores import counts

pytestmark = pytest.mark.integration

ACME = ReadScope.of_tenant("acme")
GLOBEX = ReadScope.of_tenant("globex")
EVERYTHING = ReadScope.everything()

# The tables the views read and the worker writes; others (0007, 0008, …) that
# have a conversation_id column are covered too, and listed by the first test.
CORE_TABLES = {
    "messages",
    "archival_memory",
    "archived_messages",
    "compactions",
    "outbox",
    "conversations",
}


async def conversation_tables(conn: asyncpg.Connection | asyncpg.Pool) -> list[str]:
    """Every base table of the schema with a conversation_id column."""
    rows = await conn.fetch(
        """
        SELECT c.table_name
          FROM information_schema.columns AS c
          JOIN information_schema.tables AS t USING (table_schema, table_name)
         WHERE c.column_name = 'conversation_id' AND c.table_schema = current_schema()
           AND t.table_type = 'BASE TABLE'
         ORDER BY c.table_name
        """
    )
    return [str(r["table_name"]) for r in rows]


async def _conversation(
    store: PostgresStore, cid: str, word: str, batch_id: str = "batch-1"
) -> None:
    """Four messages of conversation key ``cid``, two compacted into one batch
    (``batch_id``: the same id in several conversations is allowed, ids are
    unique per conversation)."""
    messages = [msg(i, f"{word} turn {i} about {word}", conversation_id=cid) for i in range(4)]
    outcomes = await store.ingest.save_messages([IncomingMessage(m, 10) for m in messages])
    assert {o.status for o in outcomes} == {"inserted"}
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
                b.model_copy(update={"conversation_id": cid, "id": batch_id})
                for b in plan.new_batches
            ),
        }
    )

    record = OutboxRecord(topic="clip_archives", key=cid, payload="{}")
    inputs = await store.history.compaction_inputs(plan.compaction_id, cid, up_to_seq=None)
    outbox = CompactionOutbox((record,), StoredTokens.of(plan, inputs.stored_tokens))
    assert await store.compactions.apply_compaction(plan, outbox) == Applied()


async def _two_tenants(store: PostgresStore) -> None:
    await _conversation(store, "acme/shared", "orchid")
    await _conversation(store, "globex/shared", "orchid")  # the same id, another tenant
    await _conversation(store, "loose-1", "orchid")  # no tenant


async def _visible(pool: asyncpg.Pool, scope: ReadScope) -> dict[str, set[str]]:
    """Per table, the conversations a query with no filter at all sees under ``scope``."""
    async with reading(pool, scope) as conn:
        return {
            table: {
                r["conversation_id"]
                for r in await conn.fetch(f"SELECT DISTINCT conversation_id FROM {table}")
            }
            for table in await conversation_tables(pool)
        }


async def test_every_table_with_a_conversation_id_has_the_policies(
    pg_store: PostgresStore,
) -> None:
    pool = pg_store.pool
    tables = await conversation_tables(pool)
    assert set(tables) >= CORE_TABLES
    rows = await pool.fetch(
        """
        SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
               coalesce(array_agg(p.polname || ':' || p.polcmd::text || ':' || r.rolname
                                  ORDER BY p.polname)
                        FILTER (WHERE p.polname IS NOT NULL), '{}') AS policies
          FROM pg_class AS c
          LEFT JOIN pg_policy AS p ON p.polrelid = c.oid
          LEFT JOIN LATERAL unnest(p.polroles) AS pr (oid) ON true
          LEFT JOIN pg_roles AS r ON r.oid = pr.oid
         WHERE c.relname = ANY($1::text[]) AND c.relnamespace = current_schema()::regnamespace
         GROUP BY c.relname, c.relrowsecurity, c.relforcerowsecurity
        """,
        tables,
    )
    found = {r["relname"]: r for r in rows}
    missing = {
        table: dict(found[table])
        for table in tables
        if not found[table]["relrowsecurity"]
        or not found[table]["relforcerowsecurity"]
        or list(found[table]["policies"])
        != [f"tenant_read:r:{READER_ROLE}", f"worker_all:*:{WRITER_ROLE}"]
    }
    assert not missing, (
        "a table with a conversation_id column lacks row-level security; its migration "
        f"must call SELECT compactor_protect('<table>'): {missing}"
    )
    for table in tables:
        privileges = {
            p: await pool.fetchval("SELECT has_table_privilege($1, $2, $3)", READER_ROLE, table, p)
            for p in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE")
        }
        assert privileges == {
            "SELECT": True,
            "INSERT": False,
            "UPDATE": False,
            "DELETE": False,
            "TRUNCATE": False,
        }, table


async def test_a_read_that_forgets_its_tenant_filter_sees_only_its_tenant(
    pg_store: PostgresStore,
) -> None:
    await _two_tenants(pg_store)
    pool = pg_store.pool
    for scope, own in ((ACME, "acme/shared"), (GLOBEX, "globex/shared")):
        seen = await _visible(pool, scope)
        assert {t for t in CORE_TABLES if seen[t] != {own}} == set(), seen
        assert all(ids <= {own} for ids in seen.values()), seen
    everything = await _visible(pool, EVERYTHING)
    assert all(everything[t] == {"acme/shared", "globex/shared", "loose-1"} for t in CORE_TABLES)


async def test_the_views_reads_hold_without_their_filters(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _two_tenants(pg_store)
    # The store's reads, asked by acme for globex's rows: nothing.
    assert await pg_store.history.load_history("globex/shared", scope=ACME) == []
    assert await pg_store.history.load_history("loose-1", scope=ACME) == []
    assert await pg_store.archive.expand_batch("globex/shared", "batch-1", scope=ACME) is None
    assert len(await pg_store.history.load_history("acme/shared", scope=ACME)) == 3  # clip + 2 live
    assert len(await pg_store.history.load_history("globex/shared", scope=EVERYTHING)) == 3
    theirs = await pg_store.context.context_look("globex/shared", scope=ACME)
    assert isinstance(theirs, ContextSnapshot) and theirs.history == ()
    assert not theirs.version.exists and theirs.version.watermark == Watermark()
    expanded = await pg_store.archive.expand_batch("acme/shared", "batch-1", scope=ACME)
    assert expanded is not None and len(expanded.turns) == 2

    # A search with neither conversation_id nor tenant_id: no filter at all in its SQL.
    for sources in ("both", "summaries", "raw"):
        unscoped = await pg_store.memory.memory_read("orchid", sources=sources)
        assert {h.conversation_id for h in unscoped.hits} == {
            "acme/shared",
            "globex/shared",
            "loose-1",
        }
        scoped = await pg_store.memory.memory_read("orchid", sources=sources, scope=ACME)
        assert {h.conversation_id for h in scoped.hits} == {"acme/shared"}, sources

    # Strip the tenant filter out of every search statement and ask as acme for globex's tenant.
    monkeypatch.setattr(
        memory_statements, "tenant_clause", lambda alias, n: f"(${n}::text IS NULL OR true)"
    )
    memory_statements.forget_statements()
    try:
        for kind in ((False, True), (True, True)):
            for builder in memory_statements.STATEMENTS:
                assert "conversations AS t" not in builder(kind), builder.__name__
        stripped = await pg_store.memory.memory_read("orchid", tenant_id="globex", scope=ACME)
        assert {h.conversation_id for h in stripped.hits} == {"acme/shared"}
        assert {t.conversation_id for t in stripped.turns} <= {"acme/shared"}
    finally:
        monkeypatch.undo()
        memory_statements.forget_statements()

    # The batch fill-in query, asked for globex's batch (same id as acme's) under acme.
    by_id = memory_statements.batches_by_id_sql
    async with reading(pool := pg_store.pool, ACME) as conn:
        rows = await conn.fetch(
            by_id((False, False)), ["globex/shared", "acme/shared"], ["batch-1"] * 2
        )
    assert [r["conversation_id"] for r in rows] == ["acme/shared"]
    rows = await pool.fetch(by_id((False, True)), ["globex/shared"], ["batch-1"], "acme")
    assert rows == []  # its own tenant filter holds too, without row-level security


async def test_raw_turns_lead_to_their_own_conversations_batch(pg_store: PostgresStore) -> None:
    """Two conversations with the same batch id: a raw-turn hit of one never fills
    in the other's batch (the fill-in query was by batch id alone)."""
    await _conversation(pg_store, "acme/shared", "orchid")
    await _conversation(pg_store, "acme/c2", "falcon")
    result = await pg_store.memory.memory_read("falcon", sources="raw", tenant_id="acme")
    assert [(h.conversation_id, h.content) for h in result.hits] == [
        ("acme/c2", "Summary of falcon.")
    ]


async def test_no_setting_sees_nothing_and_the_reader_cannot_write(
    pg_store: PostgresStore,
) -> None:
    await _two_tenants(pg_store)
    pool = pg_store.pool
    tables = await conversation_tables(pool)
    async with pool.acquire() as conn:
        for setup in (
            [f"SET LOCAL ROLE {READER_ROLE}"],
            [f"SET LOCAL ROLE {READER_ROLE}", f"SET LOCAL {TENANT_SETTING} = ''"],
            [f"SET LOCAL ROLE {READER_ROLE}", f"SET LOCAL {TENANT_SETTING} = 'nobody'"],
        ):
            async with conn.transaction():
                for statement in setup:
                    await conn.execute(statement)
                counts = {t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in tables}
                assert set(counts.values()) == {0}, (setup, counts)
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            async with reading(pool, EVERYTHING) as scoped:
                await scoped.execute("DELETE FROM messages")
        for statement in ("DELETE FROM messages", "INSERT INTO conversations VALUES ('x', 'acme')"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL ROLE {READER_ROLE}")
                    await conn.execute(statement)
    with pytest.raises(ValueError, match="not a tenant"):
        async with reading(pool, ReadScope.of_tenant(ALL_TENANTS)):
            pass


@pytest.fixture
async def owner_dsn(pg_database: str) -> AsyncIterator[str]:
    """The test database with every table owned by a new login role that is not a
    superuser, member of compactor_writer and compactor_reader (what the migration
    makes of the user who runs it): the production shape, where FORCE ROW LEVEL
    SECURITY holds the owner to the policies."""
    role = f"compactor_owner_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(pg_database)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS")
        await admin.execute(f"GRANT {WRITER_ROLE}, {READER_ROLE} TO {role}")
        await admin.execute(f"GRANT ALL ON SCHEMA public TO {role}")
        for table in await admin.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ):
            await admin.execute(f'ALTER TABLE "{table["tablename"]}" OWNER TO {role}')
        parts = urlsplit(pg_database)
        netloc = f"{role}@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
        yield urlunsplit(parts._replace(netloc=netloc))
    finally:
        await admin.execute(f"REASSIGN OWNED BY {role} TO CURRENT_USER")
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.close()
        cleanup = await asyncpg.connect(pg_database)
        try:
            await cleanup.execute(f"DROP ROLE IF EXISTS {role}")
        finally:
            await cleanup.close()


async def test_the_worker_writes_as_an_owner_that_is_not_a_superuser(owner_dsn: str) -> None:
    store = await PostgresStore.connect(owner_dsn, max_size=2)
    try:
        assert (
            await store.pool.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            is False
        )
        await _two_tenants(store)  # save_messages, apply_compaction, outbox
        assert (await counts(store, "acme/shared"))[1] == 3
        assert len(await store.outbox.pending_outbox()) == 3
        assert (
            len(await store.history.load_history("globex/shared")) == 3
        )  # the worker sees everything
        hits = (await store.memory.memory_read("orchid")).hits
        assert {h.conversation_id for h in hits} == {"acme/shared", "globex/shared", "loose-1"}
        # and its scoped reads are held to their tenant, as for a superuser
        assert await store.history.load_history("globex/shared", scope=ACME) == []
        look = await store.context.context_look("globex/shared", scope=ACME)
        assert not (look.version if isinstance(look, ContextSnapshot) else look).exists
        mine = await store.context.context_look("acme/shared", scope=ACME)
        assert isinstance(mine, ContextSnapshot) and len(mine.history) == 3
        scoped = await store.memory.memory_read("orchid", scope=GLOBEX)
        assert {h.conversation_id for h in scoped.hits} == {"globex/shared"}
        seen = await _visible(store.pool, ACME)
        assert all(ids <= {"acme/shared"} for ids in seen.values()), seen
    finally:
        await store.close()


async def test_a_scoped_read_leaves_its_pooled_connection_as_it_was(pg_database: str) -> None:
    store = await PostgresStore.connect(pg_database, max_size=1)  # one connection, reused
    try:
        await _two_tenants(store)
        assert len(await store.history.load_history("acme/shared", scope=ACME)) == 3
        with pytest.raises(ValueError):
            await store.memory.memory_read("  ", scope=ACME)  # fails inside the transaction
        look = await store.context.context_look("acme/shared", scope=ACME)  # sets them itself
        assert isinstance(look, ContextSnapshot) and len(look.history) == 3
        row = await store.pool.fetchrow(
            "SELECT current_user = session_user AS same_user, current_setting($1, true) AS tenant",
            TENANT_SETTING,
        )
        assert row["same_user"] and row["tenant"] in (None, "")
        assert (
            len(await store.history.load_history("globex/shared")) == 3
        )  # the worker's reads see all
    finally:
        await store.close()


async def test_the_compaction_log_is_read_through_the_scope(pg_store: PostgresStore) -> None:
    """GET /conversations/{id}/compactions reads compaction_log with the caller's scope:
    a tenant sees its own conversation's compactions and batches, never another's."""
    await _two_tenants(pg_store)
    acme = await pg_store.archive.compaction_log("acme/shared", scope=ReadScope.of_tenant("acme"))
    assert [r.compaction_id for r in acme] == ["cmp-acme/shared"]
    (record,) = acme
    assert record.messages_compressed == 2 and record.batches_created == 1
    assert [b.batch_id for b in record.batches] == ["batch-1"]
    assert record.usage is not None and record.usage.summarizer == "extractive"
    assert (
        await pg_store.archive.compaction_log("globex/shared", scope=ReadScope.of_tenant("acme"))
        == []
    )
    assert await pg_store.archive.compaction_log("loose-1", scope=ReadScope.of_tenant("acme")) == []
    everything = ReadScope.everything()
    assert len(await pg_store.archive.compaction_log("loose-1", scope=everything)) == 1
    assert await pg_store.archive.compaction_log("nobody", scope=everything) == []
