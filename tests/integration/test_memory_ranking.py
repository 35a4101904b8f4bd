"""memory_read's ranking on a real PostgreSQL: the BM25 figures kept by the archive
path, BM25 in SQL against a reference, the best turns of the scope first, why
each hit matched, and no empty answer for a question with matching words."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from core.adapters.postgres import memory as pg_memory
from core.adapters.postgres.store import PostgresStore
from core.domain.messages import ConversationMessage
from core.ports.storage import Applied
from tests.support.plans import make_plan, msg, save_all, stored
from tests.support.stores import saved

pytestmark = pytest.mark.integration

# A few words most turns have, many that few have: where BM25 and the
# selective-terms cut (MaxScore) differ from counting matches.
COMMON = ["photo", "today", "thanks"]
RARE = (
    "harbour lisbon porto budget invoice dentist piano garden tax venue ferry kayak "
    "orchid falcon glacier violin pottery marathon lantern compass meadow walnut "
    "saffron beacon canyon quartz pelican tundra sonnet zephyr"
).split()


async def compact(
    store: PostgresStore,
    conversation: str,
    compaction: str,
    texts: Sequence[str],
    first: int,
    per_batch: int = 5,
) -> list[ConversationMessage]:
    """Store ``texts`` as turns of ``conversation`` and compact all of them."""
    messages = [msg(first + i, text, conversation_id=conversation) for i, text in enumerate(texts)]
    for m in messages:
        assert await saved(store, m, 5)  # a key "acme/c1" is tenant acme's
    batches = [
        stored(
            compaction,
            n,
            f"Summary {n} of {conversation}.",
            messages[start : start + per_batch],
            conversation_id=conversation,
        )
        for n, start in enumerate(range(0, len(messages), per_batch))
    ]
    previous = await store.pool.fetchval(
        "SELECT id FROM messages WHERE conversation_id = $1 AND kind = 'clip_archive'",
        conversation,
    )
    deleted = [m.id for m in messages] + ([previous] if previous else [])
    plan = make_plan(compaction, batches, deleted, conversation_id=conversation)
    assert await store.compactions.apply_compaction(plan) == Applied()
    return messages


def random_turns(rng: random.Random, count: int) -> list[str]:
    turns = []
    for _ in range(count):
        words = [w for w in COMMON if rng.random() < 0.5]
        words += rng.sample(RARE, rng.randint(0, 2))
        words += ["and", "the", "we"] * rng.randint(0, 2)  # length without meaning
        if rng.random() < 0.2 and words:
            words.append(words[0])  # a term twice
        rng.shuffle(words)
        turns.append(" ".join([*words, f"n{rng.randrange(10**9)}"]))  # no two alike
    return turns


async def figures(store: PostgresStore) -> tuple[list[tuple[object, ...]], ...]:
    turns = await store.pool.fetch(
        "SELECT conversation_id, turns, words FROM archived_turn_stats ORDER BY 1"
    )
    terms = await store.pool.fetch(
        "SELECT conversation_id, lexeme, turns FROM archived_term_stats ORDER BY 1, 2"
    )
    return [tuple(r) for r in turns], [tuple(r) for r in terms]


async def test_figures_kept_by_compaction_and_retention_equal_a_rebuild(
    pg_store: PostgresStore,
) -> None:
    rng = random.Random(3)
    for conversation in ("conv-a", "conv-b"):
        await compact(pg_store, conversation, f"{conversation}-c1", random_turns(rng, 12), 0)
        await compact(pg_store, conversation, f"{conversation}-c2", random_turns(rng, 9), 100)
    kept = await figures(pg_store)
    assert kept[0] == [("conv-a", 21, kept[0][0][2]), ("conv-b", 21, kept[0][1][2])]
    async with pg_store.pool.acquire() as conn:
        await pg_memory.rebuild_statistics(conn)
    assert await figures(pg_store) == kept

    # Retention takes turns out of the figures; a conversation left with none has none.
    store = PostgresStore(pg_store.pool, raw_retention_days=30)
    await store.pool.execute(
        "UPDATE archived_messages SET archived_at = $1 "
        "WHERE conversation_id = 'conv-b' OR compaction_id = 'conv-a-c1'",
        datetime.now(UTC) - timedelta(days=31),
    )
    assert await store.archive.expire_raw_turns() == 33
    after = await figures(store)
    assert [row[:2] for row in after[0]] == [("conv-a", 9)]
    assert {row[0] for row in after[1]} == {"conv-a"}
    async with store.pool.acquire() as conn:
        await pg_memory.rebuild_statistics(conn)
    assert await figures(store) == after


async def test_figures_follow_turns_written_by_any_statement(pg_store: PostgresStore) -> None:
    """A worker of the previous release (rolling upgrade) archives and removes turns
    knowing nothing of the figures: the triggers keep them all the same."""
    await pg_store.pool.execute(
        """
        INSERT INTO archived_messages (conversation_id, id, compaction_id, role, content,
                                       created_at, token_estimate, seq)
        SELECT 'old-worker', 'm' || i, 'c-old', 'user', 'kafka rebalance number ' || i,
               now(), 5, i
          FROM generate_series(1, 7) AS i
        """
    )
    await pg_store.pool.execute(
        "DELETE FROM archived_messages WHERE conversation_id = 'old-worker' AND id IN ('m1', 'm2')"
    )
    kept = await figures(pg_store)
    assert kept[0] == [("old-worker", 5, 20)]
    assert ("old-worker", "kafka", 5) in kept[1] and ("old-worker", "3", 1) in kept[1]
    async with pg_store.pool.acquire() as conn:
        await pg_memory.rebuild_statistics(conn)
    assert await figures(pg_store) == kept
    await pg_store.pool.execute(
        "DELETE FROM archived_messages WHERE conversation_id = 'old-worker'"
    )
    assert await figures(pg_store) == ([], [])


def reference_bm25(
    vectors: dict[str, dict[str, int]], words: dict[str, int], terms: list[str]
) -> dict[str, float]:
    """Okapi BM25 (k1 1.2, b 0.75) over the turns' own tsvectors, in Python."""
    n = len(vectors)
    average = sum(words.values()) / n
    df = Counter(lexeme for vector in vectors.values() for lexeme in vector)
    scores = {}
    for turn, vector in vectors.items():
        score = sum(
            math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            * vector[t]
            * 2.2
            / (vector[t] + 1.2 * (0.25 + 0.75 * words[turn] / average))
            for t in terms
            if t in vector
        )
        if score > 0:
            scores[turn] = score
    return scores


