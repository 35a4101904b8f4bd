"""``memory_read`` over PostgreSQL: summaries and archived raw turns, fused by rank.

Four candidate lists at most: summaries by full text, summaries by vector,
raw turns by full text, raw turns by vector (vectors only with an embedder).
Each list is fused by reciprocal rank (``RRF_K``): a summary's score is the
sum over its lists, a raw turn's the same over its own. The result has the
best raw turns of the scope ranked on their own (``MemorySearchResult.turns``)
and the batches: a batch scores its summary plus its best raw turn, so a
batch found both ways ranks above one found either way.

Plain queries are text: the query's lexemes (``to_tsvector``, so stemming and
stop words apply and punctuation cannot change the meaning) are OR-ed, and
rows with every lexeme rank first. ``mode="websearch"`` uses
``websearch_to_tsquery`` instead (quoted phrases, ``or``, ``-word``).

Summaries keep the ranking they always had (``ts_rank_cd``, all-terms first).
Raw turns are many and short, so they are ranked by BM25 (k1 = 1.2, b = 0.75;
without an inverse document frequency a word every turn has ("photo") would
weigh as much as the name that answers the question). Its figures (turns and
words in the scope, turns holding each term) are kept by the archive path
(``term_stats``), so a search reads the rows that match and a few figures,
never the whole scope. A turn's length is its words, stop words included.

Every statement is built for its scope (conversation, tenant, both, or
everything) so that each plan uses the index its scope needs.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from core.adapters.postgres import term_stats
from core.domain.vectors import check_vectors
from core.ports.embedding import Embedder
from core.ports.storage import (
    MatchList,
    MatchReason,
    MemoryHit,
    MemorySearchResult,
    QueryMode,
    SearchSources,
    TurnHit,
)

if TYPE_CHECKING:
    from core.adapters.postgres.connection import Queryable
    from core.adapters.postgres.migrate import AnyConnection

log = logging.getLogger(__name__)

RRF_K = 60
"""Reciprocal-rank-fusion constant: the usual 60 keeps one list's top hit from
drowning a document that ranks well in both."""

TURNS_PER_HIT = 3
"""Matching raw turns returned with each batch (its best ones)."""

SNIPPET_CHARS = 600

MAX_LIMIT = 100
"""The most hits one ``memory_read`` returns."""

BM25_K1 = 1.2
BM25_B = 0.75


@dataclass(frozen=True)
class Scope:
    """What a search may see: one conversation, one tenant's, both, or all."""

    conversation_id: str | None
    tenant_id: str | None

    @property
    def kind(self) -> tuple[bool, bool]:
        return self.conversation_id is not None, self.tenant_id is not None

    @property
    def params(self) -> list[str]:
        return [p for p in (self.conversation_id, self.tenant_id) if p is not None]


def tenant_clause(alias: str, number: int) -> str:
    """The row's conversation belongs to tenant ``$number`` (``conversations.tenant_id``)."""
    return (
        f"{alias}.conversation_id IN (SELECT t.conversation_id FROM conversations AS t "
        f"WHERE t.tenant_id = ${number})"
    )


def _where(kind: tuple[bool, bool], alias: str, first: int) -> str:
    """The scope's condition on ``alias``, its parameters numbered from ``first``."""
    by_conversation, by_tenant = kind
    clauses = []
    if by_conversation:
        clauses.append(f"{alias}.conversation_id = ${first}")
    if by_tenant:
        clauses.append(tenant_clause(alias, first + by_conversation))
    return " AND ".join(clauses) or "true"


# -- statements ------------------------------------------------------------------------


