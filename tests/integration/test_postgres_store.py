"""PostgresStore and migrations against a real PostgreSQL (no mocks).

Each test gets its own freshly cloned, migrated database (see tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections.abc import Sequence

import asyncpg
import pytest

from core.adapters.postgres.migrate import applied_versions, load_migrations, migrate
from core.adapters.postgres.store import PostgresStore
from core.compaction.embedding import with_embeddings
from core.domain.compaction import CompactionPlan, StoredBatch, StoredTokens
from core.domain.messages import ConversationMessage
from core.domain.ranking import RRF_K
from core.domain.tokens import estimate_message_tokens
from core.ports.embedding import EmbeddingError
from core.ports.storage import (
    AlreadyApplied,
    Applied,
    CompactionOutbox,
    OutboxRecord,
)
from tests.support.plans import CONV, T0, make_plan, msg, save_all, stored

pytestmark = pytest.mark.integration


# -- builders ------------------------------------------------------------------


async def archive(
    store: PostgresStore,
    compaction_id: str,
    contents: Sequence[str],
    *,
    conversation_id: str = CONV,
) -> list[StoredBatch]:
    """Apply a compaction that only archives ``contents`` (one batch each), embedded
    with the store's embedder as the compactor embeds what it archives."""
    batches = [
        stored(compaction_id, i, text, conversation_id=conversation_id)
        for i, text in enumerate(contents)
    ]
    plan = CompactionPlan(
        compaction_id=compaction_id,
        conversation_id=conversation_id,
        new_batches=tuple(batches),
        deleted_message_ids=(),
        clip_archive=ConversationMessage(
            id=f"clip-archive-{compaction_id}",
            conversation_id=conversation_id,
            role="system",
            content="summary",
            created_at=T0,
        ),
        messages_compressed=0,
        tokens_estimate_before=0,
        tokens_estimate_after=0,
    )
    # Archive-only plans still insert a clip-archive; drop the previous one so
    # several calls can run in one conversation.
    previous = await store.pool.fetchval(
        "SELECT id FROM messages WHERE conversation_id = $1 AND kind = 'clip_archive'",
        conversation_id,
    )
    if previous is not None:
        plan = plan.model_copy(update={"deleted_message_ids": (previous,)})
    plan = await with_embeddings(store.embedder, plan, ())
    assert await store.compactions.apply_compaction(plan) == Applied()
    return batches


async def counts(store: PostgresStore) -> dict[str, int]:
    return {
        table: int(await store.pool.fetchval(f"SELECT count(*) FROM {table}"))
        for table in ("messages", "archival_memory", "compactions")
    }


# -- embedders -------------------------------------------------------------------

# A toy "semantic" space: words with the same concept land on the same axis,
# so "truck" is close to "car" without sharing a single character.
_CONCEPTS = {
    "car": "vehicle",
    "automobile": "vehicle",
    "truck": "vehicle",
    "vehicle": "vehicle",
    "repair": "fix",
    "fixed": "fix",
    "mechanic": "fix",
    "garage": "fix",
    "invoice": "billing",
    "payment": "billing",
    "billing": "billing",
    "refund": "billing",
}