@pytest.mark.parametrize("scope", ["conversation", "tenant"])
async def test_raw_turns_rank_by_bm25_as_a_reference_computes_it(
    pg_store: PostgresStore, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SQL BM25 with kept figures, and the selective-terms cut, give the
    reference's top scores for random questions (ties may order either way)."""
    rng = random.Random(11)
    cut: list[bool] = []
    read_terms = pg_memory.read_terms

    async def spied(*args: object) -> pg_memory.Terms:
        terms = await read_terms(*args)  # type: ignore[arg-type]
        cut.append(bool(terms.narrow))
        return terms

    monkeypatch.setattr(pg_memory, "read_terms", spied)
    for n, conversation in enumerate(("acme/c1", "acme/c2", "globex/c1")):
        for c in range(3):
            texts = random_turns(rng, 20)
            await compact(pg_store, conversation, f"{conversation}-{c}", texts, n * 1000 + c * 50)
    in_scope = ["acme/c1"] if scope == "conversation" else ["acme/c1", "acme/c2"]
    rows = await pg_store.pool.fetch(
        "SELECT a.id, a.word_count, u.lexeme, cardinality(u.positions) AS tf "
        "FROM archived_messages AS a, unnest(a.content_tsv) AS u "
        "WHERE a.conversation_id = ANY($1::text[])",
        in_scope,
    )
    vectors: dict[str, dict[str, int]] = {}
    words: dict[str, int] = {}
    for row in rows:
        vectors.setdefault(row["id"], {})[row["lexeme"]] = row["tf"]
        words[row["id"]] = row["word_count"]
    for row in await pg_store.pool.fetch(
        "SELECT id, word_count FROM archived_messages WHERE conversation_id = ANY($1::text[])",
        in_scope,
    ):  # turns with no lexeme at all count too
        vectors.setdefault(row["id"], {})
        words[row["id"]] = row["word_count"]

    for _ in range(25):
        question = rng.sample(COMMON, rng.randint(0, 2)) + rng.sample(RARE, rng.randint(1, 2))
        result = await pg_store.memory.memory_read(
            " ".join(question),
            conversation_id="acme/c1" if scope == "conversation" else None,
            tenant_id="acme" if scope == "tenant" else None,
            sources="raw",
            limit=5,
        )
        terms = [
            r["lexeme"]
            for r in await pg_store.pool.fetch(
                "SELECT lexeme FROM unnest(to_tsvector('english', $1))", " ".join(question)
            )
        ]
        expected = sorted(reference_bm25(vectors, words, terms).values(), reverse=True)[:5]
        got = [m.score for t in result.turns for m in t.matches if m.via == "raw_text"]
        assert got == pytest.approx(expected, rel=1e-9), question
        assert {t.conversation_id for t in result.turns} <= set(in_scope)
    assert 5 <= sum(cut) < len(cut)  # both paths taken


async def test_the_best_turn_comes_first_even_when_its_batch_summary_ranks_low(
    pg_store: PostgresStore,
) -> None:
    messages = [
        msg(0, "ferry ferry ferry timetable"),  # in the batch whose summary matches
        msg(1, "we talked about a ferry once"),
        msg(2, "the kayak rental is at the harbour"),
        msg(3, "The ferry to Porto leaves at 7:40 from pier 3."),  # the answer
    ]
    await save_all(pg_store, messages)
    plan = make_plan(
        "cmp-1",
        [
            stored("cmp-1", 0, "Ferry ferry ferry: ferry talk.", messages[:2]),
            stored("cmp-1", 1, "Kayaks and the harbour.", messages[2:]),
        ],
        [m.id for m in messages],
    )
    assert await pg_store.compactions.apply_compaction(plan) == Applied()

    result = await pg_store.memory.memory_read("when does the ferry to Porto leave", limit=1)

    assert [h.batch_id for h in result.hits] == ["cmp-1:0"]  # its summary wins the batches
    assert [t.message_id for t in result.turns] == [messages[3].id]  # the turn wins the turns
    assert result.turns[0].batch_id == "cmp-1:1"


async def test_each_hit_and_turn_says_why_it_matched(pg_store: PostgresStore) -> None:
    messages = [msg(0, "The invoices for the harbour project are overdue."), msg(1, "ok")]
    await save_all(pg_store, messages)
    plan = make_plan(
        "cmp-1", [stored("cmp-1", 0, "Overdue invoices, harbour.", messages)], ["conv-a-m000"]
    )
    assert await pg_store.compactions.apply_compaction(plan) == Applied()

    result = await pg_store.memory.memory_read("Which invoice is overdue?")

    hit = result.hits[0]
    assert [(m.via, m.rank, m.terms) for m in hit.matches] == [
        ("summary_text", 1, ("invoice", "overdue"))
    ]
    assert hit.matches[0].score > 0
    (turn,) = hit.turns
    assert [(m.via, m.rank, m.terms) for m in turn.matches] == [
        ("raw_text", 1, ("invoice", "overdue"))
    ]
    assert result.turns == (turn,)
    assert turn.conversation_id == "conv-a" and turn.batch_id == "cmp-1:0"


async def test_turns_with_the_same_text_are_collapsed_into_the_latest(
    pg_store: PostgresStore,
) -> None:
    texts = ["Did I mention the piano lesson?"] * 6 + ["The piano lesson is on 3 June."]
    messages = await compact(pg_store, "conv-a", "cmp-1", texts, 0)

    result = await pg_store.memory.memory_read("When is the piano lesson?", limit=5)

    assert [t.message_id for t in result.turns] == [messages[5].id, messages[6].id]
    assert [t.duplicates for t in result.turns] == [5, 0]


async def test_a_question_with_matching_words_never_comes_back_empty(
    pg_store: PostgresStore,
) -> None:
    rng = random.Random(5)
    texts = random_turns(rng, 40)
    await compact(pg_store, "conv-a", "cmp-1", texts, 0)
    vocabulary = sorted({w for t in texts for w in t.split()[:-1]} - {"and", "the", "we"})
    for word in vocabulary:
        for sources in ("both", "raw"):
            result = await pg_store.memory.memory_read(
                f"what about {word}?",
                conversation_id="conv-a",
                sources=sources,  # type: ignore[arg-type]
            )
            assert result.hits and result.turns, (word, sources)