@cache
def terms_sql(kind: tuple[bool, bool]) -> str:
    """The query's lexemes (with the word each came from), the match and all-terms
    tsqueries, and the BM25 figures of the scope. $1 query, $2 websearch; scope $3."""
    return f"""
WITH terms AS (
    SELECT DISTINCT t.lexeme FROM unnest(to_tsvector('english', $1)) AS t
     WHERE strpos(t.lexeme, E'\\\\') = 0
), words AS (
    SELECT DISTINCT ON (u.lexeme) u.lexeme, w.word
      FROM regexp_split_to_table($1, '[^[:alnum:]]+') WITH ORDINALITY AS w(word, n),
           unnest(to_tsvector('english', w.word)) AS u
     WHERE w.word <> ''
     ORDER BY u.lexeme, w.n
), df AS (
    SELECT d.lexeme, sum(d.turns) AS turns
      FROM archived_term_stats AS d
     WHERE d.lexeme IN (SELECT lexeme FROM terms) AND {_where(kind, "d", 3)}
     GROUP BY d.lexeme
), totals AS (
    SELECT coalesce(sum(s.turns), 0)::float8 AS turns, coalesce(sum(s.words), 0)::float8 AS words
      FROM archived_turn_stats AS s
     WHERE {_where(kind, "s", 3)}
)
SELECT array(SELECT lexeme FROM terms ORDER BY lexeme) AS lexemes,
       array(SELECT coalesce(w.word, t.lexeme) FROM terms AS t LEFT JOIN words AS w USING (lexeme)
              ORDER BY t.lexeme) AS words,
       array(SELECT coalesce(df.turns, 0)::float8 FROM terms AS t LEFT JOIN df USING (lexeme)
              ORDER BY t.lexeme) AS df,
       totals.turns, totals.words AS total_words,
       CASE WHEN $2::boolean THEN websearch_to_tsquery('english', $1)::text
            ELSE coalesce((SELECT string_agg(quote_literal(lexeme), ' | ') FROM terms), '')
       END AS match,
       CASE WHEN $2::boolean THEN websearch_to_tsquery('english', $1)::text
            ELSE coalesce((SELECT string_agg(quote_literal(lexeme), ' & ') FROM terms), '')
       END AS strict
  FROM totals
"""


HIT_COLUMNS = """
    m.id, m.seq, m.label, m.conversation_id, m.content, m.depth, m.start_time,
    m.end_time, m.message_count, m.superseded_by IS NOT NULL AS superseded
"""

_MATCHED = (
    "array(SELECT l FROM unnest($4::text[]) AS l "
    "WHERE r.content_tsv @@ quote_literal(l)::tsquery) AS matched"
)


def _matching(alias: str, scan: bool) -> str:
    """The full-text condition; with ``scan``, written so that no index can serve it.

    In one conversation of at most ``CONVERSATION_SCAN_TURNS`` archived turns,
    checking each of its turns costs less than the GIN index, whose posting
    lists hold every conversation's turns: the scan is bounded by the
    conversation, the index by the whole table (docs/memory.md, "The plans").
    """
    condition = f"{alias}.content_tsv @@ $1::tsquery"
    return f"({condition}) IS TRUE" if scan else condition


@cache
def summary_text_sql(kind: tuple[bool, bool], scan: bool = False) -> str:
    """$1 match, $2 all terms, $3 limit, $4 lexemes; scope $5."""
    return f"""
SELECT r.id, r.seq, r.label, r.conversation_id, r.content, r.depth, r.start_time,
       r.end_time, r.message_count, r.superseded, r.text_score, {_MATCHED}
  FROM (SELECT {HIT_COLUMNS}, m.content_tsv,
               m.content_tsv @@ $2::tsquery AS all_terms,
               ts_rank_cd(m.content_tsv, $2::tsquery) AS strict_rank,
               ts_rank_cd(m.content_tsv, $1::tsquery) AS text_score
          FROM archival_memory AS m
         WHERE {_matching("m", scan)} AND {_where(kind, "m", 5)}
         ORDER BY all_terms DESC, strict_rank DESC, text_score DESC, m.seq DESC
         LIMIT $3) AS r
 ORDER BY r.all_terms DESC, r.strict_rank DESC, r.text_score DESC, r.seq DESC
"""


_TURN_COLUMNS = "a.conversation_id, a.id, a.batch_id, a.role, a.content, a.created_at, a.seq"