class ConceptEmbedder:
    """Hashed bag of concepts: deterministic, dependency-free, cosine-meaningful."""

    def __init__(self, model: str = "test-concepts-v1", dims: int = 256) -> None:
        self.model = model
        self.dims = dims
        self.calls = 0

    async def embed(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        return [self._vector(text) for text in texts]

    def _vector(self, text: str) -> list[float]:
        vector = [0.0] * self.dims
        for word in re.findall(r"[a-z]+", text.lower()):
            concept = _CONCEPTS.get(word, word)
            slot = int.from_bytes(hashlib.sha256(concept.encode()).digest()[:4], "big") % self.dims
            vector[slot] += 1.0
        norm = math.sqrt(sum(x * x for x in vector))
        return [x / norm for x in vector] if norm else vector


class FailingEmbedder:
    model = "test-down-v1"

    async def embed(self, texts: list[str]) -> list[list[float]]:
        raise EmbeddingError("embedding service unavailable")


# -- migrations ------------------------------------------------------------------


def test_migrations_are_packaged_in_order() -> None:
    migrations = load_migrations()
    assert migrations[0].version == "0001"
    assert [m.version for m in migrations] == sorted(m.version for m in migrations)
    assert "CREATE EXTENSION IF NOT EXISTS vector" in migrations[0].sql


async def test_migrations_apply_once_and_rerun_applies_nothing(pg_empty_database: str) -> None:
    every = [m.version for m in load_migrations()]
    assert await migrate(pg_empty_database) == every
    assert await migrate(pg_empty_database) == []

    conn = await asyncpg.connect(pg_empty_database)
    try:
        assert await applied_versions(conn) == every
        tables = {
            row["tablename"]
            for row in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            )
        }
        assert {"messages", "archival_memory", "compactions", "schema_migrations"} <= tables
        assert (
            await conn.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'vector'") == 1
        )
    finally:
        await conn.close()


async def test_concurrent_migrate_applies_each_version_exactly_once(
    pg_empty_database: str,
) -> None:
    every = [m.version for m in load_migrations()]
    results = await asyncio.gather(*(migrate(pg_empty_database) for _ in range(3)))
    assert sorted(v for result in results for v in result) == every
    assert sorted(results, key=len)[:-1] == [[], []]

    conn = await asyncpg.connect(pg_empty_database)
    try:
        rows = await conn.fetch("SELECT version, count(*) FROM schema_migrations GROUP BY version")
        assert {row["version"]: row["count"] for row in rows} == dict.fromkeys(every, 1)
    finally:
        await conn.close()


async def test_migrate_accepts_a_pool(pg_database: str) -> None:
    pool = await asyncpg.create_pool(pg_database, min_size=1, max_size=1)
    try:
        assert await migrate(pool) == []
    finally:
        await pool.close()


# -- messages --------------------------------------------------------------------


# -- apply_compaction --------------------------------------------------------------


async def test_a_compaction_records_its_clip_archive_row_and_its_ledger_row(
    pg_store: PostgresStore,
) -> None:
    """The rows behind the contract (tests/contract/test_compactions.py): the
    clip-archive is a ``kind = 'clip_archive'`` row naming its compaction, and the
    ``compactions`` row records what it did."""
    history = [msg(i, f"turn {i}") for i in range(6)]
    await save_all(pg_store, history)
    batches = [
        stored("cmp-1", 0, "first summary", history[:2], start=0, end=1),
        stored("cmp-1", 1, "second summary", history[2:4], start=2, end=3),
    ]
    plan = make_plan("cmp-1", batches, [m.id for m in history[:4]])
    assert await pg_store.compactions.apply_compaction(plan) == Applied()
    row = await pg_store.pool.fetchrow(
        "SELECT kind, compaction_id, token_estimate FROM messages WHERE id = $1",
        plan.clip_archive.id,
    )
    assert dict(row) == {
        "kind": "clip_archive",
        "compaction_id": "cmp-1",
        "token_estimate": estimate_message_tokens(plan.clip_archive),
    }
    ledger = await pg_store.pool.fetchrow("SELECT * FROM compactions WHERE compaction_id = 'cmp-1'")
    assert ledger["status"] == "committed"
    assert ledger["batches_created"] == 2
    assert ledger["messages_compressed"] == 4
    assert (ledger["tokens_before"], ledger["tokens_after"]) == (1000, 100)


