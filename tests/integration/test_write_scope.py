"""Every write transaction stays inside one conversation (docs/scaling.md).

Why: past one PostgreSQL the schema is to be distributed by
``conversation_id`` (Citus). A transaction that writes rows of two
conversations then spans shards, and pays a two-phase commit; one that stays
in one conversation is routed to one node. Reviewing the store's code does
not keep that true as paths are added, so PostgreSQL records it: a trigger on
every table with a ``conversation_id`` column notes which conversations each
transaction touched (``tests/support/write_audit.py``), the worker's own
components run the whole flow in-process (``streams.cli.offline.OfflineRun``:
accounting, processor, outbox relay, reconciliation, erase) over the store,
model and embedder ``streams.bootstrap`` opens from the configuration, and the
test fails naming every transaction that touched two conversations.

The batch ingest (``PostgresIngest.save_messages``) is the one known
exception: by default it writes a whole batch, of many conversations, in one
transaction and one statement, for throughput. With
``[postgres].single_conversation_transactions = true`` it writes one
transaction per conversation, and then no exception is left.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from core.adapters.postgres.store import PostgresStore
from core.domain.gate import Rejected
from core.domain.messages import ConversationMessage
from core.domain.tenancy import conversation_key
from core.ports.storage import IncomingMessage
from core.settings import Settings, parse_settings
from streams.bootstrap import open_runtime
from streams.cli.offline import OfflineRun
from streams.events import EraseRequest, MessageEvent
from streams.worker.outbox import OutboxRelay
from streams.worker.records import Record
from streams.worker.runtime import StaticRuntime
from tests.support import write_audit
from tests.support.llm_server import ANTHROPIC_PATH, LLMTestServer, turn_words
from tests.support.plans import make_plan, stored

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)

# Conversation → tenant: two tenants and a conversation without one.
CONVERSATIONS = {"acme-1": "acme", "acme-2": "acme", "globex-1": "globex", "plain-1": None}
# ... and the keys the store knows them by.
KEYS = {c: conversation_key(t, c) for c, t in CONVERSATIONS.items()}

# What the flow must have written at least once: otherwise a path went
# untested and a passing run would say nothing about it.
EXPECTED_WRITES = {
    ("conversations", "INSERT"),  # the tenant of a conversation's first message
    ("conversations", "UPDATE"),  # its watermark: the newest record ingest stored
    ("conversations", "DELETE"),  # erase
    ("messages", "INSERT"),  # save_messages, the clip-archive
    ("messages", "DELETE"),  # a compaction moves messages out; erase
    ("archival_memory", "INSERT"),  # batches
    ("archival_memory", "UPDATE"),  # superseded by a re-summary, its archive_order
    ("archival_memory", "DELETE"),  # erase
    ("archived_messages", "INSERT"),  # raw turns behind a batch
    ("archived_messages", "UPDATE"),  # their embeddings
    ("archived_messages", "DELETE"),  # expire_raw_turns; erase
    ("compactions", "INSERT"),
    ("compactions", "DELETE"),  # erase
    ("outbox", "INSERT"),
    ("outbox", "UPDATE"),  # mark_published, by the processor and by the relay timer
    ("outbox", "DELETE"),  # erase
}

# The default mode's one allowed exception: the batch ingest's inserts, with the
# watermark of each conversation it stored into (an upsert: INSERT or UPDATE).
BATCH_INGEST_WRITES = {"messages INSERT", "conversations INSERT", "conversations UPDATE"}


def short_summaries(request: Any) -> str:
    """Short, fixed-size summaries, so every compaction brings the history back
    under budget and the flow's number of compactions does not drift."""
    return f"Summary of {len(request.messages)} messages: {turn_words(request)}."


@pytest.fixture
async def llm() -> AsyncIterator[LLMTestServer]:
    async with LLMTestServer(responder=short_summaries) as server:
        yield server


def settings_for(dsn: str, llm: LLMTestServer, single_conversation_transactions: bool) -> Settings:
    """The worker's own configuration: the store, model and embedder are opened
    from it by ``streams.bootstrap`` as ``compactor compact`` and the worker do, so
    ``[postgres].single_conversation_transactions`` goes the same way too."""
    return parse_settings(
        {
            # 200 tokens: a conversation goes over budget every ~5 messages of 40.
            "budget": {"model_max_tokens": 400, "context_budget": 0.5},
            "summarization": {
                "provider": "anthropic",
                "base_url": llm.base_url,
                "model": "claude-test",
                "keep_recent": 2,
                "chunk_size": 2,
                "min_chunk_tokens": 0,
                # Re-summarise once more than 3 batches are live: supersedes batches.
                "clip_first": 1,
                "clip_last": 1,
                "resummarize_buffer": 1,
                "max_retries": 0,
            },
            "embedding": {
                "provider": "openai",
                "base_url": llm.openai_base_url,
                "model": "test-embed",
            },
            "archive": {"raw_retention_days": 1},
            "postgres": {
                "dsn": dsn,
                "pool_max_size": 4,
                "single_conversation_transactions": single_conversation_transactions,
            },
        }
    )


