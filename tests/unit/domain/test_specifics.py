"""The specifics ledger (core/domain/specifics.py): extraction, ranking, the section."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.specifics import (
    SECTION_HEADING,
    Specific,
    apply_ledger,
    dropped_by,
    mentions_in,
    merge_ranked,
    normalized,
    present_in,
    rank_specifics,
    render_section,
    split_section,
    with_section,
)
from core.domain.tokens import DEFAULT_COUNTER
from tests.support.builders import message
from tests.support.planted import KINDS, planted_conversation, planted_value

pytestmark = pytest.mark.unit

count = DEFAULT_COUNTER.count


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("refund $1,200.50 for ORD-88123", [("amount", "$1,200.50"), ("identifier", "ORD-88123")]),
        (
            "due 2025-03-14 at 3:30 pm UTC",
            [("datetime", "2025-03-14"), ("datetime", "3:30 pm UTC")],
        ),
        ("see https://example.com/a?b=1.", [("url", "https://example.com/a?b=1")]),
        ("mail alice.smith@acme.io now", [("email", "alice.smith@acme.io")]),
        (
            "edit /etc/app/config.toml and src/app/main.py",
            [("path", "/etc/app/config.toml"), ("path", "src/app/main.py")],
        ),
        (
            "fixed in 3f9a2c7b, shipped in v2.3.1",
            [("identifier", "3f9a2c7b"), ("identifier", "v2.3.1")],
        ),
        (
            "call `load_history()` with max_summary_tokens",
            [("symbol", "load_history()"), ("symbol", "max_summary_tokens")],
        ),
        ('she said "never deploy on Fridays"', [("quote", "never deploy on Fridays")]),
        ("we met Maria Gonzalez in Lisbon", [("name", "Maria Gonzalez"), ("name", "Lisbon")]),
        (
            "latency 450 ms, disk 80%, 12 GB",
            [("amount", "450 ms"), ("amount", "80%"), ("amount", "12 GB")],
        ),
    ],
)
def test_each_kind_is_extracted(text: str, expected: list[tuple[str, str]]) -> None:
    assert [(m.kind, m.text) for m in mentions_in(text, "m1")] == expected


def test_plain_words_and_sentence_starts_are_not_specifics() -> None:
    assert mentions_in("Thanks, that sounds good. We can go on with it tomorrow.", "m1") == []


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    seed=st.integers(0, 10_000),
    lead=st.sampled_from(["", "so it is ", "We said "]),
)
def test_a_planted_specific_of_any_kind_is_found(kind: str, seed: int, lead: str) -> None:
    value = planted_value(kind, random.Random(seed))
    text = f"{lead}{value} and that was it."
    found = {normalized(m.text) for m in mentions_in(text, "m1")}
    assert normalized(value.strip('"')) in found


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 1_000), turns=st.integers(1, 60))
def test_ranking_is_deterministic_and_each_specific_is_ranked_once(seed: int, turns: int) -> None:
    conversation = planted_conversation(seed, turns)
    first = rank_specifics(conversation.messages)
    assert first == rank_specifics(conversation.messages)
    keys = [(s.kind, normalized(s.text)) for s in first]
    assert len(keys) == len(set(keys))
    assert [s.score for s in first] == sorted((s.score for s in first), reverse=True)
    ids = {m.id for m in conversation.messages}
    assert all(s.message_id in ids for s in first)


def test_who_stated_it_repetition_and_answers_rank_higher() -> None:
    turns = [
        message(0, "assistant", "the fallback bucket is s3-archive-77 maybe"),
        message(1, "user", "What is the order number?"),
        message(2, "assistant", "It is ORD-55120."),
        message(3, "user", "my budget is $9,000 and the date 2026-05-01"),
        message(4, "assistant", "noted $9,000"),
    ]
    ranked = [s.text for s in rank_specifics(turns)]
    assert ranked.index("$9,000") < ranked.index("2026-05-01")  # repeated
    assert ranked.index("ORD-55120") < ranked.index("s3-archive-77")  # answers a question


def test_the_source_turns_importance_weighs_in() -> None:
    turns = [message(0, "user", "ticket ABC-101"), message(1, "user", "ticket ABC-202")]
    ranked = rank_specifics(turns, {"m00000": 5.0, "m00001": 0.5})
    assert [s.text for s in ranked] == ["ABC-101", "ABC-202"]
    assert rank_specifics(turns, {"m00000": 0.5, "m00001": 5.0})[0].text == "ABC-202"


specifics_lists = st.lists(
    st.builds(
        Specific,
        kind=st.sampled_from(KINDS),
        text=st.text("abcdefXYZ0123456789-./$", min_size=1, max_size=30).filter(str.strip),
        message_id=st.sampled_from(["m1", "m2", "a-very-long-message-id-0123456789"]),
        score=st.floats(0, 100),
    ),
    max_size=40,
    # What rank_specifics hands on: each specific once (a repeat raises its score).
    unique_by=lambda s: (s.kind, s.text, s.message_id),
)


@settings(max_examples=200, deadline=None)
@given(ranked=specifics_lists, summary=st.text(max_size=200), allowance=st.integers(0, 400))
def test_the_ledger_fits_its_allowance_and_shows_only_what_the_summary_dropped(
    ranked: list[Specific], summary: str, allowance: int
) -> None:
    ledger = apply_ledger(summary, ranked, allowance, count)
    assert ledger.content.startswith(summary)
    assert count(ledger.content) - count(summary) <= allowance + 1  # +1: ceil of the split
    assert all(not present_in(s, summary) for s in ledger.shown)
    assert all(present_in(s, ledger.content) for s in ledger.shown)
    dropped = dropped_by(summary, ranked)
    shown = set(ledger.shown)
    # rank order: nothing shown is ranked below a dropped one that would have fit in its place
    assert [s for s in dropped if s in shown] == list(ledger.shown)


@settings(max_examples=100, deadline=None)
@given(
    ranked=specifics_lists, summary=st.text(max_size=200).filter(lambda t: SECTION_HEADING not in t)
)
def test_the_section_splits_off_again(ranked: list[Specific], summary: str) -> None:
    shown = tuple(dropped_by(summary, ranked))
    assert split_section(with_section(summary, shown)) == (
        summary,
        render_section(shown),
    )


def test_the_section_names_each_source_message_once() -> None:
    ledger = [
        Specific(kind="identifier", text="ORD-1", message_id="m7"),
        Specific(kind="amount", text="$5", message_id="m2"),
        Specific(kind="url", text="https://x.io", message_id="m7"),
    ]
    assert render_section(ledger) == f"{SECTION_HEADING}\n- m7: ORD-1; https://x.io\n- m2: $5"


def test_a_merged_ranking_keeps_each_specific_once_raised_by_its_repeats() -> None:
    a = [Specific(kind="amount", text="$5", message_id="m1", score=2.0)]
    b = [
        Specific(kind="amount", text="$5", message_id="m9", score=1.0),
        Specific(kind="name", text="Ada Byron", message_id="m9", score=2.5),
    ]
    merged = merge_ranked([a, b])
    assert [(s.text, s.message_id) for s in merged] == [("$5", "m1"), ("Ada Byron", "m9")]
    assert merged[0].score > 2.0


def test_a_turn_read_again_is_not_searched_again_and_reads_the_same() -> None:
    """The plan and the store's gate read the same turns seconds apart."""
    from core.domain import specifics

    text = "Order ORD-88123 shipped to Berlin on 2024-03-05 for $1,250 (see /srv/app/config.toml)."
    first = specifics.mentions_in(text, "m-1", 2)
    hits = specifics._remembered_spans.cache_info().hits
    again = specifics.mentions_in(text, "m-9", 7)
    assert specifics._remembered_spans.cache_info().hits == hits + 1
    assert [(m.kind, m.text) for m in again] == [(m.kind, m.text) for m in first]
    assert {(m.message_id, m.position) for m in again} == {("m-9", 7)}
    assert {m.kind for m in first} >= {"identifier", "datetime", "amount", "path"}
    long_text = text + " filler" * 1_000  # over REMEMBERED_TEXT_CHARS: read each time
    specifics.mentions_in(long_text, "m-2")
    specifics.mentions_in(long_text, "m-2")
    assert specifics._remembered_spans.cache_info().hits == hits + 1
