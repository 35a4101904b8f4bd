"""``memory_read`` over PostgreSQL: summaries and archived raw turns, fused by rank.

Four candidate lists at most: summaries by full text, summaries by vector,
raw turns by full text, raw turns by vector (vectors only with an embedder).
Each list is fused by reciprocal rank (``RRF_K``): a summary's score is the
sum over its lists, a raw turn's the same over its own; a batch scores its
summary plus its best raw turn, so a batch found both ways ranks above one
found either way.

Plain queries are text: the query's lexemes (``to_tsvector``, so stemming and
stop words apply and punctuation cannot change the meaning) are OR-ed, and
rows with every lexeme rank first. ``mode="websearch"`` uses
``websearch_to_tsquery`` instead (quoted phrases, ``or``, ``-word``).

Summaries keep the ranking they always had (``ts_rank_cd``, all-terms first).
Raw turns are many and short, so they are ranked by BM25 computed in SQL
(k1 = 1.2, b = 0.75, document frequencies within the searched conversation):
without an inverse document frequency a word every turn has ("photo") would
weigh as much as the name that answers the question.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.adapters.postgres.vectors import check_vectors
from core.ports.embedding import Embedder
from core.ports.storage import MemoryHit, MemorySearchResult, QueryMode, SearchSources, TurnHit

if TYPE_CHECKING:
    from core.adapters.postgres.connection import Queryable

log = logging.getLogger(__name__)

RRF_K = 60
"""Reciprocal-rank-fusion constant: the usual 60 keeps one list's top hit from
drowning a document that ranks well in both."""

TURNS_PER_HIT = 3
"""Matching raw turns returned with each batch (its best ones)."""

SNIPPET_CHARS = 600

MAX_LIMIT = 100
"""The most hits one ``memory_read`` returns."""

# Lexemes of the query text (a backslash cannot be quoted into a tsquery).
_TERMS = """
    SELECT DISTINCT t.lexeme, quote_literal(t.lexeme)::tsquery AS tq
      FROM unnest(to_tsvector('english', $1)) AS t
     WHERE strpos(t.lexeme, E'\\\\') = 0
"""
_ANY_TERM = "coalesce((SELECT string_agg(quote_literal(lexeme), ' | ') FROM terms), '')::tsquery"
_ALL_TERMS = "coalesce((SELECT string_agg(quote_literal(lexeme), ' & ') FROM terms), '')::tsquery"


def in_tenant(alias: str, param: int) -> str:
    """The row's conversation belongs to tenant ``$param`` (or that parameter is NULL)."""
    return (
        f"(${param}::text IS NULL OR {alias}.conversation_id IN ("
        f"SELECT t.conversation_id FROM conversations AS t WHERE t.tenant_id = ${param}))"
    )


HIT_COLUMNS = """
    m.id, m.seq, m.label, m.conversation_id, m.content, m.depth, m.start_time,
    m.end_time, m.message_count, m.superseded_by IS NOT NULL AS superseded
"""

# $1 query, $2 conversation or NULL, $3 limit, $4 websearch syntax, $5 tenant or NULL.
SUMMARY_TEXT_SQL = f"""
WITH terms AS ({_TERMS}),
q AS (
    SELECT CASE WHEN $4::boolean THEN websearch_to_tsquery('english', $1)
           ELSE {_ALL_TERMS} END AS strict,
           CASE WHEN $4::boolean THEN websearch_to_tsquery('english', $1)
           ELSE {_ANY_TERM} END AS loose
)
SELECT {HIT_COLUMNS},
       m.content_tsv @@ q.strict AS all_terms,
       ts_rank_cd(m.content_tsv, q.strict) AS strict_rank,
       ts_rank_cd(m.content_tsv, q.loose) AS loose_rank
  FROM archival_memory AS m, q
 WHERE (m.content_tsv @@ q.strict OR m.content_tsv @@ q.loose)
   AND ($2::text IS NULL OR m.conversation_id = $2)
   AND {in_tenant("m", 5)}
 ORDER BY all_terms DESC, strict_rank DESC, loose_rank DESC, m.seq DESC
 LIMIT $3
"""