def event(conversation: str, index: int, *, tokens: int = 40) -> MessageEvent:
    return MessageEvent(
        message_id=f"{conversation}-{index:03d}",
        conversation_id=conversation,
        role="assistant" if index % 2 else "user",
        content=f"Turn {index} of {conversation}: the deploy of service {index} failed at step {index * 3}.",
        created_at=T0 + timedelta(minutes=index),
        token_count=tokens,
        tenant_id=CONVERSATIONS[conversation],
    )


def interleaved(first: int, last: int) -> Iterator[MessageEvent]:
    """Messages first..last-1 of every conversation, round robin: a worker sees
    conversations mixed, not one after the other."""
    for index in range(first, last):
        for conversation in CONVERSATIONS:
            yield event(conversation, index)


def batch_message(conversation: str, index: int) -> ConversationMessage:
    return event(conversation, index).to_message()


async def backdate_archived_turns(pool: asyncpg.Pool) -> None:
    """Make every archived raw turn older than the retention, one conversation per
    transaction, and drop these set-up writes from the audit (they are the
    test's, not the store's)."""
    for conversation in KEYS.values():
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "UPDATE archived_messages SET archived_at = now() - interval '3 days' "
                "WHERE conversation_id = $1",
                conversation,
            )
            txid = await conn.fetchval("SELECT txid_current()")
            await conn.execute(f"DELETE FROM {write_audit.AUDIT_TABLE} WHERE txid = $1", txid)


