"""``memory_read``'s ranking on plain rows: which candidate goes first, and why.

The store reads up to four candidate lists (summaries and raw turns, each by
full text and by vector) and hands them here as plain rows; nothing here
knows SQL. Lists are fused by reciprocal rank (``RRF_K``): ranks, not raw
scores, because ts_rank_cd, BM25 and cosine distance live on unrelated
scales. A batch scores its summary plus its best raw turn, so a batch found
both ways ranks above one found either way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

from core.ports.storage import MatchList, MatchReason, MemoryHit, TurnHit

RRF_K = 60
"""Reciprocal-rank-fusion constant: the usual 60 keeps one list's top hit from
drowning a document that ranks well in both."""

TURNS_PER_HIT = 3
"""Matching raw turns returned with each batch (its best ones)."""

SNIPPET_CHARS = 600

SNIPPET_SCAN_CHARS = 100_000
"""How far into a turn a snippet looks for the query's words. A turn may hold
1,000,000 characters and a response up to a few hundred snippets: looking
through every one whole for every word of a 200-word query cost seconds of CPU
per request. A word first said further in gets the turn's head."""

SNIPPET_QUERY_WORDS = 16
"""The query's first distinct words (of three letters or more) a snippet looks for."""

COLLAPSE_NORMALIZED_CHARS = 10_000
"""Turns up to this long are copies when their words match whatever the case and
spacing; a longer turn only when its text is the same (a dictionary lookup at C
speed, not a lowered, split and joined copy of a pasted log)."""

BM25_K1 = 1.2
BM25_B = 0.75

COMMON_SHARE = 0.05
"""A query term held by more than this share of the scope's turns is common:
candidates come from the other (selective) terms first (MaxScore)."""

Key = tuple[str, str]
"""(conversation id, id): what identifies a batch or a raw turn."""


@dataclass(frozen=True)
class Turn:
    """An archived raw turn."""

    conversation_id: str
    id: str
    seq: int
    batch_id: str | None
    role: str
    content: str  # the turn's first SNIPPET_SCAN_CHARS at least, as the store reads it
    created_at: datetime
    chars: int = 0  # the whole turn's length when ``content`` is its head (0: ``content``'s)
    digest: str | None = None  # the whole text's SHA-256 (a long turn read by its head)


@dataclass(frozen=True)
class Summary:
    """An archived batch: its summary and what it covers."""

    conversation_id: str
    id: str
    seq: int
    label: str
    content: str
    depth: int
    start_time: datetime
    end_time: datetime
    message_count: int
    superseded: bool


Row = TypeVar("Row", Turn, Summary)


@dataclass(frozen=True)
class Found(Generic[Row]):
    """A row in one list: that list's own score and the query lexemes it holds."""

    row: Row
    score: float
    matched: tuple[str, ...] = ()


@dataclass(frozen=True)
class Candidates(Generic[Row]):
    """One candidate list, best first, and the query word each lexeme came from."""

    via: MatchList
    found: Sequence[Found[Row]] = ()
    words: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Ranked(Generic[Row]):
    """A row and its ranks in the lists it appears in, fused."""

    row: Row
    text_rank: int | None = None
    vector_rank: int | None = None
    score: float = 0.0
    matches: list[MatchReason] = field(default_factory=list)
    duplicates: int = 0

    @property
    def best(self) -> int:
        return min(r for r in (self.text_rank, self.vector_rank) if r is not None)


def fuse(text: Candidates[Row], vector: Candidates[Row]) -> dict[Key, Ranked[Row]]:
    """Reciprocal rank fusion: score = Σ 1/(RRF_K + rank) over the lists a row is in."""
    ranked: dict[Key, Ranked[Row]] = {}
    for listed, is_text in ((text, True), (vector, False)):
        for rank, found in enumerate(listed.found, start=1):
            row = found.row
            entry = ranked.setdefault((row.conversation_id, row.id), Ranked(row))
            if is_text:
                entry.text_rank = rank
            else:
                entry.vector_rank = rank
            entry.score += 1.0 / (RRF_K + rank)
            entry.matches.append(_reason(listed, rank, found))
    return ranked