SUMMARY_VECTOR_SQL = f"""
SELECT {HIT_COLUMNS},
       m.embedding <=> $1::vector AS distance
  FROM archival_memory AS m
 WHERE m.embedding IS NOT NULL
   AND m.embedding_model = $2
   AND vector_dims(m.embedding) = $3
   AND ($4::text IS NULL OR m.conversation_id = $4)
   AND {in_tenant("m", 6)}
 ORDER BY distance, m.seq DESC
 LIMIT $5
"""

_TURN_COLUMNS = "a.conversation_id, a.id, a.batch_id, a.role, a.content, a.created_at, a.seq"

# BM25 with each term's frequency from the tsvector's positions and the
# document length as its number of distinct lexemes.
RAW_TEXT_SQL = f"""
WITH terms AS ({_TERMS}),
q AS (
    SELECT CASE WHEN $4::boolean THEN websearch_to_tsquery('english', $1)
           ELSE {_ANY_TERM} END AS match
),
scope AS (
    SELECT count(*)::float8 AS n, coalesce(avg(length(content_tsv)), 1)::float8 AS avglen
      FROM archived_messages AS a
     WHERE ($2::text IS NULL OR a.conversation_id = $2) AND {in_tenant("a", 5)}
),
df AS (
    SELECT terms.lexeme,
           (SELECT count(*) FROM archived_messages AS d
             WHERE d.content_tsv @@ terms.tq
               AND ($2::text IS NULL OR d.conversation_id = $2)
               AND {in_tenant("d", 5)})::float8 AS n
      FROM terms
),
hits AS (
    SELECT a.conversation_id, a.id, a.content_tsv FROM archived_messages AS a, q
     WHERE a.content_tsv @@ q.match AND ($2::text IS NULL OR a.conversation_id = $2)
       AND {in_tenant("a", 5)}
),
scored AS (
    SELECT h.conversation_id, h.id,
           coalesce(sum(
               ln(1 + (s.n - df.n + 0.5) / (df.n + 0.5))
               * coalesce(cardinality(u.positions), 1) * 2.2
               / (coalesce(cardinality(u.positions), 1)
                  + 1.2 * (0.25 + 0.75 * length(h.content_tsv) / greatest(s.avglen, 1)))
           ), 0) AS bm25
      FROM hits AS h
     CROSS JOIN scope AS s
     CROSS JOIN LATERAL unnest(h.content_tsv) AS u
      LEFT JOIN df ON df.lexeme = u.lexeme
     GROUP BY h.conversation_id, h.id
)
SELECT {_TURN_COLUMNS}, scored.bm25
  FROM scored JOIN archived_messages AS a USING (conversation_id, id)
 ORDER BY scored.bm25 DESC, a.seq DESC
 LIMIT $3
"""

RAW_VECTOR_SQL = f"""
SELECT {_TURN_COLUMNS},
       a.embedding <=> $1::vector AS distance
  FROM archived_messages AS a
 WHERE a.embedding IS NOT NULL
   AND a.embedding_model = $2
   AND vector_dims(a.embedding) = $3
   AND ($4::text IS NULL OR a.conversation_id = $4)
   AND {in_tenant("a", 6)}
 ORDER BY distance, a.seq DESC
 LIMIT $5
"""

# The batches only raw turns found, by (conversation, id): a batch id is unique
# within its conversation only. Held to the search's scope like the lists
# above ($3 conversation or NULL, $4 tenant or NULL).
BATCHES_BY_ID_SQL = f"""
SELECT {HIT_COLUMNS}
  FROM archival_memory AS m
  JOIN unnest($1::text[], $2::text[]) AS wanted (conversation_id, id)
       USING (conversation_id, id)
 WHERE ($3::text IS NULL OR m.conversation_id = $3)
   AND {in_tenant("m", 4)}
"""

