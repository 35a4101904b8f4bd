"""``memory_read``'s SQL, each statement built for its scope.

A search sees one conversation, one tenant's conversations, both, or
everything; each statement is written for the scope it serves (not one
statement with optional filters) so that each plan uses the index its scope
needs. The text is cached per scope kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from core.domain.ranking import BM25_B, BM25_K1, COLLAPSE_NORMALIZED_CHARS, SNIPPET_SCAN_CHARS


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


def _turn_head(alias: str) -> str:
    """A listed turn as the search reads it: its head (what a snippet looks
    through), its length and, when longer than that, its text's SHA-256 (what
    its copies share): never a whole turn of a million characters per row."""
    content = f"{alias}.content"
    return (
        f"{alias}.conversation_id, {alias}.id, {alias}.batch_id, {alias}.role, "
        f"left({content}, {SNIPPET_SCAN_CHARS}) AS content, length({content}) AS content_chars, "
        f"CASE WHEN length({content}) > {min(SNIPPET_SCAN_CHARS, COLLAPSE_NORMALIZED_CHARS)} "
        f"THEN encode(sha256(convert_to({content}, 'UTF8')), 'hex') END AS digest, "
        f"{alias}.created_at, {alias}.seq"
    )


SCORED_TURNS = 2000
"""The most matching raw turns one list scores (the scope's newest): scoring
reads each turn's whole tsvector, so a common word in a scope of a million turns
would otherwise score them all, holding a read connection for seconds."""


@cache
def raw_text_sql(kind: tuple[bool, bool], scan: bool = False) -> str:
    """BM25 of the turns that match, the newest ``SCORED_TURNS`` of them at most
    (their LIMIT before any scoring): a term's frequency from the tsvector's
    positions, its weight (IDF) from the kept figures, the length in words.
    The score is a scalar subquery per row (no per-row sort or aggregate
    node: the cost of a search is in these rows); the matched terms are
    listed for the rows returned only.
    $1 match, $2 lexemes, $3 their IDF, $4 average words, $5 limit; scope $6."""
    return f"""
SELECT {_turn_head("r")}, r.text_score, {_MATCHED.replace("$4", "$2")}
  FROM (SELECT {_TURN_COLUMNS}, a.content_tsv,
               (SELECT sum(w.idf * t.tf * {BM25_K1 + 1} / (t.tf + {BM25_K1}
                           * ({1 - BM25_B} + {BM25_B} * a.word_count / $4::float8)))
                  FROM unnest(a.content_tsv) AS u,
                       unnest($2::text[], $3::float8[]) AS w(lexeme, idf),
                       LATERAL (SELECT coalesce(cardinality(u.positions), 1)::float8 AS tf) AS t
                 WHERE w.lexeme = u.lexeme) AS text_score
          FROM (SELECT * FROM archived_messages AS a
                 WHERE {_matching("a", scan)} AND {_where(kind, "a", 6)}
                 ORDER BY a.seq DESC
                 LIMIT {SCORED_TURNS}) AS a
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
SELECT {_turn_head("v")}, v.distance
  FROM (SELECT {_TURN_COLUMNS}, a.embedding <=> $1::vector AS distance
          FROM archived_messages AS a
         WHERE a.embedding IS NOT NULL AND a.embedding_model = $2
           AND vector_dims(a.embedding) = $3 AND {_where(kind, "a", 5)}
         ORDER BY distance, a.seq DESC
         LIMIT $4) AS v
 ORDER BY v.distance, v.seq DESC
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


def tsquery_any(lexemes: Sequence[str]) -> str:
    """A tsquery matching any of ``lexemes`` (each quoted as a literal)."""
    return " | ".join("'" + lexeme.replace("'", "''") + "'" for lexeme in lexemes)
