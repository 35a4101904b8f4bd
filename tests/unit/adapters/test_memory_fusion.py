"""memory_read's pure parts: fusion with its reasons, collapsing copies, the IDF
and the tsquery of selective terms."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.adapters.postgres.memory import (
    RRF_K,
    ListRows,
    Scope,
    _tsquery_any,
    _where,
    collapse_duplicates,
    fuse,
    idf,
    ranked_turns,
)

pytestmark = pytest.mark.unit


def turn(i: int, text: str = "", conversation: str = "c", **extra: Any) -> dict[str, Any]:
    return {
        "conversation_id": conversation,
        "id": f"m{i}",
        "seq": i,
        "content": text or f"turn {i}",
        **extra,
    }


def test_fusion_adds_each_lists_reciprocal_rank_and_says_why() -> None:
    text = ListRows(
        "raw_text",
        [turn(1, matched=["dentist"], text_score=7.5), turn(2, matched=[], text_score=1.0)],
        "text_score",
        words={"dentist": "Dentist"},
    )
    vector = ListRows("raw_vector", [turn(2, distance=0.25), turn(1, distance=0.5)], "distance")

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
    assert [t.row["id"] for t in ranked_turns(fused)] == ["m2", "m1"]


def test_copies_of_a_turn_collapse_into_the_first_and_are_counted() -> None:
    rows = [
        turn(9, "Did I mention the trip?"),
        turn(8, "did I  mention the trip?"),
        turn(7, "The trip is on Friday."),
        turn(6, "Did I mention the trip?", conversation="other"),
        turn(5, "Did I mention the trip?"),
    ]

    kept, copies = collapse_duplicates(rows)

    assert [(r["conversation_id"], r["id"]) for r in kept] == [
        ("c", "m9"),
        ("c", "m7"),
        ("other", "m6"),
    ]
    assert copies == {("c", "m9"): 2}


@given(st.integers(1, 10**6), st.data())
def test_idf_is_positive_and_falls_as_more_turns_hold_the_term(turns: int, data: Any) -> None:
    fewer = data.draw(st.integers(0, turns))
    more = data.draw(st.integers(fewer, turns))
    assert idf(turns, more) > 0
    assert idf(turns, fewer) >= idf(turns, more)
    assert math.isclose(idf(turns, 0), math.log(1 + (turns + 0.5) / 0.5))


def test_selective_terms_are_quoted_into_an_or_query() -> None:
    assert _tsquery_any(["dentist", "o'brien"]) == "'dentist' | 'o''brien'"


def test_each_scope_filters_only_on_what_it_names() -> None:
    assert _where(Scope(None, None).kind, "a", 3) == "true"
    assert _where(Scope("c", None).kind, "a", 3) == "a.conversation_id = $3"
    both = _where(Scope("c", "t").kind, "a", 3)
    assert both.startswith("a.conversation_id = $3 AND a.conversation_id IN (")
    assert "tenant_id = $4" in both
    assert Scope("c", "t").params == ["c", "t"]
    assert "tenant_id = $3" in _where(Scope(None, "t").kind, "a", 3)