BatchKey = tuple[str, str]
"""(conversation id, id): what identifies a batch or a raw turn."""


@dataclass(slots=True)
class Ranked:
    """A row and its ranks in the lists it appears in, fused."""

    row: Any
    text_rank: int | None = None
    vector_rank: int | None = None
    score: float = 0.0

    @property
    def best(self) -> int:
        return min(r for r in (self.text_rank, self.vector_rank) if r is not None)


def fuse(text_rows: Sequence[Any], vector_rows: Sequence[Any], key: str) -> dict[BatchKey, Ranked]:
    """Reciprocal rank fusion: score = Σ 1/(RRF_K + rank) over the lists a row is in.

    Ranks, not raw scores, are fused because ts_rank_cd, BM25 and cosine
    distance live on unrelated scales.
    """
    ranked: dict[BatchKey, Ranked] = {}
    for rank, row in enumerate(text_rows, start=1):
        entry = ranked.setdefault((row["conversation_id"], row[key]), Ranked(row))
        entry.text_rank = rank
        entry.score += 1.0 / (RRF_K + rank)
    for rank, row in enumerate(vector_rows, start=1):
        entry = ranked.setdefault((row["conversation_id"], row[key]), Ranked(row))
        entry.vector_rank = rank
        entry.score += 1.0 / (RRF_K + rank)
    return ranked


@dataclass
class _Batch:
    row: Any
    summary: Ranked | None = None
    turns: list[Ranked] = field(default_factory=list)

    @property
    def score(self) -> float:
        best_turn = max((t.score for t in self.turns), default=0.0)
        return (self.summary.score if self.summary else 0.0) + best_turn

    @property
    def best(self) -> int:
        ranks = [t.best for t in self.turns]
        if self.summary is not None:
            ranks.append(self.summary.best)
        return min(ranks)


def missing_batch_ids(
    summaries: dict[BatchKey, Ranked], turns: dict[BatchKey, Ranked]
) -> list[BatchKey]:
    """Batches only raw turns found: their rows still have to be read."""
    wanted = {
        (t.row["conversation_id"], t.row["batch_id"])
        for t in turns.values()
        if t.row["batch_id"] is not None
    }
    return sorted(wanted - set(summaries))


def hits(
    summaries: dict[BatchKey, Ranked],
    turns: dict[BatchKey, Ranked],
    batch_rows: Sequence[Any],
    query: str,
    limit: int,
) -> list[MemoryHit]:
    """Batches by fused score (summary + best raw turn), each with its best turns."""
    batches = {key: _Batch(r.row, summary=r) for key, r in summaries.items()}
    for row in batch_rows:
        batches.setdefault((row["conversation_id"], row["id"]), _Batch(row))
    for turn in turns.values():
        batch = batches.get((turn.row["conversation_id"], turn.row["batch_id"]))
        if batch is not None:
            batch.turns.append(turn)
    ordered = sorted(batches.values(), key=lambda b: (-b.score, b.best, -int(b.row["seq"])))
    return [_hit(b, query) for b in ordered[:limit]]