async def drive_every_write_path(
    run: OfflineRun, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's components through every path that writes, with several
    conversations in flight at once."""
    names = run.components.names
    offsets = itertools.count(1_000_000)

    async def control(conversation: str, value: str) -> None:
        record = Record(names.control, 0, next(offsets), conversation.encode(), value.encode())
        await run.components.accounting.handle(record)

    # 1. Messages through accounting (tenants recorded, compactions, re-summaries,
    #    outbox rows published right after each commit, completions).
    await run.replay(interleaved(0, 24))
    # Redeliveries: nothing is written twice.
    await run.replay(interleaved(0, 2))

    # 2. The batch ingest: one call with messages of every conversation, a
    #    conversation it creates, a redelivery, and another tenant's message
    #    for an id acme uses (its own conversation).
    batch = [IncomingMessage(batch_message(c, i), 40) for i in range(24, 30) for c in CONVERSATIONS]
    fresh = batch_message("plain-1", 0).model_copy(
        update={"conversation_id": "new-1", "id": "new-1-000"}
    )
    other_tenant = batch_message("acme-1", 98).model_copy(
        update={"conversation_id": conversation_key("globex", "acme-1")}
    )
    extra = [
        IncomingMessage(fresh, 40),
        IncomingMessage(batch_message("acme-1", 5), 40),
        IncomingMessage(other_tenant, 40),
    ]
    outcomes = await store.ingest.save_messages(batch + extra)
    assert [o.status for o in outcomes] == ["inserted"] * (len(batch) + 1) + [
        "duplicate",
        "inserted",
    ]

    # 2b. The same through the accounting agent's group path (what the Faust
    #     agent calls with whatever its queue holds): one group, every
    #     conversation, stored by one save_messages call.
    group = [
        Record(names.messages, 0, next(offsets), c.encode(), event(c, i).model_dump_json().encode())
        for i in range(90, 93)
        for c in CONVERSATIONS
    ]
    await run.components.accounting.handle_batch(group)
    await run.replay([event("plain-1", 93)])  # runs the commands the group issued

    # 3. A crash between commit and publish: compactions commit their outbox
    #    rows, nobody relays them, then the relay timer publishes the rows of
    #    several conversations in one pass.
    relay = run.components.relay

    async def crashed(*_: object, **__: object) -> None:
        return None

    with monkeypatch.context() as patched:
        patched.setattr(relay, "send", crashed)
        await run.replay(interleaved(30, 40))
    assert await store.outbox.pending_outbox(), "the crash left no unpublished outbox rows"
    # What the relay timer's tick runs, once the rows are older than its grace.
    timer = OutboxRelay(
        StaticRuntime(store, run.compactor), run.publisher, run.components.metrics,
        grace_seconds=0,
    )  # fmt: skip
    assert await timer.drain() > 0
    assert not await store.outbox.pending_outbox()
    await run.replay([event("plain-1", 40)])  # delivers the completions the relay published

    # 4. Reconciliation's store pass: conversations over budget, and raw turns
    #    past [archive].raw_retention_days removed.
    await backdate_archived_turns(store.pool)
    await run.components.reconciler.tick()
    await run.replay([event("plain-1", 41)])  # delivers the reconcile requests

    # 5. Erase one conversation (an EraseRequest on the erase-requests topic).
    erase = EraseRequest(
        request_id="req-1",
        conversation_id="globex-1",
        tenant_id="globex",
        requester="ops",
        reason="write scope",
        requested_at=T0,
    )
    record = Record(names.erasures, 0, next(offsets), b"globex-1", erase.model_dump_json().encode())
    await run.components.accounting.handle(record)

    # 6. A compaction the store's gate refuses (an empty summary): its refusal is
    #    recorded, nothing else written.
    live = [m for m in await store.history.load_history("plain-1") if m.id.startswith("plain-1")]
    refused = make_plan(
        "refused-1",
        [stored("refused-1", 0, "", live[:2], conversation_id="plain-1")],
        [m.id for m in live[:2]],
        conversation_id="plain-1",
    )
    assert isinstance(await store.compactions.apply_compaction(refused), Rejected)


@pytest.mark.parametrize("single", [True, False], ids=["single_conversation", "default"])
async def test_no_write_transaction_touches_two_conversations(
    pg_database: str, llm: LLMTestServer, monkeypatch: pytest.MonkeyPatch, single: bool
) -> None:
    for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "POSTGRES_DSN"):
        monkeypatch.delenv(key, raising=False)
    admin = await asyncpg.connect(pg_database)
    try:
        tables = await write_audit.install(admin)
    finally:
        await admin.close()
    assert not tables.unkeyed, (
        f"tables without a conversation_id column: {tables.unkeyed}; every table holding "
        "conversation data is keyed by conversation_id (docs/scaling.md), or is listed in "
        "tests/support/write_audit.py NOT_CONVERSATION_DATA with the reason it holds none"
    )

    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")  # the LLM test server's
    settings = settings_for(pg_database, llm, single)
    async with open_runtime(settings) as runtime:
        store = runtime.store
        assert runtime.resolved_model.kind == "anthropic"  # over HTTP to the test server
        assert store.embedder is not None  # archived turns get embedded (an UPDATE)
        windows = write_audit.TxidWindows.on(store.pool)
        for call in ("save_free", "save_messages"):  # the agent's group, and its held part
            monkeypatch.setattr(store.ingest, call, windows.wrap(getattr(store.ingest, call)))
        run = OfflineRun(settings, store, runtime.compactor)
        await drive_every_write_path(run, store, monkeypatch)

        assert llm.requests_to(ANTHROPIC_PATH), "no compaction reached the model"
        async with store.pool.acquire() as conn:
            seen = await write_audit.writes_seen(conn)
            wide = await write_audit.wide_transactions(conn)

    missing = sorted(EXPECTED_WRITES - seen)
    assert not missing, f"the flow never wrote {missing}: extend drive_every_write_path"
    unwritten = sorted(
        set(tables.keyed)
        - {table for table, _ in seen}
        - set(write_audit.WRITTEN_BY_MIGRATIONS_ONLY)
    )
    assert not unwritten, (
        f"no path in the flow wrote {unwritten}: extend drive_every_write_path so the "
        "scope of their writes is checked"
    )

    if single:
        assert not wide, (
            "write transactions that touched more than one conversation "
            "(single_conversation_transactions = true):\n" + write_audit.report(wide)
        )
        return
    not_batch_ingest = [
        t for t in wide if t.txid not in windows or not set(t.writes) <= BATCH_INGEST_WRITES
    ]
    assert not not_batch_ingest, (
        "write transactions other than the batch ingest's touched more than one "
        "conversation:\n" + write_audit.report(not_batch_ingest)
    )
    # The documented exception is real (and recognised): the direct call's batch and
    # the accounting agent's group each went in as one transaction.
    batches = [t for t in wide if len(t.conversations) >= len(CONVERSATIONS)]
    assert len(batches) >= 2, write_audit.report(wide)


# -- the audit itself --------------------------------------------------------------


async def test_the_audit_catches_a_transaction_over_two_conversations(pg_database: str) -> None:
    """The check above cannot pass vacuously: a deliberate two-conversation
    transaction is reported, a one-conversation one and a rolled-back one are not,
    and a TRUNCATE (which fires no row trigger) counts as touching them all."""
    conn = await asyncpg.connect(pg_database)
    try:
        tables = await write_audit.install(conn)
        assert "messages" in tables.keyed and "conversations" in tables.keyed

        async def claim(*conversations: str) -> int:
            async with conn.transaction():
                for c in conversations:
                    await conn.execute("INSERT INTO conversations (conversation_id) VALUES ($1)", c)
                return int(await conn.fetchval("SELECT txid_current()"))

        alone = await claim("x")
        across = await claim("y", "z")
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO conversations (conversation_id) VALUES ('p'), ('q')"
                )
                raise RuntimeError("roll back")
        async with conn.transaction():
            await conn.execute("UPDATE conversations SET tenant_id = 't'")  # x, y and z
            update = int(await conn.fetchval("SELECT txid_current()"))
        async with conn.transaction():
            await conn.execute("TRUNCATE outbox")
            truncate = int(await conn.fetchval("SELECT txid_current()"))

        wide = {t.txid: t for t in await write_audit.wide_transactions(conn)}
        assert set(wide) == {across, update, truncate}, write_audit.report(wide.values())
        assert alone not in wide
        assert wide[across].conversations == ("y", "z")
        assert wide[across].writes == ("conversations INSERT",)
        assert wide[update].conversations == ("x", "y", "z")
        assert wide[update].writes == ("conversations UPDATE",)
        assert wide[truncate].conversations == (None,)
        assert "txid" in wide[across].describe() and "'y', 'z'" in wide[across].describe()
    finally:
        await conn.close()


async def test_a_table_without_conversation_id_is_reported(pg_database: str) -> None:
    """A new table holding conversation data without the column would escape the
    audit; discovery names it so the write-scope test fails."""
    conn = await asyncpg.connect(pg_database)
    try:
        assert (await write_audit.discover(conn)).unkeyed == ()
        await conn.execute("CREATE TABLE notes (id text PRIMARY KEY, body text)")
        assert (await write_audit.discover(conn)).unkeyed == ("notes",)
    finally:
        await conn.close()


async def test_txid_windows_bracket_only_the_wrapped_call(pg_database: str) -> None:
    """The default-mode exception is recognised by the txids of save_messages'
    own transactions; a transaction outside the call must not fall in."""
    pool = await asyncpg.create_pool(pg_database, min_size=1, max_size=2)
    assert pool is not None
    try:
        windows = write_audit.TxidWindows.on(pool)

        async def write(conversation: str) -> int:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "INSERT INTO conversations (conversation_id) VALUES ($1)", conversation
                )
                return int(await conn.fetchval("SELECT txid_current()"))

        before = await write("before")
        inside = await windows.wrap(write)("inside")
        after = await write("after")
        assert inside in windows
        assert before not in windows and after not in windows
    finally:
        await pool.close()


_UNIQUE_WITHOUT_CONVERSATION_SQL = """
SELECT t.relname AS table_name, i.relname AS index_name, x.indisprimary AS is_primary
  FROM pg_index AS x
  JOIN pg_class AS i ON i.oid = x.indexrelid
  JOIN pg_class AS t ON t.oid = x.indrelid
  JOIN pg_namespace AS n ON n.oid = t.relnamespace
 WHERE n.nspname = 'public' AND x.indisunique AND t.relname = ANY($1::text[])
   AND NOT EXISTS (SELECT 1 FROM pg_attribute AS a
                    WHERE a.attrelid = t.oid AND a.attname = 'conversation_id'
                      AND a.attnum = ANY(x.indkey))
 ORDER BY 1, 2
"""


async def unkeyed_constraints(conn: asyncpg.Connection) -> list[str]:
    """What keeps the schema from being distributed by conversation_id: a table
    with conversation data but no primary key, a nullable conversation_id, or a
    primary key or unique index without the column (Citus refuses all three)."""
    tables = (await write_audit.discover(conn)).keyed
    problems = [
        f"{r['table_name']}: {'primary key' if r['is_primary'] else 'unique index'} "
        f"{r['index_name']} lacks conversation_id"
        for r in await conn.fetch(_UNIQUE_WITHOUT_CONVERSATION_SQL, list(tables))
    ]
    for table in tables:
        has_key = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = $1::regclass AND indisprimary)",
            table,
        )
        nullable = await conn.fetchval(
            "SELECT is_nullable = 'YES' FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name = $1 AND column_name = 'conversation_id'",
            table,
        )
        problems += [f"{table}: no primary key"] * (not has_key)
        problems += [f"{table}: conversation_id may be NULL"] * bool(nullable)
    return problems


async def test_every_table_is_keyed_by_conversation_id(pg_database: str) -> None:
    conn = await asyncpg.connect(pg_database)
    try:
        assert await unkeyed_constraints(conn) == []
        await conn.execute(
            "CREATE TABLE notes (id text PRIMARY KEY, conversation_id text, body text)"
        )
        assert await unkeyed_constraints(conn) == [
            "notes: primary key notes_pkey lacks conversation_id",
            "notes: conversation_id may be NULL",
        ]
    finally:
        await conn.close()