async def test_concurrent_applies_of_one_plan_apply_it_once(pg_store: PostgresStore) -> None:
    history = [msg(i) for i in range(4)]
    await save_all(pg_store, history)
    plan = make_plan(
        "cmp-1", [stored("cmp-1", 0, "summary", history[:3])], [m.id for m in history[:3]]
    )

    outcomes = await asyncio.gather(
        *(pg_store.compactions.apply_compaction(plan) for _ in range(3))
    )

    assert sorted(type(o).__name__ for o in outcomes) == [
        "AlreadyApplied",
        "AlreadyApplied",
        "Applied",
    ]
    assert await counts(pg_store) == {"messages": 2, "archival_memory": 1, "compactions": 1}


async def test_resummarisation_supersedes_and_takes_the_earliest_slot(
    pg_store: PostgresStore,
) -> None:
    history = [msg(i) for i in range(12)]
    await save_all(pg_store, history)
    b0 = stored("cmp-1", 0, "alpha summary", history[0:2], start=0, end=1)
    b1 = stored("cmp-1", 1, "beta summary", history[2:4], start=2, end=3)
    b2 = stored("cmp-1", 2, "gamma summary", history[4:6], start=4, end=5)
    first = make_plan("cmp-1", [b0, b1, b2], [m.id for m in history[:6]])
    assert await pg_store.compactions.apply_compaction(first) == Applied()

    # As the compactor plans it: fresh batches first (one of them folded in
    # straight away), the merged batch last, although it covers the oldest time.
    merged_id = "cmp-2:resummarized"
    f0 = stored("cmp-2", 0, "delta summary", history[6:8], start=6, end=7, superseded_by=merged_id)
    f1 = stored("cmp-2", 1, "epsilon summary", history[8:10], start=8, end=9)
    merged = stored(
        "cmp-2",
        "resummarized",
        "alpha beta delta merged",
        history[0:4] + history[6:8],
        depth=1,
        start=0,
        end=7,
    )
    second = make_plan(
        "cmp-2",
        [f0, f1, merged],
        [*(m.id for m in history[6:10]), first.clip_archive.id],
        superseded=[(b0.id, merged_id), (b1.id, merged_id)],
    )
    assert await pg_store.compactions.apply_compaction(second) == Applied()

    live = await pg_store.archive.live_batches(CONV)
    assert [b.id for b in live] == [merged_id, b2.id, f1.id]
    assert live[0] == merged
    superseded = await pg_store.pool.fetch(
        "SELECT id, superseded_by FROM archival_memory WHERE superseded_by IS NOT NULL ORDER BY id"
    )
    assert [(r["id"], r["superseded_by"]) for r in superseded] == [
        (b0.id, merged_id),
        (b1.id, merged_id),
        (f0.id, merged_id),
    ]

    # Superseded batches leave the clip-archive but stay searchable.
    result = await pg_store.memory.memory_read("beta", conversation_id=CONV)
    beta = {hit.batch_id: hit for hit in result.hits}[b1.id]
    assert beta.superseded is True

    # The next compaction appends after the merged batch and the survivors.
    third = make_plan(
        "cmp-3",
        [stored("cmp-3", 0, "zeta summary", history[10:12], start=10, end=11)],
        [history[10].id, history[11].id, second.clip_archive.id],
    )
    assert await pg_store.compactions.apply_compaction(third) == Applied()
    assert [b.id for b in await pg_store.archive.live_batches(CONV)] == [
        merged_id,
        b2.id,
        f1.id,
        "cmp-3:0",
    ]


# -- memory_read: full text ------------------------------------------------------------