def _reason(listed: Candidates[Row], rank: int, found: Found[Row]) -> MatchReason:
    return MatchReason(
        via=listed.via,
        rank=rank,
        score=found.score,
        terms=tuple(listed.words.get(lexeme, lexeme) for lexeme in found.matched),
    )


def collapse_duplicates(found: Sequence[Found[Turn]]) -> tuple[list[Found[Turn]], dict[Key, int]]:
    """Keep the first of the turns of one conversation with the same text.

    The same sentence said ten times ("did I mention the trip?") would take
    every place in the list from the one turn that says something else; a
    caller learns nothing from the copies, only that there are some
    (``TurnHit.duplicates``).
    """
    first: dict[tuple[str, str], Turn] = {}
    copies: dict[Key, int] = {}
    kept = []
    for candidate in found:
        turn = candidate.row
        text = (turn.conversation_id, _copy_text(turn))
        if text in first:
            keeper = first[text]
            key = (keeper.conversation_id, keeper.id)
            copies[key] = copies.get(key, 0) + 1
            continue
        first[text] = turn
        kept.append(candidate)
    return kept, copies


def _copy_text(turn: Turn) -> str:
    """What two copies share: the words (``COLLAPSE_NORMALIZED_CHARS``), or the
    text, or the whole text's digest when the store read the turn's head only."""
    if turn.digest is not None:
        return "\0" + turn.digest  # no stored text holds a NUL: never a turn's words
    if len(turn.content) > COLLAPSE_NORMALIZED_CHARS:
        return turn.content  # longer than any normalised text: the two kinds never meet
    return " ".join(turn.content.lower().split())


def fused_turns(text: Candidates[Turn], vector: Candidates[Turn]) -> dict[Key, Ranked[Turn]]:
    """Raw turns fused after their copies are collapsed in each list."""
    text_found, text_copies = collapse_duplicates(text.found)
    vector_found, vector_copies = collapse_duplicates(vector.found)
    turns = fuse(
        Candidates(text.via, text_found, text.words),
        Candidates(vector.via, vector_found, vector.words),
    )
    for key, turn in turns.items():
        turn.duplicates = max(text_copies.get(key, 0), vector_copies.get(key, 0))
    return turns


def missing_batch_ids(
    summaries: Mapping[Key, Ranked[Summary]], turns: Mapping[Key, Ranked[Turn]]
) -> list[Key]:
    """Batches only raw turns found: their rows still have to be read."""
    wanted = {
        (t.row.conversation_id, t.row.batch_id)
        for t in turns.values()
        if t.row.batch_id is not None
    }
    return sorted(wanted - set(summaries))


def ranked_turns(turns: Mapping[Key, Ranked[Turn]]) -> list[Ranked[Turn]]:
    """Raw turns by fused score; ties to the turn ranked higher in a list, then the later."""
    return sorted(turns.values(), key=lambda t: (-t.score, t.best, -t.row.seq))


@dataclass
class _Batch:
    row: Summary
    summary: Ranked[Summary] | None = None
    turns: list[Ranked[Turn]] = field(default_factory=list)

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


def hits(
    summaries: Mapping[Key, Ranked[Summary]],
    turns: Mapping[Key, Ranked[Turn]],
    batches_found_by_turns: Sequence[Summary],
    query: str,
    limit: int,
) -> list[MemoryHit]:
    """Batches by fused score (summary + best raw turn), each with its best turns."""
    batches = {key: _Batch(r.row, summary=r) for key, r in summaries.items()}
    for row in batches_found_by_turns:
        batches.setdefault((row.conversation_id, row.id), _Batch(row))
    for turn in ranked_turns(turns):
        batch_id = turn.row.batch_id
        batch = None if batch_id is None else batches.get((turn.row.conversation_id, batch_id))
        if batch is not None:
            batch.turns.append(turn)
    ordered = sorted(batches.values(), key=lambda b: (-b.score, b.best, -b.row.seq))
    return [_hit(b, query) for b in ordered[:limit]]


