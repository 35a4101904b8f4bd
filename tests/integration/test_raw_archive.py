"""Raw turns behind archived batches (archived_messages), memory_read over summaries
and raw turns, expand, and retention, on a real PostgreSQL."""

from __future__ import annotations

import asyncpg
import pytest

from core.adapters.postgres.store import PostgresStore
from core.compaction.embedding import with_embeddings
from core.domain.compaction import CompactionPlan, StoredTokens
from core.ports.storage import (
    AlreadyApplied,
    Applied,
    CompactionOutbox,
    HistoryConflictError,
    OutboxRecord,
)
from tests.integration.test_postgres_store import ConceptEmbedder
from tests.support.plans import CONV, make_plan, msg, save_all, stored

pytestmark = pytest.mark.integration

TURNS = [
    "Hi! Booking the team offsite this spring.",
    "My sister Margarethe lives in Lisbon and can host us.",
    "photo photo photo: a caption of the beach",
    "The budget for the offsite is 4,250 euros, approved by Dana.",
    "Let's meet on 14 May at the harbour cafe.",
    "I changed my mind: the offsite moves to Porto.",
]


async def _compact_all(store: PostgresStore) -> CompactionPlan:
    messages = [msg(i, text) for i, text in enumerate(TURNS)]
    await save_all(store, messages)
    plan = make_plan(
        "cmp-1",
        [
            stored("cmp-1", 0, "Offsite planning: Lisbon host.", messages[:3], end=2),
            stored("cmp-1", 1, "Budget approved; venue moved.", messages[3:], start=3, end=5),
        ],
        [m.id for m in messages],
    )
    assert await store.compactions.apply_compaction(plan) == Applied()
    return plan


async def _archived(store: PostgresStore) -> list[asyncpg.Record]:
    return await store.pool.fetch(
        "SELECT conversation_id, id, batch_id, compaction_id, role, content, seq "
        "FROM archived_messages ORDER BY id"
    )


async def test_compaction_moves_raw_turns_to_the_archive_linked_to_their_batch(
    pg_store: PostgresStore,
) -> None:
    await _compact_all(pg_store)
    rows = await _archived(pg_store)
    assert [r["content"] for r in rows] == TURNS
    assert [r["batch_id"] for r in rows] == ["cmp-1:0"] * 3 + ["cmp-1:1"] * 3
    assert {r["compaction_id"] for r in rows} == {"cmp-1"}
    assert all(r["conversation_id"] == CONV for r in rows)
    # context-compaction.AC1.5: gone from the live history; only the clip-archive is left.
    live = await pg_store.pool.fetch("SELECT kind FROM messages")
    assert [r["kind"] for r in live] == ["clip_archive"]


async def test_a_replaced_clip_archive_is_not_archived_as_a_raw_turn(
    pg_store: PostgresStore,
) -> None:
    await _compact_all(pg_store)
    later = [msg(10, "Dana confirmed the Porto hotel.")]
    await save_all(pg_store, later)
    plan = make_plan(
        "cmp-2",
        [stored("cmp-2", 0, "Hotel confirmed.", later, start=10, end=10)],
        [later[0].id, "clip-archive-cmp-1"],
    )
    assert await pg_store.compactions.apply_compaction(plan) == Applied()
    ids = [r["id"] for r in await _archived(pg_store)]
    assert "clip-archive-cmp-1" not in ids
    assert later[0].id in ids


async def test_replaying_a_compaction_archives_nothing_twice(pg_store: PostgresStore) -> None:
    plan = await _compact_all(pg_store)
    before = await _archived(pg_store)
    assert await pg_store.compactions.apply_compaction(plan) == AlreadyApplied()
    assert await _archived(pg_store) == before


async def test_a_conflicting_compaction_moves_nothing(pg_store: PostgresStore) -> None:
    messages = [msg(i, text) for i, text in enumerate(TURNS)]
    await save_all(pg_store, messages)
    plan = make_plan(
        "cmp-1",
        [stored("cmp-1", 0, "summary", messages)],
        [*(m.id for m in messages), "conv-a-m999"],  # one is not there
    )
    with pytest.raises(HistoryConflictError):
        await pg_store.compactions.apply_compaction(plan)
    assert await _archived(pg_store) == []
    assert await pg_store.pool.fetchval("SELECT count(*) FROM messages") == len(TURNS)


async def test_a_refused_outbox_write_rolls_the_archive_back_too(pg_store: PostgresStore) -> None:
    messages = [msg(i, text) for i, text in enumerate(TURNS)]
    await save_all(pg_store, messages)
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "summary", messages)], [m.id for m in messages])
    record = OutboxRecord(topic="control", key=CONV, payload="done")
    announced = StoredTokens(removed=0, added=0)  # not what the rows carry

    with pytest.raises(HistoryConflictError):
        await pg_store.compactions.apply_compaction(plan, CompactionOutbox((record,), announced))
    assert await _archived(pg_store) == []
    assert await pg_store.pool.fetchval("SELECT count(*) FROM messages") == len(TURNS)


# -- memory_read over summaries and raw turns -------------------------------------------