async def test_ac4_3_archived_batches_are_retrievable_via_memory_read_search(
    pg_store: PostgresStore,
) -> None:
    """context-compaction.AC4.3: archived batches are retrievable via memory_read."""
    await archive(
        pg_store,
        "cmp-1",
        [
            "We migrated the billing service from MySQL to PostgreSQL and kept the schema.",
            "The user prefers dark mode and short answers.",
            "PostgreSQL replication lag alerts: PostgreSQL streaming replication was tuned "
            "and the replication lag alert threshold raised to 30 seconds.",
        ],
    )

    result = await pg_store.memory.memory_read("postgresql replication lag")

    assert result.mode == "full_text"
    assert [hit.batch_id for hit in result.hits][:1] == ["cmp-1:2"]
    top = result.hits[0]
    assert top.text_rank == 1
    assert top.vector_rank is None
    assert top.superseded is False
    assert top.label == "compaction-batch-conv-a-2"
    assert top.score == pytest.approx(1 / (RRF_K + 1))
    # The partial match (PostgreSQL only) comes after the one matching every term.
    assert [hit.batch_id for hit in result.hits] == ["cmp-1:2", "cmp-1:0"]
    assert [hit.text_rank for hit in result.hits] == [1, 2]
    assert result.hits[0].score > result.hits[1].score


async def test_memory_read_ranks_the_denser_match_first(pg_store: PostgresStore) -> None:
    await archive(
        pg_store,
        "cmp-1",
        [
            "Kafka was mentioned once in passing among many unrelated topics about lunch, "
            "weather, holidays, travel plans, and the office plants.",
            "Kafka consumer group rebalancing: the Kafka consumer kept rebalancing.",
        ],
    )
    result = await pg_store.memory.memory_read("kafka consumer")
    assert [hit.batch_id for hit in result.hits] == ["cmp-1:1", "cmp-1:0"]

    # Stemming: "rebalanced" finds "rebalancing".
    stemmed = await pg_store.memory.memory_read("rebalanced")
    assert [hit.batch_id for hit in stemmed.hits] == ["cmp-1:1"]


async def test_memory_read_filters_by_conversation(pg_store: PostgresStore) -> None:
    await archive(pg_store, "cmp-a", ["Deploy the gateway on Friday."], conversation_id="conv-a")
    await archive(pg_store, "cmp-b", ["Gateway deploy postponed."], conversation_id="conv-b")

    everywhere = await pg_store.memory.memory_read("gateway deploy")
    assert {hit.conversation_id for hit in everywhere.hits} == {"conv-a", "conv-b"}

    only_b = await pg_store.memory.memory_read("gateway deploy", conversation_id="conv-b")
    assert [hit.batch_id for hit in only_b.hits] == ["cmp-b:0"]
    assert (await pg_store.memory.memory_read("gateway", conversation_id="nobody")).hits == ()


async def test_memory_read_honours_limit_and_search_syntax(pg_store: PostgresStore) -> None:
    await archive(
        pg_store,
        "cmp-1",
        [f"incident {i}: the cache was flushed" for i in range(5)] + ["cache warmed, not flushed"],
    )
    assert len((await pg_store.memory.memory_read("cache", limit=2)).hits) == 2
    assert len((await pg_store.memory.memory_read("cache", limit=100)).hits) == 6
    # websearch syntax is honoured when asked for: quoted phrase and exclusion.
    phrase = await pg_store.memory.memory_read('"cache warmed"', mode="websearch")
    assert [hit.batch_id for hit in phrase.hits] == ["cmp-1:5"]
    excluded = await pg_store.memory.memory_read("cache -warmed", mode="websearch")
    assert "cmp-1:5" not in {hit.batch_id for hit in excluded.hits}
    assert len(excluded.hits) == 5


async def test_memory_read_with_only_stop_words_finds_nothing_without_error(
    pg_store: PostgresStore,
) -> None:
    await archive(pg_store, "cmp-1", ["The answer is in the logs."])
    odd = ("the", "and or not", "-", '"', "!!! ???", "a:b & c | d", "C:\\tmp\\x y", "O'Reilly's")
    for query in odd:
        result = await pg_store.memory.memory_read(query)
        assert result.mode == "full_text"
    assert (await pg_store.memory.memory_read("the of and")).hits == ()
    assert (await pg_store.memory.memory_read("nothing matches this")).hits == ()


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
async def test_memory_read_rejects_an_empty_query(pg_store: PostgresStore, query: str) -> None:
    with pytest.raises(ValueError, match="non-empty query"):
        await pg_store.memory.memory_read(query)