@cache
def raw_text_sql(kind: tuple[bool, bool], scan: bool = False) -> str:
    """BM25 of the turns that match: a term's frequency from the tsvector's
    positions, its weight (IDF) from the kept figures, the length in words.
    The score is a scalar subquery per row (no per-row sort or aggregate
    node: the cost of a search is in these rows); the matched terms are
    listed for the rows returned only.
    $1 match, $2 lexemes, $3 their IDF, $4 average words, $5 limit; scope $6."""
    return f"""
SELECT r.conversation_id, r.id, r.batch_id, r.role, r.content, r.created_at, r.seq,
       r.text_score, {_MATCHED.replace("$4", "$2")}
  FROM (SELECT {_TURN_COLUMNS}, a.content_tsv,
               (SELECT sum(w.idf * t.tf * {BM25_K1 + 1} / (t.tf + {BM25_K1}
                           * ({1 - BM25_B} + {BM25_B} * a.word_count / $4::float8)))
                  FROM unnest(a.content_tsv) AS u,
                       unnest($2::text[], $3::float8[]) AS w(lexeme, idf),
                       LATERAL (SELECT coalesce(cardinality(u.positions), 1)::float8 AS tf) AS t
                 WHERE w.lexeme = u.lexeme) AS text_score
          FROM archived_messages AS a
         WHERE {_matching("a", scan)} AND {_where(kind, "a", 6)}
         ORDER BY text_score DESC, a.seq DESC
         LIMIT $5) AS r
 ORDER BY r.text_score DESC, r.seq DESC
"""


@cache
def summary_vector_sql(kind: tuple[bool, bool]) -> str:
    """$1 vector, $2 model, $3 dimensions, $4 limit; scope $5."""
    return f"""
SELECT {HIT_COLUMNS}, m.embedding <=> $1::vector AS distance
  FROM archival_memory AS m
 WHERE m.embedding IS NOT NULL AND m.embedding_model = $2 AND vector_dims(m.embedding) = $3
   AND {_where(kind, "m", 5)}
 ORDER BY distance, m.seq DESC
 LIMIT $4
"""


@cache
def raw_vector_sql(kind: tuple[bool, bool]) -> str:
    """$1 vector, $2 model, $3 dimensions, $4 limit; scope $5."""
    return f"""
SELECT {_TURN_COLUMNS}, a.embedding <=> $1::vector AS distance
  FROM archived_messages AS a
 WHERE a.embedding IS NOT NULL AND a.embedding_model = $2 AND vector_dims(a.embedding) = $3
   AND {_where(kind, "a", 5)}
 ORDER BY distance, a.seq DESC
 LIMIT $4
"""


@cache
def batches_by_id_sql(kind: tuple[bool, bool]) -> str:
    """The batches only raw turns found, by (conversation, id) (a batch id is
    unique within its conversation only), held to the scope. $1, $2; scope $3."""
    return f"""
SELECT {HIT_COLUMNS}
  FROM archival_memory AS m
  JOIN unnest($1::text[], $2::text[]) AS wanted (conversation_id, id)
       USING (conversation_id, id)
 WHERE {_where(kind, "m", 3)}
"""


STATEMENTS = (
    terms_sql,
    summary_text_sql,
    raw_text_sql,
    summary_vector_sql,
    raw_vector_sql,
    batches_by_id_sql,
)
"""Every statement builder (each caches its text per scope kind)."""


def forget_statements() -> None:
    """Build the statements again on next use (a test that rewrites a clause)."""
    for builder in STATEMENTS:
        builder.cache_clear()


# -- ranking -------------------------------------------------------------------------

BatchKey = tuple[str, str]
"""(conversation id, id): what identifies a batch or a raw turn."""


@dataclass(slots=True)
class Ranked:
    """A row and its ranks in the lists it appears in, fused."""

    row: Any
    text_rank: int | None = None
    vector_rank: int | None = None
    score: float = 0.0
    matches: list[MatchReason] = field(default_factory=list)
    duplicates: int = 0

    @property
    def best(self) -> int:
        return min(r for r in (self.text_rank, self.vector_rank) if r is not None)


