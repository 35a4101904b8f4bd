"""memory_read's ranking on plain rows: fusion with its reasons, copies collapsed,
batches scored by summary and best turn, snippets, BM25's IDF and the common terms."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.domain.ranking import (
    BM25_K1,
    RRF_K,
    TURNS_PER_HIT,
    Candidates,
    Found,
    Summary,
    Turn,
    fuse,
    fused_turns,
    hits,
    idf,
    missing_batch_ids,
    ranked_turns,
    snippet,
    term_weights,
    usable,
)

pytestmark = pytest.mark.unit

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def turn(i: int, text: str = "", conversation: str = "c", batch: str | None = "b1") -> Turn:
    return Turn(conversation, f"m{i}", i, batch, "user", text or f"turn {i}", T0)


def summary(name: str, seq: int, conversation: str = "c") -> Summary:
    return Summary(conversation, name, seq, name, f"Summary {name}.", 0, T0, T0, 5, False)


def found(*rows: Any, score: float = 1.0) -> list[Found[Any]]:
    return [Found(row, score) for row in rows]


def test_fusion_adds_each_lists_reciprocal_rank_and_says_why() -> None:
    text = Candidates(
        "raw_text",
        [Found(turn(1), 7.5, ("dentist",)), Found(turn(2), 1.0)],
        words={"dentist": "Dentist"},
    )
    vector = Candidates("raw_vector", [Found(turn(2), 0.25), Found(turn(1), 0.5)])

    fused = fuse(text, vector)

    first, second = fused[("c", "m1")], fused[("c", "m2")]
    assert first.score == pytest.approx(1 / (RRF_K + 1) + 1 / (RRF_K + 2))
    assert (first.text_rank, first.vector_rank) == (1, 2)
    assert [(m.via, m.rank, m.score, m.terms) for m in first.matches] == [
        ("raw_text", 1, 7.5, ("Dentist",)),
        ("raw_vector", 2, 0.5, ()),
    ]
    assert second.score == first.score  # ranks 2 + 1 = 1 + 2
    # A tie goes to the turn with the better single rank, then the later one.
    assert [t.row.id for t in ranked_turns(fused)] == ["m2", "m1"]


def test_copies_of_a_turn_collapse_into_the_first_and_are_counted() -> None:
    rows = [
        turn(9, "Did I mention the trip?"),
        turn(8, "did I  mention the trip?"),
        turn(7, "The trip is on Friday."),
        turn(6, "Did I mention the trip?", conversation="other"),
        turn(5, "Did I mention the trip?"),
    ]

    fused = fused_turns(Candidates("raw_text", found(*rows)), Candidates("raw_vector"))

    assert [(t.row.conversation_id, t.row.id) for t in ranked_turns(fused)] == [
        ("c", "m9"),
        ("c", "m7"),
        ("other", "m6"),
    ]
    assert {key: t.duplicates for key, t in fused.items() if t.duplicates} == {("c", "m9"): 2}


distinct_turns = st.lists(st.integers(0, 10_000), unique=True, max_size=30).map(
    lambda seqs: [turn(seq, f"text {seq}") for seq in seqs]
)


@given(distinct_turns)
def test_one_list_alone_keeps_its_order(turns: list[Turn]) -> None:
    fused = fused_turns(Candidates("raw_text", found(*turns)), Candidates("raw_vector"))
    assert [t.row for t in ranked_turns(fused)] == turns


@given(distinct_turns, st.randoms(use_true_random=False))
def test_which_list_is_text_does_not_change_the_order(turns: list[Turn], rng: Any) -> None:
    other = list(turns)
    rng.shuffle(other)
    one_way = fused_turns(
        Candidates("raw_text", found(*turns)), Candidates("raw_vector", found(*other))
    )
    swapped = fused_turns(
        Candidates("raw_text", found(*other)), Candidates("raw_vector", found(*turns))
    )
    order = [t.row for t in ranked_turns(one_way)]
    assert order == [t.row for t in ranked_turns(swapped)]
    scores = [t.score for t in ranked_turns(one_way)]
    assert scores == sorted(scores, reverse=True)


def test_a_batch_found_both_ways_ranks_first_with_its_best_turns() -> None:
    summaries = fuse(
        Candidates("summary_text", found(summary("b2", 20), summary("b1", 10))),
        Candidates("summary_vector"),
    )
    turns = fused_turns(
        Candidates("raw_text", found(*(turn(i) for i in range(1, 6)), turn(9, batch="b3"))),
        Candidates("raw_vector"),
    )
    assert missing_batch_ids(summaries, turns) == [("c", "b3")]

    result = hits(summaries, turns, [summary("b3", 30)], "turn", limit=10)

    assert [h.batch_id for h in result] == ["b1", "b2", "b3"]
    b1, b2, b3 = result
    assert b1.score == pytest.approx(1 / (RRF_K + 2) + 1 / (RRF_K + 1))
    assert [t.message_id for t in b1.turns] == ["m1", "m2", "m3"][:TURNS_PER_HIT]
    assert (b2.turns, b2.text_rank) == ((), 1)
    assert (b3.text_rank, b3.matches, [t.message_id for t in b3.turns]) == (None, (), ["m9"])
    assert [h.batch_id for h in hits(summaries, turns, [summary("b3", 30)], "x", 1)] == ["b1"]


def test_a_zero_vectors_nan_distance_is_no_rank() -> None:
    listed = [Found(turn(1), math.nan), Found(turn(2), 0.5)]
    assert [f.row.id for f in usable(listed)] == ["m2"]


words = st.text(alphabet="abcdefghij ", min_size=1, max_size=2000)


@given(words, st.text(alphabet="abcdefghij", min_size=3, max_size=12), st.integers(20, 700))
def test_a_snippet_is_bounded_and_holds_the_first_match(content: str, word: str, size: int) -> None:
    text, truncated = snippet(content, word, size)
    assert truncated == (len(content) > size)
    assert len(text) <= size + 2  # an ellipsis either side at most
    if not truncated:
        assert text == content
    elif word in content:
        assert word in text


@given(st.integers(1, 10**6), st.data())
def test_idf_is_positive_and_falls_as_more_turns_hold_the_term(turns: int, data: Any) -> None:
    fewer = data.draw(st.integers(0, turns))
    more = data.draw(st.integers(fewer, turns))
    assert idf(turns, more) > 0
    assert idf(turns, fewer) >= idf(turns, more)
    assert math.isclose(idf(turns, 0), math.log(1 + (turns + 0.5) / 0.5))


def test_terms_held_by_more_than_one_turn_in_twenty_are_common() -> None:
    weights = term_weights(["photo", "dentist", "today"], [300.0, 4.0, 51.0], 1000.0)
    assert weights.selective == ["dentist"]
    assert weights.idf == [idf(1000, 300), idf(1000, 4), idf(1000, 51)]
    assert weights.common_bound == pytest.approx((idf(1000, 300) + idf(1000, 51)) * (BM25_K1 + 1))
    assert term_weights(["a"], [50.0], 1000.0).selective == ["a"]  # 5% exactly is not common
