"""memory_read's per-response text work is bounded (issue 29): a snippet looks
through a turn's head for the query's first words, and copies of a long turn
are found without a lowered, split copy of its text."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.domain.ranking import (
    COLLAPSE_NORMALIZED_CHARS,
    SNIPPET_QUERY_WORDS,
    SNIPPET_SCAN_CHARS,
    Found,
    Turn,
    collapse_duplicates,
    snippet,
)

pytestmark = pytest.mark.unit

T0 = datetime(2025, 1, 1, tzinfo=UTC)
LIMIT_CHARS = 1_000_000  # max_content_chars' default ceiling
LIMIT_QUERY = " ".join(f"word{i:03d}" for i in range(200))  # ~1,600 characters, 200 words


class Watched(str):
    """A turn's text that records how much of it each ``lower()`` and slice reads."""

    read: list[int]

    def __new__(cls, text: str) -> Watched:
        made = super().__new__(cls, text)
        made.read = []
        return made

    def lower(self) -> str:
        self.read.append(len(self))
        return str.lower(self)

    def __getitem__(self, key: slice | int) -> str:  # type: ignore[override]
        piece = str.__getitem__(self, key)
        self.read.append(len(piece))
        return piece


def turn(i: int, text: str) -> Turn:
    return Turn("c", f"m{i}", i, "b1", "user", text, T0)


def test_a_snippet_reads_a_bounded_head_of_a_turn_at_the_limits() -> None:
    content = Watched("x" * LIMIT_CHARS)
    text, truncated = snippet(content, LIMIT_QUERY)
    assert truncated and text.startswith("x")
    assert max(content.read) <= SNIPPET_SCAN_CHARS  # never the whole turn


def test_a_snippet_finds_a_word_in_the_head_and_not_beyond_it() -> None:
    early = "a" * 50_000 + " needle " + "b" * (LIMIT_CHARS - 50_008)
    late = "a" * (SNIPPET_SCAN_CHARS + 1_000) + " needle " + "b" * 100
    assert "needle" in snippet(early, "needle")[0]
    head, _ = snippet(late, "needle")
    assert "needle" not in head and head.startswith("a")


def test_a_snippet_looks_for_the_querys_first_words_only() -> None:
    content = "z" * 5_000 + " word150 " + "z" * 5_000
    assert "word150" not in snippet(content, LIMIT_QUERY)[0]
    assert "word150" in snippet(content, "word150 " + LIMIT_QUERY)[0]
    first = " ".join(LIMIT_QUERY.split()[:SNIPPET_QUERY_WORDS])
    assert "word015" in snippet(content.replace("word150", "word015"), first)[0]


def test_the_earliest_of_several_words_wins() -> None:
    content = "q" * 3_000 + " beta " + "q" * 3_000 + " alpha " + "q" * 3_000
    assert "beta" in snippet(content, "alpha beta")[0]


def test_copies_of_long_turns_are_found_without_lowering_them() -> None:
    long_text = "Pasted log line\n" * (COLLAPSE_NORMALIZED_CHARS // 8)
    texts = [Watched(long_text), Watched(long_text), Watched(long_text.upper())]
    short = [Watched("Did I  mention the trip?"), Watched("did i mention the TRIP?")]
    kept, copies = collapse_duplicates(
        [Found(turn(i, t), 1.0) for i, t in enumerate([*texts, *short])]
    )
    assert [f.row.id for f in kept] == ["m0", "m2", "m3"]  # a long one's case is its own
    assert copies == {("c", "m0"): 1, ("c", "m3"): 1}
    assert all(n <= COLLAPSE_NORMALIZED_CHARS for t in [*texts, *short] for n in t.read)