def _hit(batch: _Batch, query: str) -> MemoryHit:
    row, summary = batch.row, batch.summary
    return MemoryHit(
        batch_id=row.id,
        label=row.label,
        conversation_id=row.conversation_id,
        content=row.content,
        depth=row.depth,
        start_time=row.start_time,
        end_time=row.end_time,
        message_count=row.message_count,
        score=batch.score,
        text_rank=summary.text_rank if summary else None,
        vector_rank=summary.vector_rank if summary else None,
        superseded=row.superseded,
        turns=tuple(turn_hit(t, query) for t in batch.turns[:TURNS_PER_HIT]),
        matches=tuple(summary.matches) if summary else (),
    )


def turn_hit(turn: Ranked[Turn], query: str) -> TurnHit:
    text, truncated = snippet(turn.row.content, query, total=turn.row.chars)
    return TurnHit(
        message_id=turn.row.id,
        role=turn.row.role,
        created_at=turn.row.created_at,
        text=text,
        truncated=truncated,
        score=turn.score,
        text_rank=turn.text_rank,
        vector_rank=turn.vector_rank,
        conversation_id=turn.row.conversation_id,
        batch_id=turn.row.batch_id,
        matches=tuple(turn.matches),
        duplicates=turn.duplicates,
    )


_QUERY_WORDS = re.compile(r"\w{3,}")


def snippet(
    content: str, query: str, size: int = SNIPPET_CHARS, *, total: int = 0
) -> tuple[str, bool]:
    """The whole text when short, else ``size`` characters around the first
    mention of a query word in the turn's head (``SNIPPET_SCAN_CHARS``, the
    query's first ``SNIPPET_QUERY_WORDS`` words): bounded work per snippet.
    ``total``: the whole turn's length when ``content`` is its head."""
    length = max(total, len(content))
    if length <= size:
        return content, False
    first = _first_mention(content[:SNIPPET_SCAN_CHARS].lower(), _query_words(query))
    start = max(0, min(first - size // 3, len(content) - size))
    piece = content[start : start + size]
    return ("…" if start else "") + piece + ("…" if start + size < length else ""), True


def _query_words(query: str) -> list[str]:
    """The query's first distinct words of three letters or more, lowered."""
    words = dict.fromkeys(w.lower() for w in _QUERY_WORDS.findall(query))
    return list(words)[:SNIPPET_QUERY_WORDS]


def _first_mention(window: str, words: Sequence[str]) -> int:
    """Where the first of ``words`` starts in ``window`` (0: none): each word is
    looked for only before the best start so far."""
    best = len(window)
    for word in words:
        found = window.find(word, 0, best + len(word) - 1)
        if found >= 0:
            best = found
    return best if best < len(window) else 0


def usable(found: Sequence[Found[Row]]) -> list[Found[Row]]:
    """A zero vector has no direction: its cosine distance is NaN, not a rank."""
    return [f for f in found if not math.isnan(f.score)]


def idf(turns: float, holding: float) -> float:
    """BM25's inverse document frequency (the ``+ 1`` keeps it positive)."""
    return math.log(1 + (turns - holding + 0.5) / (holding + 0.5))


@dataclass(frozen=True)
class TermWeights:
    """The query terms' BM25 weights in a scope, and which of them are selective."""

    idf: list[float]
    selective: list[str]  # held by at most COMMON_SHARE of the scope's turns
    common_bound: float  # the most the common terms alone can add to a turn's BM25


def term_weights(lexemes: Sequence[str], holding: Sequence[float], turns: float) -> TermWeights:
    """Each term's IDF; the common terms' bound is idf × (k1 + 1) each (MaxScore)."""
    weights = [idf(turns, held) for held in holding]
    common = [held > COMMON_SHARE * turns for held in holding]
    return TermWeights(
        idf=weights,
        selective=[lexeme for lexeme, c in zip(lexemes, common, strict=True) if not c],
        common_bound=sum(w * (BM25_K1 + 1) for w, c in zip(weights, common, strict=True) if c),
    )