async def test_memory_read_returns_the_batch_with_its_matching_raw_turns(
    pg_store: PostgresStore,
) -> None:
    await _compact_all(pg_store)
    result = await pg_store.memory.memory_read("Who is Margarethe?", conversation_id=CONV)
    assert result.sources == "both" and result.query_mode == "plain"
    top = result.hits[0]
    assert top.batch_id == "cmp-1:0"
    assert top.text_rank is None  # the summary does not say it
    assert top.content == "Offsite planning: Lisbon host."
    assert [t.message_id for t in top.turns] == ["conv-a-m001"]
    assert "Margarethe" in top.turns[0].text and top.turns[0].role == "user"

    summaries = await pg_store.memory.memory_read("Margarethe", sources="summaries")
    assert summaries.hits == ()
    raw = await pg_store.memory.memory_read("budget euros", sources="raw")
    assert raw.hits[0].batch_id == "cmp-1:1"
    assert raw.hits[0].text_rank is None
    assert raw.hits[0].turns[0].message_id == "conv-a-m003"


async def test_a_batch_found_by_summary_and_raw_turn_ranks_first(pg_store: PostgresStore) -> None:
    await _compact_all(pg_store)
    result = await pg_store.memory.memory_read("Lisbon", conversation_id=CONV)
    top = result.hits[0]
    assert top.batch_id == "cmp-1:0"
    assert top.text_rank == 1 and top.turns
    assert top.score > 1 / 61


async def test_raw_ranking_weighs_rare_words_above_common_ones(pg_store: PostgresStore) -> None:
    filler = [msg(i, f"photo of the beach, photo number {i}") for i in range(30)]
    answer = msg(40, "The photo Dana liked is in the Porto folder.")
    await save_all(pg_store, [*filler, answer])
    everything = [*filler, answer]
    plan = make_plan(
        "cmp-1", [stored("cmp-1", 0, "beach photos", everything)], [m.id for m in everything]
    )
    await pg_store.compactions.apply_compaction(plan)
    result = await pg_store.memory.memory_read("which photo did Dana like", sources="raw")
    assert result.hits[0].turns[0].message_id == answer.id


@pytest.mark.parametrize(
    "question",
    [
        'What did my sister "Margarethe" offer?',
        "Is the offsite in Lisbon or Porto?",
        "-- where does Margarethe live",
        "-Margarethe's city?",
        "Margarethe & Dana | budget: 4,250 (euros)!",
        "what's O'Reilly's sister Margarethe's city?",
    ],
)
async def test_plain_questions_with_punctuation_still_find_their_answer(
    pg_store: PostgresStore, question: str
) -> None:
    await _compact_all(pg_store)
    result = await pg_store.memory.memory_read(question, conversation_id=CONV)
    turns = [t.message_id for hit in result.hits for t in hit.turns]
    assert result.hits, question
    assert "conv-a-m001" in turns or "conv-a-m005" in turns


async def test_websearch_mode_is_strict_when_asked_for(pg_store: PostgresStore) -> None:
    await _compact_all(pg_store)
    phrase = await pg_store.memory.memory_read('"offsite moves"', mode="websearch", sources="raw")
    assert [t.message_id for h in phrase.hits for t in h.turns] == ["conv-a-m005"]
    excluded = await pg_store.memory.memory_read("offsite -Porto", mode="websearch", sources="raw")
    turns = {t.message_id for h in excluded.hits for t in h.turns}
    assert "conv-a-m005" not in turns and "conv-a-m000" in turns
    assert excluded.query_mode == "websearch"


async def test_raw_turns_are_embedded_and_found_by_meaning(pg_store: PostgresStore) -> None:
    store = PostgresStore(pg_store.pool, ConceptEmbedder())
    messages = [msg(0, "The mechanic fixed my car."), msg(1, "Invoice paid.")]
    await save_all(store, messages)
    plan = make_plan("cmp-1", [stored("cmp-1", 0, "errands", messages)], [m.id for m in messages])
    await store.compactions.apply_compaction(await with_embeddings(store.embedder, plan, messages))
    models = await store.pool.fetch("SELECT embedding_model FROM archived_messages")
    assert {r["embedding_model"] for r in models} == {"test-concepts-v1"}
    result = await store.memory.memory_read("truck", sources="raw")
    assert result.mode == "hybrid"
    assert result.hits[0].turns[0].message_id == messages[0].id
    assert result.hits[0].turns[0].vector_rank == 1


# -- expand and retention -----------------------------------------------------------------


async def test_covered_days_round_trip(pg_store: PostgresStore) -> None:
    from datetime import date

    messages = [msg(0, "first"), msg(1, "second")]
    await save_all(pg_store, messages)
    batch = stored("cmp-1", 0, "s", messages)
    days = (date(2026, 1, 5), date(2026, 3, 1))
    batch = batch.model_copy(update={"batch": batch.batch.model_copy(update={"days": days})})
    await pg_store.compactions.apply_compaction(
        make_plan("cmp-1", [batch], [m.id for m in messages])
    )
    (live,) = await pg_store.archive.live_batches(CONV)
    assert live.batch.days == days