@dataclass(frozen=True)
class ListRows:
    """One candidate list: its rows best first, and how to explain a row's place."""

    via: MatchList
    rows: Sequence[Any]
    score_column: str
    words: dict[str, str] = field(default_factory=dict)  # lexeme -> query word


def fuse(text: ListRows, vector: ListRows, key: str = "id") -> dict[BatchKey, Ranked]:
    """Reciprocal rank fusion: score = Σ 1/(RRF_K + rank) over the lists a row is in.

    Ranks, not raw scores, are fused because ts_rank_cd, BM25 and cosine
    distance live on unrelated scales.
    """
    ranked: dict[BatchKey, Ranked] = {}
    for listed, is_text in ((text, True), (vector, False)):
        for rank, row in enumerate(listed.rows, start=1):
            entry = ranked.setdefault((row["conversation_id"], row[key]), Ranked(row))
            if is_text:
                entry.text_rank = rank
            else:
                entry.vector_rank = rank
            entry.score += 1.0 / (RRF_K + rank)
            entry.matches.append(_reason(listed, rank, row))
    return ranked


def _reason(listed: ListRows, rank: int, row: Any) -> MatchReason:
    lexemes = row.get("matched")
    return MatchReason(
        via=listed.via,
        rank=rank,
        score=float(row[listed.score_column]),
        terms=tuple(listed.words.get(lexeme, lexeme) for lexeme in lexemes or ()),
    )


def collapse_duplicates(rows: Sequence[Any]) -> tuple[list[Any], dict[BatchKey, int]]:
    """Keep the first of the turns of one conversation with the same text.

    The same sentence said ten times ("did I mention the trip?") would take
    every place in the list from the one turn that says something else; a
    caller learns nothing from the copies, only that there are some
    (``TurnHit.duplicates``).
    """
    first: dict[tuple[str, str], Any] = {}
    copies: dict[BatchKey, int] = {}
    kept = []
    for row in rows:
        text = (row["conversation_id"], " ".join(row["content"].lower().split()))
        if text in first:
            keeper = first[text]
            key = (keeper["conversation_id"], keeper["id"])
            copies[key] = copies.get(key, 0) + 1
            continue
        first[text] = row
        kept.append(row)
    return kept, copies


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


def ranked_turns(turns: dict[BatchKey, Ranked]) -> list[Ranked]:
    """Raw turns by fused score; ties to the turn ranked higher in a list, then the later."""
    return sorted(turns.values(), key=lambda t: (-t.score, t.best, -int(t.row["seq"])))


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
    for turn in ranked_turns(turns):
        batch = batches.get((turn.row["conversation_id"], turn.row["batch_id"]))
        if batch is not None:
            batch.turns.append(turn)
    ordered = sorted(batches.values(), key=lambda b: (-b.score, b.best, -int(b.row["seq"])))
    return [_hit(b, query) for b in ordered[:limit]]


def _hit(batch: _Batch, query: str) -> MemoryHit:
    row, summary = batch.row, batch.summary
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
        turns=tuple(turn_hit(t, query) for t in batch.turns[:TURNS_PER_HIT]),
        matches=tuple(summary.matches) if summary else (),
    )


def turn_hit(turn: Ranked, query: str) -> TurnHit:
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
        conversation_id=turn.row["conversation_id"],
        batch_id=turn.row["batch_id"],
        matches=tuple(turn.matches),
        duplicates=turn.duplicates,
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


def idf(turns: float, holding: float) -> float:
    """BM25's inverse document frequency (the ``+ 1`` keeps it positive)."""
    return math.log(1 + (turns - holding + 0.5) / (holding + 0.5))


# -- the search ------------------------------------------------------------------------

CONVERSATION_SCAN_TURNS = 5000
"""A conversation with at most this many archived turns is searched by reading
its turns (``_matching``), not through the table-wide GIN index."""

COMMON_SHARE = 0.05
"""A query term held by more than this share of the scope's turns is common:
candidates come from the other (selective) terms first (``Terms.narrow``)."""


