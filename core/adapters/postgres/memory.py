"""``memory_read`` over PostgreSQL (``PostgresMemory``): summaries and archived raw
turns, fused by rank.

Four candidate lists at most: summaries by full text, summaries by vector,
raw turns by full text, raw turns by vector (vectors only with an embedder).
Each list is fused by reciprocal rank (``ranking.RRF_K``): a summary's score is the
sum over its lists, a raw turn's the same over its own. The result has the
best raw turns of the scope ranked on their own (``MemorySearchResult.turns``)
and the batches: a batch scores its summary plus its best raw turn, so a
batch found both ways ranks above one found either way.

Plain queries are text: the query's lexemes (``to_tsvector``, so stemming and
stop words apply and punctuation cannot change the meaning) are OR-ed, and
rows with every lexeme rank first. ``mode="websearch"`` uses
``websearch_to_tsquery`` instead (quoted phrases, ``or``, ``-word``).

Summaries are ranked by ``ts_rank_cd`` (all-terms first); raw turns by BM25
(k1 = 1.2, b = 0.75: without an IDF a word every turn has would weigh as much
as the name that answers the question), from figures the archive path keeps
(``term_stats``), so a search never reads the whole scope.

Every statement is built for its scope (conversation, tenant, both, or
everything) so that each plan uses the index its scope needs
(``memory_statements``). The ranking itself (fusion, IDF, copies collapsed,
snippets) is pure and lives in ``core.domain.ranking``; this module reads the
lists and hands their rows over. The ranking's text work (copies, snippets)
runs in the store's search threads, never on the worker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg

from core.adapters.postgres import term_stats
from core.adapters.postgres.connection import reading
from core.adapters.postgres.errors import port_errors_on_methods
from core.adapters.postgres.memory_statements import (
    Scope,
    batches_by_id_sql,
    raw_text_sql,
    raw_vector_sql,
    summary_text_sql,
    summary_vector_sql,
    terms_sql,
    tsquery_any,
)
from core.adapters.postgres.rows import found_in, summary_of, turn_of
from core.domain.ranking import (
    Candidates,
    Key,
    Ranked,
    Summary,
    Turn,
    fuse,
    fused_turns,
    hits,
    missing_batch_ids,
    ranked_turns,
    term_weights,
    turn_hit,
    usable,
)
from core.domain.vectors import check_vectors
from core.ports.embedding import Embedder
from core.ports.storage import (
    MemorySearch,
    MemorySearchResult,
    QueryMode,
    ReadScope,
    SearchSources,
)

if TYPE_CHECKING:
    from core.adapters.postgres.connection import Queryable
    from core.adapters.postgres.migrate import AnyConnection

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_LIMIT = 100
"""The most hits one ``memory_read`` returns."""

CONVERSATION_SCAN_TURNS = 5000
"""A conversation with at most this many archived turns is searched by reading
its turns (``memory_statements._matching``), not through the table-wide GIN index."""


# -- the query's terms -----------------------------------------------------------------


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


async def read_terms(conn: Queryable, text: str, websearch: bool, scope: Scope) -> Terms:
    row = await conn.fetchrow(terms_sql(scope.kind), text, websearch, *scope.params)
    assert row is not None  # one row from FROM totals, always
    lexemes = list(row["lexemes"])
    turns = float(row["turns"])
    weights = term_weights(lexemes, row["df"], turns)
    cut = not websearch and 0 < len(weights.selective) < len(lexemes)
    return Terms(
        lexemes=lexemes,
        words=dict(zip(lexemes, row["words"], strict=True)),
        idf=weights.idf,
        average_words=max(float(row["total_words"]) / turns, 1.0) if turns else 1.0,
        match=row["match"],
        strict=row["strict"],
        narrow=tsquery_any(weights.selective) if cut else "",
        common_bound=weights.common_bound,
        scope_turns=turns,
    )


def _scans(terms: Terms, scope: Scope) -> bool:
    return scope.conversation_id is not None and terms.scope_turns <= CONVERSATION_SCAN_TURNS


def summary_text_args(terms: Terms, match: str, scope: Scope, per_half: int) -> list[Any]:
    return [match, terms.strict or terms.match, per_half, terms.lexemes, *scope.params]


def raw_text_args(terms: Terms, match: str, scope: Scope, per_half: int) -> list[Any]:
    return [match, terms.lexemes, terms.idf, terms.average_words, per_half, *scope.params]


# -- the candidate lists ---------------------------------------------------------------


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


@dataclass(frozen=True)
class _CandidateLists:
    """What every candidate list of one search is read with."""

    conn: Queryable
    terms: Terms
    scope: Scope
    per_half: int
    limit: int
    embedder: Embedder | None
    vector: list[float] | None

    async def summaries_by_text(self) -> Candidates[Summary]:
        if not self.terms.match:
            return Candidates("summary_text")
        rows = await summary_text_rows(self.conn, self.terms, self.scope, self.per_half, self.limit)
        return Candidates(
            "summary_text", found_in(rows, "text_score", summary_of), self.terms.words
        )

    async def turns_by_text(self) -> Candidates[Turn]:
        if not self.terms.match:
            return Candidates("raw_text")
        rows = await raw_text_rows(self.conn, self.terms, self.scope, self.per_half, self.limit)
        return Candidates("raw_text", found_in(rows, "text_score", turn_of), self.terms.words)

    async def summaries_by_vector(self) -> Candidates[Summary]:
        rows = await self._nearest(summary_vector_sql(self.scope.kind))
        return Candidates("summary_vector", usable(found_in(rows, "distance", summary_of)))

    async def turns_by_vector(self) -> Candidates[Turn]:
        rows = await self._nearest(raw_vector_sql(self.scope.kind))
        return Candidates("raw_vector", usable(found_in(rows, "distance", turn_of)))

    async def _nearest(self, sql: str) -> list[Any]:
        if self.vector is None or self.embedder is None:
            return []
        model, dimensions = self.embedder.model, len(self.vector)
        args = (self.vector, model, dimensions, self.per_half, *self.scope.params)
        return list(await self.conn.fetch(sql, *args))

    async def batches(self, missing: Sequence[Key]) -> list[Summary]:
        """The batches only raw turns found (their rows were in no summary list)."""
        if not missing:
            return []
        conversations = [conversation for conversation, _ in missing]
        ids = [batch_id for _, batch_id in missing]
        sql = batches_by_id_sql(self.scope.kind)
        rows = await self.conn.fetch(sql, conversations, ids, *self.scope.params)
        return [summary_of(row) for row in rows]


# -- the search ------------------------------------------------------------------------


@port_errors_on_methods
class PostgresMemory:
    """With an ``embedder``, ``memory_read`` embeds its query (before it takes a
    connection) and fuses vector and full-text ranks; without one, full text only."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: Embedder | None = None,
        *,
        candidates_per_half: int = 50,
        threads: Executor | None = None,
    ) -> None:
        if candidates_per_half < 1:
            raise ValueError("candidates_per_half must be >= 1")
        self._pool = pool
        self._threads = threads
        self._embedder = embedder
        self._candidates_per_half = candidates_per_half

    async def memory_read(
        self,
        query: str,
        conversation_id: str | None = None,
        limit: int = 5,
        *,
        sources: SearchSources = "both",
        mode: QueryMode = "plain",
        tenant_id: str | None = None,
        scope: ReadScope | None = None,
    ) -> MemorySearchResult:
        """With a ``scope``, in one READ ONLY transaction as ``compactor_reader``
        (``connection.reading``): row-level security holds the search to the
        scope whatever its own filters say."""
        text = query.strip()
        if not text:
            raise ValueError("memory_read needs a non-empty query")
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"memory_read limit must be between 1 and {MAX_LIMIT}, got {limit}")
        vector = await _embed_query(self._embedder, text)
        asked = Asked(text, Scope(conversation_id, tenant_id), limit, sources, mode, vector)
        # One connection for the search's 3-5 statements (not one each).
        connection = self._pool.acquire() if scope is None else reading(self._pool, scope)
        async with connection as conn:
            found = await _candidates(conn, asked, self._embedder, self._candidates_per_half)
            lists = found.turns
            turns = {} if lists is None else await self._in_thread(partial(fused_turns, *lists))
            batches = await found.lists.batches(missing_batch_ids(found.summaries, turns))
        return await self._in_thread(partial(_result, asked, found.summaries, turns, batches))

    async def _in_thread(self, work: Callable[[], T]) -> T:
        """Text work off the event loop: the store's threads (None: the loop's default)."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, work)


@dataclass(frozen=True)
class Asked:
    """One search as asked, its query embedded (None: full text only)."""

    text: str
    scope: Scope
    limit: int
    sources: SearchSources
    mode: QueryMode
    vector: list[float] | None


@dataclass(frozen=True)
class _Found:
    """The lists as read: summaries fused, raw turns not yet (text work: a thread)."""

    lists: _CandidateLists
    summaries: dict[Key, Ranked[Summary]]
    turns: tuple[Candidates[Turn], Candidates[Turn]] | None


async def _candidates(
    conn: Queryable, asked: Asked, embedder: Embedder | None, candidates_per_half: int
) -> _Found:
    text, scope, limit, sources = asked.text, asked.scope, asked.limit, asked.sources
    terms = await read_terms(conn, text, asked.mode == "websearch", scope)
    per_half = max(candidates_per_half, limit)
    lists = _CandidateLists(conn, terms, scope, per_half, limit, embedder, asked.vector)
    summaries = (
        fuse(await lists.summaries_by_text(), await lists.summaries_by_vector())
        if sources != "raw"
        else {}
    )
    turns = (
        (await lists.turns_by_text(), await lists.turns_by_vector())
        if sources != "summaries"
        else None
    )
    return _Found(lists, summaries, turns)


def _result(
    asked: Asked,
    summaries: Mapping[Key, Ranked[Summary]],
    turns: Mapping[Key, Ranked[Turn]],
    batches: Sequence[Summary],
) -> MemorySearchResult:
    """The ranked hits with their snippets: text work, run in a thread."""
    text, limit = asked.text, asked.limit
    return MemorySearchResult(
        hits=tuple(hits(summaries, turns, batches, text, limit)),
        turns=tuple(turn_hit(t, text) for t in ranked_turns(turns)[:limit]),
        mode="hybrid" if asked.vector is not None else "full_text",
        sources=asked.sources,
        query_mode=asked.mode,
    )


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


# -- for tools: EXPLAIN and a bulk load ------------------------------------------------


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
    scans = _scans(terms, scope)
    for match, label in ((terms.narrow, " (selective terms)"), (terms.match, "")):
        if match:
            summary_args = summary_text_args(terms, match, scope, limit)
            raw_args = raw_text_args(terms, match, scope, limit)
            statements.append(
                ("summary_text" + label, summary_text_sql(scope.kind, scans), summary_args)
            )
            statements.append(("raw_text" + label, raw_text_sql(scope.kind, scans), raw_args))
    return statements


async def rebuild_statistics(conn: AnyConnection) -> None:
    """Recompute the BM25 figures from the archived turns (``term_stats.rebuild``)."""
    await term_stats.rebuild(conn)


if TYPE_CHECKING:

    def _implements(memory: PostgresMemory) -> MemorySearch:
        """Never called: makes mypy prove the class implements its port."""
        return memory