@pytest.mark.parametrize("limit", [0, -1, 101])
async def test_memory_read_rejects_a_limit_out_of_range(
    pg_store: PostgresStore, limit: int
) -> None:
    with pytest.raises(ValueError, match="between 1 and 100"):
        await pg_store.memory.memory_read("anything", limit=limit)


# -- memory_read: hybrid ------------------------------------------------------------------

_CAR = "Customer asked about automobile repair costs; the mechanic quoted a repair price."
_GARAGE = "The car was fixed at the garage yesterday."
_BILLING = "Quarterly invoice and payment reconciliation for the billing team."


async def test_hybrid_search_finds_by_meaning_via_the_vector_half(
    pg_store: PostgresStore,
) -> None:
    embedder = ConceptEmbedder()
    store = PostgresStore(pg_store.pool, embedder)
    await archive(store, "cmp-1", [_CAR, _GARAGE, _BILLING])
    stored_models = await store.pool.fetch(
        "SELECT embedding_model, vector_dims(embedding) AS dims FROM archival_memory"
    )
    assert {(r["embedding_model"], r["dims"]) for r in stored_models} == {("test-concepts-v1", 256)}

    # No batch contains "truck": full text alone finds nothing.
    assert (await pg_store.memory.memory_read("truck")).hits == ()
    result = await store.memory.memory_read("truck", limit=2)

    assert result.mode == "hybrid"
    assert {hit.batch_id for hit in result.hits} == {"cmp-1:0", "cmp-1:1"}
    assert all(hit.text_rank is None and hit.vector_rank is not None for hit in result.hits)
    assert [hit.vector_rank for hit in result.hits] == [1, 2]


async def test_hybrid_search_fuses_ranks_reciprocally(pg_store: PostgresStore) -> None:
    store = PostgresStore(pg_store.pool, ConceptEmbedder())
    await archive(store, "cmp-1", [_CAR, _GARAGE, _BILLING])

    result = await store.memory.memory_read("automobile repair")
    hits = {hit.batch_id: hit for hit in result.hits}

    car, garage, billing = hits["cmp-1:0"], hits["cmp-1:1"], hits["cmp-1:2"]
    assert car.text_rank == 1 and car.vector_rank is not None
    assert garage.text_rank is None and garage.vector_rank is not None
    assert billing.text_rank is None and billing.vector_rank == 3
    for hit in result.hits:
        expected = sum(1 / (RRF_K + r) for r in (hit.text_rank, hit.vector_rank) if r is not None)
        assert hit.score == pytest.approx(expected)
    # In both lists beats first in one list.
    assert [hit.batch_id for hit in result.hits] == ["cmp-1:0", "cmp-1:1", "cmp-1:2"]
    assert [hit.score for hit in result.hits] == sorted(
        (h.score for h in result.hits), reverse=True
    )


async def test_vectors_from_another_embedding_model_are_never_compared(
    pg_store: PostgresStore,
) -> None:
    await archive(PostgresStore(pg_store.pool, ConceptEmbedder()), "cmp-1", [_CAR, _GARAGE])
    other = PostgresStore(pg_store.pool, ConceptEmbedder(model="test-concepts-v2", dims=64))

    result = await other.memory.memory_read("truck")
    assert result.mode == "hybrid"
    assert result.hits == ()