def _hit(batch: _Batch, query: str) -> MemoryHit:
    row, summary = batch.row, batch.summary
    best_turns = sorted(batch.turns, key=lambda t: (-t.score, t.best))[:TURNS_PER_HIT]
    return MemoryHit(
        batch_id=row["id"],
        label=row["label"],
        conversation_id=row["conversation_id"],
        content=row["content"],
        depth=row["depth"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        message_count=row["message_count"],
        score=batch.score,
        text_rank=summary.text_rank if summary else None,
        vector_rank=summary.vector_rank if summary else None,
        superseded=row["superseded"],
        turns=tuple(_turn(t, query) for t in best_turns),
    )


def _turn(turn: Ranked, query: str) -> TurnHit:
    text, truncated = snippet(turn.row["content"], query)
    return TurnHit(
        message_id=turn.row["id"],
        role=turn.row["role"],
        created_at=turn.row["created_at"],
        text=text,
        truncated=truncated,
        score=turn.score,
        text_rank=turn.text_rank,
        vector_rank=turn.vector_rank,
    )


_QUERY_WORD = re.compile(r"\w{3,}")


def snippet(content: str, query: str, size: int = SNIPPET_CHARS) -> tuple[str, bool]:
    """The whole text when short, else ``size`` characters around the first query word."""
    if len(content) <= size:
        return content, False
    lowered = content.lower()
    found = [lowered.find(w.lower()) for w in _QUERY_WORD.findall(query)]
    first = min((i for i in found if i >= 0), default=0)
    start = max(0, min(first - size // 3, len(content) - size))
    piece = content[start : start + size]
    return ("…" if start else "") + piece + ("…" if start + size < len(content) else ""), True


def usable(rows: Sequence[Any]) -> list[Any]:
    """A zero vector has no direction: its cosine distance is NaN, not a rank."""
    return [row for row in rows if not math.isnan(row["distance"])]


async def search(
    pool: Queryable,
    embedder: Embedder | None,
    query: str,
    *,
    conversation_id: str | None,
    limit: int,
    sources: SearchSources,
    mode: QueryMode,
    tenant_id: str | None,
    candidates_per_half: int,
) -> MemorySearchResult:
    """``PostgresStore.memory_read``."""
    text = query.strip()
    if not text:
        raise ValueError("memory_read needs a non-empty query")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"memory_read limit must be between 1 and {MAX_LIMIT}, got {limit}")
    per_half = max(candidates_per_half, limit)
    websearch = mode == "websearch"
    query_vector = await _embed_query(embedder, text)
    summaries: dict[BatchKey, Ranked] = {}
    turns: dict[BatchKey, Ranked] = {}
    if sources != "raw":
        text_rows = await pool.fetch(
            SUMMARY_TEXT_SQL, text, conversation_id, per_half, websearch, tenant_id
        )
        vector_rows = await _vector_rows(
            pool, embedder, SUMMARY_VECTOR_SQL, query_vector, conversation_id, per_half, tenant_id
        )
        summaries = fuse(text_rows, vector_rows, "id")
    if sources != "summaries":
        text_rows = await pool.fetch(
            RAW_TEXT_SQL, text, conversation_id, per_half, websearch, tenant_id
        )
        vector_rows = await _vector_rows(
            pool, embedder, RAW_VECTOR_SQL, query_vector, conversation_id, per_half, tenant_id
        )
        turns = fuse(text_rows, vector_rows, "id")
    missing = missing_batch_ids(summaries, turns)
    batch_rows = (
        await pool.fetch(
            BATCHES_BY_ID_SQL,
            [conversation for conversation, _ in missing],
            [batch_id for _, batch_id in missing],
            conversation_id,
            tenant_id,
        )
        if missing
        else []
    )
    found = hits(summaries, turns, batch_rows, text, limit)
    return MemorySearchResult(
        hits=tuple(found),
        mode="hybrid" if query_vector is not None else "full_text",
        sources=sources,
        query_mode=mode,
    )


async def _vector_rows(
    pool: Queryable,
    embedder: Embedder | None,
    sql: str,
    vector: list[float] | None,
    conversation_id: str | None,
    limit: int,
    tenant_id: str | None,
) -> list[Any]:
    if vector is None or embedder is None:
        return []
    rows = await pool.fetch(
        sql, vector, embedder.model, len(vector), conversation_id, limit, tenant_id
    )
    return usable(rows)


async def _embed_query(embedder: Embedder | None, text: str) -> list[float] | None:
    if embedder is None:
        return None
    try:
        vectors = await embedder.embed([text])
        check_vectors(vectors, 1)
    except Exception as error:
        log.warning("embedding a memory_read query failed, searching full text only: %s", error)
        return None
    return vectors[0]