@dataclass(frozen=True)
class Terms:
    """What the first statement found out about the query and the scope."""

    lexemes: list[str]
    words: dict[str, str]
    idf: list[float]
    average_words: float
    match: str  # tsquery text: any term (plain), or the websearch query
    strict: str  # every term
    narrow: str = ""  # any selective term, when some terms are common (plain mode)
    common_bound: float = 0.0  # the most the common terms can add to a turn's BM25
    scope_turns: float = 0.0  # archived turns in the scope


def _tsquery_any(lexemes: Sequence[str]) -> str:
    return " | ".join("'" + lexeme.replace("'", "''") + "'" for lexeme in lexemes)


async def read_terms(conn: Queryable, text: str, websearch: bool, scope: Scope) -> Terms:
    row = await conn.fetchrow(terms_sql(scope.kind), text, websearch, *scope.params)
    assert row is not None  # one row from FROM totals, always
    lexemes = list(row["lexemes"])
    turns = float(row["turns"])
    weights = [idf(turns, holding) for holding in row["df"]]
    common = [holding > COMMON_SHARE * turns for holding in row["df"]]
    selective = [lexeme for lexeme, is_common in zip(lexemes, common, strict=True) if not is_common]
    cut = not websearch and 0 < len(selective) < len(lexemes)
    return Terms(
        lexemes=lexemes,
        words=dict(zip(lexemes, row["words"], strict=True)),
        idf=weights,
        average_words=max(float(row["total_words"]) / turns, 1.0) if turns else 1.0,
        match=row["match"],
        strict=row["strict"],
        narrow=_tsquery_any(selective) if cut else "",
        common_bound=sum(
            w * (BM25_K1 + 1) for w, is_common in zip(weights, common, strict=True) if is_common
        ),
        scope_turns=turns,
    )


def _scans(terms: Terms, scope: Scope) -> bool:
    return scope.conversation_id is not None and terms.scope_turns <= CONVERSATION_SCAN_TURNS


def summary_text_args(terms: Terms, match: str, scope: Scope, per_half: int) -> list[Any]:
    return [match, terms.strict or terms.match, per_half, terms.lexemes, *scope.params]


def raw_text_args(terms: Terms, match: str, scope: Scope, per_half: int) -> list[Any]:
    return [match, terms.lexemes, terms.idf, terms.average_words, per_half, *scope.params]


async def summary_text_rows(
    conn: Queryable, terms: Terms, scope: Scope, per_half: int, limit: int
) -> list[Any]:
    """Summaries holding a selective term first; all matching ones when those are
    fewer than ``limit`` (rows with every term rank first either way, and
    they hold the selective terms)."""
    sql = summary_text_sql(scope.kind, _scans(terms, scope))
    if terms.narrow:
        rows = await conn.fetch(sql, *summary_text_args(terms, terms.narrow, scope, per_half))
        if len(rows) >= limit:
            return list(rows)
    return list(await conn.fetch(sql, *summary_text_args(terms, terms.match, scope, per_half)))


async def raw_text_rows(
    conn: Queryable, terms: Terms, scope: Scope, per_half: int, limit: int
) -> list[Any]:
    """BM25's best turns, scored only among the turns holding a selective term
    when that provably changes none of the first ``limit`` (MaxScore): the
    ``limit``-th score there is at least the most the common terms alone can
    give a turn. Otherwise every matching turn is scored."""
    sql = raw_text_sql(scope.kind, _scans(terms, scope))
    if terms.narrow:
        rows = await conn.fetch(sql, *raw_text_args(terms, terms.narrow, scope, per_half))
        if len(rows) >= limit and rows[limit - 1]["text_score"] >= terms.common_bound:
            return list(rows)
    return list(await conn.fetch(sql, *raw_text_args(terms, terms.match, scope, per_half)))