async def test_embedder_failure_still_applies_the_compaction_without_vectors(
    pg_store: PostgresStore,
) -> None:
    history = [msg(i) for i in range(4)]
    await save_all(pg_store, history)
    store = PostgresStore(pg_store.pool, FailingEmbedder())
    plan = make_plan(
        "cmp-1", [stored("cmp-1", 0, _GARAGE, history[:2])], [history[0].id, history[1].id]
    )
    plan = await with_embeddings(store.embedder, plan, history)
    assert plan.embeddings is None

    assert await store.compactions.apply_compaction(plan) == Applied()

    row = await pg_store.pool.fetchrow("SELECT embedding, embedding_model FROM archival_memory")
    assert (row["embedding"], row["embedding_model"]) == (None, None)
    # Search degrades to full text, rather than failing, while the embedder is down.
    result = await store.memory.memory_read("garage")
    assert result.mode == "full_text"
    assert [hit.batch_id for hit in result.hits] == ["cmp-1:0"]


async def test_embedder_returning_the_wrong_shape_counts_as_a_failure(
    pg_store: PostgresStore,
) -> None:
    class ShortEmbedder(ConceptEmbedder):
        async def embed(self, texts: list[str]) -> list[list[float]]:
            return (await super().embed(texts))[:-1]

    store = PostgresStore(pg_store.pool, ShortEmbedder())
    await archive(store, "cmp-1", [_CAR, _GARAGE])
    assert (
        await pg_store.pool.fetchval("SELECT count(*) FROM archival_memory WHERE embedding IS NULL")
        == 2
    )


async def test_an_embedded_replay_is_already_applied_and_writes_nothing(
    pg_store: PostgresStore,
) -> None:
    """The processor asks ``compaction_inputs`` before it plans; a replay that gets
    past it (a race) is embedded again, but the insert into ``compactions``
    still stops it before anything is written."""
    embedder = ConceptEmbedder()
    store = PostgresStore(pg_store.pool, embedder)
    plan = await with_embeddings(embedder, make_plan("cmp-1", [stored("cmp-1", 0, _CAR)], []), ())
    assert await store.compactions.apply_compaction(plan) == Applied()
    before = await pg_store.pool.fetch("SELECT id, embedding_model FROM archival_memory")
    assert await store.compactions.apply_compaction(plan) == AlreadyApplied()
    assert await pg_store.pool.fetch("SELECT id, embedding_model FROM archival_memory") == before
    assert await pg_store.pool.fetchval("SELECT count(*) FROM compactions") == 1


# -- service helpers ------------------------------------------------------------------


# -- streaming support: arrival order, exact token deltas, outbox ----------------


async def outbox_of(
    store: PostgresStore, plan: CompactionPlan, *records: OutboxRecord
) -> CompactionOutbox:
    """``records`` with the stored token counts ``plan`` removes and adds, as the
    processor announces them (from ``compaction_inputs``)."""
    inputs = await store.history.compaction_inputs(plan.compaction_id, CONV, up_to_seq=None)
    return CompactionOutbox(records, StoredTokens.of(plan, inputs.stored_tokens))


async def test_a_rows_first_publication_time_stays(pg_store: PostgresStore) -> None:
    """Marking again keeps ``published_at`` (the contract: tests/contract/test_outbox.py)."""
    history = [msg(i) for i in range(3)]
    await save_all(pg_store, history)
    plan = make_plan(
        "cmp-1", [stored("cmp-1", 0, "summary", history[:2])], [history[0].id, history[1].id]
    )
    outbox = await outbox_of(
        pg_store,
        plan,
        OutboxRecord(topic="clip_archives", key=CONV, payload="a"),
        OutboxRecord(topic="control", key=CONV, payload="b"),
    )
    await pg_store.compactions.apply_compaction(plan, outbox)
    rows = await pg_store.outbox.outbox_rows("cmp-1")
    await pg_store.outbox.mark_published([rows[0].id])
    published_at = "SELECT published_at FROM outbox WHERE id = $1"
    first = await pg_store.pool.fetchval(published_at, rows[0].id)
    await pg_store.outbox.mark_published([r.id for r in rows])
    assert await pg_store.pool.fetchval(published_at, rows[0].id) == first
    await pg_store.outbox.mark_compaction_published("cmp-1")
    assert await pg_store.pool.fetchval(published_at, rows[0].id) == first
