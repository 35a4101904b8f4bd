"""``memory_read``: archived summaries and raw turns, found by a query."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict

from core.ports.storage.reads import ReadScope

SearchSources = Literal["both", "summaries", "raw"]
"""What ``memory_read`` ranks: archived summaries, archived raw turns, or both."""


QueryMode = Literal["plain", "websearch"]
"""``plain``: the query is text (any term matches, punctuation is ignored);
``websearch``: PostgreSQL's web-search syntax (quoted phrases, ``or``, ``-word``)."""


MatchList = Literal["summary_text", "summary_vector", "raw_text", "raw_vector"]
"""The candidate lists ``memory_read`` fuses: summaries or raw turns, by full text
(ts_rank_cd for summaries, BM25 for raw turns) or by vector (cosine distance)."""


class MatchReason(BaseModel):
    """Why a row matched: one list it is in, its rank there and what matched.

    So a caller can trust or discard a hit: a raw turn at ``raw_text`` rank 1
    holding every query word is strong evidence; one found only by vector at
    rank 40 is a guess.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    via: MatchList
    rank: int  # 1-based, within that list
    score: float  # the list's own: BM25, ts_rank_cd, or cosine distance (lower is closer)
    terms: tuple[str, ...] = ()  # query words the row holds (full-text lists; stemmed match)


class TurnHit(BaseModel):
    """An archived raw turn that matched a ``memory_read`` query."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    message_id: str
    role: str
    created_at: AwareDatetime
    text: str  # the whole turn, or a snippet around the first match when it is long
    truncated: bool
    score: float  # fused reciprocal-rank score of the turn
    text_rank: int | None  # 1-based rank among matching raw turns (full text)
    vector_rank: int | None  # 1-based rank among raw turns (vectors)
    conversation_id: str | None = None
    batch_id: str | None = None  # the depth-0 batch that summarised it
    matches: tuple[MatchReason, ...] = ()  # why it matched, one entry per list
    duplicates: int = 0  # other matching turns of its conversation with the same text


class MemoryHit(BaseModel):
    """One archived batch: its summary and, when they matched, some of its raw turns.

    ``score`` fuses the summary's ranks with its best raw turn's; ``text_rank``
    and ``vector_rank`` are the summary's own (None when only raw turns matched).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_id: str
    label: str
    conversation_id: str
    content: str
    depth: int
    start_time: AwareDatetime
    end_time: AwareDatetime
    message_count: int
    score: float  # fused reciprocal-rank score, higher is better
    text_rank: int | None  # 1-based rank in full-text results, None if absent
    vector_rank: int | None  # 1-based rank in vector results, None if absent
    superseded: bool
    turns: tuple[TurnHit, ...] = ()  # matching raw turns, best first
    matches: tuple[MatchReason, ...] = ()  # the summary's lists (empty: found by its turns)


class MemorySearchResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    hits: tuple[MemoryHit, ...]
    mode: Literal["hybrid", "full_text"]  # full_text when no embedder is configured
    # The best-matching raw turns of the whole scope, ranked on their own (not
    # inside their batches), best first, at most ``limit``.
    turns: tuple[TurnHit, ...] = ()
    sources: SearchSources = "both"
    query_mode: QueryMode = "plain"


class MemorySearch(Protocol):
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
        """Batches ranked by their summaries and their archived raw turns, fused by
        reciprocal rank; each hit carries its matching raw turns. ``tenant_id``
        limits the search to that tenant's conversations (with ``conversation_id``
        too: both must hold); ``scope`` limits what the search can see at all."""
        ...