async def explained_statements(
    conn: Queryable,
    query: str,
    *,
    conversation_id: str | None = None,
    tenant_id: str | None = None,
    limit: int = 50,
) -> list[tuple[str, str, list[Any]]]:
    """Every statement a plain full-text search may run, with its arguments (for EXPLAIN)."""
    scope = Scope(conversation_id, tenant_id)
    terms = await read_terms(conn, query, False, scope)
    statements: list[tuple[str, str, list[Any]]] = [
        ("terms and figures", terms_sql(scope.kind), [query, False, *scope.params])
    ]
    if not terms.match:
        return statements
    for match, label in ((terms.narrow, " (selective terms)"), (terms.match, "")):
        if match:
            statements.append(
                (
                    "summary_text" + label,
                    summary_text_sql(scope.kind, _scans(terms, scope)),
                    summary_text_args(terms, match, scope, limit),
                )
            )
            statements.append(
                (
                    "raw_text" + label,
                    raw_text_sql(scope.kind, _scans(terms, scope)),
                    raw_text_args(terms, match, scope, limit),
                )
            )
    return statements


async def rebuild_statistics(conn: AnyConnection) -> None:
    """Recompute the BM25 figures from the archived turns (``term_stats.rebuild``)."""
    await term_stats.rebuild(conn)


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
    scope = Scope(conversation_id, tenant_id)
    query_vector = await _embed_query(embedder, text)
    terms = await read_terms(pool, text, mode == "websearch", scope)
    listed: dict[MatchList, ListRows] = {}
    if terms.match and sources != "raw":
        rows = await summary_text_rows(pool, terms, scope, per_half, limit)
        listed["summary_text"] = ListRows("summary_text", rows, "text_score", terms.words)
    if terms.match and sources != "summaries":
        rows = await raw_text_rows(pool, terms, scope, per_half, limit)
        listed["raw_text"] = ListRows("raw_text", rows, "text_score", terms.words)
    vector_lists: list[tuple[MatchList, str]] = []
    if sources != "raw":
        vector_lists.append(("summary_vector", summary_vector_sql(scope.kind)))
    if sources != "summaries":
        vector_lists.append(("raw_vector", raw_vector_sql(scope.kind)))
    for via, sql in vector_lists:
        rows = await _vector_rows(pool, embedder, sql, query_vector, per_half, scope)
        listed[via] = ListRows(via, rows, "distance")
    summaries = fuse(_listed(listed, "summary_text"), _listed(listed, "summary_vector"))
    turns = _fused_turns(_listed(listed, "raw_text"), _listed(listed, "raw_vector"))
    missing = missing_batch_ids(summaries, turns)
    batch_rows = (
        await pool.fetch(
            batches_by_id_sql(scope.kind),
            [conversation for conversation, _ in missing],
            [batch_id for _, batch_id in missing],
            *scope.params,
        )
        if missing
        else []
    )
    return MemorySearchResult(
        hits=tuple(hits(summaries, turns, batch_rows, text, limit)),
        turns=tuple(turn_hit(t, text) for t in ranked_turns(turns)[:limit]),
        mode="hybrid" if query_vector is not None else "full_text",
        sources=sources,
        query_mode=mode,
    )


def _listed(listed: dict[MatchList, ListRows], via: MatchList) -> ListRows:
    return listed.get(via) or ListRows(via, [], "text_score")


def _fused_turns(text: ListRows, vector: ListRows) -> dict[BatchKey, Ranked]:
    """Raw turns fused after their copies are collapsed in each list."""
    text_rows, text_copies = collapse_duplicates(text.rows)
    vector_rows, vector_copies = collapse_duplicates(vector.rows)
    turns = fuse(
        ListRows(text.via, text_rows, text.score_column, text.words),
        ListRows(vector.via, vector_rows, vector.score_column),
    )
    for key, turn in turns.items():
        turn.duplicates = max(text_copies.get(key, 0), vector_copies.get(key, 0))
    return turns


async def _vector_rows(
    pool: Queryable,
    embedder: Embedder | None,
    sql: str,
    vector: list[float] | None,
    limit: int,
    scope: Scope,
) -> list[Any]:
    if vector is None or embedder is None:
        return []
    rows = await pool.fetch(sql, vector, embedder.model, len(vector), limit, *scope.params)
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
